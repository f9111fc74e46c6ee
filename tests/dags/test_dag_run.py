"""The refresh DAG end to end on a Spark standalone cluster (docs/design.md §9): a master and a
worker started on loopback with pyspark's own ``spark-class``, ``spark_default`` pointed at the master,
and each DAG run with ``dag.test()`` — every Spark stage a real spark-submit of jobs/ivm_stage.py, the
catalog-only stages Python tasks — for the demo project with real changes. Afterwards every view equals
its full recomputation, the run is in the catalog as the DAG's run, its validate task links to its
data-quality page, and it sent an asset event for each view it changed. A run with nothing to do then
starts no spark-submit, and a run refused by bad change data fails at once, without retries, its report
naming the commit.

Airflow runs in a subprocess with its own AIRFLOW_HOME (its configuration is read once per process);
the views are checked here, on the test session's Spark."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from ivm import Project, sinks
from ivm.orchestration.stages import changed_views
from tests.helpers import BIN, REPO, assert_views_recomputed, free_ports

DEMO = REPO / "include" / "views" / "demo"
#: counting (a join with GROUP BY, a view over it: two strata), CReaM (setof, an auxiliary view) and DRed
#: (reach). REDUCE and the key-based rules (the demo's passenger_routes, booked_origins) keep no state a
#: stage hands to the next beyond what counting's does; each view costs every DAG run a spark-submit
#: (~25 s), so they are left to tests/spark (test_strategies, test_stages for the stage contract)
DAG_VIEWS = ["seats_per_flight", "busy_flights", "page_visitors", "reach"]

#: the JIT of the stages' JVMs (see `deployment`)
C1_ONLY = "-XX:TieredStopAtLevel=1"

DAG_RUN = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder={dags!r}).dags[sys.argv[1]]
run = dag.test(run_conf=json.loads(sys.argv[2]))
print("DAG RUN", run.state)
"""




@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """A standalone master and one worker (2 cores) on loopback; yields the master URL."""
    work = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_ports(3)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work),
           "PYSPARK_PYTHON": sys.executable}
    spark_class = str(BIN / "spark-class")
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(work / "master.log", "w"))]
    url = f"spark://127.0.0.1:{port}"
    procs.append(subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                   "--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(work / "worker.log", "w")))
    try:
        deadline = time.monotonic() + 90
        while True:  # the master's status page counts the workers that registered
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        break
            # not up yet; or up but still attaching its handlers: until "/json" is attached, the master's
            # HTML page at "/" answers for it (a CI run failed on that)
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark standalone cluster did not start: see {work}")
            time.sleep(1)
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, spark_cluster, spark):
    """The demo project in a fresh folder, loaded and refreshed once (in process), its change logs
    appended; and an Airflow home whose spark_default is the cluster."""
    root = tmp_path_factory.mktemp("deployment")
    shutil.copytree(DEMO, root / "demo", ignore=shutil.ignore_patterns("warehouse"))
    # one view per maintenance algorithm and a view over a view (two strata): every other demo view
    # would add a spark-submit of its own to each DAG run and cover nothing more here
    project_file = root / "demo" / "ivm.yaml"
    doc = yaml.safe_load(project_file.read_text())
    doc["views"] = {v: doc["views"][v] for v in DAG_VIEWS}
    # each stage is a short-lived JVM (driver and executor) over a few rows: C1 compiles what it runs
    # soon enough, C2's compilations only take the CPU (this test 9:45 -> 6:55, a cold `ivm backfill
    # --full` of these views 24 s -> 20 s); the in-process test session, long-lived, keeps C2 (with C1
    # only, test_refresh and test_cream took 264 s against 219)
    doc["spark"]["conf"].update({f"spark.{side}.extraJavaOptions": C1_ONLY for side in ("driver", "executor")})
    project_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    project = Project.open(str(root / "demo" / "ivm.yaml"))
    project.apply()
    data = root / "demo" / "data"
    for table, file in [("flight", "flight.csv"), ("res", "res.jsonl"), ("link", "link.csv"),
                        ("page_view", "page_view.csv")]:
        project.load(table, str(data / file))
    project.refresh()
    host, port = spark_cluster.removeprefix("spark://").split(":")
    env = {**os.environ, "AIRFLOW_HOME": str(root / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "false", "IVM_PROJECT": str(root / "demo" / "ivm.yaml"),
           "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": f"spark://{host}",
                                                     "port": int(port)}),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "SPARK_LOCAL_IP": "127.0.0.1"}
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    yield project, env, data
    project.close()


