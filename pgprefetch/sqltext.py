"""Finding and replacing ``$n`` parameters in user SQL, outside literals, identifiers and comments.

The per-sample query is written as in the blog post, with ``$1..$k`` standing for the key columns. To fetch
a whole batch in one statement pgprefetch turns those into column references of a ``LATERAL`` join, so it
must find the real parameters and leave ``'$1'``, ``"$1"``, ``-- $1`` and ``$tag$ $1 $tag$`` alone.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Identifier start and rest, ``$n``, a dollar-quote tag: compiled on first use, not at import.

    Their non-ASCII ranges cost 20-40 ms to compile, paid by every command at start-up
    (``pgprefetch --version`` included) when they were module constants; only a query-mode config needs them.
    """
    return (
        re.compile(r"[A-Za-z_\u0080-\uffff]"),
        re.compile(r"[A-Za-z0-9_$\u0080-\uffff]*"),
        re.compile(r"\$([0-9]+)"),
        re.compile(r"\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$"),
    )


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted so that any column name is taken literally."""
    return '"' + name.replace('"', '""') + '"'


def _params(sql: str) -> list[tuple[int, int, int]]:
    """``(start, end, n)`` of each ``$n`` parameter, found by a scan that follows PostgreSQL's lexer.

    Skipped: string literals (``'..'`` with ``''``; ``E'..'`` also with backslash escapes), quoted
    identifiers, ``--`` comments, nested ``/* /* */ */`` comments, dollar quotes (``$$..$$``,
    ``$tag$..$tag$``), and identifiers, which may contain ``$`` (``col$1`` is a column, not ``col`` and ``$1``).
    """
    found: list[tuple[int, int, int]] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            i = _string_end(sql, i, escapes=False)
        elif c == '"':
            i = _quoted_end(sql, i)
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
        elif sql.startswith("/*", i):
            i = _comment_end(sql, i)
        elif c == "$":
            i = _dollar(sql, i, found)
        else:
            i = _word_end(sql, i)
    return found


def _quoted_end(sql: str, start: int) -> int:
    """The index just past the quoted identifier opening at ``start`` (``""`` doubles)."""
    end = sql.find('"', start + 1)
    while end != -1 and sql.startswith('""', end):
        end = sql.find('"', end + 2)
    return len(sql) if end == -1 else end + 1


def _comment_end(sql: str, start: int) -> int:
    """The index just past the block comment opening at ``start`` (they nest, as PostgreSQL's do)."""
    depth, i, n = 1, start + 2, len(sql)
    while i < n and depth:
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _dollar(sql: str, start: int, found: list[tuple[int, int, int]]) -> int:
    """Past the ``$`` at ``start``: a parameter (added to ``found``), a dollar-quoted string, or a lone ``$``."""
    _, _, param, dollar_tag = _patterns()
    if m := param.match(sql, start):
        found.append((start, m.end(), int(m[1])))
        return m.end()
    if m := dollar_tag.match(sql, start):
        end = sql.find(m[0], m.end())
        return len(sql) if end == -1 else end + len(m[0])
    return start + 1


def _word_end(sql: str, start: int) -> int:
    """Past the identifier at ``start`` (which may hold ``$``, or open an ``E'..'`` string), or past one character."""
    ident_start, ident_rest, _, _ = _patterns()
    if not ident_start.match(sql[start]):
        return start + 1
    end = m.end() if (m := ident_rest.match(sql, start + 1)) else start + 1  # (it always matches: ``*``)
    escaped = sql[start:end] in ("E", "e") and sql.startswith("'", end)  # E'...': backslash escapes
    return _string_end(sql, end, escapes=True) if escaped else end


def _string_end(sql: str, start: int, *, escapes: bool) -> int:
    """The index just past the string literal opening at ``start`` (``''`` doubles; backslashes escape in E'')."""
    i, n = start + 1, len(sql)
    while i < n:
        c = sql[i]
        if escapes and c == "\\":
            i += 2
        elif c == "'":
            if sql.startswith("''", i):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n


def find_params(sql: str) -> set[int]:
    """Return the numbers of the ``$n`` parameters that ``sql`` uses."""
    return {number for _, _, number in _params(sql)}


def replace_params(sql: str, replacement: Callable[[int], str]) -> str:
    """Return ``sql`` with each ``$n`` parameter replaced by ``replacement(n)``."""
    out, last = [], 0
    for start, end, number in _params(sql):
        out += [sql[last:start], replacement(number)]
        last = end
    return "".join([*out, sql[last:]])


def strip_statement(sql: str) -> str:
    """Trim whitespace and trailing semicolons, so the query can be nested in another statement."""
    while (stripped := sql.strip().rstrip(";")) != sql:
        sql = stripped
    return sql
