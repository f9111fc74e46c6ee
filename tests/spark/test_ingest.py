"""`ivm load` and `ivm log append`: what is accepted in each format, and that every bad input is
refused with a one-line message naming table, row and problem, storing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from ivm.changes.ingest import has_update_images, read_log
from ivm.errors import ChangeDataError, ConfigError, IvmError, NotFoundError

TABLES = {
    "res": {"columns": {"res_id": "int", "psgr_id": "int", "seat": "string"}, "key": ["res_id"]},
    "tag": {"columns": {"item": "string", "tags": "array<struct<k: string, n: int>>"}},
}


def lines(path: Path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def csv(path: Path, text: str) -> str:
    path.write_text(text.strip() + "\n")
    return str(path)


def log_rows(project, table: str) -> list[tuple]:
    cfg = project.config.tables[table]
    segments = project.catalog.segments(table, 0, 10**18)
    df = read_log(project.spark, cfg, segments, 0, 10**18)
    return sorted(tuple(r) for r in df.drop("_seq").collect())


def stored(project) -> tuple:
    """Everything an append or load could have touched: segments, log files, relation states."""
    files = sorted(str(p) for p in Path(project.warehouse.uri, "log").rglob("*"))
    return (project.catalog.all_segments(), files, [project.catalog.state(t) for t in TABLES])


@pytest.fixture
def project(make_project):
    return make_project(TABLES)


def test_native_formats(project, tmp_path):
    a = project.append("res", csv(tmp_path / "a.csv", """
