"""The Spark ivm runs on: a Spark Connect server when one is named, else local Spark started
in-process (`ivm` commands, the demo, tests); what its jobs did (`JobMetrics`, classic sessions only); and
adaptive execution switched off around a small run's work (`adaptive`).

Every module of ivm reaches Spark through the DataFrame API, Spark SQL (``MERGE INTO`` for Delta),
``spark.conf``, tags and artifacts alone, which classic and Spark Connect sessions both offer, so the same
refresh runs in-process, under spark-submit and against a warm server. What only a classic session has
(``sparkContext``, the JVM behind py4j) is used in this module alone, in the places marked CLASSIC ONLY.

Which Spark (`session`): ``SPARK_REMOTE`` (Spark's own convention), else the project's ``spark.remote``,
else (`ivm.server.remote_for`) the project's running `ivm server`, else local Spark in-process from the
project's ``spark:`` settings. spark-submit jobs build their session from spark-submit's configuration
instead, when the stage first needs it (jobs/ivm_stage.py hands `Project.open` a ``start_spark``);
`session()` reuses an active session when there is one.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ivm.config import ProjectConfig, SparkSettings
from ivm.errors import SparkUnavailableError

log = logging.getLogger(__name__)

#: Spark's own logging: warnings and errors only, on stderr
LOG4J2 = Path(__file__).with_name("log4j2.properties")

#: Defaults sized for small incremental work on a laptop-class machine (docs/design.md §11): few shuffle
#: partitions (deltas are small), no UI, no console progress bars, UTC so timestamps read back as written,
#: and room for every refresh's generated code. Spark compiles each distinct piece of whole-stage and
#: expression code with Janino (10-80 ms on the driver, before the stage's tasks run) and keeps the last
#: 100 in a cache; one refresh plans 30-130 pieces (trims, delta rules, states, rounds), so at Spark's
#: default each refresh evicted the last one's and compiled nearly all of them again (Q3 at SF 1: ~125
#: compiles per 0.1% refresh, 1.5 s of them by Spark's log in one; the closure: 34-54). With 2000
#: entries only the code whose literals change from run to run (a delta's key ranges and IN lists)
#: compiles again: 16 and 6 per refresh (about -0.4 s and -0.5 s a refresh, A/B on one machine); 4 for
#: Q3 once the log scans dropped a needless version filter and the trim a Python lambda (ivm.changes).
#: PySpark's DataFrame debugging (on by default) sends the Python call site of every Column function to
#: the JVM around the call, for the "DataFrame" query context of errors raised while the plan runs: its
#: wrapper looks up the session, a setting and a JVM class each time, 13 py4j round trips for one
#: ``F.col`` instead of 3. The call sites it records are ivm's own lines, which say nothing to a user
#: whose input is the project file (ivm's errors name the table, view, column and row); off, a Q3
#: refresh at SF 1 makes ~5,400 py4j calls instead of ~11,000.
#: The status store keeps each SQL execution's plan graph and metrics for the UI's SQL tab (1,000 by
#: default) even with the UI off, where nobody reads them: a long-lived session (the test suite's, a
#: notebook's) held ~400 MB of them in its 1 GB heap (SQLPlanMetric, their maps and plan strings), so a
#: task's peak ran the driver out of heap, which ends a local JVM. ivm's job measures read jobs and
#: stages (`JobMetrics`), never executions.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.codegen.cache.maxEntries": "2000",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2}",
}


#: Delta Lake (docs/guide.md "Delta Lake"): its SQL extension and catalog, so `spark.read.format("delta")`,
#: `UPDATE`/`DELETE`/`MERGE INTO` and Delta tables in the session catalog work in every ivm session and
#: spark-submit; its log replay in as many partitions as a shuffle of small work (Delta's default, 50,
#: makes each snapshot of a small table 50 tasks)
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "4",
}
#: Delta's jars, resolved by `make venv` (include/ivm/jvm/pom.xml)
JARS_DIR = Path(__file__).with_name("jvm") / "jars"
_VERSIONED = re.compile(r"-[0-9][0-9.]*(-[A-Za-z0-9.]+)?\.jar$")


def delta_jars() -> list[str]:
    """The jars of `JARS_DIR` that Spark does not ship itself: Delta's own and the few it adds (Spark's
    versions of Hadoop, Jackson, Parquet and Scala stay the only ones on the class path)."""
    import pyspark

    shipped = {_VERSIONED.sub("", os.path.basename(p))
               for p in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*.jar"))}
    return [p for p in sorted(glob.glob(str(JARS_DIR / "*.jar")))
            if _VERSIONED.sub("", os.path.basename(p)) not in shipped]


def delta_package() -> str:
    """The Maven coordinate of the Delta build that matches the installed pyspark and delta-spark, by
    delta-spark's own rule: ``configure_spark_with_delta_pip`` sets it as ``spark.jars.packages`` on a
    session builder (here a builder of its own, never built, whose option is read back: the function
    accepts nothing but a classic builder, and a builder has no public getter)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    return configure_spark_with_delta_pip(SparkSession.Builder())._options["spark.jars.packages"]


