"""The DAG factory (docs/design.md §9): from the project file, one scheduled refresh DAG per schedule group
and one backfill DAG for manual runs, a task per stage of ivm.refresh.stages.STAGES.

    ivm_refresh[_<schedule>]   plan → trim → [stratum_k: views → maintain] … → validate → publish → sink
                               → assets → compact → report
    ivm_backfill               the same, triggered by hand with params: views, full, from_version, sample

The catalog-only stages (plan, publish, report) are Python tasks on the worker; the others spark-submits
of ``jobs/ivm_stage.py`` that skip themselves when the run gives them nothing to do; a failure no retry
heals fails its task at once; the report runs whatever became of the rest and fails a failed run
(ivm.orchestration.operators). The validate task links to the run's data-quality page
(ivm.orchestration.links, plugins/). `build_dags`'s options: `DagOptions`, dags/README.md.

Assets (data-aware scheduling): every view is the Airflow asset ``ivm://<project>/<view>``. After the
stage that makes a run's views readable outside ivm (the sink: their Delta tables), the ``assets`` task
sends an asset event for each view whose content the run changed — none for the others — with the
view's catalog version, Delta version and rows changed in its extra (through one `AssetAlias` per DAG:
Airflow sends an event for each asset a task adds to it, where a static outlet sends one for every
asset on every success). A Delta source is the asset of its location (``file:///...``, ``s3://...``;
``table://<name>`` for a table named in the Spark catalog): the plan task declares the sources its views
read as inlets, and a schedule group whose ``schedule`` is ``@sources`` runs whenever one of them gets
an asset event (the user's pipeline declaring the source as its outlet) instead of on a cron string.

Each stratum is a task group: ``stratum_k.maintain`` is mapped over what a small Python task,
``stratum_k.views``, reads from the run's record — the views the run planned in stratum k, all in one
spark-submit, or one task per view on Spark Connect (below) — and an empty stratum is skipped. All tasks of
one DAG run share one ivm run id, derived from the DAG run; ``publish`` is the only task that changes what
readers see.

The project file is found the way the CLI finds it: ``IVM_PROJECT``, else the demo project. How the Spark
stages reach Spark is one setting:

* by default they are spark-submits of ``jobs/ivm_stage.py`` on the connection ``spark_default``
  (``IVM_SPARK_CONN_ID`` to choose another): ``local[*]`` runs the jobs on the Airflow worker,
  ``spark://host:7077`` on a standalone cluster, which receives the ivm package from the job
  (ivm.spark.ship_package). The maintain stage is one spark-submit per stratum, its views maintained one
  after the other in that one driver (a JVM per view would cost a JVM's start per view);
* with ``IVM_SPARK_CONNECT_CONN_ID`` (or ``spark_connect_conn_id``) naming an Airflow connection of type
  ``spark_connect``, they are Python tasks on the worker that connect to that Spark Connect server — one
  warm driver for every task and run, no JVM on the worker — and maintain is mapped per view (a task
  costs a Python process, not a JVM).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ivm.config import PROJECT_ENV, ProjectConfig, load_project, resolve_location
from ivm.errors import ConfigError
from ivm.orchestration.stages import run_id_for
from ivm.spark import project_conf, with_delta
from ivm.stratify import Strata

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


#: what `build_dags`'s ``spark`` option may set per stage: SparkSubmitOperator's parameters
SPARK_SETTINGS = ("driver_memory", "executor_memory", "executor_cores", "num_executors", "total_executor_cores",
                  "conf")
#: the tasks' default_args unless the caller's say otherwise: transient failures are retried (the ones no
#: retry heals fail at once, ivm.orchestration.operators)
DEFAULT_ARGS = {"owner": "ivm", "retries": 2, "retry_delay": timedelta(seconds=30)}


@dataclass(frozen=True)
class DagOptions:
    """`build_dags`'s options for every DAG it makes (documented in dags/README.md)."""

    #: Airflow's default_args of every task (owner, retries, on_failure_callback, execution_timeout, ...),
    #: over `DEFAULT_ARGS`
    default_args: dict[str, Any] = field(default_factory=dict)
    #: the Airflow pool of every spark-submit task (None: default_pool): its slots bound the Spark jobs
    #: that run at once across all ivm DAGs, so a standalone cluster is not oversubscribed
    spark_pool: str | None = None
    #: at most this many maintain tasks of one stratum at once in a DAG run (None: as many as the pool
    #: and the executor allow)
    maintain_parallelism: int | None = None
    #: Spark settings by stage name ("*": every Spark stage), keys of `SPARK_SETTINGS`; a stage's own
    #: settings win over "*", its ``conf`` merged over ivm's and the project's
    spark: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: an Airflow connection of type ``spark_connect``: the Spark stages run as Python tasks on its Spark
    #: Connect server instead of spark-submits (None: spark-submit)
    spark_connect_conn_id: str | None = None

    def __post_init__(self):
        from ivm.refresh.stages import STAGES

        spark_stages = {s.name for s in STAGES if not s.catalog_only}
        for stage, settings in self.spark.items():
            if stage != "*" and stage not in spark_stages:
                raise ConfigError(f"build_dags: spark[{stage!r}]: not a stage that runs Spark; use '*' or one of "
                                  + ", ".join(sorted(spark_stages)))
            unknown = sorted(set(settings) - set(SPARK_SETTINGS))
            if unknown:
                raise ConfigError(f"build_dags: spark[{stage!r}]: unknown setting {unknown[0]!r}; use "
                                  + ", ".join(SPARK_SETTINGS))
        if self.maintain_parallelism is not None and self.maintain_parallelism < 1:
            raise ConfigError("build_dags: maintain_parallelism must be at least 1")

    def spark_kwargs(self, stage: str, conf: dict[str, str]) -> dict[str, Any]:
        """The SparkSubmitOperator parameters of ``stage``'s tasks beyond the application: its settings,
        ``conf`` (ivm's) under them, and the pool."""
        settings = {**self.spark.get("*", {}), **self.spark.get(stage, {})}
        merged = {**conf, **self.spark.get("*", {}).get("conf", {}), **self.spark.get(stage, {}).get("conf", {})}
        return {**settings, "conf": merged, **({"pool": self.spark_pool} if self.spark_pool else {})}


