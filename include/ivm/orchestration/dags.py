"""The DAG factory (DESIGN.md §9): from the project file, one scheduled refresh DAG per schedule group
and one backfill DAG for manual runs, every stage a spark-submit of ``jobs/ivm_stage.py``.

    ivm_refresh[_<schedule>]   plan → trim → maintain_stratum_1 … n → validate → publish → sink → assets
                               → compact → report (a task per stage of ivm.refresh.stages.STAGES, and
                               the asset events of the views the run changed)
    ivm_backfill               the same, triggered by hand with params: views, full, from_version, sample

The validate task links to the run's data-quality page (ivm.orchestration.links, plugins/).

Assets (data-aware scheduling): every view is the Airflow asset ``ivm://<project>/<view>``. After the
stage that makes a run's views readable outside ivm (the sink: their Delta tables), the ``assets`` task
sends an asset event for each view whose content the run changed — none for the others — with the
view's catalog version, Delta version and rows changed in its extra (through one `AssetAlias` per DAG:
Airflow sends an event for each asset a task adds to it, where a static outlet sends one for every
asset on every success). A Delta source is the asset of its location (``file:///...``, ``s3://...``;
``table://<name>`` for a table named in the Spark catalog): the plan task declares the sources its views
read as inlets, and a schedule group whose ``schedule`` is ``@sources`` runs whenever one of them gets
an asset event (the user's pipeline declaring the source as its outlet) instead of on a cron string.

Each ``maintain_stratum_k`` is mapped over the views the run planned in stratum k (a small Python task,
``views_stratum_k``, reads them from the run's record), so the views of one stratum run side by side
and an empty stratum is skipped. All tasks of one DAG run share one ivm run id, derived from the DAG
run; ``publish`` is the only task that changes what readers see.

The project file is found the way the CLI finds it: ``IVM_PROJECT``, else the demo project. The Spark
connection is ``spark_default`` (``IVM_SPARK_CONN_ID`` to choose another): ``local[*]`` runs the jobs
on the Airflow worker, ``spark://host:7077`` on a standalone cluster, which receives the ivm package
from the job (ivm.spark.ship_package).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from ivm.config import PROJECT_ENV, ProjectConfig, load_project, resolve_location
from ivm.errors import ConfigError
from ivm.orchestration.stages import run_id_for
from ivm.spark import project_conf, with_delta

#: where the demo project lives, for a deployment that does not set IVM_PROJECT
DEMO_PROJECT = Path(__file__).resolve().parents[2] / "views" / "demo" / "ivm.yaml"
RUN = "{{ ivm_run_id(dag.dag_id, run_id) }}"
#: a view's ``schedule`` that runs its group on its Delta sources' asset events
SOURCES_SCHEDULE = "@sources"


def project_file() -> str:
    return os.environ.get(PROJECT_ENV) or str(DEMO_PROJECT)


def schedule_groups(config: ProjectConfig) -> dict[str | None, list[str]]:
    """Views by their ``schedule`` (None: no schedule, refreshed when triggered)."""
    groups: dict[str | None, list[str]] = {}
    for name, view in config.views.items():
        groups.setdefault(view.schedule, []).append(name)
    return groups


def dag_id_for(schedule: str | None) -> str:
    """The refresh DAG of a schedule group: ``ivm_refresh`` (no schedule), ``ivm_refresh_<preset>``, or
    for a cron string its readable form and a hash of it, so two schedules never share an id ("0 6 * * *"
    and "0 */6 * * *" both read ``0_6``).

    >>> dag_id_for("@daily"), dag_id_for("0 6 * * *"), dag_id_for("0 */6 * * *")
    ('ivm_refresh_daily', 'ivm_refresh_0_6_504879', 'ivm_refresh_0_6_204a8d')
    """
    if schedule is None:
        return "ivm_refresh"
    readable = re.sub(r"[^A-Za-z0-9]+", "_", schedule).strip("_")
    if schedule.startswith("@"):
        return f"ivm_refresh_{readable}"
    return f"ivm_refresh_{readable}_{hashlib.sha1(schedule.encode()).hexdigest()[:6]}"


def view_asset_uri(config: ProjectConfig, view: str) -> str:
    return f"ivm://{config.project_name}/{view}"


def source_asset_uri(config: ProjectConfig, table: str) -> str:
    """The asset of a table's Delta source: its location as a URI (``file://`` for a local folder), or
    ``table://<name>`` for a table named in the Spark catalog (its location is the metastore's)."""
    source = config.tables[table].source
    if source.table is not None:
        return f"table://{source.table}"
    where = resolve_location(source.delta, config.root)
    return where if "://" in where else Path(where).as_uri()