def dag_test(env: dict, dag_id: str, conf: dict | None = None, state: str = "success") -> str:
    script = DAG_RUN.format(dags=str(REPO / "dags"))
    done = subprocess.run([sys.executable, "-c", script, dag_id, json.dumps(conf or {})],
                          env=env, capture_output=True, text=True, timeout=1200)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0 and f"DAG RUN {state}" in done.stdout, tail
    return done.stdout + done.stderr


def task_states(env: dict, dag_id: str) -> dict[str, tuple[str, int]]:
    """(state, try number) of each task of the DAG's newest run (a mapped task: its first instance)."""
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        (run_id,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                               (dag_id,)).fetchone()
        return {t: (s, n) for t, s, n in db.execute(
            "SELECT task_id, state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? "
            "AND map_index <= 0", (dag_id, run_id))}






@pytest.mark.e2e
def test_the_refresh_dag_on_a_standalone_cluster(deployment, spark_cluster):
    project, env, data = deployment
    for table, file, fmt in [("res", "res_changes_1.jsonl", "cdf"), ("res", "res_debezium.jsonl", "debezium"),
                             ("link", "link_changes.csv", "cdf"), ("page_view", "page_view_changes.csv", "cdf")]:
        project.append(table, str(data / file), fmt)
    before = {v: project.catalog.state(v).version_id for v in project.config.views}
    log = dag_test(env, "ivm_refresh")
    assert f"--master {spark_cluster}" in log  # the stages went to the cluster
    run = project.runs(1)[0]
    assert run.id.startswith("ivm_refresh-manual") and (run.kind, run.status) == ("refresh", "succeeded")
    maintained = {s.relation: s.mode for s in run.stages if s.stage == "maintain"}
    assert maintained and set(maintained.values()) <= {"incremental", "noop"}
    assert [v for v in project.config.views if project.catalog.state(v).version_id != before[v]]
    assert {s.relation for s in run.stages if s.stage == "trim"} == {"res", "link", "page_view"}
    assert_views_recomputed(project)
    # the validate task checked every incrementally maintained view (counting, DRed, CReaM) against its
    # sampled recomputation, and its extra link (kept as an XCom) leads to the run's data-quality page
    checks = {v.view: v.status for v in project.catalog.validations(run_id=run.id)}
    assert checks == {v: "passed" for v, mode in maintained.items() if mode == "incremental"}
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        (link,) = db.execute("SELECT value FROM xcom WHERE dag_id = 'ivm_refresh' AND task_id = 'validate' "
                             "AND key = '_link_DataQualityLink'").fetchone()
    assert json.loads(link).endswith(f"/ivm/quality?run={run.id}")
    # a stratum's views are maintained by one spark-submit (not one per view), shown by their names
    # (map_index_template)
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        shown = [r[0] for r in db.execute("SELECT rendered_map_index FROM task_instance WHERE dag_id = 'ivm_refresh' "
                                          "AND task_id LIKE 'stratum_%.maintain' AND map_index >= 0")]
    strata = {project.program[1].stratum_of[v] for v in maintained}
    assert len(shown) == len(strata) and sorted(v for s in shown for v in s.split(",")) == sorted(maintained)
    # the assets task sent one event per view the run changed, none for the others, with the Delta
    # version its sink wrote (and the view's catalog version, rows changed) in the event's extra
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        events = {uri: json.loads(extra) for uri, extra in db.execute(
            "SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id")}
    changed = changed_views(project.ctx, run.id)
    assert changed and set(events) == {f"ivm://demo/{v}" for v in changed}
    for view, extra in changed.items():
        sink = DeltaTable(sinks.location(project.ctx, view))
        assert events[f"ivm://demo/{view}"] == {**extra, "delta_version": sink.version()}
        assert extra["view_version"] == project.catalog.state(view).version_id
    # (the backfill DAG runs the same stage tasks: that its params reach them is test_dags's
    # test_backfill_params_reach_the_stages, a replay through the stages test_stages's; a second DAG run
    # here cost CI ~6 minutes)
    # each task returned its summary (XCom): the report the run's status, the maintain task its view
    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        xcoms = {(t, i): json.loads(v) for t, i, v in db.execute(
            "SELECT task_id, map_index, value FROM xcom WHERE dag_id = 'ivm_refresh' AND key = 'return_value'")}
    assert xcoms[("report", -1)]["status"] == "succeeded" and xcoms[("report", -1)]["run"] == run.id
    assert {r for (t, _), x in xcoms.items() if t.endswith(".maintain") for r in x["relations"]} == set(maintained)
    assert set(xcoms[("trim", -1)]["relations"]) == {"res", "link", "page_view"}

    # nothing changed since: the plan finds nothing to do, every Spark stage skips itself (no spark-submit,
    # no JVM) and the report says so
    log = dag_test(env, "ivm_refresh")
    assert "spark-submit" not in log and "--master" not in log
    states = task_states(env, "ivm_refresh")
    assert {t for t, (s, _) in states.items() if s == "skipped"} >= {"trim", "validate", "sink", "compact"}
    assert states["plan"][0] == states["publish"][0] == states["report"][0] == "success"
    assert project.runs(1)[0].status == "noop" and "nothing was refreshed" in log

    # a commit the trim refuses (bad change data, exit code 3): the trim fails at once, not retried, and
    # the report task (which runs anyway) fails the DAG run with the stage and the one-line error
    project.append("res", str(data / "res_bad.jsonl"), "cdf")
    log = dag_test(env, "ivm_refresh", state="failed")
    states = task_states(env, "ivm_refresh")
    assert states["trim"] == ("failed", 1) and states["report"][0] == "failed", states
    assert states["publish"][0] == "upstream_failed"
    failed = project.runs(1)[0]
    assert failed.status == "failed" and failed.error.startswith("trim: table res: commit version")
    assert f"ivm run {failed.id} failed: {failed.error}" in log and "not retried" in log