res_id,psgr_id,seat,_change_type
1,7,1A,insert
2,,1B,insert"""))
    assert (a.segment.min_commit_version, a.rows) == (1, 2)
    b = project.append("res", lines(tmp_path / "b.jsonl",
                                    {"res_id": 1, "psgr_id": 7, "seat": "1A", "_change_type": "update_preimage",
                                     "_commit_version": 5},
                                    {"res_id": 1, "psgr_id": 7, "seat": "2C", "_change_type": "update_postimage",
                                     "_commit_version": 5},
                                    "",
                                    {"res_id": 2, "psgr_id": None, "seat": "1B", "_change_type": "DELETE",
                                     "_commit_version": 6}))
    assert (b.segment.min_commit_version, b.segment.max_commit_version) == (5, 6)
    pq = tmp_path / "c.parquet"
    pd.DataFrame({"res_id": [3], "psgr_id": [9], "seat": ["3F"], "_change_type": ["insert"]}).to_parquet(pq)
    c = project.append("res", str(pq))
    assert c.segment.min_commit_version == 7
    assert log_rows(project, "res") == [
        (1, 7, "1A", "insert", 1), (1, 7, "1A", "update_preimage", 5), (1, 7, "2C", "update_postimage", 5),
        (2, None, "1B", "delete", 6), (2, None, "1B", "insert", 1), (3, 9, "3F", "insert", 7)]


def test_nested_columns_from_json_lines(project, tmp_path):
    project.append("tag", lines(tmp_path / "t.jsonl",
                                {"item": "a", "tags": [{"k": "x", "n": 1}, {"k": "y", "n": None}],
                                 "_change_type": "insert"},
                                {"item": "b", "tags": None, "_change_type": "insert"}))
    rows = log_rows(project, "tag")
    assert rows[0][0] == "a" and [tuple(t) for t in rows[0][1]] == [("x", 1), ("y", None)]
    assert rows[1][:2] == ("b", None)


def test_debezium_envelopes(project, tmp_path):
    path = lines(tmp_path / "dbz.jsonl",
                 {"payload": {"before": None, "after": {"res_id": 1, "psgr_id": 7, "seat": "1A"}, "op": "r",
                              "ts_ms": 10, "source": {"lsn": 100}}},
                 {"before": None, "after": {"res_id": 2, "psgr_id": 8, "seat": "1B"}, "op": "c",
                  "source": {"lsn": 101}},
                 "null",
                 {"payload": {"before": {"res_id": 1, "psgr_id": 7, "seat": "1A"},
                              "after": {"res_id": 10, "psgr_id": 7, "seat": "1A"}, "op": "u", "ts_ms": 11,
                              "source": {"lsn": 102}}},
                 {"payload": {"before": {"res_id": 2, "psgr_id": 8, "seat": "1B"}, "after": None, "op": "d",
                              "ts_ms": 12, "source": {}}},
                 {"schema": {}, "payload": None})
    result = project.append("res", path, "debezium")
    assert (result.rows, result.segment.min_commit_version, result.segment.max_commit_version) == (5, 12, 102)
    assert log_rows(project, "res") == [
        (1, 7, "1A", "insert", 100), (1, 7, "1A", "update_preimage", 102), (2, 8, "1B", "delete", 12),
        (2, 8, "1B", "insert", 101), (10, 7, "1A", "update_postimage", 102)]


BAD_APPENDS = [
    ("unknown.csv", "res_id,psgr_id,seat,cabin,_change_type\n1,2,3,x,insert\n", "cdf",
     "table res: {path} has unknown column 'cabin' (columns are res_id, psgr_id, seat)"),
    ("missing.csv", "res_id,seat,_change_type\n1,3,insert\n", "cdf", "table res: {path} lacks column 'psgr_id'"),
    ("nochange.csv", "res_id,psgr_id,seat\n1,2,3\n", "cdf", "table res: {path} lacks column '_change_type'"),
    ("cast.csv", "res_id,psgr_id,seat,_change_type\n1,2,1A,insert\n2,two,1B,insert\n", "cdf",
     'row {{"res_id":"2","psgr_id":"two","seat":"1B","_change_type":"insert"}}: '
     "column psgr_id: value does not cast to INT"),
    ("type.jsonl", '{"res_id": 1, "psgr_id": 2, "seat": "1A", "_change_type": "upsert"}\n', "cdf",
     "_change_type must be one of insert, delete, update_preimage, update_postimage"),
    ("nullkey.jsonl", '{"res_id": null, "psgr_id": 2, "seat": "1A", "_change_type": "insert"}\n', "cdf",
     "key column res_id is NULL"),
    ("jsoncast.jsonl", '{"res_id": "x1", "psgr_id": 2, "seat": "1A", "_change_type": "insert"}\n', "cdf",
     "column res_id: value does not cast to INT"),
    ("notjson.jsonl", '{"res_id": 1, "psgr_id": 2,\n', "cdf", "not a JSON object"),
    ("version.jsonl", '{"res_id": 1, "psgr_id": 2, "seat": "1A", "_change_type": "insert", "_commit_version": 1}\n'
                      '{"res_id": 2, "psgr_id": 2, "seat": "1B", "_change_type": "insert"}\n', "cdf",
     "has no _commit_version while other rows do"),
    ("badversion.jsonl", '{"res_id": 1, "psgr_id": 2, "seat": "1A", "_change_type": "insert", '
                         '"_commit_version": "v1"}\n', "cdf", "_commit_version is not a whole number"),
    ("changes.txt", "x\n", "cdf", "unknown file format '.txt'"),
    ("dbz_unknown.jsonl", '{"op": "c", "ts_ms": 1, "after": {"res_id": 1, "psgr_id": 2, "seat": "1A", "x": 1}}\n',
     "debezium", "has unknown column 'x'"),
    # (an update without a before image names its row by the key: test_key_images; a delete cannot)
    ("dbz_nobefore.jsonl", '{"op": "d", "ts_ms": 1, "before": null, "after": null}\n', "debezium",
     "the event has no before/after image for its op"),
    ("dbz_op.jsonl", '{"op": "x", "ts_ms": 1, "after": {"res_id": 1, "psgr_id": 2, "seat": "1A"}}\n', "debezium",
     "op must be one of c, r, u, d"),
    ("dbz_version.jsonl", '{"op": "c", "after": {"res_id": 1, "psgr_id": 2, "seat": "1A"}}\n', "debezium",
     "the event has neither source.lsn nor ts_ms"),
]


@pytest.mark.parametrize("name, content, fmt, message", BAD_APPENDS, ids=[b[0] for b in BAD_APPENDS])
def test_bad_appends_store_nothing(project, tmp_path, name, content, fmt, message):
    project.append("res", csv(tmp_path / "ok.csv", "res_id,psgr_id,seat,_change_type\n9,9,9Z,insert"))
    before = stored(project)
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ChangeDataError) as e:
        project.append("res", str(path), fmt)
    assert message.format(path=path) in str(e.value)
    assert "\n" not in str(e.value)
    assert stored(project) == before


def test_commit_versions_must_not_go_back(project, tmp_path):
    row = '{{"res_id": {i}, "psgr_id": 2, "seat": "1A", "_change_type": "insert", "_commit_version": {v}}}'
    project.append("res", lines(tmp_path / "a.jsonl", row.format(i=1, v=5), row.format(i=2, v=8)))
    before = stored(project)
    with pytest.raises(ChangeDataError, match=r"commit versions 6..6 overlap segment \d+ \(5..8\)"):
        project.append("res", lines(tmp_path / "b.jsonl", row.format(i=3, v=6)))
    assert stored(project) == before


def test_a_log_range_reads_only_its_commit_versions(project, tmp_path):
    """A segment holding several commit versions, read for a range that ends or starts inside it (a
    backfill from a version), gives that range's changes only; a range around it reads it whole."""
    row = '{{"res_id": {v}, "psgr_id": 2, "seat": "1A", "_change_type": "insert", "_commit_version": {v}}}'
    project.append("res", lines(tmp_path / "a.jsonl", *(row.format(v=v) for v in (1, 2, 3))))
    cfg, segments = project.config.tables["res"], project.catalog.segments("res", 0, 3)

    def versions(after: int, upto: int) -> list[int]:
        return sorted(r["_commit_version"] for r in read_log(project.spark, cfg, segments, after, upto).collect())

    assert (versions(0, 3), versions(1, 3), versions(0, 2), versions(1, 2)) == ([1, 2, 3], [2, 3], [1, 2], [2])