def build_dags(jobs_dir: str | Path, path: str | None = None, conn_id: str | None = None) -> dict:
    """Every DAG of the project at ``path`` (default: `project_file()`), by DAG id."""
    from ivm.lang import compile_project
    from ivm.stratify import stratify

    path = path or project_file()
    config = load_project(path)
    program = compile_project(config)
    strata = stratify(program)
    conn_id = conn_id or os.environ.get("IVM_SPARK_CONN_ID", "spark_default")
    job = str(Path(jobs_dir) / "ivm_stage.py")

    def closure(views: list[str]) -> list[str]:
        """The views a refresh of ``views`` maintains: they and the views they read."""
        return sorted({u for v in views for u in strata.upstream(v) if u in config.views} | set(views))

    def sources(views: list[str]) -> list[str]:
        """The tables with a Delta source that ``views`` read."""
        return sorted({u for v in views for u in strata.upstream(v)
                       if u in config.tables and config.tables[u].source is not None})

    dags = {}
    for schedule, views in schedule_groups(config).items():
        dag_id = dag_id_for(schedule)
        if dag_id in dags:  # (a hash collision of two cron strings: never silently one DAG for both)
            raise ConfigError(f"views.{sorted(views)[0]}.schedule: {schedule!r} would share DAG {dag_id} with "
                              "another schedule; write it differently")
        if schedule == SOURCES_SCHEDULE and not sources(views):
            raise ConfigError(f"views.{sorted(views)[0]}.schedule: {SOURCES_SCHEDULE} runs on the asset events of "
                              f"the Delta sources its views read, and {', '.join(sorted(views))} read none")
        dags[dag_id] = _dag(dag_id, schedule, job, path, conn_id, closure(views), sources(views), strata, config,
                            plan_args=["--views", ",".join(sorted(views)), "--mode", "auto"], validate_args=[],
                            doc=f"Scheduled refresh of {', '.join(sorted(views))} ({schedule or 'no schedule'}).")
    dags["ivm_backfill"] = _dag(
        "ivm_backfill", None, job, path, conn_id, sorted(config.views), sources(list(config.views)), strata, config,
        plan_args=["--views", "{{ params.views | join(',') }}", "--mode", "{{ 'full' if params.full else 'auto' }}",
                   "--kind", "backfill", "--from-version", "{{ params.from_version or '' }}"],
        validate_args=["--sample", "{{ '' if params.sample is none else params.sample }}"],
        params={"views": (sorted(config.views), "the views to refresh (and the views they read)", {}),
                "full": (False, "recompute the views from the current snapshot instead of maintaining them", {}),
                "from_version": (None, "replay: restore the views to their state before this commit version of "
                                       "every table they read and apply the changes since then again (empty: no "
                                       "replay; not with full)", {"type": ["null", "integer"], "minimum": 1}),
                "sample": (None, "keys per view the validation recomputes (empty: each view's validate.sample; "
                                 "0: none)", {"type": ["null", "integer"], "minimum": 0})},
        doc="Manual refresh, rebuild or replay of chosen views: trigger with params `views`, `full`, "
            "`from_version`, `sample`.")
    return dags