def with_delta(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with `DELTA_CONF` and Delta's jars, unless it names its own ``spark.jars.packages``: the
    jars `make venv` vendors (`delta_jars`, added to any ``spark.jars``), or where there are none (ivm
    installed with pip alone) the Delta build of the installed delta-spark as ``spark.jars.packages``
    (`delta_package`; Spark fetches it and what it needs once, into its Ivy cache), as delta-spark
    documents it."""
    out = {**DELTA_CONF, **conf}
    if "spark.jars.packages" not in conf:
        jars = delta_jars()
        if jars:
            out["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars"), *jars]))
        else:
            out["spark.jars.packages"] = delta_package()
            log.info("no vendored Delta Lake jars in %s: Spark fetches %s", JARS_DIR, out["spark.jars.packages"])
    return out


#: Spark's catalog implementation setting (static: fixed when the session starts)
CATALOG_IMPLEMENTATION = "spark.sql.catalogImplementation"


def with_metastore(conf: dict[str, str], warehouse: str, metastore: str | None = None) -> dict[str, str]:
    """``conf`` with a persistent Spark catalog for the views' names (`ivm.sinks.register`): Spark's
    Hive catalog on the metastore service ``metastore`` (``thrift://host:port``: one that every JVM of the
    project shares), or else on its embedded metastore, an Apache Derby database in
    ``<warehouse>/metastore_db`` — unless ``conf`` chooses a catalog itself
    (``spark.sql.catalogImplementation``) or, without ``metastore``, the warehouse is not a local folder.

    A Derby database is opened by one JVM at a time: a notebook reading the views by name through it
    keeps ivm's `apply` from registering until it stops (docs/guide.md "Delta Lake"). Spark opens the metastore
    on a session's first use of the catalog, which only `apply` and table-named sources make: refreshes
    read and write Delta tables by path, so a DAG's parallel tasks do not contend for it."""
    if CATALOG_IMPLEMENTATION in conf:
        return conf
    if metastore:  # (a metastore service: every JVM of the project shares it)
        return {CATALOG_IMPLEMENTATION: "hive", "spark.hadoop.hive.metastore.uris": metastore,
                **({} if "://" in warehouse else {"spark.sql.warehouse.dir": str(Path(warehouse) / "spark-warehouse")}),
                **conf}
    if "://" in warehouse:
        return conf
    home = Path(warehouse)
    # (quoted: Spark splits the options as a shell would, and a space in the path cut it in two)
    options = " ".join(filter(None, [conf.get("spark.driver.extraJavaOptions"), f'"-Dderby.system.home={home}"']))
    return {**conf, CATALOG_IMPLEMENTATION: "hive",
            "spark.hadoop.javax.jdo.option.ConnectionURL":
                f"jdbc:derby:;databaseName={home / 'metastore_db'};create=true",
            "spark.sql.warehouse.dir": str(home / "spark-warehouse"),
            "spark.driver.extraJavaOptions": options}


def project_conf(config: ProjectConfig) -> dict[str, str]:
    """What a project's Spark starts with, in process (`ivm.context.RunContext.spark`) and under the DAG's
    spark-submits alike: ivm's `DEFAULT_CONF` under the project's ``spark.conf``, with its views' metastore
    (`with_metastore`; the defaults come first so that its Java option joins their log configuration's)."""
    return with_metastore({**DEFAULT_CONF, **config.spark.conf}, config.warehouse_uri, config.spark.metastore)


#: Hadoop's local file system with permissions set in-process (include/ivm/jvm/NioLocalFileSystem.java,
#: built by `make venv` when javac is there). Without Hadoop's native library, which pip's pyspark does
#: not ship, Hadoop's own starts a ``chmod`` process for each directory and file a write creates: about
#: 12 per Parquet write, ~4 ms each from the driver's JVM, ~50 per Q3 refresh at SF 1. A 5,000-row
#: write took 64 ms against 97 (medians of 40, two processes each way).
LOCAL_FS_JAR = Path(__file__).with_name("jvm") / "ivm-hadoop.jar"
LOCAL_FS_CLASS = "ivm.hadoop.NioLocalFileSystem"


def local_file_system(master: str, conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with `LOCAL_FS_CLASS` as the ``file:`` file system of a local master (its executors run
    in the driver's JVM, whose class path the jar joins), when the jar is built and ``conf`` does not
    choose a file system itself; else ``conf`` as it is."""
    local = master == "local" or master.startswith("local[")
    if not local or not LOCAL_FS_JAR.exists() or "spark.hadoop.fs.file.impl" in conf:
        return conf
    path = os.pathsep.join(filter(None, [conf.get("spark.driver.extraClassPath"), str(LOCAL_FS_JAR)]))
    return {**conf, "spark.driver.extraClassPath": path, "spark.hadoop.fs.file.impl": LOCAL_FS_CLASS}


#: PySpark's loggers of the query context of a Spark error (pyspark.errors.exceptions.base): each error
#: that carries one is logged whole, as JSON with the JVM's stack, at ERROR on stderr before it is raised.
#: ivm catches the errors it foresees (a view Spark cannot type, at `ivm apply`) and words them in one line,
#: so those lines told a user nothing the error did not; an error ivm does not foresee still carries its
#: message and query context out (and `-v` prints its traceback).
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def quiet_query_context() -> None:
    """PySpark's query-context loggers above ERROR (`QUERY_CONTEXT_LOGGERS`)."""
    from pyspark.logger import PySparkLogger

    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


#: Spark's own environment variable naming a Spark Connect server (``sc://host:port``)
SPARK_REMOTE = "SPARK_REMOTE"


def remote_address(settings: SparkSettings | None = None) -> str | None:
    """The Spark Connect server named by ``SPARK_REMOTE``, else by the project's ``spark.remote``."""
    return os.environ.get(SPARK_REMOTE) or (settings.remote if settings is not None else None)


def classic_session_active() -> bool:
    """Whether this process already runs classic Spark (a notebook's session, the test suite's): it keeps
    it, rather than switching PySpark to Spark Connect under it. Asked without importing PySpark."""
    context = sys.modules.get("pyspark.core.context")
    return context is not None and context.SparkContext._active_spark_context is not None


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a server), not a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session(settings: SparkSettings | None = None, app_name: str = "ivm", remote: str | None = None,
            jvm_log: Path | None = None):
    """A SparkSession: a client of the Spark Connect server ``remote`` (default `remote_address`), else
    the active classic session, or a new local one built from the project's ``spark:`` settings — its
    JVM's console (stdout and stderr: the JVM's own warnings, Spark's log) appended to ``jvm_log`` when
    given, not the terminal."""
    settings = settings or SparkSettings()
    remote = remote or remote_address(settings)
    if remote:
        return connect(remote, settings.conf)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # the driver and the Python workers must run the same interpreter (the venv's)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(settings.master)
    for k, v in local_file_system(settings.master, with_delta({**DEFAULT_CONF, **settings.conf})).items():
        builder = builder.config(k, v)
    log.info("starting Spark (%s)", settings.master)
    with _console_to(jvm_log):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # CLASSIC ONLY: the session started here is classic
    return spark


@contextmanager
def _console_to(path: Path | None):
    """While a JVM starts: this process's stdout and stderr are ``path`` (appended), so the JVM, which
    inherits them, writes its console there for its whole life; this process's own are back after."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def reachable(remote: str, timeout: float = 2.0) -> bool:
    """Whether something listens at a Spark Connect address's host and port (a TCP connect, no RPC)."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(remote.split(";", 1)[0].replace("sc://", "http://", 1))
    try:
        with socket.create_connection((parsed.hostname or "localhost", parsed.port or CONNECT_PORT), timeout):
            return True
    except OSError:
        return False


#: Spark Connect's default port
CONNECT_PORT = 15002


def connect(remote: str, conf: dict[str, str] | None = None):
    """A client session of the Spark Connect server at ``remote``, with the runtime SQL settings of
    ``conf`` (``spark.sql.*``: shuffle partitions, the time zone, ...) set on it; the others (memory, jars,
    extensions, the catalog) are the server's, fixed when it started (`ivm server start` starts it with
    the project's). A server that does not answer is one line, `SparkUnavailableError`, at once: Spark's
    client would retry for minutes."""
    if not reachable(remote):
        raise SparkUnavailableError(f"no Spark Connect server answers at {remote} (SPARK_REMOTE or spark.remote): "
                                    "start one with `ivm server start`, or unset it to run Spark in-process")
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    active = ConnectSession.getActiveSession()
    if active is not None and not active.is_stopped:  # (as a classic session is reused: the caller's, as it is)
        return active
    started = time.perf_counter()
    runtime = {k: v for k, v in (conf or {}).items() if k.startswith("spark.sql.") and k not in STATIC_SQL_CONF}
    # (PySpark's own builder: it also switches `pyspark.sql.functions` to Spark Connect for this process)
    from pyspark.sql import SparkSession

    # the client warns of a window without PARTITION BY as it builds the plan (a classic session logs it in
    # the JVM, below ivm's log level): ivm's are on purpose, a small change's rows in one partition
    warnings.filterwarnings("ignore", message="WARN WindowExpression: No Partition Defined", category=UserWarning)

    spark = SparkSession.builder.remote(remote).config(map=runtime).getOrCreate()
    log.info("connected to Spark Connect at %s (Spark %s, %.2f s)", remote, spark.version,
             time.perf_counter() - started)
    return stop_at_exit(spark)


#: the Spark Connect sessions this process opened (`stop_at_exit`)
_OPENED: list = []


def stop_at_exit(spark):
    """Stop a Spark Connect session this process opened when the process exits, before the interpreter
    tears its modules down, and keep its ``__del__`` from closing its gRPC channel a second time then:
    that close can wait forever on gRPC's threads, already gone (a DAG test's process hung so after its
    run had succeeded, both with and without the stop before it)."""
    import atexit
    import weakref

    if not _OPENED:
        atexit.register(_stop_opened)
    _OPENED.append(weakref.ref(spark))
    return spark


def _stop_opened() -> None:
    for ref in reversed(_OPENED):
        spark = ref()
        if spark is not None and not spark.is_stopped:
            try:
                spark.stop()  # (releases its session on the server, closes its channel)
            except Exception:  # noqa: BLE001 - the server may be gone already: nothing to release
                pass
        if spark is not None:  # (PySpark's SparkSession.__del__ closes the client again: made a no-op)
            spark.client.close = lambda: None
    _OPENED.clear()


#: SQL settings a session cannot change (Spark's static SQL configuration): a Connect server's own
STATIC_SQL_CONF = frozenset({"spark.sql.extensions", "spark.sql.catalogImplementation", "spark.sql.warehouse.dir",
                             "spark.sql.catalog.spark_catalog", "spark.sql.ui.retainedExecutions",
                             "spark.sql.codegen.cache.maxEntries"})


def side_session(spark):
    """A session beside ``spark`` on the same Spark (its cluster, its catalog) with temporary views of its
    own, so none of ``spark``'s names is shadowed: a classic session's ``newSession``, a Spark Connect
    session's ``cloneSession`` (a new session on the server; Connect has no ``newSession``)."""
    return stop_at_exit(spark.cloneSession()) if is_connect(spark) else spark.newSession()


def observed(observation) -> dict | None:
    """An Observation's metrics after its action, or None when Spark proved the observed rows empty and
    dropped the observation with the plan: a Spark Connect client then received no metrics (``{}``), a
    classic session holds an empty row that ``get`` cannot read (looked at through py4j: CLASSIC ONLY)."""
    if not hasattr(observation, "_jo"):  # (a Spark Connect client's)
        return observation.get or None
    return None if observation._jo.getRow().length() == 0 else observation.get


def spark_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a Spark call raises for a failure inside Spark: PySpark's own (classic and Connect),
    and py4j's for a JVM error a classic session does not convert (py4j is absent with pyspark-client)."""
    from pyspark.errors import PySparkException

    try:
        from py4j.protocol import Py4JJavaError
    except ImportError:
        return (PySparkException,)
    return (PySparkException, Py4JJavaError)


@contextmanager
def tagged(spark, tag: str) -> Iterator[None]:
    """Run a block with ``tag`` on every Spark operation it starts from this thread (Spark's job tags, both
    session kinds: what job groups were), so a run's jobs are found by its tag in Spark's UI and status
    store, and ``spark.interruptTag(tag)`` cancels them. Commas are not allowed in a tag: they become ``_``."""
    tag = tag.replace(",", "_")
    spark.addTag(tag)
    try:
        yield
    finally:
        spark.removeTag(tag)


def run_tag(run_id: str) -> str:
    """The job tag of an ivm run's Spark operations (`tagged`)."""
    return f"ivm-run-{run_id}"


ADAPTIVE = "spark.sql.adaptive.enabled"
SINGLE_PARTITION_BYTES = "spark.sql.maxSinglePartitionBytes"


@contextmanager
def adaptive(spark, enabled: bool) -> Iterator[None]:
    """Run a block with adaptive query execution on or off, then restore the session's setting.

    A small change's plans (`zset.one_partition`: the change in one partition, the stored rows at its
    keys broadcast or gathered into it) have nothing for adaptive execution to adapt: no partitions to
    coalesce, no skew, their joins broadcast by hint. What it costs them is latency: it runs a plan as
    a chain of query stages, submitted one after the other, and re-optimizes the rest of the plan
    between them (0.1-0.25 s per stage on a 2-core machine). The trim and the incremental maintenance
    of a small run turn it off; full recomputes and large changes keep it (A/B in one process at SF 1,
    Δ 0.1%, alternate refreshes, medians: Q1 3.92 s against 4.37 s with it on, Q3 5.47 against 5.92;
    at SF 10, Q3 at Δ 0.1% about even, its joins with the large tables dominating).
    The setting is the session's: callers switch it around work that does not run beside other work.

    Off, it lifts Spark's ``spark.sql.maxSinglePartitionBytes`` too (128m since Spark 4.0): above that
    *estimated* size Spark shuffles a one-partition side of a join apart for parallelism, and a join's
    estimate without statistics is its sides' sizes multiplied, so two small frames joined in their
    one partition (`zset.local_join`) were shuffled after a join below them."""
    settings = {ADAPTIVE: "true" if enabled else "false"}
    if not enabled:
        settings[SINGLE_PARTITION_BYTES] = str(2**63 - 1)
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def runs_elsewhere(spark) -> bool:
    """Whether the Python workers of ``spark`` may run on another machine or interpreter than this one: a
    Spark Connect server (whatever its master), or a classic session on a cluster master."""
    return is_connect(spark) or not spark.conf.get("spark.master", "local").startswith("local")


def ship_package(spark) -> None:
    """Make the ``ivm`` package importable by the Python workers of a cluster or a Spark Connect server
    (its Python UDFs, registered aggregates, run there): zip it and add it as a Python artifact
    (``addArtifacts``, both session kinds). Local classic masters share the driver's interpreter."""
    if runs_elsewhere(spark):
        ship_python(spark, Path(__file__).resolve().parent)


def ship_python(spark, source: Path) -> None:
    """Add a Python module file, or a package folder zipped (`package_archive`), as a Python artifact of
    the session: its Python workers import it by name."""
    artifact = package_archive(source) if source.is_dir() else source
    spark.addArtifacts(str(artifact), pyfile=True)
    log.info("shipped %s to Spark's Python workers (%s)", source.name, artifact)


def package_archive(package: Path) -> Path:
    """A zip of the package folder ``package``, made once per content (named by a hash of its files, kept
    in the temporary folder): a Spark Connect session per command ships the same file."""
    import hashlib
    import tempfile
    import zipfile

    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix in {".py", ".properties", ".mako"})
    digest = hashlib.sha1()
    for p in files:
        digest.update(str(p.relative_to(package)).encode())
        digest.update(p.read_bytes())
    target = Path(tempfile.gettempdir()) / f"ivm-package-{digest.hexdigest()[:12]}" / f"{package.name}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                z.write(p, Path(package.name) / p.relative_to(package))
        partial.replace(target)
    return target


@dataclass
class Measured:
    """What the Spark jobs of one measured block did: the numbers Spark's UI shows for their stages."""

    label: str
    seconds: float = 0.0
    jobs: int = 0
    rows_read: int = 0      # input records of the stages (rows read from files)
    bytes_written: int = 0  # output bytes of the stages (files written)
    shuffled: int = 0       # records written to shuffles


class JobMetrics:
    """Jobs, rows read and bytes written by what runs inside ``measure`` (a job group per block, the
    stages' metrics from Spark's status store, which is kept with the UI off too).

    CLASSIC ONLY: the status store has no API a Spark Connect client reaches (the benchmark and a few
    tests measure in a classic session)."""

    def __init__(self, spark):
        self.sc = spark.sparkContext
        self.n = 0
        #: job groups unique to this instance: another one on the same context (the benchmark's next view)
        #: numbers its blocks from 1 again, and a shared group name would count the earlier block's jobs too
        self.prefix = f"ivm-measure-{uuid.uuid4().hex[:8]}"

    @contextmanager
    def measure(self, label: str) -> Iterator[Measured]:
        self.n += 1
        group = f"{self.prefix}-{self.n}-{label}"
        out = Measured(label)
        self.sc.setJobGroup(group, label)
        started = time.perf_counter()
        try:
            yield out
        finally:
            out.seconds = time.perf_counter() - started
            self.sc.setLocalProperty("spark.jobGroup.id", None)
            time.sleep(0.5)  # let the listener bus deliver the last stages' metrics
            self._fill(group, out)

    def _fill(self, group: str, out: Measured) -> None:
        tracker = self.sc.statusTracker()
        jobs = list(tracker.getJobIdsForGroup(group))
        stages = {s for j in jobs if (info := tracker.getJobInfo(j)) for s in info.stageIds}
        out.jobs = len(jobs)
        gw = self.sc._gateway  # noqa: SLF001 - the status store has no Python API
        data = self.sc._jsc.sc().statusStore().stageList(None, False, False, gw.new_array(gw.jvm.double, 0), None)
        it = data.iterator()
        while it.hasNext():
            s = it.next()
            if s.stageId() in stages:
                out.rows_read += s.inputRecords()
                out.bytes_written += s.outputBytes()
                out.shuffled += s.shuffleWriteRecords()
