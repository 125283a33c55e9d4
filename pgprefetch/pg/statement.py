"""The one-round-trip batch statement, and the other SQL pgprefetch writes around the user's queries.

Each batch is one prepared statement: the batch's key columns travel as ``int8[]`` bind parameters,
``unnest(...) WITH ORDINALITY`` turns them back into samples, and the user's per-sample query runs
``LATERAL`` for each. The statement returns one row holding every result column as binary arrays
(``array_send(array_agg(col))`` per sample, concatenated), which :mod:`pgprefetch.decode.collate` views with
numpy; for values of any length, a row per sample of binary values (:func:`row_wise`). Bind parameters
keep the statement text constant (prepared once per connection, no injection).
``COPY ... TO STDOUT`` is what this replaces: COPY cannot take bind parameters, so it would need the keys
pasted into its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.sqltext import quote_ident, replace_params

K = "_pgpf_k"  # aliases unlikely to collide with names in the user's query
Q = "_pgpf_q"
U = "_pgpf_u"
V = "_pgpf_v"
L = "_pgpf_l"
ORD = "_pgpf_ord"

# What the batch statement returned: its one row of blobs, or for a row-wise statement each result column's
# values over the rows (the rows transposed).
Fetched = Sequence[bytes | None] | Sequence[Sequence[object]]


@dataclass(frozen=True)
class BatchStatement:
    """A batch statement as its reader prepares it: the text, its parameters after the keys, its shape.

    What a cluster's part is sent of a source it fetches itself, to open a reader of its own.
    """

    sql: str
    params: tuple[list[str], ...]  # bind parameters after the key arrays: the category lists
    row_wise: bool  # a row per sample (:func:`row_wise`)


def row_wise(columns: Sequence[Column], rows: int, variable_rows: bool) -> bool:
    """Whether the batch statement returns a row per sample (a column of any length, one row per sample).

    Aggregating long values into one value per batch (``string_agg`` of each row's ``array_send`` or bytes)
    cost the server 40% more than sending them row by row (100,000 arrays of 1..512 int4, batches of 256:
    1.87 s against 1.31 s with the client's decoding, one connection), while the client takes a few
    hundred rows a batch at no measurable cost. Rows of scalars stay aggregated: many small values are
    what a row per value would make expensive for the client.
    """
    return rows == 1 and not variable_rows and any(c.ragged or c.is_bytes for c in columns)


def batch_statement(
    query: str,
    keys: KeyColumns,
    columns: Sequence[Column],
    rows: int,
    *,
    variable_rows: bool = False,
    row_truncate: str = "error",
) -> str:
    """The one-round-trip statement that runs the per-sample ``query`` for every key of a batch.

    With ``rows > 1`` each sample's rows are aggregated where they are produced (one array per column, and
    the row count), then the samples' arrays are concatenated in key order: about 30% less server work
    than aggregating the batch row by row (measured on the demo windows). With ``rows = 1`` there is
    nothing to group, and one array per column over the whole batch, with each row's key ordinal, is
    cheaper still (about 25%, measured on the demo rows). Samples of ``variable_rows`` (``max_rows``) are
    grouped whatever the count, for the row counts. A column of any length with ``rows = 1`` makes the
    statement :func:`row_wise`: a row per sample, its key ordinal first.

    No sample sends more rows than tell that it has too many: with ``rows = 1`` the batch stops at one row
    more than it has samples (a LIMIT on the join, which a sample of 20 million rows would otherwise fill
    the client's memory with before the count is checked), otherwise each sample at ``rows + 1``; except
    under ``max_rows`` with ``row_truncate = "left"``, which keeps a sample's last rows.
    """
    values = keys.value_sql([f"{K}.k{i}" for i in range(1, keys.width + 1)])  # a uuid from its two slots
    inner_query = replace_params(query, lambda n: values[n - 1])
    arrays = ", ".join(f"${i}::int8[]" for i in range(1, keys.width + 1))
    names = ", ".join(f"k{i}" for i in range(1, keys.width + 1))
    source = f"FROM unnest({arrays}) WITH ORDINALITY AS {K}({names}, ord)\nCROSS JOIN LATERAL (\n"
    one_more = "LIMIT cardinality($1::int8[]) + 1"  # every key slot's array has the batch's length
    if row_wise(columns, rows, variable_rows):  # each row: its key ordinal, then each column's bytes
        selects = [f"{K}.ord::int4"]
        for c in columns:
            ref = f"{Q}.{quote_ident(c.name)}"
            selects += [c.send_sql(ref), *([f"{ref} IS NULL"] if c.nullable else [])]
        return f"SELECT {', '.join(selects)}\n{source}{inner_query}\n) AS {Q}\n{one_more}"
    if rows == 1 and not variable_rows:
        quoted = [quote_ident(name) for name in dict.fromkeys(c.name for c in columns)]
        joined = ", ".join([f"{K}.ord::int4 AS {ORD}", *(f"{Q}.{name}" for name in quoted)])
        selects = [f"array_send(array_agg({L}.{ORD}))"]
        for c in columns:
            selects += _aggregates(c, f"{L}.{quote_ident(c.name)}")
        limited = f"SELECT {joined}\n{source}{inner_query}\n) AS {Q}\n{one_more}"
        return f"SELECT {', '.join(selects)}\nFROM (\n{limited}\n) AS {L}"
    if not (variable_rows and row_truncate == "left"):
        inner_query = f"SELECT * FROM (\n{inner_query}\n) AS {L} LIMIT {rows + 1}"
    inner = ["count(*)::int4 AS n"]
    outer = [f"array_send(array_agg({Q}.n ORDER BY {K}.ord))"]
    for i, c in enumerate(columns):
        for j, aggregate in enumerate(_aggregates(c, f"{U}.{quote_ident(c.name)}")):
            inner.append(f"{aggregate} AS c{i}_{j}")
            outer.append(f"string_agg({Q}.c{i}_{j}, ''::bytea ORDER BY {K}.ord)")
    grouped = f"SELECT {', '.join(inner)}\nFROM (\n{inner_query}\n) AS {U}"
    return f"SELECT {', '.join(outer)}\n{source}{grouped}\n) AS {Q}"


def _aggregates(c: Column, ref: str) -> list[str]:
    """The binary aggregates that carry column ``c``: its values, then array lengths or the NULL mask."""
    if c.is_array and c.ragged:
        # Not cardinality(): it would decompress a TOASTed array a second time (+60% of the server's work on
        # arrays of 1..512 int4). The lengths are in the array_send headers; IS NULL reads no value.
        return [f"string_agg(array_send({c.value_sql(ref)}), ''::bytea)", f"array_send(array_agg({ref} IS NULL))"]
    if c.is_array:
        return [f"string_agg(array_send({c.value_sql(ref)}), ''::bytea)", f"array_send(array_agg(cardinality({ref})))"]
    if c.is_bytes:  # the bytes back to back, and each value's length (NULL for a NULL, which string_agg skips)
        value = c.value_sql(ref)
        return [f"string_agg({value}, ''::bytea)", f"array_send(array_agg(octet_length({value})))"]
    out = [f"array_send(array_agg({c.value_sql(ref)}))"]
    if c.nullable:
        out.append(f"array_send(array_agg({ref} IS NULL))")
    return out


VOCABULARY_SETTING = "pgprefetch.vocabulary_{}"  # a worker's category list i, set by BatchReader.open


def vocabulary_sql(i: int) -> str:
    """The category list ``i`` as a ``text[]`` a COPY can use: read from the worker's session, never pasted.

    A COPY takes no bind parameters, so the list is bound where it can be (``set_config``, as
    :meth:`~pgprefetch.pg.session.BatchReader.open` does on each worker) and read back here; a scalar
    subquery is an InitPlan, so the text is parsed into an array once per COPY, not once a row.
    """
    return f"(SELECT current_setting('{VOCABULARY_SETTING.format(int(i))}')::text[])"


def distinct_values_statement(source: str, refs: Sequence[str], cut: int) -> str:
    """The distinct values of every column ``refs`` of ``source`` as text, in one read: ``(i, value, rows)``.

    One statement for all of a config's ``categories = "auto"`` columns, so the relation is read once for
    them all, not once a column; ``i`` is the column's place in ``refs``, ``value`` NULL for the NULLs and cut
    to ``cut`` characters (a value past the limit is refused by the caller without its whole bytes sent),
    ``rows`` how many rows hold it (their sum for one ``i`` is the rows read).
    """
    pairs = ", ".join(f"({i}, {ref}::text)" for i, ref in enumerate(refs))
    return (
        f"SELECT {V}.i, left({V}.v, {int(cut)}), count(*)::int8 FROM {source}\n"
        f"CROSS JOIN LATERAL (VALUES {pairs}) AS {V}(i, v) GROUP BY {V}.i, {V}.v"
    )


def query_column(column: str) -> str:
    """A column of the per-sample query in :func:`samples_rows`."""
    return f"{Q}.{quote_ident(column)}"


def samples_rows(keys: str, query: str, n_params: int) -> str:
    """The rows of every sample of query mode: the keys query, then the per-sample query for each key."""
    names = ", ".join(f"k{i}" for i in range(1, n_params + 1))
    # On lines of their own: the keys query may end in a -- comment.
    source = f"(\n{keys}\n) AS {K}({names})" if n_params else f"(\n{keys}\n) AS {K}"
    inner = replace_params(query, lambda i: f"{K}.k{i}")
    return f"{source}\nCROSS JOIN LATERAL (\n{inner}\n) AS {Q}"


def sample_text_statement(query: str, column: str) -> str:
    """``column::text`` of one sample's rows (the per-sample query with its own parameters)."""
    return f"SELECT {Q}.{quote_ident(column)}::text FROM ({query}) AS {Q}"


WANT = "_pgpf_want"  # the inputs statement's flag per key: 1 sends the input values, 0 only their digests


def inputs_statement(
    keys: KeyColumns, digests: Sequence[Sequence[str]], inputs: Sequence[str], *, query: str | None, relation: str = ""
) -> str:
    """The transforms' statement: per key, its ordinal, each digest's SHA-256 and (when wanted) the inputs.

    The keys travel as the batch statement's do, with one more ``int8[]`` after them: 1 where the client
    wants the sample's input values, 0 where their digests do (a cached output is looked up by them, so a
    cached epoch sends 32 bytes a sample, not its text). A digest is ``sha256(record_send(ROW(...)))`` of
    a transform's inputs: PostgreSQL's own binary form of the values, the same in both modes.
    ``query``: query mode's per-sample query, run LATERAL; else scan mode's ``relation`` joined on its key
    columns (integers: a slot is the value).
    """
    width = keys.width
    names = [f"k{i}" for i in range(1, width + 1)]
    arrays = ", ".join(f"${i}::int8[]" for i in range(1, width + 2))
    source = f"FROM unnest({arrays}) WITH ORDINALITY AS {K}({', '.join(names)}, {WANT}, ord)\n"
    if query is not None:
        values = keys.value_sql([f"{K}.{n}" for n in names])
        source += f"CROSS JOIN LATERAL (\n{replace_params(query, lambda n: values[n - 1])}\n) AS {Q}"
    else:
        on = " AND ".join(f"{Q}.{quote_ident(c)} = {K}.{n}" for c, n in zip(keys.names, names, strict=True))
        source += f"JOIN (SELECT * FROM {relation}) AS {Q} ON {on}"  # (a SELECT as [samples] table: its own alias)
    selects = [f"{K}.ord::int4"]
    selects += [f"sha256(record_send(ROW({', '.join(f'{Q}.{quote_ident(c)}' for c in d)})))" for d in digests]
    selects += [f"CASE WHEN {K}.{WANT} = 1 THEN {Q}.{quote_ident(c)} END" for c in inputs]
    return f"SELECT {', '.join(selects)}\n{source}\nLIMIT cardinality($1::int8[]) + 1"


def lengths_statement(keys: KeyColumns, query: str, column: str, *, as_bytes: bool) -> str:
    """Per key, its ordinal and the length of the query's ``column``: an array's elements, or text's or bytea's bytes.

    A packed epoch is planned from its documents' lengths (:mod:`pgprefetch.write.pack`): the server reads
    each document and sends 12 bytes of it, not its tokens. The keys travel as the batch statement's do.
    """
    width = keys.width
    names = [f"k{i}" for i in range(1, width + 1)]
    arrays = ", ".join(f"${i}::int8[]" for i in range(1, width + 1))
    values = keys.value_sql([f"{K}.{n}" for n in names])
    length = f"{'octet_length' if as_bytes else 'cardinality'}({Q}.{quote_ident(column)})::int8"
    return (
        f"SELECT {K}.ord::int4, {length}\n"
        f"FROM unnest({arrays}) WITH ORDINALITY AS {K}({', '.join(names)}, ord)\n"
        f"CROSS JOIN LATERAL (\n{replace_params(query, lambda n: values[n - 1])}\n) AS {Q}\n"
        "LIMIT cardinality($1::int8[]) + 1"
    )


def pieces_statement(keys: KeyColumns, query: str, column: str, *, kind: str, width: int = 0) -> str:
    """Per (key, first, count): its ordinal and tokens ``first ... first + count - 1`` of the query's ``column``.

    A packed unit asks for the pieces of documents its sequences hold: the server sends those tokens only, so a
    document cut into many sequences is read whole by the server but sent a piece at a time, each once.
    ``kind``: ``"array"`` (elements counted from the array's lower bound, sent with ``array_send``), ``"bytea"``
    (tokens of ``width`` bytes each) or ``"text"`` (its UTF-8 bytes). The keys, the firsts and the counts
    travel as ``int8[]`` bind parameters, the keys' as the batch statement's do.
    """
    width_keys = keys.width
    names = [f"k{i}" for i in range(1, width_keys + 1)]
    arrays = ", ".join(f"${i}::int8[]" for i in range(1, width_keys + 3))
    values = keys.value_sql([f"{K}.{n}" for n in names])
    col = f"{Q}.{quote_ident(column)}"
    first, count = f"{K}.{ORD}_first::int4", f"{K}.{ORD}_count::int4"  # (subscripts and substring take int4)
    if kind == "array":
        lo = f"coalesce(array_lower({col}, 1), 1)"
        sent = f"array_send(({col})[{lo} + {first}:{lo} + {first} + {count} - 1])"
    elif kind == "bytea":
        sent = f"substring({col} from {first} * {width} + 1 for {count} * {width})"
    else:
        sent = f"substring(convert_to({col}, 'UTF8') from {first} + 1 for {count})"
    return (
        f"SELECT {K}.ord::int4, {sent}\n"
        f"FROM unnest({arrays}) WITH ORDINALITY AS {K}({', '.join(names)}, {ORD}_first, {ORD}_count, ord)\n"
        f"CROSS JOIN LATERAL (\n{replace_params(query, lambda n: values[n - 1])}\n) AS {Q}\n"
        "LIMIT cardinality($1::int8[]) + 1"
    )
