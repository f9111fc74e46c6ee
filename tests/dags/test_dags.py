"""The DAGs (docs/design.md §9): every DAG file imports with no error, and the DAGs have the documented
structure — one refresh DAG per schedule group (max_active_runs 1) and the backfill DAG with its
params; plan → trim → (stratum_k.views → mapped stratum_k.maintain)… → validate → publish → sink →
assets → compact → report (ivm.refresh.stages.STAGES), the catalog-only stages Python tasks, the others
spark-submits of jobs/ivm_stage.py, all with the same command line and run id; the assets task sends
the changed views' asset events through the DAG's asset alias; Delta sources are the plan's inlets and
can schedule a group; build_dags's options reach the tasks. Parsing needs no Spark and no database."""

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
    # per_k is stratum 2 (its GROUP BY input is stratum 1), busy reads it; each stratum a task group
    assert [t.task_id for t in hourly.topological_sort()] == [
        "plan", "trim", "stratum_2.views", "stratum_2.maintain", "stratum_3.views", "stratum_3.maintain",
        "validate", "publish", "sink", "assets", "compact", "report"]
    assert set(hourly.task_group.children) >= {"stratum_2", "stratum_3"}
    assert upstream(hourly, "trim") == {"plan"} and upstream(hourly, "stratum_2.views") == {"trim"}
    assert upstream(hourly, "stratum_3.maintain") == {"stratum_3.views"}
    assert upstream(hourly, "validate") == {"stratum_3.maintain"} and upstream(hourly, "report") == {"compact"}
    # the stages that only read and write the catalog run on the worker (no spark-submit); the others
    # are spark-submits of the stage job; both take the same command line
    kinds = {t.task_id: type(t).__name__ for t in hourly.tasks}
    assert {k for k, v in kinds.items() if v == "_PythonDecoratedOperator"} == {
        "plan", "stratum_2.views", "stratum_3.views", "publish", "assets", "report"}
    assert kinds["trim"] == "SparkStageOperator" and kinds["validate"] == "ValidateOperator"
    plan, trim = hourly.get_task("plan"), hourly.get_task("trim")
    assert trim.application == str(REPO / "jobs" / "ivm_stage.py")
    (command,) = plan.op_args
    assert command[:3] == ["plan", "--run-id", "{{ ivm_run_id(dag.dag_id, run_id) }}"]
    assert command[-4:] == ["--views", "busy,per_k", "--mode", "auto"]
    assert trim.application_args[:3] == ["trim", "--run-id", "{{ ivm_run_id(dag.dag_id, run_id) }}"]
    assert hourly.user_defined_macros["ivm_run_id"]("d", "r") == hourly.user_defined_macros["ivm_run_id"]("d", "r")
    # a task after the plan runs unless one before it failed (a stage with nothing to do skips itself);
    # the report runs whatever became of them; transient failures are retried
    rules = {t.task_id: t.trigger_rule.value for t in hourly.tasks}
    assert rules.pop("plan") == "all_success" and rules.pop("report") == "all_done"
    assert set(rules.values()) == {"none_failed"}
    assert {t.retries for t in hourly.tasks} == {2}
    # the views of a stratum are mapped tasks over the argument lists stratum_k.views returns
    maintain = hourly.get_task("stratum_2.maintain")
    assert type(maintain).__name__ == "MappedOperator" and "application_args" in maintain.expand_input.value
    # no static outlets (an event for every view on every run): the assets task, after the sink, sends
    # the changed views' events through the DAG's alias
    assert not any(t.outlets for t in hourly.tasks if t.task_id != "assets")
    assert [a.name for a in hourly.get_task("assets").outlets] == ["ivm_refresh_hourly_views"]
    assert upstream(hourly, "assets") == {"sink"} and upstream(hourly, "compact") == {"assets"}
    assert not hourly.get_task("plan").inlets  # (its tables have no Delta source)
    unscheduled = dagbag.dags["ivm_refresh"]
    assert unscheduled.schedule is None
    assert unscheduled.get_task("plan").op_args[0][-4:] == ["--views", "joined", "--mode", "auto"]


