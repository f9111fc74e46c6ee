"""The project's Spark Connect server: one warm Spark driver that every `ivm` command, the Python API and
the DAG's Spark tasks share, started with the project's Spark settings.

    ivm server start [--host 127.0.0.1] [--port 15002]   # in the background; prints its sc:// address
    ivm server status                                    # the address, pid and log, or "not running"
    ivm server stop

The server is Spark's own (``org.apache.spark.sql.connect.service.SparkConnectServer``, shipped in pip's
pyspark), started by pyspark's ``spark-submit`` with what an in-process session of the project gets
(`ivm.spark.project_conf`: ivm's defaults, the project's ``spark.conf``, Delta's extension and jars, the
views' metastore) and the project's ``spark.master``. Its Python workers run this interpreter (the one
ivm is installed in), so registered Python aggregates run there as they do in-process.

What a running server is, is kept in ``<warehouse>/spark-connect/server.json`` (its pid, address and log,
``server.log`` beside it); a command of the project that is not told otherwise (``SPARK_REMOTE``,
``spark.remote``) connects to it (`remote_for`): in-process Spark beside it would find the views' embedded
metastore held by the server's JVM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ivm.config import QUIET_JVM_ENV, ProjectConfig
from ivm.errors import ConfigError, SparkUnavailableError
from ivm.spark import (
    CONNECT_PORT,
    classic_session_active,
    local_file_system,
    project_conf,
    reachable,
    remote_address,
    session,
    with_delta,
)

log = logging.getLogger(__name__)

#: Spark's Spark Connect server (in pyspark's jars since Spark 4.0)
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: how long `start` waits for a new server to answer (a cold JVM with Delta's jars: ~10-20 s here)
START_TIMEOUT_SECONDS = 180.0
#: how long `stop` waits for the server to end after SIGTERM before it kills it
STOP_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class ServerState:
    """A server `start` started: what `status` reports and `stop` ends."""

    pid: int
    address: str
    log: str
    master: str
    started_at: float

    def describe(self) -> str:
        return (f"Spark Connect server at {self.address} (pid {self.pid}, master {self.master}, "
                f"up {time.time() - self.started_at:.0f} s, log {self.log})")


def state_dir(config: ProjectConfig) -> Path:
    """Where the project's server keeps its state and log: the warehouse's ``spark-connect/`` when the
    warehouse is a local folder, else the project folder's ``.ivm/spark-connect/``."""
    base = Path(config.warehouse_uri) if config.warehouse_is_local else Path(config.root) / ".ivm"
    return base / "spark-connect"


