"""The stage contract (docs/design.md §6, ivm.refresh) through the stage commands the Airflow tasks run
(ivm.refresh.stages.run_stage), each stage with a project of its own, as separate processes
have: a maintenance stage killed mid-way and retried, and a whole run re-run after a failed publish,
leave every view equal to its full recomputation and the log applied exactly once; a published run is
final; a refresh of some views does not lose the others' deltas."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from ivm import Project, gc
from ivm.errors import CatalogError, RunError
from ivm.maintain.counting import Counting
from ivm.orchestration.stages import run_id_for
from ivm.refresh import load_plan
from ivm.refresh.stages import STAGE_NAMES, StageArgs, run_stage
from ivm.spark import session
from tests.conftest import drawn_stream
from tests.helpers import (
    ROWS,
    STREAMS,
    apply_batch,
    assert_views_recomputed,
    batch,
    corrupt,
    lines,
    rows,
    write_jsonl,
)

TABLES = {"t": {"columns": {"k": "string", "v": "int"}}, "u": {"columns": {"k": "string", "w": "int"}}}
VIEWS = {"per_k": {"sql": "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k"},
         "joined": {"sql": "SELECT t.k, t.v, u.w FROM t JOIN u ON t.k = u.k"},
         "big": {"sql": "SELECT k, n FROM per_k WHERE n > 1"}}
STAGES = STAGE_NAMES


def zset(project: Project, name: str) -> Counter:
    return Counter({tuple(r[:-1]): r[-1] for r in project.read_zset(name).collect()})


@pytest.fixture
def setup(make_project, tmp_path):
    p = make_project(TABLES, views=VIEWS)
    p.load("t", lines(tmp_path / "t.jsonl", [("a", 1), ("a", 2), ("b", 3)], cols=("k", "v")))
    p.load("u", lines(tmp_path / "u.jsonl", [("a", 10), ("b", 20)], cols=("k", "w")))
    p.refresh()
    p.append("t", lines(tmp_path / "c1.jsonl", [("a", 5), ("b", 3)], "insert", cols=("k", "v")))
    p.append("u", lines(tmp_path / "c2.jsonl", [("b", 20)], "delete", cols=("k", "w")))
    path = str(tmp_path / "project" / "ivm.yaml")
    return p, path


def stage(path: str, name: str, run_id: str, started: list[str] | None = None, **kwargs):
    """One stage as its own task would run it: a fresh Project on the same files; ``started`` collects
    the stages that started Spark (jobs/ivm_stage.py starts it on first use, as here)."""

    def start_spark():
        if started is not None:
            started.append(name)
        return session()  # (the test session)

    p = Project.open(path, start_spark=start_spark)
    try:
        if "views" in kwargs:
            kwargs["views"] = tuple(kwargs["views"])
        return run_stage(p.ctx, name, StageArgs(run_id, **kwargs))
    finally:
        p.close()


def test_stages_one_by_one_match_in_process_refresh(setup):
    p, path = setup
    run_id = run_id_for("ivm_refresh", "manual__2026-11-26T08:00:00+00:00")
    assert len(run_id) <= 64 and run_id == run_id_for("ivm_refresh", "manual__2026-11-26T08:00:00+00:00")
    started: list[str] = []
    stage(path, "plan", run_id, started)
    stage(path, "trim", run_id, started)
    stage(path, "maintain", run_id, started, views=["per_k", "joined"])  # stratum by stratum, as the DAG maps them
    with pytest.raises(RunError, match="has not been staged yet"):
        stage(path, "publish", run_id, started)  # big is not maintained: nothing may be published
    stage(path, "maintain", run_id, started, views=["big"])
    for name in ["validate", "publish", "compact"]:
        stage(path, name, run_id, started)
    result = stage(path, "report", run_id, started)
    # the stages that only read and write the catalog start no Spark application (no executors taken)
    assert started == ["trim", "maintain", "maintain", "validate"]
    assert result.status == "succeeded"
    assert {v.view: v.mode for v in result.views} == dict.fromkeys(VIEWS, "incremental")
    assert zset(p, "t") == Counter({("a", 1): 1, ("a", 2): 1, ("a", 5): 1, ("b", 3): 2})
    assert_views_recomputed(p)
    assert {s.status for s in p.catalog.get_run(run_id).stages} == {"succeeded"}
    with pytest.raises(RunError, match="was published already"):
        stage(path, "plan", run_id)


@pytest.mark.parametrize("tasks", ["one process", "a task per stratum"])
def test_a_recomputed_view_passes_its_difference_up(setup, make_project, tasks):
    """#48, no cascade: per_k's definition changed, so the run recomputes it; big, which reads it, is
    maintained from per_k's new state minus its old one (000 Algorithm 4.1: a view's Δ passes up), not
    recomputed — in one process (`ivm refresh`) and with per_k and big maintained by separate tasks
    (the DAG's), where big's task reads the difference from per_k's staged base layer and its old one."""
    p, path = setup
    p.refresh()  # big: (a, 3), (b, 2)
    p.append("t", lines(Path(p.config.root) / "c3.jsonl", [("a", 7), ("c", 1)], "insert", cols=("k", "v")))
    changed = dict(VIEWS, per_k={"sql": "SELECT k, count(*) AS n, sum(v) AS s FROM t WHERE v <> 3 GROUP BY k"})
    again = make_project(TABLES, views=changed, root=Path(p.config.root))
    if tasks == "one process":
        result = again.refresh()
    else:
        run_id = "no-cascade"
        for name in ["plan", "trim"]:
            stage(path, name, run_id)
        stage(path, "maintain", run_id, views=["per_k", "joined"])
        stage(path, "maintain", run_id, views=["big"])
        for name in ["validate", "publish"]:
            stage(path, name, run_id)
        result = stage(path, "report", run_id)
    modes = {v.view: (v.mode, v.reason) for v in result.views}
    assert modes["per_k"] == ("full", "the definition changed")
    assert modes["big"][0] == "incremental" and "reads per_k, recomputed in this run" in modes["big"][1]
    assert zset(again, "big") == Counter({("a", 4): 1})  # a: 1, 2, 5, 7; b's 3s are filtered now; c: 1
    assert_views_recomputed(again)


#: a view recomputed on every run (``mode: full``) and views that read it: a bag with a filter, a global
#: aggregate, a set
ABOVE_FULL = {"low": {"sql": "SELECT b, count(*) AS n, sum(a) AS s FROM r GROUP BY b", "mode": "full"},
              "pairs": {"sql": "SELECT b, n FROM low WHERE n > 1"},
              "total": {"sql": "SELECT count(*) AS c, sum(s) AS s FROM low"},
              "sizes": {"sql": "SELECT DISTINCT n FROM low"}}


def assert_as_duckdb(p: Project, tables: dict[str, dict[str, str]], state: dict[str, list[tuple]], views: dict) -> None:
    """Every view as DuckDB runs its SQL over the same rows of the tables."""
    con = duckdb.connect()
    for t, columns in tables.items():
        con.execute(f"CREATE TABLE {t} ({', '.join(f'{c} {y}' for c, y in columns.items())})")
        if state[t]:
            con.executemany(f"INSERT INTO {t} VALUES ({', '.join('?' for _ in columns)})", state[t])
    for view, spec in views.items():
        con.execute(f"CREATE VIEW {view} AS {spec['sql']}")
        assert rows(tuple(r) for r in p.read(view).collect()) == rows(
            con.execute(f"SELECT * FROM {view}").fetchall()), view


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_views_above_a_recomputed_view_follow_change_streams(make_project, tmp_path_factory, data):
    """#48, no cascade, differentially: ``low`` is recomputed by every run and the views that read it are
    maintained from its difference; over hypothesis change streams of ``r`` (inserts, deletes, updates,
    NULLs, duplicates, emptied groups) every view equals its full recomputation and DuckDB after each run."""
    drawn_stream(data)
    root = tmp_path_factory.mktemp("above-full")
    cols = ["a", "b"]
    p = make_project({"r": {"columns": {"a": "int", "b": "string"}}}, root=root / "p", views=ABOVE_FULL)
    state = {"r": data.draw(st.lists(ROWS["r"], max_size=8), "initial")}
    p.load("r", write_jsonl(root / "r-0.jsonl", cols, state["r"]))
    p.refresh()
    for n in range(1, 4):
        changes = {t: c for t, c in data.draw(batch(state), f"batch {n}").items() if t == "r"}
        apply_batch(state, changes)
        if changes:
            p.append("r", write_jsonl(root / f"r-{n}.jsonl", cols, [r for _, r in changes["r"]],
                                      [k for k, _ in changes["r"]]))
        modes = {v.view: v.mode for v in p.refresh().views}
        assert modes.get("low") in (None, "full") and "full" not in {modes.get(v) for v in ABOVE_FULL if v != "low"}
        assert_views_recomputed(p)
        assert_as_duckdb(p, {"r": {"a": "int", "b": "string"}}, state, ABOVE_FULL)


BEHIND = {"r_only": {"sql": "SELECT b, count(*) AS n, sum(a) AS total FROM r GROUP BY b"},
          "rs": {"sql": "SELECT r.a, r.b, s.c FROM r JOIN s ON r.b = s.b"},
          "rs_max": {"sql": "SELECT b, max(c) AS m, min(a) AS lo, count(*) AS n FROM rs GROUP BY b"},
          "r_set": {"sql": "SELECT DISTINCT b FROM r WHERE a IS NOT NULL"}}


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_views_left_behind_catch_up_from_their_pointers(make_project, tmp_path_factory, data):
    """#48, per-view pointers, differentially: each batch is refreshed either for ``r_only`` alone (its
    run trims r, passing the other views by) or for every view; the views left behind (a join, a MIN/MAX
    aggregate over it, a set) catch up incrementally from their own pointers, over hypothesis change
    streams of r and s (inserts, deletes, updates, NULLs, duplicates, deletes of the current MIN/MAX,
    emptied groups), and after each run of every view each equals its full recomputation and DuckDB. When
    drawn, r is compacted while they lag: their catch-up then reads r's log since their pointer (#71 item
    2, `Maintenance._log_since`)."""
    drawn_stream(data)
    root = tmp_path_factory.mktemp("behind")
    tables = {"r": {"columns": {"a": "int", "b": "string"}}, "s": {"columns": {"b": "string", "c": "int"}}}
    cols = {"r": ["a", "b"], "s": ["b", "c"]}
    p = make_project(tables, root=root / "p", views=BEHIND)
    state = {t: data.draw(st.lists(ROWS[t], max_size=8), f"initial {t}") for t in tables}
    for t in tables:
        p.load(t, write_jsonl(root / f"{t}-0.jsonl", cols[t], state[t]))
    p.refresh()
    passed_by = False  # a run of r_only alone applied changes of r: the other views fell behind
    for n in range(1, 6):
        changes = data.draw(batch(state), f"batch {n}")
        apply_batch(state, changes)
        for t, items in changes.items():
            if items:
                p.append(t, write_jsonl(root / f"{t}-{n}.jsonl", cols[t], [r for _, r in items], [k for k, _ in items]))
        if n == 1 or (n < 5 and data.draw(st.booleans(), f"batch {n}: r_only alone")):
            passed_by |= bool(p.refresh(["r_only"]).tables)
            if data.draw(st.booleans(), f"batch {n}: r compacted while the others lag"):
                p.compact(["r"], force=True)
            continue
        works = p.refresh().views
        assert "full" not in {w.mode for w in works}, [(w.view, w.reason) for w in works]
        behind = {w.view for w in works if "catches up from its own pointer" in w.reason}
        assert behind == ({"rs", "rs_max", "r_set"} if passed_by else set()), [(w.view, w.reason) for w in works]
        passed_by = False
        assert_views_recomputed(p)
        assert_as_duckdb(p, {t: spec["columns"] for t, spec in tables.items()}, state, BEHIND)


def test_views_compacted_while_they_lag_catch_up_without_a_recompute(make_project, tmp_path):
    """#71 item 1: a view another run passed by, compacted while it lags — the view itself, its GROUP BY
    states, the view it reads — still finds its pointer (a compaction holds the state it replaced,
    `Catalog.same_states`), catches up incrementally, and equals its recompute and DuckDB."""
    tables = {"r": {"columns": {"a": "int", "b": "string"}}, "s": {"columns": {"b": "string", "c": "int"}}}
    cols = {"r": ["a", "b"], "s": ["b", "c"]}
    p = make_project(tables, views=BEHIND)
    state = {"r": [(1, "x"), (2, "x"), (3, "y"), (None, "y")], "s": [("x", 10), ("y", 20), ("y", 21)]}
    for t in tables:
        p.load(t, write_jsonl(tmp_path / f"{t}-0.jsonl", cols[t], state[t]))
    p.refresh()
    batches = [{"r": [("insert", (4, "x")), ("delete", (3, "y"))], "s": [("insert", ("x", 12))]},  # all views
               {"r": [("delete", (1, "x")), ("insert", (5, "z"))]},                             # r_only alone
               {"r": [("insert", (6, "y"))], "s": [("delete", ("y", 21))]}]                     # all, behind
    for n, changes in enumerate(batches, 1):
        apply_batch(state, changes)
        for t, items in changes.items():
            p.append(t, write_jsonl(tmp_path / f"{t}-{n}.jsonl", cols[t], [r for _, r in items], [k for k, _ in items]))
        if n == 2:
            assert p.refresh(["r_only"]).tables
            lagging = sorted({r for v in ("rs", "rs_max", "r_set") for r in p.stored_relations(v)})
            # (and r: their catch-up reads its log since their pointer, #71 item 2)
            compacted = {c.relation for c in p.compact([*lagging, "r"], force=True)}
            assert {"rs", "rs_max", "r_set", "r"} <= compacted and any(r.startswith("rs_max") and r != "rs_max"
                                                                  for r in compacted), compacted
            continue
        works = p.refresh().views
        assert "full" not in {w.mode for w in works}, [(w.view, w.reason) for w in works]
    assert {w.view for w in works if "catches up from its own pointer" in w.reason} == {"rs", "rs_max", "r_set"}
    assert_views_recomputed(p)
    assert_as_duckdb(p, {t: spec["columns"] for t, spec in tables.items()}, state, BEHIND)


def test_a_maintenance_task_killed_midway_and_retried(setup, monkeypatch):
    p, path = setup
    run_id = "retry-maintain"
    for name in ["plan", "trim"]:
        stage(path, name, run_id)
    calls = []
    real = Counting.maintain

    def dies_on_the_second_predicate(self, pred):
        calls.append(pred)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")  # after the first delta layer was written
        return real(self, pred)

    monkeypatch.setattr(Counting, "maintain", dies_on_the_second_predicate)
    with pytest.raises(KeyboardInterrupt):
        stage(path, "maintain", run_id)
    assert p.catalog.get_run(run_id).status == "running"  # nothing published, the run goes on
    monkeypatch.setattr(Counting, "maintain", real)
    for name in ["maintain", "validate", "publish"]:  # the retried task, then the rest of the run
        stage(path, name, run_id)
    assert zset(p, "t") == Counter({("a", 1): 1, ("a", 2): 1, ("a", 5): 1, ("b", 3): 2})
    assert_views_recomputed(p)
    # the retry overwrote its own files: one delta layer per relation, and the log was applied once
    assert [x.kind for x in p.catalog.state("per_k").layers].count("delta") == 1


def test_a_run_re_run_after_a_failed_publish(setup, monkeypatch):
    p, path = setup
    run_id = "rerun-publish"
    for name in ["plan", "trim", "maintain", "validate"]:
        stage(path, name, run_id)

    def fails(*args, **kwargs):
        raise CatalogError("the catalog went away")

    monkeypatch.setattr("ivm.catalog.store.Catalog.publish", fails)
    with pytest.raises(CatalogError):
        stage(path, "publish", run_id)
    monkeypatch.undo()
    run = p.catalog.get_run(run_id)
    assert run.status == "failed" and run.error == "publish: the catalog went away"
    assert zset(p, "t") == Counter({("a", 1): 1, ("a", 2): 1, ("b", 3): 1})  # nothing applied
    for name in STAGES:  # the whole DAG run again, same run id
        stage(path, name, run_id)
    assert p.catalog.get_run(run_id).status == "succeeded"
    assert zset(p, "t") == Counter({("a", 1): 1, ("a", 2): 1, ("a", 5): 1, ("b", 3): 2})
    assert p.catalog.watermarks()[("t", "t")] == 1 and p.catalog.watermarks()[("per_k", "t")] == 1
    assert_views_recomputed(p)
    stage(path, "plan", "next")  # a new run finds nothing left to apply
    assert stage(path, "publish", "next").status == p.catalog.get_run("next").status == "noop"
    assert zset(p, "t") == Counter({("a", 1): 1, ("a", 2): 1, ("a", 5): 1, ("b", 3): 2})


def test_refreshing_some_views_keeps_the_others_correct(setup, tmp_path, caplog):
    """A refresh of per_k trims only t; joined, which also reads t, and big, which reads per_k, catch up
    on their next refresh from their own pointers (#48, item 1: the states the run before published, and
    t's and per_k's changes since), incrementally, and end equal to the full recomputation; twice over,
    the second time with per_k and t compacted in between (per_k's changes since are then its new state
    minus the old one; t's, its log since the pointer, trimmed: #71 item 2, 002 §3(b)). Once `ivm gc` has
    dropped the state at a view's pointer, the view is recomputed and the run says why."""
    p, _ = setup
    for n, compact in enumerate([False, True]):
        result = p.refresh(["per_k"])
        assert [t.table for t in result.tables] == ["t"] and [v.view for v in result.views] == ["per_k"]
        if compact:
            p.compact(["per_k", "t"], force=True)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ivm.refresh.maintenance"):
            result = p.refresh()
        from_log = [m for m in caplog.messages if m.startswith("t: catching up from commit version")]
        assert bool(from_log) == compact, caplog.messages  # (each view that reads t and lags)
        modes = {v.view: (v.mode, v.reason) for v in result.views}
        assert modes["joined"][0] == modes["big"][0] == "incremental", modes
        assert "catches up from its own pointer, the state run " in modes["joined"][1]
        assert f"t {n + 1}..{n + 1} applied since without it" in modes["joined"][1], modes
        assert_views_recomputed(p)
        p.append("t", lines(tmp_path / f"more-{n}.jsonl", [("a", 7 + n), ("b", 8)], "insert", cols=("k", "v")))
        p.append("u", lines(tmp_path / f"more-u-{n}.jsonl", [("a", 30 + n)], "insert", cols=("k", "w")))
    p.refresh(["per_k"])
    gc.collect(p, now=datetime.now(UTC) + timedelta(days=365))
    modes = {v.view: (v.mode, v.reason) for v in p.refresh().views}
    assert modes["joined"][0] == "full" and "were applied by a run that did not refresh this view, and the state of " \
        in modes["joined"][1] and "was garbage-collected (storage.retention_hours)" in modes["joined"][1], modes
    assert_views_recomputed(p)


def test_backfill_on_the_command_line(setup, capsys):
    """`ivm backfill VIEW --full` recomputes the view and what it reads; without --full it catches the
    views up like a refresh of them; an unknown view is a one-line error."""
    from ivm.cli import main

    p, path = setup
    assert main(["backfill", "big", "--full", "--project", path]) == 0
    out = capsys.readouterr().out
    assert "maintain: per_k (stratum 2): full recompute (--mode full)" in out and "backfill succeeded" in out
    run = p.runs(1)[0]
    assert run.kind == "backfill" and {s.relation: s.mode for s in run.stages if s.stage == "maintain"} == {
        "per_k": "full", "big": "full"}
    p.refresh()  # joined, which the backfill left behind, catches up
    assert_views_recomputed(p)
    assert main(["backfill", "nope", "--project", path]) == 2
    assert capsys.readouterr().err == "ivm: error: unknown view 'nope'\n"




@pytest.fixture
def three_runs(setup, tmp_path):
    """Runs at t@0/u@0 (after the loads), t@1/u@1 and t@2/u@2; then per_k gains a tuple and joined loses
    one that the log never changed."""
    p, path = setup
    p.refresh()
    p.append("t", lines(tmp_path / "c3.jsonl", [("a", 1), ("b", 3)], "delete", cols=("k", "v")))
    p.append("t", lines(tmp_path / "c4.jsonl", [("c", 4), ("a", 1)], "insert", cols=("k", "v")))
    p.append("u", lines(tmp_path / "c5.jsonl", [("c", 30)], "insert", cols=("k", "w")))
    p.refresh()
    runs = {r.snapshot["t"]: r.id for r in p.runs(10) if r.kind == "refresh"}
    assert sorted(runs) == [0, 1, 3]
    corrupt(p, "per_k", lambda df: df.withColumn("k", F.lit("zz")))
    corrupt(p, "joined", lambda df: df.withColumn("__count", -F.col("__count")))
    with pytest.raises(AssertionError):
        assert_views_recomputed(p)
    return p, path, runs


def test_a_replay_from_a_commit_version_repairs_the_views(three_runs):
    """`--from-version 2` through the stage commands (the backfill DAG's): the views go back to the state
    after the run at t@1/u@1 and the changes since are applied again, read from the tables' published
    delta layers; the tables and their watermarks stay as they are, and the next refresh is incremental."""
    p, path, runs = three_runs
    tables, marks = {t: zset(p, t) for t in TABLES}, p.catalog.watermarks()
    run_id = "replay-2"
    stage(path, "plan", run_id, views=["big", "joined"], kind="backfill", from_version=2)
    plan, _ = load_plan(p.ctx, run_id)
    assert plan.replay.run_id == runs[1] and plan.replay.snapshot == {"t": 1, "u": 1}
    assert [(t.table, t.from_version, t.to_version) for t in plan.tables] == [("t", 1, 3), ("u", 1, 2)]
    assert {v.view: v.mode for v in plan.views} == dict.fromkeys(VIEWS, "incremental")
    assert f"replay from the state after run {runs[1]} (commit versions t 2..3; u 2..2)" in plan.views[0].reason
    for name in STAGES[1:]:
        stage(path, name, run_id)
    assert_views_recomputed(p)
    trimmed = {s.relation: s for s in p.catalog.get_run(run_id).stages if s.stage == "trim"}
    # t's changes since t@1: the delta layer the run at t@3 published ((a, 1) out and in again cancel)
    assert trimmed["t"].rows_in == trimmed["t"].delta_rows == 2
    assert {t: zset(p, t) for t in TABLES} == tables and p.catalog.watermarks() == marks
    run = p.catalog.get_run(run_id)
    assert (run.kind, run.mode, run.status) == ("backfill", "replay", "succeeded")
    p.append("u", lines(Path(path).parent / "c6.jsonl", [("a", 10)], "delete", cols=("k", "w")))
    assert {v.view: v.mode for v in p.refresh().views} == {"joined": "incremental"}
    assert_views_recomputed(p)


def test_a_replay_across_a_compaction_and_its_refusals(three_runs, capsys):
    """After a compaction the changes are the difference of the two states; `ivm backfill --from-version`
    on the command line; a replay from before every recorded state, with --full, or from states garbage
    collection dropped, is refused with one line and changes nothing."""
    from ivm.cli import main

    p, path, runs = three_runs
    p.compact(["t", "u"], force=True)
    assert main(["backfill", "big", "joined", "--from-version", "3", "--project", path]) == 0
    assert f"replay from commit version 3: the state after run {runs[1]} (t@1, u@1)" in capsys.readouterr().out
    assert_views_recomputed(p)
    with pytest.raises(SystemExit) as exit_:
        main(["backfill", "big", "--from-version", "2", "--full", "--project", path])
    assert exit_.value.code == 2 and "argument --full: not allowed with argument --from-version" in \
        capsys.readouterr().err
    versions = {v: p.catalog.state(v).version_id for v in VIEWS}
    assert main(["backfill", "big", "--from-version", "0", "--project", path]) == 2
    assert capsys.readouterr().err == "ivm: error: --from-version 0: commit versions start at 1\n"
    gc.collect(p, now=datetime.now(UTC) + timedelta(days=365))
    assert main(["backfill", "big", "--from-version", "2", "--project", path]) != 0
    err = capsys.readouterr().err
    assert err.startswith("ivm: error: cannot replay from commit version 2: the state of ") and \
        f"after run {runs[1]} was garbage-collected (storage.retention_hours); use --full" in err
    assert {v: p.catalog.state(v).version_id for v in VIEWS} == versions
