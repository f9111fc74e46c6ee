"""What the Airflow DAGs need of a run beside its stages (ivm.refresh.stages): a stage's command line
(`parse_stage_args`: the same for a spark-submit of ``jobs/ivm_stage.py`` and a Python task), the ivm
run id of a DAG run, the views a run planned in a stratum (what the DAG maps a stratum's maintain task
over), the views it changed (the asset events it sends), the small summary each task returns as its
XCom, and which failures no retry can heal (`PERMANENT`). Nothing here imports Airflow."""

from __future__ import annotations

import argparse
import hashlib
import re

from ivm import sinks
from ivm.context import RunContext
from ivm.errors import ChangeDataError, ConfigError, NotFoundError, RunError, ValidationError
from ivm.modes import Mode
from ivm.refresh.plan import load_plan
from ivm.refresh.stages import STAGE_NAMES, StageArgs

#: exit codes (ivm.errors) of failures a retry cannot heal — a bad project or name (2), bad change data
#: (3), a stage out of order (6), a failed validation (7): the task fails at once. The others — Spark
#: lost, the catalog unreachable, a lease held (4, 5, 1, a killed process) — are retried.
PERMANENT: frozenset[int] = frozenset(e.exit_code for e in (ConfigError, NotFoundError, ChangeDataError, RunError,
                                                            ValidationError))


def parse_stage_args(argv: list[str]) -> tuple[str, str | None, StageArgs]:
    """A stage's command line, as the DAG's tasks render it: the stage, the project file and the
    `StageArgs`.

    >>> parse_stage_args(["plan", "--run-id", "r1", "--views", "a,b", "--from-version", ""])[2]
    StageArgs(run_id='r1', views=('a', 'b'), mode=<Mode.AUTO: 'auto'>, kind='refresh', from_version=None, sample=None)
    """
    ap = argparse.ArgumentParser(prog="ivm_stage.py", description="Run one stage of an ivm run.")
    ap.add_argument("stage", choices=STAGE_NAMES)
    ap.add_argument("--run-id", required=True, help="the ivm run (the same for every stage of it)")
    ap.add_argument("--project", help="the project file (default: $IVM_PROJECT, else ./ivm.yaml)")
    ap.add_argument("--views", default="", help="comma-separated views: what plan refreshes, what maintain maintains")
    ap.add_argument("--mode", default=Mode.AUTO, choices=[str(m) for m in Mode.asked()])
    ap.add_argument("--kind", default="refresh", choices=["refresh", "backfill"])
    ap.add_argument("--from-version", default="", help="plan a replay from this commit version (empty: none)")
    ap.add_argument("--sample", default="", help="validate: keys per view to recompute (empty: each view's own)")
    a = ap.parse_args(argv)
    return a.stage, a.project, StageArgs(a.run_id, tuple(v for v in a.views.split(",") if v), Mode(a.mode), a.kind,
                                         int(a.from_version) if a.from_version.strip() else None,
                                         int(a.sample) if a.sample.strip() else None)


def run_id_for(dag_id: str, airflow_run_id: str) -> str:
    """The ivm run of an Airflow DAG run: readable, fit for file names and at most 64 characters, the
    same on every task (and on a retry) of that DAG run."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{dag_id}-{airflow_run_id}").strip("_")
    digest = hashlib.sha1(f"{dag_id}/{airflow_run_id}".encode()).hexdigest()[:10]
    return f"{clean[:50]}-{digest}"


def views_of_stratum(ctx: RunContext, run_id: str, stratum: int) -> list[str]:
    """The views run ``run_id`` planned in ``stratum`` (what the DAG maps the stratum's task over)."""
    p, _ = load_plan(ctx, run_id)
    return [w.view for w in p.views if w.stratum == stratum]


def changed_views(ctx: RunContext, run_id: str) -> dict[str, dict]:
    """The views run ``run_id`` changed — maintained with a non-empty delta, or recomputed (a recompute
    does not count what changed) — each with its asset event's extra: the run, the view's catalog
    version, its Delta table and version (where the sink stage wrote one), rows changed and how."""
    p, _ = load_plan(ctx, run_id)
    written = sinks.written(ctx, run_id)
    out = {}
    for w in p.views:
        if w.mode is Mode.NOOP or (w.mode is Mode.INCREMENTAL and not w.rows_changed):
            continue
        sink = written.get(w.view, {})
        version = sink.get("view_version") or ctx.catalog.state(w.view).version_id
        out[w.view] = {"run_id": run_id, "view_version": version,
                       "rows_changed": w.rows_changed, "mode": str(w.mode),
                       "delta_table": sink.get("location"), "delta_version": sink.get("delta_version")}
    return out


def stage_summary(ctx: RunContext, run_id: str, stage: str, views: tuple[str, ...] = ()) -> dict:
    """What a stage's task returns as its XCom (with its seconds): the run, the relations the stage
    recorded (of ``views`` where given: one maintain task's) and the rows they changed."""
    records = [r for r in ctx.catalog.stage_records(run_id)
               if r.stage == stage and r.relation and (not views or r.relation in views)]
    return {"run": run_id, "stage": stage, "relations": [r.relation for r in records],
            "rows_changed": sum(r.delta_rows or 0 for r in records)}
