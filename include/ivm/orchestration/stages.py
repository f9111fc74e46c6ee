"""What the Airflow DAGs need of a run beside its stages (ivm.refresh.stages, which ``jobs/ivm_stage.py``
runs under spark-submit): the ivm run id of a DAG run, the views a run planned in a stratum (what the
DAG maps a stratum's maintain task over), and the views it changed (the asset events it sends)."""

from __future__ import annotations

import hashlib
import re

from ivm.context import RunContext
from ivm.modes import Mode
from ivm.refresh.plan import load_plan


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
    run = ctx.catalog.get_run(run_id)
    sinks = {s.relation: s.detail for s in (run.stages if run else []) if s.stage == "sink"}
    out = {}
    for w in p.views:
        if w.mode is Mode.NOOP or (w.mode is Mode.INCREMENTAL and not w.rows_changed):
            continue
        sink = sinks.get(w.view, {})
        version = sink.get("view_version") or ctx.catalog.state(w.view).version_id
        out[w.view] = {"run_id": run_id, "view_version": version,
                       "rows_changed": w.rows_changed, "mode": str(w.mode),
                       "delta_table": sink.get("location"), "delta_version": sink.get("delta_version")}
    return out
