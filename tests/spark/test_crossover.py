"""`--mode auto` past the crossover: a view whose measured incremental refreshes cost more than its
measured recompute for the run's change is recomputed, with both estimates in the run's record; below
the crossover it stays incremental; `--mode incremental` never asks. The history is the catalog's run
stages: two earlier refreshes are recorded there with chosen times, the recompute is the real first
materialization."""

from __future__ import annotations

from ivm.catalog.store import StageRecord
from ivm.changes import cancel
from tests.helpers import as_zset, write_jsonl

TABLES = {"t": {"columns": {"k": "int", "v": "int"}, "key": ["k"]}}
VIEW = {"sql": "SELECT v, count(*) AS n FROM t GROUP BY v",
        "crossover": {"min_saving_seconds": 0, "ratio": 1}}


def _history(p, seconds_per_row: float) -> None:
    """Two succeeded refreshes of the view, 1 and 3 changed rows, at ``seconds_per_row``."""
    for n, rows in enumerate([1, 3]):
        run = f"measured-{seconds_per_row}-{n}"
        p.catalog.start_run(run, "refresh")
        p.catalog.save_stage(run, StageRecord("maintain", "v", mode="incremental", rows_in=rows,
                                              seconds=rows * seconds_per_row))
        p.catalog.finish_run(run, "succeeded")


def _change(p, tmp_path, n: int, rows: list[tuple]) -> None:
    p.append("t", write_jsonl(tmp_path / f"c{n}.jsonl", ["k", "v"], rows, ["insert"] * len(rows)))


def test_auto_recomputes_past_the_crossover_and_records_both_estimates(make_project, tmp_path, capsys):
    p = make_project(TABLES, views={"v": VIEW})
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v"], [(k, k % 3) for k in range(20)]))
    first = p.refresh()
    assert first.views[0].mode == "full"
    full_s = p.catalog.maintain_history("v", "full", 1)[0][1]

    _history(p, seconds_per_row=1000.0)  # incremental: 1,000 s per changed row, far past the recompute
    _change(p, tmp_path, 1, [(100, 1), (101, 2)])
    result = p.refresh()
    [work] = result.views
    assert work.mode == "full" and work.reason.startswith("auto: estimated 2000.0 s incremental for 2 changed rows")
    stage = next(s for s in p.runs(1)[0].stages if s.stage == "maintain")
    est = stage.detail["choice"]["crossover"]
    assert est["full"] and est["incremental_s"] == 2000.0 and est["full_s"] == round(full_s, 3)
    assert est["points"] == 2
    assert as_zset(p.read_zset("v").collect()) == {(0, 7): 1, (1, 8): 1, (2, 7): 1}

    # `ivm runs` shows the estimates
    from tests.helpers import run
    code, out, _ = run(capsys, "runs", "--limit", "1", "--project", str(tmp_path / "project" / "ivm.yaml"))
    assert code == 0 and "v full" in out and "(auto: est. 2000.0s inc" in out

    # --mode incremental does not ask the crossover
    _change(p, tmp_path, 2, [(102, 0)])
    assert p.refresh(mode="incremental").views[0].mode == "incremental"


def test_auto_stays_incremental_below_the_crossover(make_project, tmp_path):
    p = make_project(TABLES, views={"v": VIEW})
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v"], [(k, k % 3) for k in range(20)]))
    p.refresh()
    _history(p, seconds_per_row=0.0001)
    _change(p, tmp_path, 1, [(100, 1)])
    [work] = p.refresh().views
    assert work.mode == "incremental"
    est = next(s for s in p.runs(1)[0].stages if s.stage == "maintain").detail["choice"]["crossover"]
    assert not est["full"] and est["incremental_s"] < est["full_s"]
    assert as_zset(p.read_zset("v").collect()) == {(0, 7): 1, (1, 8): 1, (2, 6): 1}


def test_auto_weighs_net_deltas_a_change_and_its_undoing_is_nothing_to_do(make_project, tmp_path, monkeypatch):
    """A change and its undoing is nothing to do: the plan finds it on the driver (ivm.changes.cancel) and
    starts no run. Where that is left to Spark (here: forced, CANCEL_MAX_ROWS 0), the plan sees the log's
    rows (4, past the crossover at 1,000 s per row); the trim nets them to nothing, and the view is then
    neither recomputed nor maintained. A change stays as planned where the net deltas hold what the plan
    saw (the tests above)."""
    p = make_project(TABLES, views={"v": VIEW})
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v"], [(k, k % 3) for k in range(20)]))
    p.refresh()
    full_s = p.catalog.maintain_history("v", "full", 1)[0][1]
    _history(p, seconds_per_row=full_s + 0.01)  # one changed row costs about a recompute: four, four times
    _change(p, tmp_path, 1, [(100, 1), (101, 2)])
    p.append("t", write_jsonl(tmp_path / "undo.jsonl", ["k", "v"], [(100, 1), (101, 2)], ["delete", "delete"]))
    assert p.refresh().status == "noop"
    monkeypatch.setattr(cancel, "CANCEL_MAX_ROWS", 0)
    result = p.refresh()
    [work] = result.views
    assert work.mode == "noop", work.reason
    planned = next(s for s in p.runs(1)[0].stages if s.stage == "plan").detail["views"][0]
    assert planned["mode"] == "full" and planned["reason"].startswith("auto: estimated")  # (on the log's 4 rows)
    assert {t.table: t.delta_rows for t in result.tables} == {"t": 0}
    assert as_zset(p.read_zset("v").collect()) == {(0, 7): 1, (1, 7): 1, (2, 6): 1}
