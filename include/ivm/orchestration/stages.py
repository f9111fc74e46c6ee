"""One stage of one run, as an Airflow task runs it: ``jobs/ivm_stage.py`` (under spark-submit) parses
its arguments and calls `run_stage`. Every stage reads what the stages before it recorded in the
catalog and records what it staged, so each task can run in its own process, on any machine, and be
retried (ivm.refresh explains why a retry is safe)."""

from __future__ import annotations

import hashlib
import logging
import re
import time

from tabulate import tabulate

from ivm import refresh
from ivm.errors import one_line
from ivm.project import Project

log = logging.getLogger(__name__)

STAGES = ("plan", "trim", "maintain", "validate", "publish", "compact", "report")
#: the stages whose work is Spark's: Spark starts before them. The others read and write the catalog and
#: start Spark only if they come to need it (`Project.spark`: compact with something to compact); a
#: spark-submit of theirs takes no executors from the cluster otherwise
SPARK_STAGES = ("trim", "maintain", "validate")


def run_id_for(dag_id: str, airflow_run_id: str) -> str:
    """The ivm run of an Airflow DAG run: readable, fit for file names and at most 64 characters, the
    same on every task (and on a retry) of that DAG run."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{dag_id}-{airflow_run_id}").strip("_")
    digest = hashlib.sha1(f"{dag_id}/{airflow_run_id}".encode()).hexdigest()[:10]
    return f"{clean[:50]}-{digest}"


def run_stage(project: Project, stage: str, run_id: str, views: list[str] | None = None, mode: str = "auto",
              kind: str = "refresh", from_version: int | None = None,
              sample: int | None = None) -> refresh.RefreshResult | None:
    """Run ``stage`` of run ``run_id``; progress and timings go to the log (the task log in Airflow).
    ``views``, ``mode`` and ``from_version`` (a replay) matter to ``plan`` (which views the run
    refreshes, and how); ``views`` to ``maintain`` too (which of the planned views this task
    maintains: one stratum's, or one view); ``sample`` to ``validate``."""
    started = time.perf_counter()
    say = log.info
    say("ivm %s: run %s%s", stage, run_id, f", views {', '.join(views)}" if views else "")
    try:
        if stage in SPARK_STAGES:
            _ = project.spark
        if stage == "plan":
            p = refresh.plan(project, views or None, mode, run_id, from_version)
            refresh.begin(project, p, kind)
            say("plan: snapshot %s; %d tables, %d views: %s", p.snapshot, len(p.tables), len(p.views),
                "; ".join(f"{w.view} (stratum {w.stratum}): {w.mode}, {w.reason}" for w in p.views) or "nothing to do")
        elif stage == "trim":
            refresh.trim_stage(project, run_id, say)
        elif stage == "maintain":
            refresh.maintain_stage(project, run_id, views or None, say)
        elif stage == "validate":
            refresh.validate_stage(project, run_id, say, sample)
        elif stage == "publish":
            return refresh.publish_stage(project, run_id, say)
        elif stage == "compact":
            refresh.compact_stage(project, run_id, say)
        elif stage == "report":
            result = refresh.report(project, run_id)
            say("run %s %s\n%s", run_id, result.status,
                tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))
            return result
        else:
            raise ValueError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    except Exception as e:
        # the run stays retryable: its leases hold until they expire or a retry publishes
        project.catalog.finish_run(run_id, "failed", f"{stage}: {one_line(e)}", keep_leases=True)
        raise
    finally:
        say("ivm %s: done in %.2f s", stage, time.perf_counter() - started)
    return None


def views_of_stratum(project: Project, run_id: str, stratum: int) -> list[str]:
    """The views run ``run_id`` planned in ``stratum`` (what the DAG maps the stratum's task over)."""
    p, _ = refresh.load_plan(project, run_id)
    return [w.view for w in p.views if w.stratum == stratum]
