"""How the ivm DAGs run a stage (docs/design.md §9), from one command line (ivm.orchestration.stages
.parse_stage_args):

* a stage that needs Spark (trim, maintain, validate, sink, compact) as a spark-submit of
  ``jobs/ivm_stage.py`` — `SparkStageOperator`, which first asks the catalog whether the run gives the
  stage anything to do and skips the task if not (Stage.idle: a run with nothing to do starts no JVM),
  and runs it on the worker itself when its work this time needs no JVM (Stage.without_jvm: the sink
  of small views, written by delta-rs);
* or, with an Airflow connection of type ``spark_connect``, as a Python task on the worker whose Spark is
  a client session of that connection's Spark Connect server (the provider's ``SparkConnectHook``) —
  `ConnectStageOperator`: no spark-submit, no JVM on the worker, a warm driver shared by every task;
* a stage that only reads and writes the catalog (plan, publish, report) as a Python task on the
  Airflow worker — `run_catalog_stage`, `run_report`.

Either way a failure no retry can heal (ivm.orchestration.stages.PERMANENT: a bad project or name, bad
change data, a stage out of order, a failed validation) fails the task at once with its one line
(AirflowFailException); anything else (Spark lost, the catalog unreachable, a lease held) is retried. A
task returns a small summary as its XCom: the run, the relations, rows changed, seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ivm.errors import IvmError
from ivm.orchestration.links import DataQualityLink
from ivm.orchestration.stages import PERMANENT, parse_stage_args, stage_summary
from ivm.project import Project
from ivm.refresh import stages
from ivm.vocabulary import RunStatus, StageName


@contextmanager
def opened(path: str | None, stage: str, start_spark=None) -> Iterator[Project]:
    """The project, for what the worker itself does (catalog reads and writes): no Spark unless
    ``start_spark`` gives one (a Spark Connect client). An IvmError no retry heals fails the task at once."""

    def no_spark():
        raise RuntimeError(f"ivm {stage}: a stage run on the Airflow worker asked for Spark")

    project = None
    try:
        project = Project.open(path, start_spark=start_spark or no_spark)
        yield project
    except IvmError as e:
        if e.exit_code in PERMANENT:
            raise AirflowFailException(f"ivm {stage}: {e} (exit code {e.exit_code}: not retried)") from None
        raise
    finally:
        if project is not None:
            project.close()


def run_catalog_stage(argv: list[str]) -> dict:
    """A catalog-only stage (plan, publish) in this process; its summary."""
    name, path, args = parse_stage_args(argv)
    started = time.perf_counter()
    with opened(path, name) as project:
        stages.run_stage(project.ctx, name, args)
        return {**stage_summary(project.ctx, args.run_id, name), "seconds": round(time.perf_counter() - started, 2)}


def run_report(argv: list[str]) -> dict:
    """The report task (it runs whatever became of the stages before it): the run as its record tells it,
    in the task log; the task fails if the run failed, with the stage and the one-line error."""
    name, path, args = parse_stage_args(argv)
    with opened(path, name) as project:
        run = project.catalog.get_run(args.run_id)
        if run is None:
            raise AirflowFailException(f"ivm run {args.run_id} was never planned: see the plan task's log")
        planned = any(r.stage == StageName.PLAN for r in project.catalog.stage_records(args.run_id))
        result = stages.run_stage(project.ctx, name, args) if planned else None
        if run.status == RunStatus.FAILED:
            raise AirflowFailException(f"ivm run {args.run_id} failed: {run.error}")
        # (the views the run maintained, and the run's seconds as its record tells them)
        return {**stage_summary(project.ctx, args.run_id, "maintain"), "stage": name, "status": run.status,
                "seconds": round(result.seconds, 2) if result is not None and run.finished_at else None}


class StageLineage:
    """OpenLineage through Airflow's provider, which asks a task's operator for its datasets when the task
    ends: the stage that reads the run's changes (trim) reports the tables it consumed at the versions it
    read, the stage that writes the views' Delta tables (sink) the views at the Delta versions it wrote
    (ivm.lineage); every stage's events carry the ivm run id as a tag. Read from the catalog alone."""

    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow.providers.openlineage.extractors import OperatorLineage

        from ivm import lineage
        from ivm.refresh.plan import load_plan

        name, path, args = parse_stage_args(list(self.application_args))
        stage = stages.stage(name)
        with opened(path, name) as project:
            found = OperatorLineage(run_facets=lineage.run_facets(args.run_id))
            if stage.consumes:
                found.inputs.extend(lineage.inputs(project.ctx, load_plan(project.ctx, args.run_id)[0]))
            if stage.readable:
                found.outputs.extend(lineage.outputs(project.ctx, args.run_id))
            return found

    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete


