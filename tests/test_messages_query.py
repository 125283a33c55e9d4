"""What a user reads for mistakes of the keys, windows and order columns (#37.6, #37.8, #37.9, #37.18).

Each test makes the mistake against the real server through the CLI and reads the one line it prints.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from pgprefetch.cli import cli

from .harness.configs import toml_value, v_config
from .harness.db import execute


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def dump_cli(cfg: Path, dsn: str) -> tuple[int, str]:
    return run_cli("dump", "--config", str(cfg), "--epoch", "0", "--dsn", dsn)


def test_a_key_column_the_query_does_not_use_is_named_with_the_fix(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE obs (fdate date, id int, v real)",
        "INSERT INTO obs SELECT date '2024-01-01' + g % 3, g, g FROM generate_series(1, 64) g",
    )
    cfg = v_config(tmp_path, "obs", keys="SELECT fdate, id FROM obs", query="SELECT v FROM obs WHERE id = $2")
    for command in ("dump", "check"):
        argv = [command, "--config", str(cfg), "--dsn", db, *(["--epoch", "0"] if command == "dump" else [])]
        code, out = run_cli(*argv)
        assert code == 2, out
        assert "the query does not use $1 (key column fdate)" in out, out
        assert "drop fdate from [samples] keys" in out
        assert "could not determine data type" not in out
        assert len(out.strip().splitlines()) == 1, out


def scan_config(folder: Path, **samples: object) -> Path:
    lines = ["[source]", "connections = 2", "[samples]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in samples.items()]
    lines += ["[batches]", "size = 4", "drop_last = false", "[store]", 'path = "store.zarr"']
    lines += ["[fields.x]", 'columns = ["v"]', 'dtype = "float32"']
    path = folder / "scan.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_window_longer_than_every_series_names_the_window_and_the_longest(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE series (sid int, t int, v real)",
        "INSERT INTO series SELECT s, t, t FROM generate_series(1, 5) s, generate_series(1, 10 + s) t",
    )
    cfg = scan_config(tmp_path, table="series", key="sid", order="t", window=64)
    code, out = dump_cli(cfg, db)
    assert code != 0
    assert "keys query" not in out, out
    assert "[samples] window = 64 is longer than every series (the longest has 15 rows)" in out, out
    assert "set window to at most 15" in out
    assert [line for line in out.splitlines() if "Error" in line or "Traceback" in line] == [out.splitlines()[-1]]


def test_a_repeated_timestamp_order_value_is_shown_as_a_timestamp(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE hours (origin int, time_hour timestamp, v real)",
        "INSERT INTO hours SELECT 1, timestamp '2013-01-01 00:00' + g * interval '1 hour', g"
        " FROM generate_series(0, 9) g",
        "INSERT INTO hours VALUES (1, timestamp '2013-01-01 05:00', 99)",
    )
    cfg = scan_config(tmp_path, table="hours", key="origin", order="time_hour", window=4)
    code, out = dump_cli(cfg, db)
    assert code != 0
    assert "has two rows with time_hour = 2013-01-01 05:00:00:" in out, out
    assert "1356" not in out  # not microseconds


def warnings_of(cfg: Path, dsn: str) -> list[str]:
    code, out = run_cli("check", "--config", str(cfg), "--dsn", dsn)
    assert code == 0, out
    return [line for line in out.splitlines() if line.startswith("warning: ")]


def test_a_small_indexed_table_the_planner_scans_whole_gets_no_index_advice(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE raybad (id int PRIMARY KEY, v real)",
        "INSERT INTO raybad SELECT g, g FROM generate_series(1, 20000) g",
        "ANALYZE raybad",
    )
    cfg = v_config(tmp_path, "raybad", size=100)
    assert warnings_of(cfg, db) == []


def test_an_index_the_planner_does_not_use_is_named_with_analyze_not_advised_again(db: str, tmp_path: Path) -> None:
    # One key holds nearly every row: from the statistics a key's rows are many, and the planner reads the
    # table whole once a batch rather than through the index. Advising CREATE INDEX would be wrong.
    execute(
        db,
        "CREATE TABLE skew (id int, v real)",
        "INSERT INTO skew SELECT g, g FROM generate_series(1, 64) g",
        "INSERT INTO skew SELECT 7, g FROM generate_series(1, 1000000) g",
        "CREATE INDEX skew_id ON skew (id)",
        "ANALYZE skew",
    )
    cfg = v_config(tmp_path, "skew", keys="SELECT id FROM skew WHERE id <> 7 GROUP BY id")
    warnings = warnings_of(cfg, db)
    assert len(warnings) == 1, warnings
    assert "CREATE INDEX" not in warnings[0]
    assert warnings[0].endswith(
        "although index skew_id serves its WHERE: the planner's statistics may be out of date; run ANALYZE skew"
    )
