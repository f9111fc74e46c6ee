"""The DAGs (DESIGN.md §9): every DAG file imports with no error, and the DAGs have the documented
structure — one refresh DAG per schedule group (max_active_runs 1) and the backfill DAG with its
params; plan → trim → (views_stratum_k → mapped maintain_stratum_k)… → validate → publish → sink →
assets → compact → report (ivm.refresh.stages.STAGES), each stage a spark-submit of jobs/ivm_stage.py
with the run id; the assets task sends the changed views' asset events through the DAG's asset alias;
Delta sources are the plan's inlets and can schedule a group. Parsing needs no Spark and no database."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from airflow.sdk.exceptions import ParamValidationError

from tests.conftest import write_project

REPO = Path(__file__).resolve().parents[2]
TABLES = {"t": {"columns": {"k": "string", "v": "int"}}, "u": {"columns": {"k": "string", "w": "int"}},
          "s": {"columns": {"k": "string", "x": "int"}, "source": {"delta": "lake/s"}}}
VIEWS = {
    "per_k": {"sql": "SELECT k, count(*) AS n FROM t GROUP BY k", "schedule": "@hourly"},
    "busy": {"sql": "SELECT k FROM per_k WHERE n > 1", "schedule": "@hourly"},
    "joined": {"sql": "SELECT t.k, u.w FROM t JOIN u ON t.k = u.k"},
    "from_lake": {"sql": "SELECT s.k, s.x, u.w FROM s JOIN u ON s.k = u.k", "schedule": "@sources"},
}


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    root = tmp_path_factory.mktemp("dags")
    path = write_project(root / "proj", TABLES, views=VIEWS)
    mp = pytest.MonkeyPatch()
    mp.setenv("IVM_PROJECT", str(path))
    mp.setenv("AIRFLOW_HOME", str(root / "airflow"))
    from airflow.dag_processing.dagbag import DagBag

    yield DagBag(dag_folder=str(REPO / "dags"))
    mp.undo()


def upstream(dag, task_id: str) -> set[str]:
    return set(dag.get_task(task_id).upstream_task_ids)


def test_every_dag_imports(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"ivm_refresh", "ivm_refresh_hourly", "ivm_refresh_sources", "ivm_backfill"}


def test_refresh_dags_per_schedule_group(dagbag):
    hourly = dagbag.dags["ivm_refresh_hourly"]
    assert str(hourly.schedule) == "@hourly" and hourly.max_active_runs == 1
    # per_k is stratum 2 (its GROUP BY input is stratum 1), busy reads it
    assert [t.task_id for t in hourly.topological_sort()] == [
        "plan", "trim", "views_stratum_2", "maintain_stratum_2", "views_stratum_3", "maintain_stratum_3",
        "validate", "publish", "sink", "assets", "compact", "report"]
    assert upstream(hourly, "trim") == {"plan"} and upstream(hourly, "views_stratum_2") == {"trim"}
    assert upstream(hourly, "maintain_stratum_3") == {"views_stratum_3"}
    assert upstream(hourly, "validate") == {"maintain_stratum_3"} and upstream(hourly, "report") == {"compact"}
    plan = hourly.get_task("plan")
    assert type(plan).__name__ == "SparkSubmitOperator" and plan.application == str(REPO / "jobs" / "ivm_stage.py")
    assert plan.application_args[:3] == ["plan", "--run-id", "{{ ivm_run_id(dag.dag_id, run_id) }}"]
    assert plan.application_args[-4:] == ["--views", "busy,per_k", "--mode", "auto"]
    assert hourly.user_defined_macros["ivm_run_id"]("d", "r") == hourly.user_defined_macros["ivm_run_id"]("d", "r")
    # the views of a stratum are mapped tasks over the argument lists views_stratum_k returns
    maintain = hourly.get_task("maintain_stratum_2")
    assert type(maintain).__name__ == "MappedOperator" and "application_args" in maintain.expand_input.value
    # no static outlets (an event for every view on every run): the assets task, after the sink, sends
    # the changed views' events through the DAG's alias
    assert not any(t.outlets for t in hourly.tasks if t.task_id != "assets")
    assert [a.name for a in hourly.get_task("assets").outlets] == ["ivm_refresh_hourly_views"]
    assert upstream(hourly, "assets") == {"sink"} and upstream(hourly, "compact") == {"assets"}
    assert not hourly.get_task("plan").inlets  # (its tables have no Delta source)
    unscheduled = dagbag.dags["ivm_refresh"]
    assert unscheduled.schedule is None
    assert unscheduled.get_task("plan").application_args[-4:] == ["--views", "joined", "--mode", "auto"]


def test_delta_sources_are_inlets_and_can_schedule_their_group(dagbag, tmp_path):
    """A group with ``schedule: "@sources"`` runs on its Delta sources' asset events; their assets are
    the plan's inlets. A group of such a schedule whose views read no Delta source is refused."""
    from ivm.errors import ConfigError
    from ivm.orchestration.dags import build_dags

    lake = dagbag.dags["ivm_refresh_sources"]
    project_dir = Path(lake.get_task("plan").application_args[4]).parent
    source = (project_dir / "lake" / "s").as_uri()
    assert [a.uri for a in lake.get_task("plan").inlets] == [source]
    assert [a.uri for a in lake.schedule.objects] == [source]
    assert lake.get_task("plan").application_args[-4:] == ["--views", "from_lake", "--mode", "auto"]
    bad = write_project(tmp_path / "bad", TABLES, views={"joined": {**VIEWS["joined"], "schedule": "@sources"}})
    with pytest.raises(ConfigError, match=r"views.joined.schedule: @sources .* read none"):
        build_dags(REPO / "jobs", str(bad))


