"""Shared fixtures: one SparkSession for the whole session, projects in temporary folders, and the
catalog URLs the catalog tests run against (SQLite always, PostgreSQL when IVM_TEST_POSTGRES_URL is
set — `.ci/run` sets it; in CI its absence is an error, not a skip)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

POSTGRES_ENV = "IVM_TEST_POSTGRES_URL"

# CI explores a fixed, reproducible set of random cases so that a landing is never decided by the
# seed; developers' runs draw new cases every time (and keep failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


#: Spark's own variable naming a Spark Connect server: set, the suite runs on that server (each pytest
#: worker a client session of it) instead of a local Spark of its own, and so do the `ivm` commands the
#: tests run (`make test`'s second pass starts one with tests/connect/ivm.yaml's settings)
SPARK_REMOTE = "SPARK_REMOTE"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from ivm.config import SparkSettings
    from ivm.spark import session

    if os.environ.get(SPARK_REMOTE):
        s = session(SparkSettings(conf={"spark.sql.shuffle.partitions": "2"}), "ivm-tests")
        yield s
        s.stop()
        return
    # (the session's catalog is Spark's in-memory one, its databases' folders in a temporary folder: the
    # views ivm registers by name, tests/spark/test_delta.py, live as long as the session). Its driver,
    # which runs the tasks too, gets 3 GB of heap: one JVM runs a whole worker's share of the suite (with
    # 2 GB a CI run ran out of heap late in a worker's share; `_release_jvm_caches`)
    s = session(SparkSettings(master="local[2]", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "3g",
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse"))}), "ivm-tests")
    yield s
    s.stop()


@pytest.fixture(scope="module", autouse=True)
def _release_jvm_caches():
    """After each module, drop what the session's JVM keeps for tables no later test reads: Delta's
    cache of table logs (a snapshot per table the module touched, each with its state persisted in
    memory) and Spark's cached relations. One JVM runs a whole worker's share of the suite; a CI run
    ran out of heap building a small broadcast after ~25 minutes (measured: test_delta alone leaves
    36 persisted snapshot states and ~110 MB of heap that this frees)."""
    yield
    if "pyspark.sql" not in sys.modules:  # a module that started no Spark
        return
    from pyspark.sql import SparkSession

    s = SparkSession.getActiveSession()
    # (CLASSIC ONLY: a Spark Connect server's JVM is its own, sized for the suite)
    if s is not None and not os.environ.get(SPARK_REMOTE):
        s._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        s.catalog.clearCache()


#: the differential change-stream test `make test` runs in both passes (`--spark-pass`): TPC-H's 22 views, the
#: SQL users run most, on a classic session and on Spark Connect. The other streams (the counting
#: library's, test_counting.py, the longest at ~15 minutes a pass) run once, on Spark Connect: the stricter
#: of the two (a call only a classic session offers fails there) and how ivm runs warm; the classic one
#: runs the same DataFrame plans, and the tests outside tests/spark (the CLI's, the DAG's) run on it.
#: Both passes ran every stream until CI passed 45 minutes.
DIFFERENTIAL = ("tests/spark/test_tpch.py",)
#: tests that start Spark Connect servers of their own (`ivm server`): in-process only
OWN_SERVERS = ("tests/spark/test_server.py",)


def pytest_addoption(parser):
    parser.addoption("--spark-pass", choices=["all", "in-process", "connect"], default="all",
                     help="which tests this pass runs (`make test` runs two): all of them (the default); "
                          "in-process: those that need a JVM of their own (tests outside tests/spark, the DAG "
                          "tests' spark-submits among them; tests/spark's `classic` ones and its own servers') and "
                          "the TPC-H change streams; connect: every test of tests/spark (but "
                          "its own servers'), on the Spark Connect server SPARK_REMOTE names")


def _in_pass(item, chosen: str) -> bool:
    """Whether ``item`` runs in pass ``chosen`` (in-process or connect) of `--spark-pass`."""
    path = item.nodeid.split("::")[0]
    if path in DIFFERENTIAL:
        return True
    in_process = not path.startswith("tests/spark/") or path in OWN_SERVERS or "classic" in item.keywords
    return in_process == (chosen == "in-process")


def pytest_collection_modifyitems(config, items):
    """`--spark-pass` keeps its pass's tests. On a Spark Connect server (`SPARK_REMOTE`), the tests marked
    ``classic`` look into a JVM the client does not have: they run in the in-process pass, not here."""
    chosen = config.getoption("--spark-pass")
    if chosen == "connect" and not os.environ.get(SPARK_REMOTE):
        raise pytest.UsageError("--spark-pass connect runs on the Spark Connect server SPARK_REMOTE names; it is unset")
    if chosen != "all":
        kept = [i for i in items if _in_pass(i, chosen)]
        config.hook.pytest_deselected(items=[i for i in items if not _in_pass(i, chosen)])
        items[:] = kept
    if not os.environ.get(SPARK_REMOTE):
        return
    skip = pytest.mark.skip(reason="looks into a classic session's JVM; runs in `make test`'s in-process pass")
    for item in items:
        if "classic" in item.keywords:
            item.add_marker(skip)


def _postgres_admin_url() -> str | None:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        if os.environ.get("CI"):
            pytest.fail(f"{POSTGRES_ENV} is not set in CI: .ci/run must start PostgreSQL")
        return None
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def catalog_url(request, tmp_path):
    """A fresh, empty catalog database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    admin = _postgres_admin_url()
    if admin is None:
        pytest.skip(f"set {POSTGRES_ENV} to run the PostgreSQL catalog tests (.ci/run does)")
    name = f"ivm_test_{uuid.uuid4().hex[:10]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


