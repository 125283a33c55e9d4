"""A transform's callables found, and the fingerprint that keys its cache: what its outputs depend on.

``module:callable`` is imported with the config file's folder first on the import path (``prep.py`` beside
the config), in the dump's process or in each worker. The fingerprint hashes what decides an output besides
the input values: the config's description of the transform (:meth:`TransformConfig.content`: function,
inputs, ``version``, options), the **source file of each module** that holds the function and its set-up
(a helper edited in ``prep.py`` changes the outputs as surely as the function), a file an option names as
``path`` (a tokenizer's JSON), and the output fields' declarations (what the values were cast and cut to).
A library the code imports is not hashed: a tokenizer upgraded under the same code is what ``version`` is
for, and the docs say so. Hashing the function's pickled bytes, as Hugging Face ``datasets`` does, misses
on every unpicklable closure and falls back to a random hash: a full recompute nobody asked for.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pgprefetch.config.model import Config, FieldConfig, TransformConfig, callable_name
from pgprefetch.errors import ConfigError

FINGERPRINT_VERSION = 1  # how outputs are packed and hashed: a change of it is a new cache


def resolve(function: str | Callable[..., Any], folder: Path | None, where: str) -> Callable[..., Any]:
    """The callable ``module:callable`` names (``folder`` first on the import path), or ``function`` itself.

    A module that is a file in the config's folder (``prep.py``) is executed from that file each time, never
    taken from ``sys.modules``: what runs is what the fingerprint hashed, even after an edit in a long-lived
    process (a notebook, a test run), and two configs' ``prep.py`` in one process are their own.
    """
    if not isinstance(function, str):
        return function
    module_name, _, attribute = function.partition(":")
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    path = module_file(module_name, folder)
    try:
        value: Any = _load_file(module_name, path) if path is not None else importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except ImportError as e:
        raise ConfigError(f"{where}: cannot import {module_name!r}: {e}") from None
    except AttributeError:
        raise ConfigError(f"{where}: module {module_name!r} has no {attribute!r}") from None
    except Exception as e:  # the module itself failed (a SyntaxError, an error at its top level)
        shown = " ".join(str(e).split())[:300]
        raise ConfigError(f"{where}: importing {module_name!r} failed: {type(e).__name__}: {shown}") from None
    if not callable(value):
        raise ConfigError(f"{where}: {function!r} is not callable")
    return value  # type: ignore[no-any-return]


def module_file(module_name: str, folder: Path | None) -> Path | None:
    """The file of ``module_name`` in the config's folder (``prep.py``, ``a/b.py`` for ``a.b``), if it is one."""
    if folder is None:
        return None
    path = folder.joinpath(*module_name.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def _load_file(module_name: str, path: Path) -> ModuleType:
    """``path`` executed as module ``module_name`` (registered: a dataclass or a pickle in it finds its module)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def output_fields(cfg: Config, name: str) -> tuple[FieldConfig, ...]:
    """The fields transform ``name`` fills, in the config's order."""
    return tuple(f for f in cfg.fields if f.transform == name)


def fingerprint(cfg: Config, t: TransformConfig) -> str:
    """The hex sha256 of everything but the input values that decides ``t``'s outputs (see the module's doc)."""
    where = f"{cfg.file}: [transforms.{t.name}]" if cfg.file else f"[transforms.{t.name}]"
    h = hashlib.sha256()
    described = {
        "version": FINGERPRINT_VERSION,
        "transform": t.content() | {"version": t.version},
        "fields": [_declared(f) for f in output_fields(cfg, t.name)],
    }
    h.update(json.dumps(described, sort_keys=True, default=str).encode())
    for function in (t.function, t.setup):
        if function is None:
            continue
        own = module_file(function.partition(":")[0], t.folder) if isinstance(function, str) else None
        h.update(own.read_bytes() if own is not None else _source(resolve(function, t.folder, where)))
    path = t.option_values.get("path")
    if isinstance(path, str) and Path(path).is_file():
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    return h.hexdigest()


def _declared(f: FieldConfig) -> dict[str, Any]:
    return {
        "name": f.name,
        "dtype": f.dtype,
        "shape": list(f.shape),
        "max_length": f.max_length,
        "truncate": f.truncate,
        "cast": f.cast,
    }


def _source(function: Callable[..., Any]) -> bytes:
    """The bytes of the file defining ``function``; its own source, or its code, where there is no file."""
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if path and Path(path).is_file():  # a script's __main__ too: its helpers count as the function's
        return Path(path).read_bytes()
    try:
        return inspect.getsource(function).encode()
    except (OSError, TypeError):
        code = getattr(function, "__code__", None)
        return repr((callable_name(function), code.co_code if code else b"", code.co_consts if code else ())).encode()
