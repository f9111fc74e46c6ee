"""How the DAGs run a stage (ivm.orchestration.operators), without an Airflow scheduler: a Spark stage
with nothing to do skips itself before any spark-submit; a failure no retry heals (a bad name, bad
change data, a failed validation: ivm.orchestration.stages.PERMANENT) fails the task at once with the
run's one-line error, anything else is raised for Airflow to retry; the report task fails a failed run;
each task returns its summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from ivm.errors import IvmError, LeaseError
from ivm.orchestration.operators import SparkStageOperator, run_catalog_stage, run_report
from ivm.orchestration.stages import PERMANENT

ACCT = {"columns": {"id": "int", "owner": "string", "balance": "bigint"}, "key": ["id"]}
VIEWS = {"rich": {"sql": "SELECT owner, sum(balance) AS total FROM acct GROUP BY owner"}}


def command(stage: str, run_id: str, path: str, *extra: str) -> list[str]:
    return [stage, "--run-id", run_id, "--project", path, *extra]


def changes(path: Path, *rows: tuple[str | None, int, str, int]) -> str:
    path.write_text("".join(json.dumps({**({"_change_type": kind} if kind else {}), "id": i, "owner": o,
                                        "balance": b}) + "\n" for kind, i, o, b in rows))
    return str(path)


class FailedSubmit:
    """What SparkSubmitHook leaves after spark-submit exited with ``code``."""

    def __init__(self, code: int):
        self._submit_sp = type("Popen", (), {"returncode": code})()


def spark_stage(monkeypatch, stage: str, run_id: str, path: str, exit_code: int | None) -> dict:
    """The stage's SparkStageOperator with spark-submit replaced: it exits with ``exit_code`` (None: the
    stage itself, run in this process, as the job would)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from ivm import Project
    from ivm.orchestration.stages import parse_stage_args
    from ivm.refresh.stages import run_stage

    def submit(self, context):
        if exit_code is not None:
            self._hook = FailedSubmit(exit_code)
            raise RuntimeError(f"Cannot execute: spark-submit ... Error code is: {exit_code}.")
        name, project_file, args = parse_stage_args(list(self.application_args))
        p = Project.open(project_file)
        try:
            run_stage(p.ctx, name, args)
        except IvmError as e:  # (jobs/ivm_stage.py exits with the error's code)
            self._hook = FailedSubmit(e.exit_code)
            raise RuntimeError(f"Cannot execute: spark-submit ... Error code is: {e.exit_code}.") from e
        finally:
            p.close()

    monkeypatch.setattr(SparkSubmitOperator, "execute", submit)
    op = SparkStageOperator(task_id=stage, application="ivm_stage.py", application_args=command(stage, run_id, path))
    return op.execute({})


@pytest.fixture
def project(make_project, tmp_path):
    p = make_project({"acct": ACCT}, views=VIEWS)
    p.load("acct", changes(tmp_path / "acct.jsonl", (None, 1, "ann", 10)))
    p.refresh()
    return p, str(Path(p.config.root) / "ivm.yaml")


def test_permanent_exit_codes():
    assert PERMANENT == {2, 3, 6, 7}


def test_a_run_with_nothing_to_do_skips_every_spark_stage(project, monkeypatch):
    p, path = project
    summary = run_catalog_stage(command("plan", "idle", path))
    assert summary["run"] == "idle" and summary["stage"] == "plan" and summary["seconds"] >= 0
    for stage, why in [("trim", "no table has changes past its watermark"),
                       ("validate", "no view was maintained incrementally")]:
        with pytest.raises(AirflowSkipException, match=f"ivm {stage}: nothing to do in run idle: {why}"):
            spark_stage(monkeypatch, stage, "idle", path, exit_code=0)
    run_catalog_stage(command("publish", "idle", path))
    for stage in ("sink", "compact"):
        with pytest.raises(AirflowSkipException):
            spark_stage(monkeypatch, stage, "idle", path, exit_code=0)
    assert run_report(command("report", "idle", path))["status"] == "noop"