#: the project setting that plans every refresh distributed, however small its change
#: (`spark.single_partition_rows: 0`): the differential streams' all-at-once projects use it, so each
#: stream checks the one-partition plan of small changes (batch by batch, the default) and the
#: distributed plan of large ones against the same final state (the counting stream's plans small up to
#: 2 rows instead: a large run's GROUP BY then pairs few touched groups in one partition)
DISTRIBUTED = {"single_partition_rows": 0}


def write_project(root: Path, tables: dict, **settings) -> Path:
    """An ivm.yaml in ``root`` with the given tables (and any other top-level settings)."""
    root.mkdir(parents=True, exist_ok=True)
    # The sampled recomputation (ivm.validate) is off unless a test asks for it: the differential tests
    # compare every view with its whole recomputation and DuckDB after each refresh, which a sample of
    # keys cannot add to, and it would cost a recompute per view per refresh. tests/spark/test_validate.py
    # and the demo (the DAG tests) run it.
    # Likewise `mode: auto`'s crossover (ivm.maintain.crossover) is off unless a test asks for it: on a
    # few rows a recompute is often cheaper than a refresh's fixed costs, and the tests here check the
    # incremental path after every batch. tests/spark/test_crossover.py runs it.
    if "views" in settings:
        settings["views"] = {name: spec if not isinstance(spec, dict) else {
            **({} if "validate" in spec else {"validate": {"sample": 0}}),
            **({} if "crossover" in spec else {"crossover": {"enabled": False}}), **spec}
            for name, spec in settings["views"].items()}
    # Views are published as Delta tables (ivm.sinks) only where a test asks for it: a Delta commit per
    # view and refresh would double the suite's time; tests/spark/test_delta.py runs them.
    settings["storage"] = {"delta_views": False, **settings.get("storage", {})}
    doc = {"warehouse": "./warehouse", "tables": tables, **settings}
    path = root / "ivm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def make_project(tmp_path, spark):
    """Build, apply and open a project in a temporary folder; closes it afterwards."""
    from ivm import Project

    opened = []

    def make(tables: dict, catalog: str | None = None, root: Path | None = None, **settings) -> Project:
        if catalog:
            settings["catalog"] = catalog
        path = write_project(root or tmp_path / "project", tables, **settings)
        project = Project.open(str(path))
        project.apply()
        opened.append(project)
        return project

    yield make
    for p in opened:
        p.close()


def drawn_stream(data) -> None:
    """Reject Hypothesis's simplest example in a change-stream test. Hypothesis runs it first and counts
    it among ``max_examples`` (its every list empty, every choice the first: empty tables, empty
    batches), so a stream test of one example per run checked nothing; rejected before any Spark work
    (the simplest example draws False here, a drawn one True half the time), every example run is drawn."""
    assume(data.draw(st.booleans(), "a drawn example, not the simplest"))
