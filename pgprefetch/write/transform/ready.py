"""The transforms most users write first, ready: a Hugging Face ``tokenizers`` file and a ``tiktoken`` encoding.

``tokenizer = "huggingface"`` with ``path = "tokenizer.json"`` and ``tokenizer = "tiktoken"`` with
``encoding = "cl100k_base"`` become this module's :func:`encode` with the matching set-up
(:mod:`pgprefetch.config.transforms`). Each takes one text input and fills one field with the token ids.
Neither library is a dependency of the dump host: ``pip install 'pgprefetch[tokenizers]'``.

The Hugging Face tokenizer's fingerprint hashes its JSON file (an option named ``path``), so a retrained
vocabulary recomputes the cache; a tiktoken encoding is known by its name, and a ``version`` bump is what
tells the cache that the library's files changed under it. tiktoken's ``encode_ordinary_batch`` is used:
text that happens to contain ``<|endoftext|>`` is encoded as text, never raises, and never becomes a
special token a model was not meant to see.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pgprefetch.errors import ConfigError


def load_huggingface(options: dict[str, Any]) -> Any:
    """The ``tokenizers.Tokenizer`` in the JSON file ``options["path"]``."""
    tokenizers = _library("tokenizers", "huggingface")
    return _loaded(lambda: tokenizers.Tokenizer.from_file(str(options["path"])), f"the tokenizer {options['path']}")


def load_tiktoken(options: dict[str, Any]) -> Any:
    """The ``tiktoken`` encoding named ``options["encoding"]``."""
    tiktoken = _library("tiktoken", "tiktoken")
    encoding = str(options["encoding"])
    return _loaded(lambda: tiktoken.get_encoding(encoding), f"the tiktoken encoding {encoding!r}")


def _library(module: str, kind: str) -> Any:
    """The tokenizer's library, or one line saying how to install it (the dump host does not need it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f'tokenizer = "{kind}" needs the {module} package: pip install "pgprefetch[tokenizers]"'
        ) from None


def _loaded(load: Callable[[], Any], what: str) -> Any:
    """What ``load`` returns; its failure one line (the libraries raise plain exceptions for a bad file or name)."""
    try:
        return load()
    except Exception as e:  # a missing or malformed file, an unknown name, a download refused offline
        raise ConfigError(f"cannot load {what}: {' '.join(str(e).split())}") from None


def encode(batch: dict[str, list[Any]], ctx: Any) -> dict[str, list[list[int]]]:
    """Each text's token ids, under the one field the transform fills."""
    (texts,) = batch.values()
    (output,) = ctx.outputs
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"expected text to tokenize, got {'NULL' if text is None else type(text).__name__}")
    tokenizer = ctx.state
    if ctx.options["tokenizer"] == "tiktoken":
        return {output: tokenizer.encode_ordinary_batch(texts)}
    special = bool(ctx.options.get("add_special_tokens", True))  # the library's own default
    return {output: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=special)]}