def test_backfill_dag_has_params(dagbag):
    backfill = dagbag.dags["ivm_backfill"]
    assert backfill.schedule is None and backfill.max_active_runs == 1
    assert backfill.params["views"] == ["busy", "from_lake", "joined", "per_k"] and backfill.params["full"] is False
    args = backfill.get_task("plan").application_args
    assert args[-8:] == ["--views", "{{ params.views | join(',') }}", "--mode",
                         "{{ 'full' if params.full else 'auto' }}", "--kind", "backfill",
                         "--from-version", "{{ params.from_version or '' }}"]
    assert backfill.params["from_version"] is None and backfill.params["sample"] is None
    assert backfill.get_task("validate").application_args[-2:] == [
        "--sample", "{{ '' if params.sample is none else params.sample }}"]
    backfill.params.validate()
    replay = backfill.params.get_param("from_version")
    assert replay.resolve(3) == 3
    with pytest.raises(ParamValidationError):
        replay.resolve(0)
    assert {t.task_id for t in backfill.tasks} >= {"maintain_stratum_2", "maintain_stratum_3", "publish"}


@pytest.mark.parametrize("conf, expected", [
    ({}, {"views": ("busy", "from_lake", "joined", "per_k"), "mode": "auto", "from_version": None, "sample": None}),
    ({"views": ["per_k"], "full": True, "sample": 0},
     {"views": ("per_k",), "mode": "full", "from_version": None, "sample": 0}),
    ({"views": ["busy"], "from_version": 3, "sample": 50},
     {"views": ("busy",), "mode": "auto", "from_version": 3, "sample": 50})])
def test_backfill_params_reach_the_stages(dagbag, conf, expected):
    """A triggered backfill's params, rendered into the plan and validate tasks' command lines as Airflow
    renders them, give jobs/ivm_stage.py the stage arguments they stand for (the same run id on both)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ivm_stage", REPO / "jobs" / "ivm_stage.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    backfill = dagbag.dags["ivm_backfill"]
    # (the params' defaults, test_backfill_dag_has_params, which resolves one: dump() would give its value)
    defaults = {"views": sorted(VIEWS), "full": False, "from_version": None, "sample": None}
    context = {"params": {**defaults, **conf}, "dag": backfill, "run_id": "manual__2026-12-02"}
    parsed = {}
    for task in ("plan", "validate"):
        op = backfill.get_task(task)
        _, parsed[task] = job.parse_args(op.render_template(op.application_args, context,
                                                            jinja_env=backfill.get_template_env()))
    plan, validate = parsed["plan"], parsed["validate"]
    assert (plan.views, str(plan.mode), plan.kind, plan.from_version) == (
        expected["views"], expected["mode"], "backfill", expected["from_version"])
    assert validate.sample == expected["sample"] and validate.run_id == plan.run_id


def test_validate_tasks_link_to_their_data_quality_page(dagbag):
    """Each validate task carries the extra link to its ivm run's data-quality page (Airflow 3 resolves it
    when the task ends and keeps the URL as an XCom, which the DAG run test checks)."""
    from airflow.models.taskinstancekey import TaskInstanceKey

    from ivm.orchestration.stages import run_id_for

    for dag in dagbag.dags.values():
        validate = dag.get_task("validate")
        assert type(validate).__name__ == "ValidateOperator" and validate.application_args[0] == "validate"
        (link,) = validate.operator_extra_links
        assert link.name == "Data quality" and link.xcom_key == "_link_DataQualityLink"
        key = TaskInstanceKey(dag.dag_id, "validate", "manual__2026-11-26T10:00:00+00:00")
        assert link.get_link(validate, ti_key=key).endswith(
            f"/ivm/quality?run={run_id_for(dag.dag_id, key.run_id)}")


def test_docker_compose_has_the_airflow_3_layout():
    """The services of the official Airflow 3 compose file plus Spark, built from the repo's Dockerfile,
    with the repo's folders mounted. (`docker compose config` checks it further where the compose
    plugin is installed.)"""
    doc = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    assert set(doc["services"]) == {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler",
                                    "airflow-dag-processor", "airflow-triggerer", "spark-master", "spark-worker"}
    api = doc["services"]["airflow-apiserver"]
    assert api["command"] == "api-server" and api["build"] == "."
    assert {v.split(":")[1] for v in api["volumes"]} >= {"/opt/airflow/dags", "/opt/airflow/jobs",
                                                         "/opt/airflow/include", "/opt/airflow/plugins"}
    assert "spark://spark-master" in api["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert "org.apache.spark.deploy.worker.Worker" in doc["services"]["spark-worker"]["entrypoint"]
    assert (REPO / "Dockerfile").read_text().startswith("#") and "openjdk-17" in (REPO / "Dockerfile").read_text()
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        checked = subprocess.run([docker, "compose", "-f", str(REPO / "docker-compose.yaml"), "config", "--quiet"],
                                 capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
