"""What the Airflow DAGs need of a run beside its stages (ivm.refresh.stages, which ``jobs/ivm_stage.py``
runs under spark-submit): the ivm run id of a DAG run, and the views a run planned in a stratum (what
the DAG maps a stratum's maintain task over)."""

from __future__ import annotations

import hashlib
import re

from ivm.context import RunContext
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