def test_failures_no_retry_heals_fail_at_once(project, monkeypatch, tmp_path):
    p, path = project
    # a bad name: the plan task (on the worker) fails, not retried
    with pytest.raises(AirflowFailException, match=r"ivm plan: unknown view 'nope' \(exit code 2: not retried\)"):
        run_catalog_stage(command("plan", "bad-name", path, "--views", "nope"))
    # bad change data: the trim's spark-submit exits 3; the task fails with the run's recorded error
    p.append("acct", changes(tmp_path / "c1.jsonl", ("delete", 9, "zed", 1)))
    run_catalog_stage(command("plan", "bad-data", path))
    with pytest.raises(AirflowFailException, match=r"^ivm run bad-data failed: trim: table acct: commit version 1, "
                                                   r"row \(id=9.* \(exit code 3: not retried\)$"):
        spark_stage(monkeypatch, "trim", "bad-data", path, exit_code=None)
    with pytest.raises(AirflowFailException, match=r"ivm run bad-data failed: trim: table acct: commit version 1"):
        run_report(command("report", "bad-data", path))
    # Spark lost (any other exit code): raised as it came, for Airflow to retry
    with pytest.raises(RuntimeError, match="Error code is: 1"):
        spark_stage(monkeypatch, "trim", "bad-data", path, exit_code=1)


def test_a_held_lease_is_retried(project, tmp_path):
    """Another run holds the table's lease (exit code 4): the plan task raises it for a retry."""
    p, path = project
    p.append("acct", changes(tmp_path / "c1.jsonl", ("insert", 2, "bob", 5)))
    p.catalog.acquire_leases("someone-else", ["acct"], p.ctx.lease_timeout)
    with pytest.raises(LeaseError):
        run_catalog_stage(command("plan", "leased", path))


def test_each_task_returns_its_summary(project, monkeypatch, tmp_path):
    p, path = project
    p.append("acct", changes(tmp_path / "c1.jsonl", ("insert", 2, "bob", 5), ("insert", 3, "ann", 1)))
    run_catalog_stage(command("plan", "ok", path))
    trim = spark_stage(monkeypatch, "trim", "ok", path, exit_code=None)
    assert (trim["relations"], trim["rows_changed"]) == (["acct"], 2)
    maintain = spark_stage(monkeypatch, "maintain", "ok", path, exit_code=None)
    assert maintain["relations"] == ["rich"] and maintain["rows_changed"] >= 2
    spark_stage(monkeypatch, "validate", "ok", path, exit_code=None)
    run_catalog_stage(command("publish", "ok", path))
    report = run_report(command("report", "ok", path))
    assert (report["status"], report["relations"], report["run"]) == ("succeeded", ["rich"], "ok")
    assert sorted(tuple(r) for r in p.read("rich").collect()) == [("ann", 11), ("bob", 5)]


def test_the_sink_of_small_views_runs_on_the_worker(make_project, monkeypatch, tmp_path):
    """The sink task of a run whose views are small (`storage.sink_without_jvm_mb`) writes their Delta
    tables with delta-rs on the worker itself: no spark-submit, no JVM (Stage.without_jvm); should it
    fail, the run stays published (the sink is after the commit point) and the retried task writes."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from ivm import sinks

    p = make_project({"acct": ACCT}, views=VIEWS, storage={"delta_views": True})
    p.load("acct", changes(tmp_path / "acct.jsonl", (None, 1, "ann", 10), (None, 2, "bob", 5)))
    p.refresh()
    p.append("acct", changes(tmp_path / "c1.jsonl", ("insert", 3, "ann", 1)))
    path = str(Path(p.config.root) / "ivm.yaml")
    run_catalog_stage(command("plan", "small", path))
    for stage in ("trim", "maintain", "validate"):
        spark_stage(monkeypatch, stage, "small", path, exit_code=None)
    run_catalog_stage(command("publish", "small", path))
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: pytest.fail("a spark-submit"))
    monkeypatch.setattr("ivm.context.project_session", lambda *a, **k: pytest.fail("the worker started Spark"))
    op = SparkStageOperator(task_id="sink", application="ivm_stage.py", application_args=command("sink", "small", path))
    # a sink that fails after the commit point fails its task, not the published run (a retry completes it)
    with monkeypatch.context() as m:
        m.setattr(sinks, "write_view", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
        with pytest.raises(OSError, match="disk full"):
            op.execute({})
    assert p.catalog.get_run("small").status == "succeeded"
    summary = op.execute({})
    assert summary["relations"] == ["rich"]
    assert p.catalog.latest_stage("sink", "rich").detail["how"] == "merge (copies, delta-rs)"
    assert sinks.read_without_jvm(p.ctx, "rich").to_pylist() == [{"owner": "ann", "total": 11},
                                                                  {"owner": "bob", "total": 5}]