@pytest.mark.e2e
def test_the_refresh_dag_on_spark_connect(deployment):
    """The same DAG with one setting changed (``IVM_SPARK_CONNECT_CONN_ID``): its Spark stages are Python
    tasks that connect to the project's Spark Connect server (`ivm server start`) through an Airflow
    connection of type ``spark_connect`` — no spark-submit, no JVM started by any task, the maintain
    tasks one per view — and the views end equal to their recomputation."""
    from ivm import server

    project, env, data = deployment
    bad = project.runs(1)[0]
    if bad.status == "failed" and "commit version" in (bad.error or ""):
        # (the test before left a refused commit, and its failed run the leases it keeps for a retry)
        project.catalog.release_leases(bad.id)
        project.quarantine("res", int(bad.error.split("commit version ")[1].split(",")[0]))
    state = server.start(project.config, port=free_ports(1)[0])
    try:
        host, port = state.address.removeprefix("sc://").split(":")
        lineage = Path(env["AIRFLOW_HOME"]) / "openlineage.jsonl"
        connect_env = {**env, "IVM_SPARK_CONNECT_CONN_ID": "spark_connect_default",
                       "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
                           {"conn_type": "spark_connect", "host": f"sc://{host}", "port": int(port)}),
                       # Airflow's OpenLineage provider, its file transport (one event per line)
                       "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                           {"type": "file", "log_file_path": str(lineage), "append": True})}
        project.append("res", str(data / "res_changes_2.jsonl"))
        log = dag_test(connect_env, "ivm_refresh")
        assert "spark-submit" not in log and "--master" not in log
        assert "Spark Connect server of connection spark_connect_default" in log
        run = project.runs(1)[0]
        assert (run.kind, run.status) == ("refresh", "succeeded"), run.error
        maintained = {s.relation for s in run.stages if s.stage == "maintain"}
        assert {s.relation for s in run.stages if s.stage == "trim"} == {"res"} and maintained
        # one maintain task per view on Spark Connect (a task is a Python process there, not a JVM)
        with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
            (dag_run,) = db.execute("SELECT run_id FROM dag_run WHERE dag_id = 'ivm_refresh' ORDER BY id DESC "
                                    "LIMIT 1").fetchone()
            shown = {r[0] for r in db.execute("SELECT rendered_map_index FROM task_instance WHERE dag_id = "
                                              "'ivm_refresh' AND run_id = ? AND task_id LIKE 'stratum_%.maintain' "
                                              "AND map_index >= 0", (dag_run,))}
        assert shown == maintained
        # OpenLineage through Airflow's provider: the trim task's inputs (the tables whose changes the run
        # read, at the versions read), the sink task's outputs (the views' Delta tables at the versions
        # written), each task's events tagged with the ivm run
        sent = [json.loads(line) for line in lineage.read_text().splitlines() if line.strip()]
        done = {e["job"]["name"]: e for e in sent if e["eventType"] == "COMPLETE"}
        trim, sink = done["ivm_refresh.trim"], done["ivm_refresh.sink"]
        assert [(i["name"], i["facets"]["version"]["datasetVersion"]) for i in trim["inputs"]] == [
            (project.ctx.warehouse.path("log", "res"), str(run.snapshot["res"]))]
        written = {s.relation: s.detail for s in run.stages if s.stage == "sink"}
        assert written and {o["name"]: o["facets"]["version"]["datasetVersion"] for o in sink["outputs"]} == {
            d["location"]: str(d["delta_version"]) for d in written.values()}
        for event in (trim, sink):
            assert {"key": "ivm.run_id", "value": run.id, "source": "IVM"} in event["run"]["facets"]["tags"]["tags"]
    finally:
        server.stop(project.config)
    assert_views_recomputed(project)
