"""Reading the server's plan of the batch statement for the one mistake that costs the most: a missing index.

The query mode runs the user's per-sample query once per sample, ``LATERAL`` to the batch's keys. With an
index on the columns its ``WHERE`` compares with the key (and its ``ORDER BY``), each run reads a few
pages; without one, each run reads the whole table: on a 200k-row table, 1,000 windows took 4.0 s instead
of 0.45 s, and the cost grows with the table. ``EXPLAIN`` (no ``ANALYZE``: nothing runs) shows it as a
sequential scan, or a sort, on the inner side of the nested loop over the keys. :func:`index_advice`
finds those and names the index that would serve them, from the plan's own filter and sort key.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgprefetch.pg.statement import K
from pgprefetch.sqltext import quote_ident

# A column compared with one of the batch's keys, as EXPLAIN prints a condition, either way round:
# "(t >= _pgpf_k.k2)", "((_pgpf_k.k1)::integer = tnx.s)".
_NAME = r'("(?:[^"]|"")+"|\w+)'
_KEY = r'\(*"?' + K + r'"?\.k\d+\)*(?:::[\w ]+)?'
_COLUMN = r'\(*(?:"?\w+"?\.)?' + _NAME + r"\)*(?:::[\w ]+)?"
_OPS = r"\s*(=|>=|<=|>|<)\s*"
_COLUMN_KEY = re.compile(_COLUMN + _OPS + _KEY)
_KEY_COLUMN = re.compile(_KEY + _OPS + _COLUMN)
_JOIN_CONDITIONS = ("Hash Cond", "Merge Cond", "Join Filter", "Filter")
PER_BATCH_FACTOR = 10  # a scan reading this many rows per key of the batch reads the table, not the samples
# A key's lookup through an index, as the planner costs it: the index's pages down to the leaf and the heap
# page, about two random page reads (random_page_cost 4). A scan of the whole table once per batch is worth
# an index only when it costs more than the batch's lookups would, twice over: a 20,000-row table read
# whole for 100 keys costs about what 100 lookups do, and the planner is right to prefer it.
LOOKUP_COST = 8.0
PER_SAMPLE_COST = 100.0  # a scan per sample the planner costs this much (about 100 pages) is worth an index


@dataclass(frozen=True)
class IndexAdvice:
    """A table the per-sample query reads whole for each sample (or batch), and the index that would serve it."""

    relation: str  # as EXPLAIN names it (schema-qualified outside public)
    columns: tuple[str, ...]  # equality columns, then range columns, then the sort's
    sorts: bool  # the query also sorts its rows for each sample
    per: str = "sample"  # "sample": a nested loop scans it for each key; "batch": a join reads it whole
    rows: int = 0  # the rows the planner expects the scan to read
    regclass: str = ""  # the relation as SQL names it, quoted (where its indexes are looked up)
    index: str = ""  # an existing index that leads with the first of ``columns``: the planner does not use it

    def line(self) -> str:
        """The one-line warning ``check`` prints and ``dump`` logs."""
        what = "scans and sorts" if self.sorts else "scans"
        size = f" (about {self.rows:,} rows)" if self.rows else ""
        if self.index:  # never advise an index that exists: the planner's figures are what is off
            return (
                f"the per-sample query {what} all of {self.relation}{size} for each {self.per} although index "
                f"{self.index} serves its WHERE: the planner's statistics may be out of date; run "
                f"ANALYZE {self.relation}"
            )
        fix = f"CREATE INDEX ON {self.relation} ({', '.join(self.columns)})" if self.columns else "an index"
        return (
            f"the per-sample query {what} all of {self.relation}{size} for each {self.per} (no index serves "
            f"its WHERE): {fix} would make each sample a few page reads"
        )


_Node = dict[str, Any]  # a node of EXPLAIN's JSON plan


def index_advice(plan: list[dict[str, Any]] | dict[str, Any]) -> list[IndexAdvice]:
    """The tables an ``EXPLAIN (FORMAT JSON)`` of the batch statement reads whole, per sample or per batch."""
    root = plan[0]["Plan"] if isinstance(plan, list) else plan["Plan"]
    keys = max((n.get("Plan Rows", 1) for n in _walk(root) if n.get("Alias") == K), default=1)
    out: dict[str, IndexAdvice] = {}
    for scan, path in _scans(root, []):
        per_sample = _inner_of_keys_loop(path)
        if not _costly(scan, path, per_sample, keys):
            continue
        advice = _advice(scan, path, per_sample)
        out.setdefault(advice.relation, advice)
    return list(out.values())


def _costly(scan: _Node, path: list[_Node], per_sample: list[_Node] | None, keys: int) -> bool:
    """Whether reading ``scan``'s table whole costs more than an index would (per sample, or per batch)."""
    if per_sample:
        return bool(scan.get("Total Cost", PER_SAMPLE_COST) >= PER_SAMPLE_COST)  # a small table: about a lookup
    if scan.get("Plan Rows", 0) < PER_BATCH_FACTOR * keys or scan.get("Total Cost", 0) < 2 * keys * LOOKUP_COST:
        return False  # read whole once a batch, it costs about what the batch's index lookups would
    return any(_holds_keys(n) for n in path)  # else not joined with the keys (a lookup table, a constant subquery)


