"""Finding and replacing ``$n`` parameters in user SQL, leaving literals, identifiers and comments alone."""

from __future__ import annotations

import pytest

from pgprefetch.sqltext import find_params, replace_params, strip_statement

# Untagged dollar quotes are not recognised: the optional tag group does not take part in the match, so the
# backreference (?P=tag) fails and "$$ $6 $$" is scanned as plain SQL (see the report; strict, so a fix shows).

# Every kind of span that hides a "$n", around two real parameters ($$..$$ is tested on its own).
EVERYTHING = """\
SELECT '$1' AS a, 'it''s $1' AS b, E'tab\\t $2 ' AS c, "$3" AS d, "x""$3" AS e,
       $tag$ $7 $$ 'x' $tag$ AS g -- $4 in a line comment
FROM t /* $5 in a
          block comment */
WHERE series_id = $1 AND t >= $2 ORDER BY t
"""


def k(n: int) -> str:
    return f"k{n}"


def test_find_params_finds_plain_parameters() -> None:
    assert find_params("SELECT * FROM t WHERE a = $1 AND b = $2") == {1, 2}


def test_find_params_of_sql_without_parameters_is_empty() -> None:
    assert find_params("SELECT 1") == set()


def test_find_params_counts_a_repeated_parameter_once() -> None:
    assert find_params("SELECT $1, $1 + 1") == {1}


def test_find_params_reads_all_digits() -> None:
    assert find_params("SELECT $1 + $12, $3::int8") == {1, 12, 3}


def test_find_params_finds_parameters_without_spaces_around_them() -> None:
    assert find_params("SELECT a FROM t WHERE a=$1AND(b=$2)") == {1, 2}


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT '$1', $2", {2}),
        ("SELECT 'it''s $1', $2", {2}),
        ("SELECT E'a $2 b', $1", {1}),
        ("SELECT e'\\n$2', $1", {1}),
        ('SELECT "$3" FROM t WHERE a = $1', {1}),
        ('SELECT "a""$3" FROM t WHERE a = $1', {1}),
        ("SELECT $1 -- $4\nFROM t WHERE b = $2", {1, 2}),
        ("SELECT /* $5 */ $1", {1}),
        ("SELECT /* $5\n $6 */ $1", {1}),
        pytest.param("SELECT $$ $6 $$, $1", {1}),
        pytest.param("SELECT $$a\n$6$$, $1", {1}),
        ("SELECT $tag$ $7 $tag$, $1", {1}),
        ("SELECT $tag$ $$ $7 $$ $tag$, $1", {1}),
        ("SELECT $_t1$ '$7' $_t1$, $1", {1}),
    ],
    ids=[
        "string",
        "string-with-escaped-quote",
        "escape-string",
        "lowercase-escape-string",
        "quoted-identifier",
        "identifier-with-escaped-quote",
        "line-comment",
        "block-comment",
        "multiline-block-comment",
        "dollar-quote",
        "multiline-dollar-quote",
        "tagged-dollar-quote",
        "tagged-dollar-quote-holding-dollars",
        "tag-with-digits",
    ],
)
def test_find_params_skips_literals_identifiers_and_comments(sql: str, expected: set[int]) -> None:
    assert find_params(sql) == expected


def test_find_params_skips_every_kind_of_span_in_one_query() -> None:
    assert find_params(EVERYTHING) == {1, 2}


def test_replace_params_replaces_each_parameter() -> None:
    assert replace_params("a = $1 AND b = $2 OR c = $1", k) == "a = k1 AND b = k2 OR c = k1"


def test_replace_params_keeps_1_and_12_distinct() -> None:
    assert replace_params("$12 + $1 + $1::int8", k) == "k12 + k1 + k1::int8"


def test_replace_params_leaves_literals_identifiers_and_comments_alone() -> None:
    expected = EVERYTHING.replace("series_id = $1 AND t >= $2", "series_id = k1 AND t >= k2")
    assert replace_params(EVERYTHING, k) == expected


def test_replace_params_leaves_untagged_dollar_quotes_alone() -> None:
    assert replace_params("SELECT $$ $6 $$, $1", k) == "SELECT $$ $6 $$, k1"


def test_find_params_sees_a_parameter_after_a_dollar_quote_holding_a_quote() -> None:
    assert find_params("SELECT $$it's$$, $1, 'x'") == {1}


def test_replace_params_without_parameters_returns_the_text_unchanged() -> None:
    sql = "SELECT 'a', \"b\" -- c\n"
    assert replace_params(sql, k) == sql


def test_replace_params_calls_the_replacement_with_each_number() -> None:
    seen: list[int] = []
    replace_params("SELECT $2, '$3', $1, $2", lambda n: seen.append(n) or "")
    assert seen == [2, 1, 2]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("  SELECT 1\n", "SELECT 1"),
        ("SELECT 1;", "SELECT 1"),
        ("\n\tSELECT 1 ;\n", "SELECT 1"),
        ("SELECT 1;;", "SELECT 1"),
        ("SELECT ';'", "SELECT ';'"),
        ("SELECT 1; SELECT 2;", "SELECT 1; SELECT 2"),
        ("", ""),
        ("  \n", ""),
        (";", ""),
        (" ; ", ""),
    ],
)
def test_strip_statement_trims_whitespace_and_trailing_semicolons(sql: str, expected: str) -> None:
    assert strip_statement(sql) == expected


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT col$1 FROM t WHERE id = $2", {2}),  # $ inside an identifier
        ("SELECT E'it\\'s $3', $1", {1}),  # a backslash escape in an E'' string
        ("SELECT e'a\\\\', $1", {1}),  # an escaped backslash ends the string
        ("SELECT /* a /* nested $3 */ still $4 */ $1", {1}),  # comments nest
        ("SELECT 'it''s $7', $2", {2}),
        ("SELECT $q$ it's $9 $q$, $1", {1}),
    ],
)
def test_the_scanner_follows_postgresql_lexing(sql: str, params: set[int]) -> None:
    assert find_params(sql) == params


def test_an_identifier_with_a_dollar_is_left_alone_by_the_replacement() -> None:
    assert replace_params("SELECT col$1 FROM t WHERE id = $1", lambda n: f"k.k{n}") == (
        "SELECT col$1 FROM t WHERE id = k.k1"
    )
