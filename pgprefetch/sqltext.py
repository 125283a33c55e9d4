"""Finding and replacing ``$n`` parameters in user SQL, outside literals, identifiers and comments.

The per-sample query is written as in the blog post, with ``$1..$k`` standing for the key columns. To fetch
a whole batch in one statement pgprefetch turns those into column references of a ``LATERAL`` join, so it
must find the real parameters and leave ``'$1'``, ``"$1"``, ``-- $1`` and ``$tag$ $1 $tag$`` alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# One alternation, tried left to right at each position: the skippable spans first, then a parameter.
_TOKENS = re.compile(
    r"""
      (?P<string>[EeXxBbUu]?'(?:[^']|'')*')          # 'text', E'..', with '' escapes
    | (?P<ident>"(?:[^"]|"")*")                      # "quoted identifier"
    | (?P<line_comment>--[^\n]*)
    | (?P<block_comment>/\*.*?\*/)
    | (?P<dollar>\$(?P<tag>(?:[A-Za-z_][A-Za-z_0-9]*)?)\$.*?\$(?P=tag)\$)   # $$..$$ and $tag$..$tag$
    | (?P<param>\$(?P<number>[0-9]+))
    """,
    re.VERBOSE | re.DOTALL,
)


def find_params(sql: str) -> set[int]:
    """Return the numbers of the ``$n`` parameters that ``sql`` uses."""
    return {int(m["number"]) for m in _TOKENS.finditer(sql) if m["param"]}


def replace_params(sql: str, replacement: Callable[[int], str]) -> str:
    """Return ``sql`` with each ``$n`` parameter replaced by ``replacement(n)``."""

    def substitute(m: re.Match[str]) -> str:
        return replacement(int(m["number"])) if m["param"] else m[0]

    return _TOKENS.sub(substitute, sql)


def strip_statement(sql: str) -> str:
    """Trim whitespace and trailing semicolons, so the query can be nested in another statement."""
    while (stripped := sql.strip().rstrip(";")) != sql:
        sql = stripped
    return sql