def server_conf(config: ProjectConfig, host: str, port: int) -> dict[str, str]:
    """The Spark settings the project's server starts with: an in-process session's (`ivm.spark.session`)
    and the address it listens on."""
    conf = local_file_system(config.spark.master, with_delta(project_conf(config)))
    return {**conf, "spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)}


def spark_home() -> Path:
    """pyspark's folder: a Spark distribution's layout (``bin/spark-submit``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def command(config: ProjectConfig, host: str = "127.0.0.1", port: int = CONNECT_PORT,
            master: str | None = None) -> list[str]:
    """The server's command line: pyspark's spark-submit of `SERVER_CLASS` with `server_conf`, on the
    project's ``spark.master`` or ``master``."""
    master = master or config.spark.master
    conf = server_conf(config.model_copy(update={"spark": config.spark.model_copy(update={"master": master})}),
                       host, port)
    args = [str(spark_home() / "bin" / "spark-submit"), "--master", master, "--class", SERVER_CLASS,
            "--name", f"ivm-{config.project_name}"]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    return [*args, "spark-internal"]


def environment(config: ProjectConfig) -> dict[str, str]:
    """The server's environment: pyspark as Spark's home, this interpreter for its Python workers."""
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SPARK_REMOTE", None)
    if config.spark.master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status(config: ProjectConfig) -> ServerState | None:
    """The project's running server, or None (a state file whose process has ended is removed)."""
    path = state_dir(config) / "server.json"
    try:
        state = ServerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _alive(state.pid):
        path.unlink(missing_ok=True)
        return None
    return state


def remote_for(config: ProjectConfig) -> str | None:
    """The Spark Connect server a command of the project runs on: ``SPARK_REMOTE``, else ``spark.remote``,
    else the project's running server (`status`) unless this process already runs classic Spark; None:
    Spark in-process."""
    named = remote_address(config.spark)
    if named:
        return named
    if classic_session_active():
        return None
    running = status(config)
    if running is not None:
        log.info("using the project's Spark Connect server at %s (ivm server status)", running.address)
        return running.address
    return None


def project_session(config: ProjectConfig):
    """The Spark session a project's commands run on: its Spark Connect server (`remote_for`), else local
    Spark with the project's settings, Delta's extension and jars and its views' metastore — under the
    `ivm` command (`QUIET_JVM_ENV`), its JVM's console in ``spark-driver.log`` beside the server's log."""
    quiet = state_dir(config).parent / "spark-driver.log" if os.environ.get(QUIET_JVM_ENV) else None
    return session(config.spark.model_copy(update={"conf": project_conf(config)}), remote=remote_for(config),
                   jvm_log=quiet)


def session_for(path: str | None = None):
    """The project's Spark session for a notebook or a script, one line: ``spark = ivm.session_for(
    "ivm.yaml")``, then ``spark.table("<database>.<view>")`` or ``spark.read.format("delta").load(...)``
    (``path``: the project file; default ``$IVM_PROJECT``, else ``./ivm.yaml``)."""
    from ivm.config import load_project

    return project_session(load_project(path))


def start(config: ProjectConfig, host: str = "127.0.0.1", port: int = CONNECT_PORT,
          timeout: float = START_TIMEOUT_SECONDS, progress: Callable[[str], None] = lambda _: None,
          master: str | None = None) -> ServerState:
    """Start the project's server in the background (on the project's ``spark.master``, or ``master``)
    and wait until it answers; its state. Refused in one line while one runs, when the port is taken, or
    when the server ends or does not answer in ``timeout`` seconds (its log's last line named)."""
    running = status(config)
    if running is not None:
        raise ConfigError(f"the project's {running.describe()} is already running: `ivm server stop` first")
    address = f"sc://{'localhost' if host in ('0.0.0.0', '::') else host}:{port}"
    if reachable(address, timeout=0.5):
        raise ConfigError(f"port {port} on {host} is taken by another program: choose another with --port")
    where = state_dir(config)
    where.mkdir(parents=True, exist_ok=True)
    log_path = where / "server.log"
    master = master or config.spark.master
    progress(f"starting a Spark Connect server for {config.project_name} (master {master}) at {address} ...")
    with open(log_path, "ab") as out:
        process = subprocess.Popen(command(config, host, port, master), env=environment(config), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    state = ServerState(process.pid, address, str(log_path), master, time.time())
    started = time.perf_counter()
    while not reachable(address, timeout=0.5):
        if process.poll() is not None:
            raise SparkUnavailableError(f"the Spark Connect server ended at start (exit code {process.returncode}): "
                                        f"{_last_line(log_path)} (log: {log_path})")
        if time.perf_counter() - started > timeout:
            _terminate(process.pid)
            raise SparkUnavailableError(f"the Spark Connect server did not answer in {timeout:.0f} s and was "
                                        f"stopped (log: {log_path})")
        time.sleep(0.25)
    (where / "server.json").write_text(json.dumps(asdict(state)))
    log.info("Spark Connect server started at %s (pid %d, %.1f s)", address, process.pid,
             time.perf_counter() - started)
    return state


def run_in_foreground(config: ProjectConfig, host: str = "127.0.0.1", port: int = CONNECT_PORT,
                      master: str | None = None) -> None:
    """Become the server (``exec``): for a container or a service manager, which keep it running and
    stop it themselves; its log on this process's output, no state file."""
    argv = command(config, host, port, master)
    os.execvpe(argv[0], argv, environment(config))


def stop(config: ProjectConfig, timeout: float = STOP_TIMEOUT_SECONDS) -> ServerState | None:
    """Stop the project's server (SIGTERM to its process group, SIGKILL after ``timeout`` seconds); the
    state it had, or None when none was running."""
    state = status(config)
    if state is None:
        return None
    _terminate(state.pid, timeout)
    (state_dir(config) / "server.json").unlink(missing_ok=True)
    return state


def _terminate(pid: int, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # (reaps it when this process started it)
        except ChildProcessError:
            pass
        if not _alive(pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_line(path: Path) -> str:
    """The last line of the server's log that says something (Spark's warnings about incubator modules
    and the like aside)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    useful = [ln for ln in lines if "incubator" not in ln and not ln.startswith("at ")]
    return (useful or lines or ["no output"])[-1]