def test_same_file_twice_is_stored_once(project, tmp_path):
    path = csv(tmp_path / "a.csv", "res_id,psgr_id,seat,_change_type\n1,2,1A,insert")
    first = project.append("res", path)
    again = project.append("res", path)
    assert again.duplicate_of == first.segment
    assert "already appended as segment" in again.describe()
    assert len(project.catalog.all_segments()) == 1
    # the same content in another file is another transaction
    copy = csv(tmp_path / "b.csv", "res_id,psgr_id,seat,_change_type\n1,2,1A,insert")
    assert project.append("res", copy).segment.min_commit_version == 2


def test_csv_cannot_hold_nested_columns(project, tmp_path):
    with pytest.raises(ChangeDataError, match="column tags is nested; CSV cannot hold it"):
        project.append("tag", csv(tmp_path / "t.csv", "item,tags,_change_type\na,x,insert"))


def test_load_checks_keys_and_refuses_a_second_load(project, tmp_path):
    with pytest.raises(ChangeDataError, match=r"key \(res_id=1\) occurs 2 times; nothing was stored"):
        project.load("res", csv(tmp_path / "dup.csv", "res_id,psgr_id,seat\n1,1,1A\n1,2,1B"))
    with pytest.raises(ChangeDataError, match="key column res_id is NULL"):
        project.load("res", csv(tmp_path / "null.csv", "res_id,psgr_id,seat\n,1,1A"))
    assert project.catalog.state("res").version == 0
    rows, version = project.load("res", csv(tmp_path / "ok.csv", "res_id,psgr_id,seat\n1,1,1A\n2,,1B"))
    assert (rows, version) == (2, 1)
    assert sorted(tuple(r) for r in project.read("res").collect()) == [(1, 1, "1A"), (2, None, "1B")]
    with pytest.raises(ChangeDataError, match="table res already has data or changes"):
        project.load("res", csv(tmp_path / "ok2.csv", "res_id,psgr_id,seat\n3,1,1A"))


