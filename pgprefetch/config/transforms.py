"""``[transforms.NAME]`` and the fields they fill (``transform = "NAME"``), checked at the edge.

A transform is named Python (``module:callable``) or one of the ready tokenizers (``tokenizer =
"huggingface"`` with a ``path``, ``tokenizer = "tiktoken"`` with an ``encoding``), which become the same
thing: a function and a set-up in :mod:`pgprefetch.write.transform.ready`, with their file or encoding as
options. Whatever names a column or a field is checked here against the rest of the config, so that a
typo is one line before any database is touched; whether the columns exist is the dump's to check, on the
server's description of the query.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from pgprefetch.config.model import FieldConfig, SamplesConfig, ScanConfig, TransformConfig
from pgprefetch.config.values import show

READY = "pgprefetch.write.transform.ready"  # the module of the ready tokenizers (a name: config imports no write)
TOKENIZERS = {
    "huggingface": ("path", f"{READY}:encode", f"{READY}:load_huggingface"),
    "tiktoken": ("encoding", f"{READY}:encode", f"{READY}:load_tiktoken"),
}
_CALLABLE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z"
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_KEYS = (
    "function",
    "tokenizer",
    "path",
    "encoding",
    "inputs",
    "random",
    "workers",
    "version",
    "setup",
    "options",
    "on_error",
)
ON_ERROR = ("error", "skip")
MAX_WORKERS = 256


class _Parser(Protocol):
    """The getters of :mod:`pgprefetch.config.parse` a transform's table is checked with."""

    file: Path | None

    def fail(self, where: str, message: str) -> NoReturn: ...

    def keys(
        self, table: dict[str, Any], section: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> None: ...

    def boolean(self, table: dict[str, Any], section: str, key: str, default: bool) -> bool: ...


def parse_transforms(p: _Parser, table: Any) -> tuple[TransformConfig, ...]:
    """Every ``[transforms.NAME]`` table, in the config's order."""
    if not isinstance(table, dict) or not table:
        p.fail("[transforms]", "expected [transforms.NAME] tables, each with a function and its inputs")
    folder = p.file.resolve().parent if p.file is not None else None
    return tuple(_transform(p, name, spec, folder) for name, spec in table.items())


def _transform(p: _Parser, name: str, spec: Any, folder: Path | None) -> TransformConfig:
    where = f"[transforms.{name}]"
    if not _NAME.fullmatch(name):
        p.fail(where, "a transform's name must be letters, digits and underscores, not starting with a digit")
    if not isinstance(spec, dict):
        p.fail(where, f"expected a table with a function and its inputs, got {show(spec)}")
    p.keys(spec, f"transforms.{name}", required=("inputs",), optional=_KEYS)
    function, setup, options = _callables(p, spec, where, folder)
    inputs = spec["inputs"]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(c, str) and c for c in inputs):
        p.fail(f"{where} inputs", f"expected a non-empty list of column names, got {show(inputs)}")
    if len(set(inputs)) != len(inputs):
        p.fail(f"{where} inputs", f"a column is listed twice in {inputs}")
    workers = spec.get("workers")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= MAX_WORKERS
    ):
        p.fail(
            f"{where} workers", f"expected 0 (the dump's own process) to {MAX_WORKERS} processes, got {show(workers)}"
        )
    version = spec.get("version", "")
    if not isinstance(version, str | int) or isinstance(version, bool):
        p.fail(f"{where} version", f"expected a string, got {show(version)}")
    on_error = spec.get("on_error", "error")
    if on_error not in ON_ERROR:
        p.fail(f"{where} on_error", f"expected one of {', '.join(ON_ERROR)}; got {show(on_error)}")
    random = p.boolean(spec, f"transforms.{name}", "random", default=False)
    if random and on_error == "skip":
        p.fail(
            f"{where} on_error",
            '"skip" is for deterministic transforms: a random one\'s failures would change with its draws, '
            "and the epoch's samples with them",
        )
    return TransformConfig(
        name=name,
        function=function,
        inputs=tuple(inputs),
        random=random,
        on_error=str(on_error),
        workers=workers,
        version=str(version),
        setup=setup,
        options=options,
        folder=folder,
    )