def test_build_dags_options_reach_the_tasks(tmp_path):
    """default_args, the Spark pool, per-stage Spark settings and the maintain tasks' parallelism, as
    dags/README.md documents them; unknown stages and settings are refused with the name."""
    from ivm.errors import ConfigError
    from ivm.orchestration.dags import build_dags

    path = str(write_project(tmp_path / "proj", TABLES, views=VIEWS))

    def failed(context):
        return None

    dags = build_dags(REPO / "jobs", path, default_args={"owner": "data-eng", "retries": 4,
                                                         "on_failure_callback": failed},
                      spark_pool="spark", maintain_parallelism=2,
                      spark={"*": {"executor_memory": "2g", "conf": {"spark.sql.shuffle.partitions": "8"}},
                             "maintain": {"executor_memory": "6g", "executor_cores": 2}})
    dag = dags["ivm_refresh_hourly"]
    assert {(t.owner, t.retries) for t in dag.tasks} == {("data-eng", 4)}
    assert all(failed in (t.on_failure_callback or []) for t in dag.tasks)
    trim, maintain = dag.get_task("trim"), dag.get_task("stratum_2.maintain")
    assert trim.pool == "spark" and trim._executor_memory == "2g"
    assert trim.conf["spark.sql.shuffle.partitions"] == "8" and "spark.jars.packages" not in trim.conf
    kwargs = maintain.partial_kwargs
    assert kwargs["pool"] == "spark" and kwargs["max_active_tis_per_dagrun"] == 2
    assert (kwargs["executor_memory"], kwargs["executor_cores"]) == ("6g", 2)
    assert kwargs["conf"]["spark.sql.shuffle.partitions"] == "8"
    assert dag.get_task("plan").pool == "default_pool"  # (the worker's tasks take no Spark slot)
    with pytest.raises(ConfigError, match=r"spark\['publish'\]: not a stage that runs Spark"):
        build_dags(REPO / "jobs", path, spark={"publish": {"driver_memory": "1g"}})
    with pytest.raises(ConfigError, match=r"spark\['trim'\]: unknown setting 'memory'"):
        build_dags(REPO / "jobs", path, spark={"trim": {"memory": "1g"}})


def test_with_a_spark_connect_connection_the_spark_stages_are_python_tasks(tmp_path, monkeypatch):
    """One setting (``IVM_SPARK_CONNECT_CONN_ID``, or ``spark_connect_conn_id``) turns every Spark stage into
    a Python task on the worker that connects to that connection's Spark Connect server: no spark-submit
    task is left, the maintain tasks stay mapped (per view there, `views` decides), the validate task
    keeps its data-quality link, and the pool still applies."""
    from ivm.orchestration.dags import CONNECT_CONN_ENV, build_dags
    from ivm.orchestration.links import DataQualityLink

    path = str(write_project(tmp_path / "proj", TABLES, views=VIEWS))
    monkeypatch.setenv(CONNECT_CONN_ENV, "warm")
    dag = build_dags(REPO / "jobs", path, spark_pool="spark")["ivm_refresh_hourly"]
    kinds = {t.task_id: type(t).__name__ for t in dag.tasks}
    assert not any("SparkStage" in k or k == "ValidateOperator" for k in kinds.values()), kinds
    assert kinds["trim"] == kinds["sink"] == kinds["compact"] == "ConnectStageOperator"
    assert kinds["validate"] == "ConnectValidateOperator"
    trim, validate = dag.get_task("trim"), dag.get_task("validate")
    assert (trim.conn_id, trim.pool) == ("warm", "spark") and trim.application_args[0] == "trim"
    assert any(isinstance(link, DataQualityLink) for link in validate.operator_extra_links)
    maintain = dag.get_task("stratum_2.maintain")
    assert type(maintain).__name__ == "MappedOperator" and maintain.partial_kwargs["conn_id"] == "warm"
    assert [t.task_id for t in dag.topological_sort()] == [
        "plan", "trim", "stratum_2.views", "stratum_2.maintain", "stratum_3.views", "stratum_3.maintain",
        "validate", "publish", "sink", "assets", "compact", "report"]
    # the default: spark-submits
    monkeypatch.delenv(CONNECT_CONN_ENV)
    assert type(build_dags(REPO / "jobs", path)["ivm_refresh_hourly"].get_task("trim")).__name__ == "SparkStageOperator"


def test_delta_sources_are_inlets_and_can_schedule_their_group(dagbag, tmp_path):
    """A group with ``schedule: "@sources"`` runs on its Delta sources' asset events; their assets are
    the plan's inlets. A group of such a schedule whose views read no Delta source is refused."""
    from ivm.errors import ConfigError
    from ivm.orchestration.dags import build_dags

    lake = dagbag.dags["ivm_refresh_sources"]
    project_dir = Path(lake.get_task("plan").op_args[0][4]).parent
    source = (project_dir / "lake" / "s").as_uri()
    assert [a.uri for a in lake.get_task("plan").inlets] == [source]
    assert [a.uri for a in lake.schedule.objects] == [source]
    assert lake.get_task("plan").op_args[0][-4:] == ["--views", "from_lake", "--mode", "auto"]
    bad = write_project(tmp_path / "bad", TABLES, views={"joined": {**VIEWS["joined"], "schedule": "@sources"}})
    with pytest.raises(ConfigError, match=r"views.joined.schedule: @sources .* read none"):
        build_dags(REPO / "jobs", str(bad))


