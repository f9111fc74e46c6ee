"""Refreshing base snapshots end to end, through files, the catalog and the warehouse: one snapshot
for all tables, refusal of bad changes with nothing applied, crash safety, leases, compaction and
garbage collection."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivm.errors import ChangeDataError, LeaseError
from ivm.modes import Mode

TABLES = {
    "acct": {"columns": {"id": "int", "owner": "string", "balance": "bigint"}, "key": ["id"]},
    "event": {"columns": {"kind": "string", "n": "int"}},
}


def changes(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def contents(project, table: str) -> Counter:
    return Counter(tuple(r) for r in project.read(table).collect())


def touched(project) -> tuple:
    """What a refresh may change: relation versions, watermarks, segments, visible rows."""
    return ([project.catalog.state(t) for t in TABLES], project.catalog.watermarks(),
            project.catalog.all_segments(), {t: contents(project, t) for t in TABLES})


@pytest.fixture
def project(make_project, tmp_path):
    p = make_project(TABLES)
    p.load("acct", changes(tmp_path / "acct.jsonl", [{"id": 1, "owner": "ann", "balance": 10},
                                                     {"id": 2, "owner": "bob", "balance": None}]))
    p.load("event", changes(tmp_path / "event.jsonl", [{"kind": "a", "n": 1}, {"kind": "a", "n": 1}]))
    return p


def test_all_tables_refresh_at_one_snapshot(project, tmp_path):
    project.append("acct", changes(tmp_path / "c1.jsonl", [
        {"id": 3, "owner": "cy", "balance": 5, "_change_type": "insert"},
        {"id": 1, "owner": "ann", "balance": 10, "_change_type": "update_preimage"},
        {"id": 1, "owner": "ann", "balance": 12, "_change_type": "update_postimage"}]))
    project.append("event", changes(tmp_path / "e1.jsonl", [
        {"kind": "a", "n": 1, "_change_type": "delete"}, {"kind": None, "n": None, "_change_type": "insert"}]))
    lines = []
    result = project.refresh(progress=lines.append)
    assert result.status == "succeeded"
    assert {t.table: (t.log_rows, t.delta_rows) for t in result.tables} == {"acct": (3, 3), "event": (2, 2)}
    assert contents(project, "acct") == Counter({(1, "ann", 12): 1, (2, "bob", None): 1, (3, "cy", 5): 1})
    assert contents(project, "event") == Counter({("a", 1): 1, (None, None): 1})
    assert project.catalog.watermarks() == {("acct", "acct"): 1, ("event", "event"): 1}
    run = project.catalog.get_run(result.run_id)
    assert run.status == "succeeded" and run.snapshot == {"acct": 1, "event": 1}
    assert {(s.stage, s.relation, s.delta_rows) for s in run.stages} == {("plan", None, None), ("trim", "acct", 3),
                                                                         ("trim", "event", 2), ("publish", None, None)}
    assert any(line.startswith("publish:") for line in lines)
    # a delta layer was appended: O(|delta|) writes, the base layer is untouched
    assert [x.kind for x in project.catalog.state("acct").layers] == ["base", "delta"]


def test_a_runs_spark_operations_carry_its_job_tag(project, tmp_path, monkeypatch):
    """Every Spark operation of a refresh carries the run's job tag (`ivm.spark.tagged`: Spark's job tags,
    classic and Connect alike), seen by the session while the stages run, and none is left after."""
    from ivm.spark import run_tag
    from ivm.storage import Warehouse

    spark = project.spark
    seen: set[str] = set()
    real = Warehouse.write_layer

    def write_layer(self, df, *a, **k):  # (each layer a stage writes: the tags of its write's job)
        seen.update(spark.getTags())
        return real(self, df, *a, **k)

    monkeypatch.setattr(Warehouse, "write_layer", write_layer)
    project.append("acct", changes(tmp_path / "c.jsonl", [{"id": 3, "owner": "cy", "balance": 5,
                                                           "_change_type": "insert"}]))
    result = project.refresh()
    assert run_tag(result.run_id) in seen and spark.getTags() == set()


@pytest.mark.classic  # (Spark's job tracker: a classic session's)
def test_noop_refresh_launches_no_spark_job(project):
    sc = project.spark.sparkContext
    sc.setJobGroup("noop-refresh", "jobs a no-op refresh launches")
    try:
        result = project.refresh()
        jobs = sc.statusTracker().getJobIdsForGroup("noop-refresh")
        project.spark.range(1).count()  # the control: a job in this group is seen
        control = sc.statusTracker().getJobIdsForGroup("noop-refresh")
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert result.status == "noop" and result.run_id is None
    assert jobs == [] and len(control) >= 1


def test_bad_change_refuses_the_whole_refresh_and_a_late_commit_repairs_it(project, tmp_path):
    project.append("event", changes(tmp_path / "ok.jsonl", [{"kind": "b", "n": 2, "_change_type": "insert"}]))
    project.append("acct", changes(tmp_path / "bad.jsonl", [
        {"id": 9, "owner": "zed", "balance": 1, "_change_type": "delete", "_commit_version": 20}]))
    before = touched(project)
    with pytest.raises(ChangeDataError) as e:
        project.refresh()
    assert str(e.value) == ("table acct: commit version 20, row (id=9, owner='zed', balance=1): "
                            "delete of a row that is not there; nothing was applied (to go on without it: "
                            "`ivm log quarantine acct --version 20`)")
    assert touched(project) == before  # not even the good table moved: all or nothing
    failed = project.runs(1)[0]
    assert failed.status == "failed" and "commit version 20" in failed.error
    # the missing insert arrives late, below the bad commit: the log now applies
    project.append("acct", changes(tmp_path / "fix.jsonl", [
        {"id": 9, "owner": "zed", "balance": 1, "_change_type": "insert", "_commit_version": 15}]))
    absorbed = project.catalog.watermarks()[("acct", "acct")]
    result = project.refresh()
    # (acct's range now cancels out, as the driver finds: left out of the run, pending — ivm.changes.cancel)
    assert {t.table: t.delta_rows for t in result.tables} == {"event": 1}
    assert contents(project, "event")[("b", 2)] == 1
    assert (9, "zed", 1) not in contents(project, "acct")
    assert project.catalog.watermarks()[("acct", "acct")] == absorbed


def test_crash_before_publish_leaves_the_old_version_and_a_rerun_applies_once(project, tmp_path, monkeypatch):
    project.append("acct", changes(tmp_path / "c.jsonl", [
        {"id": 2, "owner": "bob", "balance": None, "_change_type": "update_preimage"},
        {"id": 2, "owner": "bob", "balance": 7, "_change_type": "update_postimage"}]))
    project.append("event", changes(tmp_path / "e.jsonl", [{"kind": "a", "n": 1, "_change_type": "insert"}]))
    before = touched(project)
    real_publish = project.catalog.publish

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash between writing layers and committing")

    monkeypatch.setattr(project.catalog, "publish", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        project.refresh()
    assert touched(project) == before
    layer_dirs = {p.name for p in Path(project.warehouse.uri, "data", "acct").iterdir()}
    assert len(layer_dirs) == 2  # the crashed run's delta layer exists on disk, but no version has it
    monkeypatch.setattr(project.catalog, "publish", real_publish)
    project.refresh()
    assert contents(project, "acct")[(2, "bob", 7)] == 1 and contents(project, "acct")[(2, "bob", None)] == 0
    assert contents(project, "event") == Counter({("a", 1): 3})
    assert project.refresh().status == "noop"  # the log is absorbed exactly once


def test_a_held_lease_blocks_a_second_refresh(project, tmp_path):
    project.append("acct", changes(tmp_path / "c.jsonl", [{"id": 5, "owner": "e", "balance": 0,
                                                          "_change_type": "insert"}]))
    project.catalog.acquire_leases("other-run", ["acct"], timedelta(minutes=10))
    before = touched(project)
    with pytest.raises(LeaseError, match="acct is being refreshed by run other-run"):
        project.refresh()
    assert touched(project) == before
    project.catalog.release_leases("other-run")
    assert project.refresh().status == "succeeded"


def test_compaction_and_garbage_collection(make_project, tmp_path):
    project = make_project(TABLES, storage={"compact_max_layers": 2, "retention_hours": 0})
    project.load("acct", changes(tmp_path / "a.jsonl", [{"id": i, "owner": "o", "balance": i} for i in range(5)]))
    expected = {i: i for i in range(5)}
    for step in range(3):
        project.append("acct", changes(tmp_path / f"c{step}.jsonl", [
            {"id": step, "owner": "o", "balance": step, "_change_type": "update_preimage"},
            {"id": step, "owner": "o", "balance": 100 + step, "_change_type": "update_postimage"}]))
        expected[step] = 100 + step
        result = project.refresh()
    assert result.compacted == ["acct"]  # the third delta layer passed compact_max_layers = 2
    state = project.catalog.state("acct")
    assert [x.kind for x in state.layers] == ["base"]
    assert contents(project, "acct") == Counter({(i, "o", b): 1 for i, b in expected.items()})
    compaction = project.runs(1)[0]
    assert compaction.kind == "compact" and compaction.status == "succeeded"
    old_paths = {p for p in project.catalog.known_layer_paths() if p != state.layers[0].path}
    assert old_paths and all(Path(p).exists() for p in old_paths)
    result = project.gc()
    assert result.layers == len(old_paths) and result.segments == 3
    assert not any(Path(p).exists() for p in old_paths)
    assert project.catalog.all_segments() == []
    assert contents(project, "acct") == Counter({(i, "o", b): 1 for i, b in expected.items()})


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(st.tuples(st.sampled_from(["ins", "del", "upd"]), st.integers(0, 4),
                                           st.one_of(st.none(), st.integers(0, 3))), min_size=1, max_size=4),
                        min_size=1, max_size=3))
def test_batch_by_batch_equals_all_at_once(make_project, tmp_path_factory, batches):
    """The same valid change stream refreshed after every batch and once at the end gives the same
    snapshot, equal to applying every change in order (bags too: the event table mirrors acct)."""
    root = tmp_path_factory.mktemp("stream")
    stepwise = make_project(TABLES, root=root / "stepwise")
    at_once = make_project(TABLES, root=root / "at_once")
    state: dict[int, int | None] = {}
    bag: Counter = Counter()
    for i, batch in enumerate(batches):
        rows = []
        for op, k, v in batch:
            if op == "ins" and k not in state:
                state[k] = v
                bag[("k", v)] += 1
                rows += [{"id": k, "owner": "x", "balance": v, "_change_type": "insert"}]
            elif op == "del" and k in state:
                old = state.pop(k)
                bag[("k", old)] -= 1
                rows += [{"id": k, "owner": "x", "balance": old, "_change_type": "delete"}]
            elif op == "upd" and k in state:
                old, state[k] = state[k], v
                bag[("k", old)] -= 1
                bag[("k", v)] += 1
                rows += [{"id": k, "owner": "x", "balance": old, "_change_type": "update_preimage"},
                         {"id": k, "owner": "x", "balance": v, "_change_type": "update_postimage"}]
        if not rows:
            continue
        acct = changes(root / f"acct{i}.jsonl", rows)
        event = changes(root / f"event{i}.jsonl", [{"kind": "k", "n": r["balance"], "_change_type":
                                                    "insert" if r["_change_type"] in ("insert", "update_postimage")
                                                    else "delete"} for r in rows])
        for p in (stepwise, at_once):
            p.append("acct", acct)
            p.append("event", event)
        stepwise.refresh()
    at_once.refresh()
    expected = Counter({(k, "x", v): 1 for k, v in state.items()})
    assert contents(stepwise, "acct") == contents(at_once, "acct") == expected
    assert contents(stepwise, "event") == contents(at_once, "event") == +bag


def test_refresh_with_a_postgresql_catalog(make_project, catalog_url, tmp_path):
    project = make_project(TABLES, catalog=catalog_url)
    project.load("acct", changes(tmp_path / "a.jsonl", [{"id": 1, "owner": "a", "balance": 1}]))
    project.append("acct", changes(tmp_path / "c.jsonl", [{"id": 1, "owner": "a", "balance": 1,
                                                          "_change_type": "delete"}]))
    assert project.refresh().status == "succeeded"
    assert contents(project, "acct") == Counter()
    assert project.catalog.engine.dialect.name == catalog_url.split(":")[0].split("+")[0]


@pytest.mark.parametrize("limit", [250_000, 0])
def test_a_small_run_plans_without_adaptive_execution(make_project, tmp_path, monkeypatch, limit):
    """The writes of a small run's trims and incremental maintenance run with Spark's adaptive execution
    off, a full recompute's with it on (ivm.spark.adaptive); a project that plans every run distributed
    (``single_partition_rows: 0``) keeps it throughout; and the session's setting is back after every
    refresh, a refused one too."""
    from ivm.storage import Warehouse

    p = make_project(TABLES, spark={"single_partition_rows": limit},
                     views={"total": {"sql": "SELECT owner, sum(balance) AS b FROM acct GROUP BY owner"}})
    p.load("acct", changes(tmp_path / "acct.jsonl", [{"id": 1, "owner": "ann", "balance": 10}]))
    p.refresh()
    conf = p.spark.conf
    assert conf.get("spark.sql.adaptive.enabled") == "true"
    writes = []
    write_layer = Warehouse.write_layer

    def spy(self, df, relation, kind, *args, **kwargs):
        writes.append((relation, kind, conf.get("spark.sql.adaptive.enabled")))
        return write_layer(self, df, relation, kind, *args, **kwargs)

    monkeypatch.setattr(Warehouse, "write_layer", spy)
    small = "false" if limit else "true"
    p.append("acct", changes(tmp_path / "c1.jsonl",
                             [{"id": 2, "owner": "bob", "balance": 5, "_change_type": "insert"}]))
    p.refresh(mode="incremental")
    assert writes == [("acct", "delta", small), ("total__agg0_0", "delta", small), ("total", "delta", small)]
    writes.clear()
    p.append("acct", changes(tmp_path / "c2.jsonl", [{"id": 3, "owner": "cy", "balance": 1, "_change_type": "insert"}]))
    p.refresh(mode="full")
    assert writes[0] == ("acct", "delta", small) and {w[1:] for w in writes[1:]} == {("base", "true")}, writes
    p.append("acct", changes(tmp_path / "c3.jsonl", [{"id": 9, "owner": "x", "balance": 1, "_change_type": "delete"}]))
    with pytest.raises(ChangeDataError):
        p.refresh()
    assert conf.get("spark.sql.adaptive.enabled") == "true"


def test_an_aggregate_whose_groups_did_not_change_plans_no_view_delta(make_project, tmp_path, monkeypatch):
    """When a change leaves a GROUP BY state as it was (its delta layer comes out empty: here the
    rows the WHERE drops), the view's delta rule over it is not planned and no view delta is written;
    a change that reaches the groups still writes both, and the view stays its recomputation."""
    from ivm.maintain.counting import Counting
    from ivm.storage import Warehouse

    sql = "SELECT owner, sum(balance) AS b, count(*) AS n FROM acct WHERE balance > 100 GROUP BY owner"
    p = make_project(TABLES, views={"big": {"sql": sql}})
    p.load("acct", changes(tmp_path / "acct.jsonl", [{"id": 1, "owner": "ann", "balance": 150}]))
    p.refresh()
    writes, planned = [], []
    write_layer, delta_rule = Warehouse.write_layer, Counting.delta_rule

    def spy_write(self, df, relation, kind, *args, **kwargs):
        writes.append(relation)
        return write_layer(self, df, relation, kind, *args, **kwargs)

    def spy_rule(self, pred, *args, **kwargs):
        planned.append(pred)
        return delta_rule(self, pred, *args, **kwargs)

    monkeypatch.setattr(Warehouse, "write_layer", spy_write)
    monkeypatch.setattr(Counting, "delta_rule", spy_rule)
    p.append("acct", changes(tmp_path / "c1.jsonl",
                             [{"id": 2, "owner": "ann", "balance": 5, "_change_type": "insert"}]))
    [work] = p.refresh(mode="incremental").views
    assert (work.mode, work.rows_changed) == (Mode.INCREMENTAL, 0)
    assert writes == ["acct", "big__agg0_0"] and "big" not in planned, (writes, planned)
    assert contents(p, "big") == Counter({("ann", 150, 1): 1})
    writes.clear()
    planned.clear()
    p.append("acct", changes(tmp_path / "c2.jsonl",
                             [{"id": 3, "owner": "ann", "balance": 200, "_change_type": "insert"}]))
    [work] = p.refresh(mode="incremental").views
    assert writes == ["acct", "big__agg0_0", "big"] and "big" in planned, (writes, planned)
    assert work.rows_changed == 2 and contents(p, "big") == Counter({("ann", 350, 2): 1})


def test_segments_keep_their_key_bounds_and_the_trim_merges_them(project, tmp_path, monkeypatch):
    """A large table's log segments record where their keys fall when they are appended
    (ivm.changes.ingest.segment_key_bounds); the trim of a range whose segments all have them merges
    them instead of querying the log (the query is made to fail here), and finds the same stored rows.
    A segment without them (appended while the table was small) sends the trim back to the query. (Where
    the driver reads a small change's keys itself, `ingest.log_keys`, neither is needed: made to decline
    here, as it does for a TIMESTAMP key or too many keys, until the end.)"""
    from ivm.changes import ingest, trim
    from ivm.refresh import trim as trim_stage
    from ivm.zset import KeyBounds

    monkeypatch.setattr(trim, "SKIP_MIN_ROWS", 1)  # (the two tables hold 2 rows each: "large" here)
    monkeypatch.setattr(trim_stage, "log_keys", lambda *args: None)
    project.append("acct", changes(tmp_path / "c0.jsonl", [
        {"id": 1, "owner": "ann", "balance": 10, "_change_type": "delete"}]))
    assert project.catalog.all_segments()[-1].key_bounds is None  # small at its append
    monkeypatch.setattr(ingest, "SKIP_MIN_ROWS", 1)
    project.append("acct", changes(tmp_path / "c1.jsonl", [
        {"id": 2, "owner": "bob", "balance": None, "_change_type": "update_preimage"},
        {"id": 2, "owner": "bob", "balance": 7, "_change_type": "update_postimage"},
        {"id": 40, "owner": "di", "balance": 1, "_change_type": "insert"}]))
    project.append("event", changes(tmp_path / "e1.jsonl", [
        {"kind": "a", "n": 1, "_change_type": "delete"}, {"kind": "b", "n": 2, "_change_type": "insert"}]))
    acct, event = project.catalog.all_segments()[-2:]
    assert KeyBounds.from_json(acct.key_bounds) == KeyBounds(((2, 2), (40, 40)))
    assert (acct.key_bounds["column"], acct.key_bounds["column_type"]) == ("id", "INT")  # (declared types normalized)
    # bounds recorded for another declaration of the table are not taken for this one
    assert trim.log_bounds(project.table("acct"), [acct.key_bounds]) == KeyBounds(((2, 2), (40, 40)))
    assert trim.log_bounds(project.table("acct"), [{**acct.key_bounds, "column_type": "BIGINT"}]) is None
    assert event.key_bounds is None  # a bag's first column is a string: its keys are cut in equal runs
    queried = []
    key_bounds = trim.key_bounds
    monkeypatch.setattr(trim, "key_bounds", lambda keys, column: queried.append(column) or key_bounds(keys, column))
    project.refresh()  # acct: a segment without bounds in the range; event: none recorded
    assert sorted(queried) == ["id", "kind"]
    assert contents(project, "acct") == Counter({(2, "bob", 7): 1, (40, "di", 1): 1})
    project.append("acct", changes(tmp_path / "c2.jsonl", [
        {"id": 40, "owner": "di", "balance": 1, "_change_type": "delete"},
        {"id": 3, "owner": "cy", "balance": 5, "_change_type": "insert"}]))
    monkeypatch.setattr(trim, "key_bounds", lambda keys, column: pytest.fail("the trim queried the log's keys"))
    result = project.refresh()
    assert {t.table: t.delta_rows for t in result.tables} == {"acct": 2}
    assert contents(project, "acct") == Counter({(2, "bob", 7): 1, (3, "cy", 5): 1})
    # the driver reads the keys of a segment without bounds (appended while small): no query either
    monkeypatch.setattr(ingest, "SKIP_MIN_ROWS", 10**6)
    monkeypatch.setattr(trim_stage, "log_keys", ingest.log_keys)
    project.append("event", changes(tmp_path / "e2.jsonl", [{"kind": "b", "n": 2, "_change_type": "delete"}]))
    assert project.catalog.all_segments()[-1].key_bounds is None
    project.refresh()
    assert contents(project, "event") == Counter({("a", 1): 1})