def _callables(
    p: _Parser, spec: dict[str, Any], where: str, folder: Path | None
) -> tuple[str | Callable[..., Any], str | Callable[..., Any] | None, tuple[tuple[str, Any], ...]]:
    """The function, the set-up and the options: as written, or a ready tokenizer's."""
    options = spec.get("options", {})
    if not isinstance(options, dict):
        p.fail(f"{where} options", f"expected a table, got {show(options)}")
    if "tokenizer" in spec:
        return _tokenizer(p, spec, where, options)
    for key in ("path", "encoding"):
        if key in spec:
            p.fail(f"{where} {key}", 'belongs to a ready tokenizer: set tokenizer = "huggingface" or "tiktoken"')
    if "function" not in spec:
        p.fail(where, 'missing required key "function" ("module:callable"), or a ready tokenizer = "..."')
    function = _callable(p, spec, where, "function")
    setup = _callable(p, spec, where, "setup") if "setup" in spec else None
    return function, setup, tuple(sorted(options.items()))


def _tokenizer(
    p: _Parser, spec: dict[str, Any], where: str, options: dict[str, Any]
) -> tuple[str, str | None, tuple[tuple[str, Any], ...]]:
    kind = spec["tokenizer"]
    if kind not in TOKENIZERS:
        p.fail(f"{where} tokenizer", f"expected one of {', '.join(TOKENIZERS)}; got {show(kind)}")
    needed, function, setup = TOKENIZERS[kind]
    for key in ("function", "setup", "path", "encoding"):
        if key in spec and key != needed:
            p.fail(f"{where} {key}", f"a ready tokenizer = {show(kind)} takes {needed}, not {key}")
    value = spec.get(needed)
    if not isinstance(value, str) or not value.strip():
        p.fail(f"{where} {needed}", f"expected the tokenizer's {'file' if needed == 'path' else 'encoding name'}")
    # (a path as written: relative to the config file's folder, resolved where it is used, so that moving the
    # config and its files together keeps the config's identity)
    return function, setup, tuple(sorted({**options, needed: value, "tokenizer": kind}.items()))


def _callable(p: _Parser, spec: dict[str, Any], where: str, key: str) -> str | Callable[..., Any]:
    value = spec[key]
    if callable(value):  # a config built in Python (a notebook): the function itself
        return value  # type: ignore[no-any-return]
    if not isinstance(value, str) or not _CALLABLE.fullmatch(value.strip()):
        p.fail(f"{where} {key}", f'expected "module:callable" (prep:tokenize), got {show(value)}')
    return value.strip()


def check_transform_fields(
    p: _Parser, fields: tuple[FieldConfig, ...], transforms: tuple[TransformConfig, ...]
) -> None:
    """Each field's transform exists, each transform fills a field, and no input is a transform's output."""
    named = {t.name for t in transforms}
    for f in fields:
        if f.transform is not None and f.transform not in named:
            known = ", ".join(sorted(named)) or "none"
            p.fail(f"[fields.{f.name}] transform", f"no [transforms.{f.transform}] (transforms: {known})")
    for t in transforms:
        filled = [f.name for f in fields if f.transform == t.name]
        if not filled:
            p.fail(f"[transforms.{t.name}]", f'no field stores its output: add a field with transform = "{t.name}"')
        kind = t.option_values.get("tokenizer") if t.function == TOKENIZERS["huggingface"][1] else None
        if kind is not None and (len(t.inputs) != 1 or len(filled) != 1):
            p.fail(
                f"[transforms.{t.name}]",
                f"a ready tokenizer takes one text input and fills one field (inputs {list(t.inputs)}, "
                f"fields {filled})",
            )


def check_samples_fit(p: _Parser, samples: SamplesConfig | ScanConfig, section: str) -> None:
    """A transform takes samples of one row (windows and several rows per sample: not yet)."""
    many = samples.window is not None if isinstance(samples, ScanConfig) else samples.rows > 1 or samples.max_rows
    if many:
        p.fail(
            f"[{section}]",
            "transforms take samples of one row each; windows and rows > 1 are not supported with [transforms]",
        )