def test_bags_keep_duplicates(project, tmp_path):
    project.load("tag", lines(tmp_path / "t.jsonl", {"item": "a", "tags": []}, {"item": "a", "tags": []},
                              {"item": "b", "tags": None}))
    assert project.read_zset("tag").count() == 2  # consolidated: (a, [], 2), (b, NULL, 1)
    assert sorted(r.item for r in project.read("tag").collect()) == ["a", "a", "b"]


def test_a_small_load_starts_no_spark_and_stores_what_spark_would(make_project, tmp_path, monkeypatch):
    """`ivm load` of a small file reads and writes it with pyarrow (ivm.changes.arrow_reader, #49 item 4):
    no Spark starts, and the stored base layer holds the Z-set Spark's load stores from the same file — a
    bag's equal rows as one with their number (NULLs equal, -0.0 equal to 0.0), a keyed table's rows once
    — in DATE, TIMESTAMP, DECIMAL and DOUBLE; a repeated key is refused in Spark's words."""
    from ivm import Project
    from ivm.changes import arrow_reader

    tables = {"sale": {"columns": {"day": "date", "at": "timestamp", "amount": "decimal(12,2)", "rate": "double",
                                   "who": "string"}},
              "acct": {"columns": {"day": "date", "id": "int", "rate": "double"}, "key": ["day", "id"]}}
    sale = csv(tmp_path / "s.csv", "day,at,amount,rate,who\n"
                                   "2024-01-02,2024-01-02 10:00:00,1.50,0.0,ann\n"
                                   "2024-01-02,2024-01-02 10:00:00,1.50,-0.0,ann\n"
                                   ",,,,\n,,,,\n2024-01-03,2024-01-03 23:59:59.5,-3.00,1e-3,\n"
                                   "2024-01-02,2024-01-02 10:00:00,1.50,0.0,bob")
    acct = lines(tmp_path / "a.jsonl", {"day": "2024-01-02", "id": 2, "rate": -0.0}, {"day": "2024-01-01", "id": 2},
                 {"day": "2024-01-02", "id": 1, "rate": 2.5})
    loaded = {}
    for how in ("spark", "arrow"):
        if how == "spark":
            monkeypatch.setattr(arrow_reader, "read_snapshot", lambda *a, **k: None)
        p = make_project(tables, root=tmp_path / how)
        fresh = Project.open(str(tmp_path / how / "ivm.yaml"))
        try:
            assert fresh.load("sale", sale) == (6, 1) and fresh.load("acct", acct) == (3, 1)
            assert fresh.ctx.spark_started is (how == "spark")
        finally:
            fresh.close()
        monkeypatch.undo()
        loaded[how] = {t: sorted((tuple(r) for r in p.read_zset(t).collect()), key=repr) for t in tables}
    assert loaded["arrow"] == loaded["spark"]
    assert sorted(r[-1] for r in loaded["arrow"]["sale"]) == [1, 1, 2, 2]  # (ann's two, the NULL rows' two)
    dup = tmp_path / "dup"
    p = make_project(tables, root=dup)
    with pytest.raises(ChangeDataError, match=r"table acct: .*: key \(day=2024-01-02, id=1\) occurs 2 times; "
                                              "nothing was stored"):
        p.load("acct", lines(tmp_path / "d.jsonl", {"day": "2024-01-02", "id": 1, "rate": 1.0},
                                  {"day": "2024-01-02", "id": 1, "rate": None}))
    assert p.catalog.state("acct").version == 0


