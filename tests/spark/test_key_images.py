"""Changes as CDC producers send them by default (#69 item 1): on a keyed table the key identifies the row.
Debezium from PostgreSQL with its default replica identity sends a delete's ``before`` with the key alone
(the other fields null) and an update with ``before: null``; MySQL's ``binlog_row_image=minimal`` the same.
Such a delete removes the stored row with that key, such an update replaces it; a before image that does
carry values must still match the stored row; a key that is not there is still refused; a keyless table
keeps whole-row deletes. A truncate (PostgreSQL's ``op: t``) deletes every row the table holds at its
position. After each refresh the view equals its recompute and DuckDB's result."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from ivm.errors import ChangeDataError
from tests.helpers import assert_views_recomputed, norm, write_jsonl

TABLES = {"t": {"columns": {"k": "int", "v": "int", "name": "string"}, "key": ["k"]},
          "bag": {"columns": {"k": "int", "v": "int"}}}
VIEWS = {"per_name": {"sql": "SELECT name, count(*) AS n, sum(v) AS total FROM t GROUP BY name"},
         "bag_sum": {"sql": "SELECT k, sum(v) AS total FROM bag GROUP BY k"}}


def events(path: Path, *items: dict, wrap: bool = False) -> str:
    """Debezium events, PostgreSQL's shape (``source.lsn``), optionally in the ``schema``/``payload`` wrapper."""
    path.write_text("".join(json.dumps({"schema": {}, "payload": e} if wrap else e) + "\n" for e in items))
    return str(path)


def ev(op: str, lsn: int, before: dict | None, after: dict | None) -> dict:
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn, "db": "shop"}, "ts_ms": lsn}


def duck(rows: list[tuple]) -> Counter:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k INTEGER, v INTEGER, name VARCHAR)")
    if rows:
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    return Counter(tuple(norm(x) for x in r) for r in con.execute(VIEWS["per_name"]["sql"]).fetchall())


def view(p) -> Counter:
    return Counter(tuple(norm(x) for x in r) for r in p.read("per_name").collect())


@pytest.fixture
def project(make_project, tmp_path):
    p = make_project(TABLES, views=VIEWS)
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v", "name"], [(1, 10, "a"), (2, 20, "b"), (3, 30, "a")]))
    p.load("bag", write_jsonl(tmp_path / "bag.jsonl", ["k", "v"], [(1, 5), (1, 5)]))
    p.refresh()
    return p


def test_key_only_deletes_and_before_less_updates_as_postgresql_sends_them(project, tmp_path):
    p = project
    p.append("t", events(tmp_path / "pg.jsonl",
                         {"status": "BEGIN", "id": "571:53195832", "event_count": None},
                         ev("d", 100, {"k": 1, "v": None, "name": None}, None),        # REPLICA IDENTITY DEFAULT
                         ev("u", 101, None, {"k": 2, "v": 25, "name": "c"}),            # no before image
                         ev("u", 102, {"k": 3, "v": 30, "name": "a"}, {"k": 3, "v": 31, "name": "a"}),  # FULL
                         ev("c", 103, None, {"k": 4, "v": 40, "name": "b"}),
                         {"status": "END", "id": "571:53195832", "event_count": 4},  # (transaction metadata)
                         wrap=True), "debezium")
    tomb = events(tmp_path / "tomb.jsonl", ev("d", 104, {"k": 4, "v": None, "name": None}, None))
    Path(tomb).write_text(Path(tomb).read_text() + "null\n")  # (Kafka's tombstone after a delete: skipped)
    p.append("t", tomb, "debezium")
    p.refresh()
    state = [(2, 25, "c"), (3, 31, "a")]
    assert view(p) == duck(state)
    assert_views_recomputed(p)
    # the native format too: a delete carrying the key alone
    p.append("t", write_jsonl(tmp_path / "native.jsonl", ["k", "v", "name"], [(2, None, None)], ["delete"]))
    p.refresh()
    assert view(p) == duck([(3, 31, "a")])
    assert_views_recomputed(p)


def test_a_before_image_with_values_must_still_match_and_a_missing_key_is_refused(project, tmp_path):
    p = project
    p.append("t", events(tmp_path / "wrong.jsonl", ev("d", 200, {"k": 1, "v": 99, "name": None}, None)), "debezium")
    with pytest.raises(ChangeDataError, match=r"commit version 200, row \(k=1, v=99, name=NULL\): delete does "
                                              r"not match the stored row"):
        p.refresh()
    p.quarantine("t", 200)
    p.append("t", events(tmp_path / "gone.jsonl", ev("d", 201, {"k": 9, "v": None, "name": None}, None)), "debezium")
    with pytest.raises(ChangeDataError, match=r"commit version 201, row \(k=9, v=NULL, name=NULL\): delete of a "
                                              r"row that is not there"):
        p.refresh()
    p.quarantine("t", 201)
    p.append("t", events(tmp_path / "upd.jsonl", ev("u", 202, None, {"k": 8, "v": 1, "name": "z"})), "debezium")
    with pytest.raises(ChangeDataError, match=r"commit version 202, row \(k=8, v=NULL, name=NULL\): "
                                              r"update_preimage of a row that is not there"):
        p.refresh()