def _dag(dag_id, schedule, job, path, conn_id, views, sources, strata, config, plan_args, validate_args, doc,
         params=None):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import DAG, Asset, AssetAny, Param, TriggerRule

    from ivm.orchestration.links import ValidateOperator
    from ivm.refresh.stages import STAGES

    # the driver runs the interpreter Airflow runs (it has ivm installed); so do local executors
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, PROJECT_ENV: path}
    # ivm's Spark defaults (quiet logs, no UI, few shuffle partitions) and the project's `spark.conf`;
    # the master is the connection's
    conf = with_delta(project_conf(config))
    # Delta's jars go to the driver and the executors (spark-submit --jars)
    jars = conf.pop("spark.jars", "")
    common = {"application": job, "conn_id": conn_id, "env_vars": env, "conf": conf, "retries": 2,
              **({"jars": jars} if jars else {})}

    def submit(stage: str, *extra: str, operator=SparkSubmitOperator, **kwargs):
        return operator(task_id=stage, name=f"ivm-{stage}",
                        application_args=[stage, "--run-id", RUN, "--project", path, *extra], **common, **kwargs)

    inlets = [Asset(source_asset_uri(config, t)) for t in sources]
    if schedule == SOURCES_SCHEDULE:
        schedule = AssetAny(*inlets)
    with DAG(dag_id, schedule=schedule, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
             max_active_runs=1, tags=["ivm"], doc_md=doc, user_defined_macros={"ivm_run_id": run_id_for},
             params={k: Param(v, description=d, **schema) for k, (v, d, schema) in (params or {}).items()}) as dag:
        args = {"plan": plan_args, "validate": validate_args}
        # the validate task links to the run's data-quality page
        kwargs = {"validate": {"operator": ValidateOperator}}
        previous, mapped = None, False  # (after a mapped stage, a task runs unless one failed: none_failed)
        for stage in STAGES:  # one task per stage, in order (ivm.refresh.stages)
            if stage.per_view:
                for stratum in sorted({strata.stratum_of[v] for v in views}):
                    previous = _per_view(stage, stratum, path, common, previous)
                mapped = True
                continue
            rule = {"trigger_rule": TriggerRule.NONE_FAILED} if mapped else {}
            # the first stage plans on the sources' newest versions: they are its inlets
            lineage = {"inlets": inlets} if stage is STAGES[0] and inlets else {}
            current = submit(stage.name, *args.get(stage.name, []), **kwargs.get(stage.name, {}), **rule, **lineage)
            if previous is not None:
                previous >> current
            previous = current
            if stage.readable:
                previous = _announce(dag_id, path, config, previous)
    return dag


def _announce(dag_id: str, path: str, config: ProjectConfig, previous):
    """The ``assets`` task: an asset event for each view the run changed (`changed_views`), with what
    changed in its extra, through the DAG's asset alias."""
    from airflow.sdk import Asset, AssetAlias, task

    alias = AssetAlias(f"{dag_id}_views")

    @task(task_id="assets", outlets=[alias])
    def assets(ivm_run: str, *, outlet_events=None) -> dict:
        """Send the asset events of the views run ``ivm_run`` changed; returns what it sent."""
        from ivm.orchestration.stages import changed_views
        from ivm.project import Project

        project = Project.open(path)
        try:
            changed = changed_views(project.ctx, ivm_run)
        finally:
            project.close()
        for view, extra in changed.items():
            outlet_events[alias].add(Asset(view_asset_uri(config, view)), extra=extra)
        return {"changed_views": sorted(changed)}

    current = assets(RUN)
    previous >> current
    return current


def _per_view(stage, stratum: int, path: str, common: dict, previous):
    """A stage run per view (maintain) for one stratum: a small Python task reads the views the run
    planned there from its record, and the stage's spark-submit is mapped over them (an empty stratum
    is skipped)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import TriggerRule, task

    @task(task_id=f"views_stratum_{stratum}", trigger_rule=TriggerRule.NONE_FAILED)
    def select(ivm_run: str) -> list[list[str]]:
        """The spark-submit arguments of one task per view the run planned here."""
        from ivm.orchestration.stages import views_of_stratum
        from ivm.project import Project

        project = Project.open(path)
        try:
            return [[stage.name, "--run-id", ivm_run, "--project", path, "--views", v]
                    for v in views_of_stratum(project.ctx, ivm_run, stratum)]
        finally:
            project.close()

    chosen = select(RUN)
    # each mapped task shows its view in the UI (its arguments end with `--views VIEW`)
    mapped = SparkSubmitOperator.partial(task_id=f"{stage.name}_stratum_{stratum}", name=f"ivm-{stage.name}",
                                         trigger_rule=TriggerRule.NONE_FAILED,
                                         map_index_template="{{ task.application_args[-1] }}", **common
                                         ).expand(application_args=chosen)
    if previous is not None:
        previous >> chosen
    chosen >> mapped
    return mapped