def test_table_schemas_are_built_as_spark_parses_them(spark, monkeypatch):
    """`table_schema` builds a table's Spark types without the JVM (`ivm show` of a table starts none) and
    leaves to Spark's parser only the types it does not build; either way the schema is Spark's own."""
    from pyspark.sql.types import _parse_datatype_string

    from ivm.changes import reader
    from ivm.config import TableConfig

    built = {"b": "boolean", "t": "tinyint", "s": "smallint", "i": "int", "l": "bigint", "f": "float", "d": "double",
             "str": "string", "bin": "binary", "day": "date", "at": "timestamp", "ntz": "timestamp_ntz",
             "dec": "decimal", "dec5": "decimal(5)", "dec12": "decimal(12,2)", "arr": "array<int>",
             "nested": "array<struct<City: string, `a b`: decimal(38,10), inner: array<struct<x: date>>>>",
             "st": "struct<k: string, n: array<bigint>>"}
    for columns, jvm in [(built, False), ({**built, "v": "varchar(3)"}, True),
                         ({"s": "struct<a: int NOT NULL, b: string COMMENT 'note'>"}, True)]:
        table = TableConfig(columns=columns)
        called: list[str] = []
        monkeypatch.setattr(reader, "_parse_datatype_string",
                            lambda ddl, called=called: called.append(ddl) or _parse_datatype_string(ddl))
        got = reader.table_schema(table)
        monkeypatch.undo()
        assert got == _parse_datatype_string(table.ddl()) and bool(called) is jvm, columns


def test_unknown_or_unapplied_tables(project, tmp_path, make_project):
    with pytest.raises(NotFoundError, match="unknown table 'nope'"):
        project.append("nope", csv(tmp_path / "a.csv", "x\n1"))
    with pytest.raises(ChangeDataError, match="not found"):
        project.append("res", str(tmp_path / "missing.csv"))
    changed = dict(TABLES, extra={"columns": {"x": "int"}})
    from ivm import Project
    from tests.conftest import write_project

    p2 = Project(Project.open(str(write_project(tmp_path / "project", changed))).config)
    with pytest.raises(ConfigError, match="table extra is not in the catalog yet; run `ivm apply`"):
        p2.append("extra", csv(tmp_path / "b.csv", "x,_change_type\n1,insert"))
    assert issubclass(ConfigError, IvmError)


def test_segment_footers_tell_whether_a_log_holds_update_images(project, tmp_path):
    """Trimming leaves the update-image pairing out of its plan for a range without update images;
    the segments' Parquet statistics of the change type say so without a Spark job."""
    project.append("res", csv(tmp_path / "a.csv", """
res_id,psgr_id,seat,_change_type
1,7,1A,insert
2,8,1B,insert"""))
    project.append("res", csv(tmp_path / "b.csv", """
res_id,psgr_id,seat,_change_type
2,8,1B,delete"""))
    plain = project.catalog.segments("res", 0, 10**18)
    assert not has_update_images(project.warehouse, plain)
    project.append("res", csv(tmp_path / "c.csv", """
res_id,psgr_id,seat,_change_type
1,7,1A,update_preimage
1,7,2C,update_postimage"""))
    every = project.catalog.segments("res", 0, 10**18)
    assert has_update_images(project.warehouse, every)
    assert has_update_images(project.warehouse, every[-1:])
    assert project.warehouse.column_range(every[0].path, "_change_type") == ("insert", "insert")
    # a nested column before the change type has several Parquet leaf columns
    project.append("tag", lines(tmp_path / "t.jsonl",
                                {"item": "a", "tags": [{"k": "x", "n": 1}], "_change_type": "insert"}))
    [tagged] = project.catalog.segments("tag", 0, 10**18)
    assert project.warehouse.column_range(tagged.path, "_change_type") == ("insert", "insert")
    assert not has_update_images(project.warehouse, [tagged])