def test_a_keyless_table_deletes_whole_rows(project, tmp_path):
    p = project
    p.append("bag", write_jsonl(tmp_path / "b.jsonl", ["k", "v"], [(1, None)], ["delete"]))
    with pytest.raises(ChangeDataError, match=r"row \(k=1, v=NULL\): delete of a row that is not there"):
        p.refresh()


def test_mysql_minimal_row_images(project, tmp_path):
    """Debezium's MySQL connector under ``binlog_row_image=minimal``: no ``source.lsn`` (the binlog file and
    position instead; ``ts_ms`` orders the events), a delete's ``before`` and an update's ``before`` with the
    primary key alone."""
    p = project

    def mysql(op: str, ts: int, before: dict | None, after: dict | None) -> dict:
        return {"op": op, "before": before, "after": after, "ts_ms": ts,
                "source": {"connector": "mysql", "file": "binlog.000003", "pos": ts * 10, "ts_ms": ts - 1,
                           "gtid": None, "db": "shop", "table": "t"},
                "transaction": {"id": f"tx{ts}", "total_order": 1, "data_collection_order": 1}}

    p.append("t", events(tmp_path / "mysql.jsonl",
                         mysql("u", 300, {"k": 1, "v": None, "name": None}, {"k": 1, "v": 11, "name": "a"}),
                         mysql("d", 301, {"k": 3, "v": None, "name": None}, None),
                         mysql("c", 302, None, {"k": 5, "v": 50, "name": "b"})), "debezium")
    p.refresh()
    assert view(p) == duck([(1, 11, "a"), (2, 20, "b"), (5, 50, "b")])
    assert_views_recomputed(p)


def bag_view(p) -> Counter:
    return Counter(tuple(norm(x) for x in r) for r in p.read("bag_sum").collect())


def test_a_truncate_deletes_every_row_at_its_position(project, tmp_path):
    """PostgreSQL's connector sends ``TRUNCATE t`` as an event with ``op: t`` and no images. Rows changed
    before it in the same range are gone too; a key inserted after it is new (its old row is gone), an
    update after it applies to the new row, and a delete of a row only the truncate removed is refused."""
    p = project
    trunc = {"op": "t", "before": None, "after": None, "source": {"lsn": 402, "db": "shop", "table": "t"},
             "ts_ms": 402, "transaction": None}
    p.append("t", events(tmp_path / "pg.jsonl",
                         ev("c", 400, None, {"k": 5, "v": 50, "name": "c"}),
                         ev("u", 401, {"k": 1, "v": 10, "name": "a"}, {"k": 1, "v": 11, "name": "a"}),
                         trunc,
                         ev("c", 403, None, {"k": 1, "v": 12, "name": "b"}),          # a key the table had
                         ev("c", 404, None, {"k": 6, "v": 60, "name": "b"}),
                         ev("u", 405, None, {"k": 6, "v": 61, "name": "b"}), wrap=True), "debezium")
    p.append("bag", events(tmp_path / "bag.jsonl",
                           ev("c", 500, None, {"k": 2, "v": 7}),
                           {**trunc, "source": {"lsn": 501}, "ts_ms": 501},
                           ev("c", 502, None, {"k": 1, "v": 5})), "debezium")
    p.refresh()
    assert view(p) == duck([(1, 12, "b"), (6, 61, "b")])
    assert bag_view(p) == Counter({(1, 5): 1})
    assert_views_recomputed(p)
    # one truncate at a time too: every row the table holds, none of the refresh's own changes in play
    p.append("t", events(tmp_path / "t2.jsonl", {**trunc, "source": {"lsn": 600}, "ts_ms": 600}), "debezium")
    p.refresh()
    assert view(p) == duck([])
    assert_views_recomputed(p)
    p.append("t", events(tmp_path / "late.jsonl", ev("d", 700, {"k": 6, "v": None, "name": None}, None)), "debezium")
    with pytest.raises(ChangeDataError, match=r"commit version 700, row \(k=6, v=NULL, name=NULL\): delete of a "
                                              r"row that is not there"):
        p.refresh()


def test_a_truncate_read_by_spark_and_restored_from_quarantine(project, tmp_path):
    """A file the Arrow reader declines (here: a number where a string goes, which Spark casts) is read
    by Spark, its truncate found by the append's one job; a quarantined truncate put back below what the
    views absorbed is appended again as a new commit, still a truncate."""
    p = project
    trunc = {"op": "t", "before": None, "after": None, "source": {"lsn": 801}, "ts_ms": 801}
    p.append("t", events(tmp_path / "spark.jsonl", ev("c", 800, None, {"k": 7, "v": 70, "name": 9}), trunc,
                         ev("c", 802, None, {"k": 8, "v": 80, "name": "z"})), "debezium")
    segment = p.catalog.segments("t", 799, 802)[-1]
    assert segment.truncates and segment.truncates[0][0] == 801
    p.quarantine("t", 801)
    p.refresh()
    assert view(p) == duck([(1, 10, "a"), (2, 20, "b"), (3, 30, "a"), (7, 70, "9"), (8, 80, "z")])
    p.restore("t", 801)
    p.refresh()
    assert view(p) == duck([])
    assert_views_recomputed(p)
