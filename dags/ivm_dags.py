"""ivm's Airflow DAGs, built from the project file ($IVM_PROJECT, else the demo project) by
ivm.orchestration.dags: one refresh DAG per schedule group and the backfill DAG."""

from pathlib import Path

from ivm.orchestration.dags import build_dags

globals().update(build_dags(jobs_dir=Path(__file__).resolve().parents[1] / "jobs"))
