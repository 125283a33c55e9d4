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

from typing import Any

from pgprefetch.errors import ConfigError


def load_huggingface(options: dict[str, Any]) -> Any:
    """The ``tokenizers.Tokenizer`` in the JSON file ``options["path"]``."""
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            'tokenizer = "huggingface" needs the tokenizers package: pip install "pgprefetch[tokenizers]"'
        ) from None
    try:
        return tokenizers.Tokenizer.from_file(str(options["path"]))
    except Exception as e:  # the library raises a plain Exception for a missing or malformed file
        raise ConfigError(f"cannot load the tokenizer {options['path']}: {' '.join(str(e).split())}") from None


def load_tiktoken(options: dict[str, Any]) -> Any:
    """The ``tiktoken`` encoding named ``options["encoding"]``."""
    try:
        import tiktoken
    except ImportError:
        raise ConfigError(
            'tokenizer = "tiktoken" needs the tiktoken package: pip install "pgprefetch[tokenizers]"'
        ) from None
    try:
        return tiktoken.get_encoding(str(options["encoding"]))
    except Exception as e:  # an unknown name is a ValueError; a download refused offline, anything
        raise ConfigError(
            f"cannot load the tiktoken encoding {options['encoding']!r}: {' '.join(str(e).split())}"
        ) from None


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