#: the environment variable naming the `spark_connect` connection the Spark stages run on (unset: spark-submit)
CONNECT_CONN_ENV = "IVM_SPARK_CONNECT_CONN_ID"


def build_dags(jobs_dir: str | Path, path: str | None = None, conn_id: str | None = None, *,
               default_args: dict[str, Any] | None = None, spark_pool: str | None = None,
               maintain_parallelism: int | None = None, spark: dict[str, dict[str, Any]] | None = None,
               spark_connect_conn_id: str | None = None) -> dict:
    """Every DAG of the project at ``path`` (default: `project_file()`), by DAG id. The keyword options
    are `DagOptions`'s (dags/README.md); ``spark_connect_conn_id`` defaults to `CONNECT_CONN_ENV`'s value."""
    from ivm.lang import compile_project
    from ivm.stratify import stratify

    options = DagOptions(default_args or {}, spark_pool, maintain_parallelism, spark or {},
                         spark_connect_conn_id or os.environ.get(CONNECT_CONN_ENV) or None)
    path = path or project_file()
    config = load_project(path)
    program = compile_project(config)
    strata = stratify(program)
    factory = _Factory(str(Path(jobs_dir) / "ivm_stage.py"), path,
                       conn_id or os.environ.get("IVM_SPARK_CONN_ID", "spark_default"), config, strata, options)

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
        dags[dag_id] = factory.dag(dag_id, schedule, closure(views), sources(views),
                                   plan_args=["--views", ",".join(sorted(views)), "--mode", "auto"], validate_args=[],
                                   doc=f"Scheduled refresh of {', '.join(sorted(views))} "
                                       f"({schedule or 'no schedule'}).")
    dags["ivm_backfill"] = factory.dag(
        "ivm_backfill", None, sorted(config.views), sources(list(config.views)),
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


@dataclass(frozen=True)
class _Factory:
    """What every DAG of one project shares: the job, the project, the Spark connection, the options."""

    job: str
    path: str
    conn_id: str
    config: ProjectConfig
    strata: Strata
    options: DagOptions

    @property
    def in_worker(self) -> bool:
        """Whether the catalog-only stages run as Python tasks on the worker: not when a table's Delta
        source is named in the Spark catalog (plan and publish find its location through Spark's
        metastore), where every stage is a spark-submit."""
        return not any(t.source is not None and t.source.table is not None for t in self.config.tables.values())

    def dag(self, dag_id, schedule, views, sources, plan_args, validate_args, doc, params=None):
        from airflow.sdk import DAG, Asset, AssetAny, Param, TriggerRule

        from ivm.refresh.stages import STAGES

        # the driver runs the interpreter Airflow runs (it has ivm installed); so do local executors
        env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, PROJECT_ENV: self.path}
        # ivm's Spark defaults (quiet logs, no UI, few shuffle partitions) and the project's `spark.conf`;
        # the master is the connection's
        conf = with_delta(project_conf(self.config))
        # Delta's jars go to the driver and the executors (spark-submit --jars)
        jars = conf.pop("spark.jars", "")
        common = {"application": self.job, "conn_id": self.conn_id, "env_vars": env, **({"jars": jars} if jars else {})}
        inlets = [Asset(source_asset_uri(self.config, t)) for t in sources]
        if schedule == SOURCES_SCHEDULE:
            schedule = AssetAny(*inlets)
        with DAG(dag_id, schedule=schedule, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False,
                 max_active_runs=1, tags=["ivm"], doc_md=doc, user_defined_macros={"ivm_run_id": run_id_for},
                 default_args={**DEFAULT_ARGS, **self.options.default_args},
                 params={k: Param(v, description=d, **schema) for k, (v, d, schema) in (params or {}).items()}) as dag:
            args = {"plan": plan_args, "validate": validate_args}
            previous = None
            for stage in STAGES:  # one task per stage, in order (ivm.refresh.stages)
                argv = [stage.name, "--run-id", RUN, "--project", self.path, *args.get(stage.name, [])]
                # after the plan, a task runs unless one before it failed (a stage with nothing to do is
                # skipped, and the next still runs); the report runs whatever became of them
                rule = (TriggerRule.ALL_DONE if stage is STAGES[-1] else TriggerRule.NONE_FAILED if previous
                        else TriggerRule.ALL_SUCCESS)
                # the first stage plans on the sources' newest versions: they are its inlets
                lineage = {"inlets": inlets} if stage is STAGES[0] and inlets else {}
                if stage.per_view:
                    for stratum in sorted({self.strata.stratum_of[v] for v in views}):
                        previous = self._per_view(stage, stratum, common, conf, previous)
                    continue
                if stage.catalog_only and self.in_worker:
                    current = _python_stage(stage, argv, rule, lineage)
                else:
                    operator, kwargs = self._spark_task(stage, common, conf)
                    current = operator(task_id=stage.name, application_args=argv, trigger_rule=rule, **lineage,
                                       **kwargs)
                if previous is not None:
                    previous >> current
                previous = current
                if stage.readable:
                    previous = _announce(dag_id, self.path, self.config, previous)
        return dag

    def _spark_task(self, stage, common: dict, conf: dict[str, str]) -> tuple[type, dict[str, Any]]:
        """The operator of a Spark stage's task and its arguments (but the command line): a Python task on
        the Spark Connect connection when there is one (`DagOptions.spark_connect_conn_id`), else a
        spark-submit with the stage's settings."""
        from ivm.orchestration.operators import (
            CONNECT_OPERATORS,
            SPARK_OPERATORS,
            ConnectStageOperator,
            SparkStageOperator,
        )

        pool = {"pool": self.options.spark_pool} if self.options.spark_pool else {}
        if self.options.spark_connect_conn_id:
            return (CONNECT_OPERATORS.get(stage.name, ConnectStageOperator),
                    {"conn_id": self.options.spark_connect_conn_id, **pool})
        return (SPARK_OPERATORS.get(stage.name, SparkStageOperator),
                {"name": f"ivm-{stage.name}", **common, **self.options.spark_kwargs(stage.name, conf)})

    def _per_view(self, stage, stratum: int, common: dict, conf: dict[str, str], previous):
        """A stage run per view (maintain) for one stratum, in the task group ``stratum_<k>``: a small
        Python task (``views``) reads the views the run planned there from its record, and the stage's task
        is mapped over them — one task per view on Spark Connect, one spark-submit for all of them
        otherwise (an empty stratum is skipped)."""
        from airflow.sdk import TaskGroup, TriggerRule, task

        path = self.path
        per_view = bool(self.options.spark_connect_conn_id)

        with TaskGroup(f"stratum_{stratum}", tooltip=f"the views of stratum {stratum}, maintained side by side"):
            @task(task_id="views", trigger_rule=TriggerRule.NONE_FAILED)
            def select(ivm_run: str) -> list[list[str]]:
                """The stage's command line for each view the run planned here."""
                from ivm.orchestration.stages import views_of_stratum
                from ivm.project import Project

                project = Project.open(path)
                try:
                    views = views_of_stratum(project.ctx, ivm_run, stratum)
                finally:
                    project.close()
                groups = [[v] for v in views] if per_view else [views] if views else []
                return [[stage.name, "--run-id", ivm_run, "--project", path, "--views", ",".join(g)] for g in groups]

            chosen = select(RUN)
            parallel = self.options.maintain_parallelism
            operator, kwargs = self._spark_task(stage, common, conf)
            # each mapped task shows its view(s) in the UI (its arguments end with `--views VIEWS`)
            mapped = operator.partial(
                task_id=stage.name, trigger_rule=TriggerRule.NONE_FAILED,
                map_index_template="{{ task.application_args[-1] }}", **kwargs,
                **({"max_active_tis_per_dagrun": parallel} if parallel else {})).expand(application_args=chosen)
        if previous is not None:
            previous >> chosen
        chosen >> mapped
        return mapped


def _python_stage(stage, argv: list[str], rule, lineage: dict):
    """A catalog-only stage as a Python task on the worker (ivm.orchestration.operators); its command
    line is templated like a spark-submit's."""
    from airflow.sdk import task

    from ivm.orchestration import operators

    run = operators.WORKER_TASKS.get(stage.name, operators.run_catalog_stage)

    @task(task_id=stage.name, trigger_rule=rule, doc_md=f"The {stage.name} stage, on the Airflow worker (no Spark).",
          **lineage)
    def python_stage(command: list[str]) -> dict:
        return run(command)

    return python_stage(argv)


def _announce(dag_id: str, path: str, config: ProjectConfig, previous):
    """The ``assets`` task: an asset event for each view the run changed (`changed_views`), with what
    changed in its extra, through the DAG's asset alias."""
    from airflow.sdk import Asset, AssetAlias, TriggerRule, task

    alias = AssetAlias(f"{dag_id}_views")

    @task(task_id="assets", outlets=[alias], trigger_rule=TriggerRule.NONE_FAILED)
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
