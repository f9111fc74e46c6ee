"""A log range that cancels out starts no Spark (#68 item 4; ivm.changes.cancel).

The driver's check is compared with Spark's trim (the reference) on drawn ranges, mostly of changes that
undo each other — an insert and its delete, an update and its reversal, a delete and the row put back,
with whole or key-only images — mixed with changes that do not cancel or do not apply: where the driver
says a range cancels, Spark's net delta is empty and every change applies; where Spark finds that, the
driver says so too (its only refusals are a truncate, a NaN, a range too large). Then, as a user runs
it: a refresh whose changes cancel out (a late commit taking back an earlier one) opens no Spark
session, leaves the views as they were and the range pending, and the next change's trim reads it."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivm import Project
from ivm.changes import cancel
from ivm.changes.ingest import read_log
from ivm.changes.trim import trim
from ivm.errors import BadChange
from tests.helpers import assert_views_recomputed, norm, write_jsonl

TABLES = {"acct": {"columns": {"k": "int", "v": "decimal(10,2)", "at": "timestamp", "s": "string"}, "key": ["k"]},
          "bag": {"columns": {"a": "string", "b": "int"}}}
STORED = {"acct": [(1, "1.50", "2024-01-01 10:00:00", "a"), (2, None, None, "b"), (3, "2.25", None, None)],
          "bag": [("x", 1), ("x", 1), ("y", None)]}
ACCT_ROWS = st.tuples(st.sampled_from([None, "1.50", "2.25"]), st.sampled_from([None, "2024-01-01 10:00:00"]),
                      st.sampled_from([None, "a", "b"]))
BAG_ROWS = st.tuples(st.sampled_from(["x", "y", "z"]), st.sampled_from([None, 1, 2]))


@st.composite
def keyed_changes(draw, stored: dict[int, tuple]) -> list[tuple[str, tuple]]:
    """Per drawn key, a few changes that undo each other, or not."""
    out = []
    for k in draw(st.sets(st.integers(1, 5), max_size=4)):
        row = stored.get(k)
        if row is None:
            new = (k, *draw(ACCT_ROWS))
            gone = draw(st.sampled_from([new, (k, None, None, None)]))
            out += draw(st.sampled_from([[("insert", new), ("delete", gone)], [("insert", new)],
                                         [("delete", new)]]))
        else:
            whole = (k, *row)
            gone = draw(st.sampled_from([whole, (k, None, None, None)]))
            other = (k, *draw(ACCT_ROWS))
            out += draw(st.sampled_from([
                [("delete", gone), ("insert", whole)],
                [("update_preimage", gone), ("update_postimage", other),
                 ("update_preimage", other), ("update_postimage", whole)],
                [("delete", gone), ("insert", other)], [("insert", whole)], [("delete", other)]]))
    return out


@st.composite
def bag_changes(draw) -> list[tuple[str, tuple]]:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        row = draw(BAG_ROWS)
        out += draw(st.sampled_from([[("insert", row), ("delete", row)], [("delete", row), ("insert", row)],
                                     [("insert", row)], [("delete", row)]]))
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_drivers_check_agrees_with_sparks_trim(make_project, tmp_path_factory, data):
    root = tmp_path_factory.mktemp("cancel")
    p = make_project(TABLES, root=root / "p")
    for table, rows in STORED.items():
        p.load(table, write_jsonl(root / f"{table}.jsonl", list(TABLES[table]["columns"]), rows))
    stored = {r[0]: r[1:] for r in STORED["acct"]}
    for n in range(3):  # (each round a range of its own past the last, against the loaded rows)
        table = data.draw(st.sampled_from(["acct", "bag"]), f"round {n}: table")
        changes = data.draw(keyed_changes(stored) if table == "acct" else bag_changes(), f"round {n}: changes")
        if not changes:
            continue
        after = p.catalog.last_commit_version(table)
        cut = data.draw(st.integers(0, len(changes)), f"round {n}: commit boundary")
        for i, part in enumerate((changes[:cut], changes[cut:])):
            if part:
                p.append(table, write_jsonl(root / f"{table}-{n}-{i}.jsonl", list(TABLES[table]["columns"]),
                                            [r for _, r in part], [k for k, _ in part]))
        upto = p.catalog.last_commit_version(table)
        config, segments = p.config.tables[table], p.catalog.segments(table, after, upto)
        layers = [x.path for x in p.catalog.state(table).layers]
        said = cancel.cancels(p.warehouse, config, segments, layers, after, upto)
        net = trim(table, config, read_log(p.spark, config, segments, after, upto),
                   p.warehouse.read_layers(p.spark, layers, p.ctx.schema(table)))
        delta = net.delta.collect()
        try:
            net.check()
            applies = True
        except BadChange:
            applies = False
        assert said == (applies and not delta), (changes, cut, delta, applies)


def test_a_refresh_whose_changes_cancel_out_starts_no_spark(make_project, tmp_path):
    tables = {"acct": TABLES["acct"]}
    views = {"per_s": {"sql": "SELECT s, count(*) AS n, sum(v) AS total FROM acct GROUP BY s"}}
    p = make_project(tables, views=views)
    p.load("acct", write_jsonl(tmp_path / "acct.jsonl", list(tables["acct"]["columns"]), STORED["acct"]))
    p.refresh()
    versions = {v: p.catalog.state(v).version for v in views}
    columns = list(tables["acct"]["columns"])
    fresh = Project.open(str(tmp_path / "project" / "ivm.yaml"))
    said: list[str] = []
    try:
        # commit 1 inserts a row and updates another; a late correction, commit 2, takes both back (the
        # delete naming its key alone, as PostgreSQL's connector sends it)
        fresh.append("acct", write_jsonl(tmp_path / "c1.jsonl", columns, [
            (7, 1.5, None, "z"), (2, None, None, "b"), (2, 2.25, None, "b")],
            ["insert", "update_preimage", "update_postimage"]))
        fresh.append("acct", write_jsonl(tmp_path / "c2.jsonl", columns, [
            (7, None, None, None), (2, 2.25, None, "b"), (2, None, None, "b")],
            ["delete", "update_preimage", "update_postimage"]))
        assert not fresh.ctx.spark_started  # (small files: read by pyarrow)
        result = fresh.refresh(progress=said.append)
        assert result.status == "noop" and result.views == []
        assert not fresh.ctx.spark_started
        assert "plan: the changes of acct (commit versions 1..2) cancel out; left for a later trim" in said
        assert {v: fresh.catalog.state(v).version for v in views} == versions
        assert fresh.catalog.watermarks()[("acct", "acct")] == 0  # (pending: the next trim reads the range)
    finally:
        fresh.close()
    # the next change: its trim reads the cancelled range with it
    p.append("acct", write_jsonl(tmp_path / "c3.jsonl", columns, [(8, "2.25", None, "z")], ["insert"]))
    result = p.refresh()
    assert [str(v.mode) for v in result.views] == ["incremental"]
    assert p.catalog.watermarks()[("acct", "acct")] == 3
    state = [(1, Decimal("1.50"), "a"), (2, None, "b"), (3, Decimal("2.25"), None), (8, Decimal("2.25"), "z")]
    con = duckdb.connect()
    con.execute("CREATE TABLE acct (k INTEGER, v DECIMAL(10, 2), s VARCHAR)")
    con.executemany("INSERT INTO acct VALUES (?, ?, ?)", state)
    assert Counter(tuple(norm(x) for x in r) for r in p.read("per_s").collect()) == Counter(
        tuple(norm(x) for x in r) for r in con.execute(views["per_s"]["sql"]).fetchall())
    assert_views_recomputed(p)