def _advice(scan: _Node, path: list[_Node], per_sample: list[_Node] | None) -> IndexAdvice:
    """The index that would serve ``scan``: the columns compared with the keys (equalities first), then sorted by."""
    conditions = " AND ".join(n.get(c, "") for n in [*path, scan] for c in _JOIN_CONDITIONS)
    compared = [(c, op) for c, op in _COLUMN_KEY.findall(conditions)]
    compared += [(c, op) for op, c in _KEY_COLUMN.findall(conditions)]
    sort_keys = [_column(k) for n in (per_sample or []) for k in n.get("Sort Key", [])]
    columns = [c for c, op in compared if op == "="] + [c for c, op in compared if op != "="]
    columns += [c for c in sort_keys if c]
    name = scan.get("Relation Name", "?")
    relation, regclass = name, quote_ident(name)
    if scan.get("Schema") not in (None, "public"):
        relation = regclass = f"{quote_ident(scan['Schema'])}.{quote_ident(name)}"
    rows = int(scan.get("Plan Rows", 0)) if not per_sample else 0
    per = "sample" if per_sample else "batch"
    return IndexAdvice(relation, tuple(dict.fromkeys(columns)), bool(sort_keys), per, rows, regclass)


def _scans(node: dict[str, Any], path: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each sequential scan of a table, with the nodes above it (outermost first)."""
    if node.get("Node Type") == "Seq Scan" and node.get("Relation Name"):
        yield node, path
    for child in node.get("Plans", []):
        yield from _scans(child, [*path, node])


def _inner_of_keys_loop(path: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The nodes run once per key above a scan (its per-sample subtree), or None when it is not in one.

    A nested loop runs its inner side once per row of its outer side; when that outer side reads the
    batch's keys, everything on the inner side runs once per sample.
    """
    for depth, node in enumerate(path[:-1]):
        child = path[depth + 1]
        if node.get("Node Type") != "Nested Loop" or child.get("Parent Relationship") != "Inner":
            continue
        outer = [c for c in node.get("Plans", []) if c.get("Parent Relationship") == "Outer"]
        if any(n.get("Alias") == K for o in outer for n in _walk(o)):
            return path[depth + 1 :]
    return None


def _holds_keys(node: dict[str, Any]) -> bool:
    """Whether a join node joins something with the batch's keys."""
    return "Join" in node.get("Node Type", "") and any(n.get("Alias") == K for n in _walk(node))


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _column(sort_key: str) -> str:
    """``ticks.t`` or ``t DESC`` as the column it sorts by (an expression gives nothing)."""
    name = sort_key.split()[0].rsplit(".", 1)[-1]
    return name if re.fullmatch(r'\w+|"(?:[^"]|"")+"', name) else ""