def test_backfill_dag_has_params(dagbag):
    backfill = dagbag.dags["ivm_backfill"]
    assert backfill.schedule is None and backfill.max_active_runs == 1
    assert backfill.params["views"] == ["busy", "from_lake", "joined", "per_k"] and backfill.params["full"] is False
    args = backfill.get_task("plan").op_args[0]
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
    assert {t.task_id for t in backfill.tasks} >= {"stratum_2.maintain", "stratum_3.maintain", "publish"}


@pytest.mark.parametrize("conf, expected", [
    ({}, {"views": ("busy", "from_lake", "joined", "per_k"), "mode": "auto", "from_version": None, "sample": None}),
    ({"views": ["per_k"], "full": True, "sample": 0},
     {"views": ("per_k",), "mode": "full", "from_version": None, "sample": 0}),
    ({"views": ["busy"], "from_version": 3, "sample": 50},
     {"views": ("busy",), "mode": "auto", "from_version": 3, "sample": 50})])
def test_backfill_params_reach_the_stages(dagbag, conf, expected):
    """A triggered backfill's params, rendered into the plan and validate tasks' command lines as Airflow
    renders them, give the stages the arguments they stand for (the same run id on both)."""
    from ivm.orchestration.stages import parse_stage_args

    backfill = dagbag.dags["ivm_backfill"]
    # (the params' defaults, test_backfill_dag_has_params, which resolves one: dump() would give its value)
    defaults = {"views": sorted(VIEWS), "full": False, "from_version": None, "sample": None}
    context = {"params": {**defaults, **conf}, "dag": backfill, "run_id": "manual__2026-12-02"}
    parsed = {}
    for task, field in (("plan", "op_args"), ("validate", "application_args")):
        op = backfill.get_task(task)
        command = getattr(op, field)[0] if field == "op_args" else op.application_args
        rendered = op.render_template(command, context, jinja_env=backfill.get_template_env())
        _, _, parsed[task] = parse_stage_args(rendered)
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
    """The services of the official Airflow 3 compose file plus Spark (a standalone cluster and a Spark
    Connect server) and a Hive metastore, built from the repo's Dockerfile, with the repo's folders mounted.
    (`docker compose config` checks it further where the compose plugin is installed.)"""
    doc = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    assert set(doc["services"]) == {"postgres", "hive-metastore", "airflow-init", "airflow-apiserver",
                                    "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "spark-master",
                                    "spark-worker", "spark-connect"}
    api = doc["services"]["airflow-apiserver"]
    assert api["command"] == "api-server" and api["build"] == "."
    assert {v.split(":")[1] for v in api["volumes"]} >= {"/opt/airflow/dags", "/opt/airflow/jobs",
                                                         "/opt/airflow/include", "/opt/airflow/plugins"}
    assert "spark://spark-master" in api["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert "org.apache.spark.deploy.worker.Worker" in doc["services"]["spark-worker"]["command"][-1]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "openjdk-17" in dockerfile
    assert doc["services"]["hive-metastore"]["build"] == {"context": ".", "target": "hive-metastore"}
    assert "FROM apache/hive:" in dockerfile and " AS hive-metastore" in dockerfile
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        checked = subprocess.run([docker, "compose", "-f", str(REPO / "docker-compose.yaml"), "config", "--quiet"],
                                 capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


def test_docker_compose_comes_up_as_documented():
    """What made the compose file fail to come up, checked without a Docker engine: the user and password
    docs/operations.md and the file's header document are the ones airflow-init creates in Airflow's FAB auth
    manager; the warehouse and logs volumes are handed to the tasks' user (AIRFLOW_UID) by the init, which
    runs as root, and the Spark services run as that user too, through the image's entrypoint (which names
    a user id other than 50000; Hadoop refuses a nameless one); JAVA_HOME is no one architecture's; the
    task logs are one volume and the API and JWT secrets one value for every Airflow service; every
    long-running service has a healthcheck, and the ones after it wait for it to be healthy."""
    text = (REPO / "docker-compose.yaml").read_text()
    doc = yaml.safe_load(text)
    services = doc["services"]
    airflow = {n: s for n, s in services.items() if n.startswith("airflow-")}
    readme = (REPO / "docs" / "operations.md").read_text()  # (the compose stack: docs/operations.md)
    assert "user and password `airflow`" in readme and "(user airflow, password airflow)" in text
    init = services["airflow-init"]
    script = init["command"][-1]
    assert "airflow users create --username airflow --password airflow --role Admin" in script
    assert init["user"] == "0:0"
    uid = "${AIRFLOW_UID:-50000}"
    chown = next(line for line in script.splitlines() if line.strip().startswith("chown -R"))
    assert chown.split()[2] == '"$${AIRFLOW_UID:-50000}:0"'  # (compose makes $$ a $ for the shell)
    for name, service in {**airflow, "spark-connect": services["spark-connect"]}.items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        env = service["environment"]
        assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("fab_auth_manager.FabAuthManager"), name
        assert mounts["/opt/airflow/logs"] == "airflow-logs" and mounts["/opt/ivm/warehouse"] == "ivm-warehouse", name
        assert env["AIRFLOW__API__SECRET_KEY"] and env["AIRFLOW__API_AUTH__JWT_SECRET"], name
        assert {env["AIRFLOW__API__SECRET_KEY"], env["AIRFLOW__API_AUTH__JWT_SECRET"]} == {
            services["airflow-apiserver"]["environment"]["AIRFLOW__API__SECRET_KEY"],
            services["airflow-apiserver"]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"]}
        if name != "airflow-init":
            assert service["user"] == f"{uid}:0" and "healthcheck" in service, name
            assert service["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully", name
            assert service["depends_on"]["hive-metastore"]["condition"] == "service_healthy", name
    for path in ("/opt/ivm/warehouse", "/opt/airflow/logs"):
        assert path in chown, path
    for name in ("spark-master", "spark-worker"):
        service = services[name]
        assert service["user"] == f"{uid}:0" and "healthcheck" in service, name
        assert "entrypoint" not in service and service["command"][:2] == ["bash", "-c"], name
        assert service["command"][2].startswith("exec spark-class org.apache.spark.deploy."), name
    worker = services["spark-worker"]
    assert "ivm-warehouse:/opt/ivm/warehouse" in worker["volumes"]
    dockerfile = (REPO / "Dockerfile").read_text()
    java_home = next(line for line in dockerfile.splitlines() if line.startswith("ENV JAVA_HOME="))
    assert "amd64" not in java_home and "arm64" not in java_home and "dpkg --print-architecture" in dockerfile


def test_docker_compose_runs_spark_connect_and_a_shared_metastore():
    """The Spark Connect server runs ivm's own `ivm server start` (in the foreground) on the standalone
    cluster, healthchecked; the `spark_connect` connection names it, beside `spark_default`; the DAGs keep
    spark-submit unless IVM_SPARK_CONNECT_CONN_ID is set; every JVM keeps the views' names in the Hive
    metastore on the stack's PostgreSQL (the demo project reads IVM_METASTORE); the Spark master, the
    Connect server and PostgreSQL are published on the host's loopback only."""
    from ivm.cli import parse_args
    from ivm.config import load_project

    doc = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = doc["services"]
    connect = services["spark-connect"]
    command = connect["command"][2].removeprefix("exec ").split()
    assert command[:3] == ["ivm", "server", "start"]
    args = parse_args(command[1:])
    assert (args.foreground, args.host, args.port, args.master) == (True, "0.0.0.0", 15002, "spark://spark-master:7077")
    assert "15002" in " ".join(connect["healthcheck"]["test"])
    assert connect["depends_on"]["spark-worker"]["condition"] == "service_healthy"
    env = services["airflow-scheduler"]["environment"]
    conn = yaml.safe_load(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert (conn["conn_type"], conn["host"], conn["port"]) == ("spark_connect", "sc://spark-connect", 15002)
    assert env["IVM_SPARK_CONNECT_CONN_ID"] == "${IVM_SPARK_CONNECT_CONN_ID:-}"  # (spark-submit by default)
    assert env["IVM_METASTORE"] == "thrift://hive-metastore:9083"
    metastore = services["hive-metastore"]
    assert "jdbc:postgresql://postgres:5432/metastore" in metastore["environment"]["SERVICE_OPTS"]
    assert "9083" in " ".join(metastore["healthcheck"]["test"])
    assert "CREATE DATABASE metastore" in (REPO / "include" / "docker" / "postgres-init.sql").read_text()
    demo = str(REPO / "include" / "views" / "demo" / "ivm.yaml")
    mp = pytest.MonkeyPatch()
    mp.setenv("IVM_METASTORE", env["IVM_METASTORE"])
    try:
        assert load_project(demo).spark.metastore == env["IVM_METASTORE"]
    finally:
        mp.undo()
    for name, port in [("spark-master", "7077"), ("spark-master", "8081"), ("spark-connect", "15002"),
                       ("postgres", "5432")]:
        published = [p for p in services[name]["ports"] if p.endswith(f":{port}")]
        assert published and all(p.startswith("127.0.0.1:") for p in published), (name, published)