#: "spark: True" when the append reached Spark: a JVM of its own (classic), or a session of the Spark Connect
#: server the suite runs on (SPARK_REMOTE)
APPEND = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession
from ivm.cli import main
code = main(["--project", sys.argv[1], "log", "append", "res", sys.argv[2]])
print("spark:", SparkContext._gateway is not None or SparkSession.getActiveSession() is not None)
sys.exit(code)
"""


def test_a_small_append_starts_no_jvm(project, tmp_path):
    """`ivm log append` of a small change file reads it with pyarrow (ivm.changes.arrow_reader): no JVM
    starts (#49 item 4), and a refresh's Spark reads the segment as it reads one Spark wrote; a file the
    Arrow reader declines (a Parquet column of another type) goes through Spark."""
    project_file = str(Path(project.config.root) / "ivm.yaml")

    def append(path: str) -> str:
        done = subprocess.run([sys.executable, "-c", APPEND, project_file, path], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout
    out = append(csv(tmp_path / "a.csv", "res_id,psgr_id,seat,_change_type\n1,7,\"1A, window\",insert\n2,,1B,insert"))
    assert "appended 2 changes as commit version 1" in out and "spark: False" in out, out
    pq = tmp_path / "b.parquet"
    pd.DataFrame({"res_id": [3], "psgr_id": [9], "seat": ["3F"], "_change_type": ["insert"]}).to_parquet(pq)
    out = append(str(pq))  # (res_id is BIGINT in the file, INT in the table: Spark casts it)
    assert "commit version 2" in out and "spark: True" in out, out
    assert log_rows(project, "res") == [(1, 7, "1A, window", "insert", 1), (2, None, "1B", "insert", 1),
                                        (3, 9, "3F", "insert", 2)]


def test_show_of_a_small_table_or_view_reads_its_layers_without_spark(make_project, tmp_path):
    """`ivm show` consolidates a small table's or view's layers with pyarrow (`sinks.layers_without_jvm`):
    the rows Spark reads, a bag's duplicates repeated, a set's rows once, a deleted row gone, NULLs
    first, in DATE, TIMESTAMP, DECIMAL and DOUBLE."""
    from ivm import sinks

    p = make_project({"sale": {"columns": {"day": "date", "at": "timestamp", "amount": "decimal(12,2)",
                                           "rate": "double", "who": "string"}}},
                     views={"buyers": {"sql": "SELECT DISTINCT who, day FROM sale"},
                            "per_day": {"sql": "SELECT day, sum(amount) AS total, avg(rate) AS rate, count(*) AS n "
                                               "FROM sale GROUP BY day"}})
    rows = [("2024-01-02", "2024-01-02 10:00:00", "1.50", "0.25", "ann"),
            ("2024-01-02", "2024-01-02 10:00:00", "1.50", "0.25", "ann"),
            ("2024-01-03", "2024-01-03 23:59:59.5", "-3.00", "", ""), ("", "", "", "1e-3", "bob")]
    p.load("sale", csv(tmp_path / "s.csv", "day,at,amount,rate,who\n" + "\n".join(",".join(r) for r in rows)))
    p.refresh()
    p.append("sale", csv(tmp_path / "c.csv", "day,at,amount,rate,who,_change_type\n"
                                             ",,,1e-3,bob,delete\n"
                                             "2024-01-04,2024-01-04 00:00:00,7.25,2.5,cy,insert"))
    p.refresh()
    # (ann's two rows: twice in sale, once in the set buyers; bob's day, NULL, leaves per_day)
    for name, n in [("sale", 4), ("buyers", 3), ("per_day", 3)]:
        got = sinks.layers_without_jvm(p.ctx, name)
        assert got is not None, name
        spark_rows = p.read(name).orderBy(*got.column_names).toArrow().to_pylist()
        expected = [{k: v.replace(tzinfo=None) if k == "at" and v is not None else v for k, v in r.items()}
                    for r in spark_rows]
        assert got.to_pylist() == expected and len(expected) == n, name
