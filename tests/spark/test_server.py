"""`ivm server` (ivm.server): the project's Spark Connect server, started, used and stopped as a user does
it, through the `ivm` command in processes of their own — every command of the project then runs on the
server (found from the project's folder, no SPARK_REMOTE needed), none starts a JVM of its own (the java
processes under each call are watched while it runs), a second start is refused in one line, and a
server that does not answer is one line too, at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ivm.errors import SparkUnavailableError
from tests.conftest import write_project
from tests.helpers import BIN, free_port

TABLES = {"link": {"columns": {"src": "string", "dst": "string"}, "key": ["src", "dst"]}}
VIEWS = {"hop": {"sql": "SELECT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src"}}


def java_descendants(pid: int) -> set[int]:
    """The java processes below process ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        names[int(entry.name)] = name
        children.setdefault(int(rest[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if names.get(child) == "java":
                found.add(child)
    return found


def ivm(env: dict, *argv: str, timeout: float = 300) -> tuple[int, str, str, set[int]]:
    """`ivm ARGV...` in a process of its own: exit code, stdout, stderr, and the java processes seen below
    it while it ran (polled every 20 ms)."""
    proc = subprocess.Popen([str(BIN / "ivm"), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= java_descendants(proc.pid)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    return proc.returncode, out, err, seen


@pytest.fixture
def user_env(tmp_path):
    """A user's environment: no SPARK_REMOTE (the suite's own, when it runs on a server, is not theirs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    return {**env, "IVM_PROJECT": str(write_project(tmp_path / "proj", TABLES, views=VIEWS))}


@pytest.mark.e2e
def test_one_server_serves_every_command_and_none_starts_a_jvm(user_env, tmp_path):
    (tmp_path / "link.csv").write_text("src,dst\na,b\nb,c\n")
    (tmp_path / "c1.csv").write_text("src,dst,_change_type\nc,d,insert\na,b,delete\n")
    port = free_port()
    code, out, err, _ = ivm(user_env, "server", "start", "--port", str(port))
    assert code == 0 and out.strip() == f"sc://127.0.0.1:{port}", err
    try:
        assert "ready: Spark Connect server at" in err
        code, out, err, _ = ivm(user_env, "server", "start", "--port", str(free_port()))
        assert code == 2 and err.count("\n") == 1 and "is already running: `ivm server stop` first" in err, err
        code, out, _, _ = ivm(user_env, "server", "status")
        assert code == 0 and out.startswith(f"Spark Connect server at sc://127.0.0.1:{port} (pid ")
        # every command as a user types it: none starts a JVM, the work is the server's
        for argv, expect in [(("apply",), "created view hop"), (("load", "link", str(tmp_path / "link.csv")),
                                                                 "loaded 2 rows"),
                             (("log", "append", "link", str(tmp_path / "c1.csv")), "appended 2 changes"),
                             (("refresh",), "succeeded"), (("show", "hop", "--format", "csv"), "src,dst\nb,d\n"),
                             (("refresh", "--mode", "full"), "succeeded"), (("explain", "hop"), "hop"),
                             (("show", "nosuch"), "")]:
            code, out, err, java = ivm(user_env, *argv)
            assert not java, (argv, "started a JVM")
            if argv == ("show", "nosuch"):
                assert code == 2 and err.count("\n") == 1 and err.startswith("ivm: error:"), err
            else:
                assert code == 0 and expect in out + err, (argv, out, err)
    finally:
        code, out, _, _ = ivm(user_env, "server", "stop")
    assert code == 0 and out.startswith("stopped the Spark Connect server")
    code, out, _, _ = ivm(user_env, "server", "status")
    assert code == 1 and out.strip() == "no Spark Connect server of this project is running"


def test_a_server_that_does_not_answer_is_one_line_at_once(user_env):
    """SPARK_REMOTE naming a port where nothing listens: one line, exit code 8, in well under Spark's own
    retries (minutes), and no JVM."""
    env = {**user_env, "SPARK_REMOTE": f"sc://127.0.0.1:{free_port()}"}
    started = time.monotonic()
    code, out, err, java = ivm(env, "apply")
    assert (code, out, java) == (SparkUnavailableError.exit_code, "", set())
    assert err.count("\n") == 1 and err.startswith("ivm: error: no Spark Connect server answers at sc://127.0.0.1:")
    assert time.monotonic() - started < 30


def test_an_unknown_name_is_refused_before_spark_starts(tmp_path, spark):
    """`ivm show nosuch` (Project.read) answers from the project file, its compiled program and the catalog:
    no Spark session is started or reached for it (it started a JVM and analysed every view: 12 s)."""
    from ivm import Project
    from ivm.errors import NotFoundError

    p = Project.open(str(write_project(tmp_path / "p", TABLES, views=VIEWS)))
    try:
        with pytest.raises(NotFoundError, match="unknown table or view 'nosuch'"):
            p.read("nosuch")
        assert not p.ctx.spark_started
    finally:
        p.close()


def test_a_session_of_the_users_own_is_the_projects_spark(tmp_path, spark):
    """`Project.open(path, spark=...)`: the user's session, classic or Connect (whichever the suite runs on),
    is the one every stage uses."""
    from ivm import Project

    p = Project.open(str(write_project(tmp_path / "p", TABLES)), spark=spark)
    try:
        assert p.spark is spark
    finally:
        p.close()


def test_the_servers_command_line_is_the_projects_spark(tmp_path):
    """`ivm.server.command`: pyspark's spark-submit of Spark's Connect server with what an in-process
    session of the project gets (ivm's defaults, the project's conf, Delta, the views' metastore) and
    the address; its Python workers run this interpreter."""
    from ivm import server
    from ivm.config import load_project

    path = write_project(tmp_path / "p", TABLES, spark={"master": "local[3]", "conf": {"spark.driver.memory": "5g"},
                                                        "metastore": "thrift://meta:9083"})
    config = load_project(str(path))
    argv = server.command(config, "0.0.0.0", 15123)
    assert argv[0].endswith("pyspark/bin/spark-submit") and argv[-1] == "spark-internal"
    assert argv[1:7] == ["--master", "local[3]", "--class", server.SERVER_CLASS, "--name", "ivm-p"]
    conf = dict(a.split("=", 1) for a in argv[8::2])
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert conf["spark.connect.grpc.binding.port"] == "15123"
    assert conf["spark.driver.memory"] == "5g" and conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.hadoop.hive.metastore.uris"] == "thrift://meta:9083"
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert server.environment(config)["PYSPARK_PYTHON"] == sys.executable
    assert server.status(config) is None