class SparkStageOperator(StageLineage, SparkSubmitOperator):
    """A stage as a spark-submit of ``jobs/ivm_stage.py``: skipped when the run gives it nothing to do,
    failed without retries on an exit code no retry heals, its summary returned."""

    def execute(self, context) -> dict:
        name, path, args = parse_stage_args(list(self.application_args))
        started = time.perf_counter()
        with opened(path, name) as project:
            stage = stages.stage(name)
            why = stage.idle(project.ctx, args.run_id)
            if why is not None:
                raise AirflowSkipException(f"ivm {name}: nothing to do in run {args.run_id}: {why}")
            if stage.without_jvm(project.ctx, args.run_id):  # (e.g. the sink of small views, by delta-rs)
                self.log.info("ivm %s: the run's work needs no JVM: done on the worker, no spark-submit", name)
                stages.run_stage(project.ctx, name, args)
                return {**stage_summary(project.ctx, args.run_id, name, args.views),
                        "seconds": round(time.perf_counter() - started, 2)}
            try:
                super().execute(context)
            except Exception:
                code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None)
                if code not in PERMANENT:
                    raise
                run = project.catalog.get_run(args.run_id)
                error = run.error if run is not None and run.status == RunStatus.FAILED else f"{name}: see the task log"
                raise AirflowFailException(f"ivm run {args.run_id} failed: {error} (exit code {code}: not retried)"
                                           ) from None
            summary = stage_summary(project.ctx, args.run_id, name, args.views)
        return {**summary, "seconds": round(time.perf_counter() - started, 2)}


class ValidateOperator(SparkStageOperator):
    """The validate stage, with a link to its run's data-quality report."""

    operator_extra_links = (DataQualityLink(),)


class ConnectStageOperator(StageLineage, BaseOperator):
    """A Spark stage as a Python task on the Airflow worker, its Spark a client session of the Spark Connect
    server that Airflow connection ``conn_id`` (type ``spark_connect``: `SparkConnectHook`) names; skipped
    when the run gives it nothing to do, failed without retries on an error no retry heals (`opened`), its
    summary returned. The worker needs pyspark's client alone: no spark-submit, no Java.

    :param application_args: the stage's command line (ivm.orchestration.stages.parse_stage_args), as a
        spark-submit task's application arguments (templated)
    :param conn_id: the Airflow connection of the Spark Connect server (default ``spark_connect_default``)
    """

    template_fields = ("application_args",)
    ui_color = "#f4a460"

    def __init__(self, *, application_args: list[str], conn_id: str = "spark_connect_default", **kwargs):
        super().__init__(**kwargs)
        self.application_args = application_args
        self.conn_id = conn_id

    def execute(self, context) -> dict:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from ivm.spark import connect, project_conf

        name, path, args = parse_stage_args(list(self.application_args))
        started = time.perf_counter()
        holder: dict[str, Project] = {}

        def start_spark():
            url = SparkConnectHook(self.conn_id).get_connection_url()
            self.log.info("ivm %s: Spark Connect server of connection %s", name, self.conn_id)
            return connect(url, project_conf(holder["project"].config))

        with opened(path, name, start_spark) as project:
            holder["project"] = project
            why = stages.stage(name).idle(project.ctx, args.run_id)
            if why is not None:
                raise AirflowSkipException(f"ivm {name}: nothing to do in run {args.run_id}: {why}")
            stages.run_stage(project.ctx, name, args)
            summary = stage_summary(project.ctx, args.run_id, name, args.views)
        return {**summary, "seconds": round(time.perf_counter() - started, 2)}


class ConnectValidateOperator(ConnectStageOperator):
    """The validate stage on Spark Connect, with a link to its run's data-quality report."""

    operator_extra_links = (DataQualityLink(),)


#: the operator of a Spark stage, by stage (the others: SparkStageOperator)
SPARK_OPERATORS: dict[str, type[SparkStageOperator]] = {"validate": ValidateOperator}
#: the same on Spark Connect (the others: ConnectStageOperator)
CONNECT_OPERATORS: dict[str, type[ConnectStageOperator]] = {"validate": ConnectValidateOperator}
#: what a catalog-only stage's Python task runs, by stage (the others: run_catalog_stage)
WORKER_TASKS = {"report": run_report}
