"""Every documented error of the `ivm` command is one line on stderr and its exit code (docs/reference/cli.md),
whatever starts underneath — run as a user runs it, the `ivm` executable in a fresh process: a malformed
project file, an unknown name, a missing file, a misspelt column (found from the file's header before any
JVM starts), an unreachable catalog, an unreachable Spark Connect server, a view another run holds, a
view whose expectations fail, and a bad change refused by a refresh on local Spark, whose JVM's own
warnings (``Using incubator modules``) and Spark's log stay out of the terminal (in
``spark-driver.log``). A reader that leaves the pipe early ends the command quietly.

No Spark runs in this test's process; the cases that refresh start a local JVM in the `ivm` subprocess.
(Exit code 6, a stage asked for out of order, is the DAG's stage commands' (`jobs/ivm_stage.py`), not
the `ivm` command's: tests/spark/test_stages.py.)"""

from __future__ import annotations

import datetime
import os
import subprocess
import time

import pytest

from tests.helpers import BIN

PROJECT = """
tables:
  orders: {columns: {id: int, customer: string, amount: double}, key: [id]}
  customers: {columns: {name: string, city: string}, key: [name]}
views:
  per_customer: {sql: "SELECT customer, sum(amount) AS total FROM orders GROUP BY customer"}
  checked:
    sql: "SELECT customer, count(*) AS n FROM orders GROUP BY customer"
    validate:
      policy: fail
      expectations: [{type: expect_column_values_to_be_between, kwargs: {column: n, max_value: 0}}]
"""


def ivm(root, *argv, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    return subprocess.run([str(BIN / "ivm"), "--project", str(root / "ivm.yaml"), *argv], capture_output=True,
                          text=True, timeout=timeout, env={**clean, **(env or {})}, cwd=root)


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (code, 1), f"exit {done.returncode}, stderr:\n{done.stderr}"
    assert lines[0].startswith("ivm: error: "), lines[0]
    return lines[0]


@pytest.fixture
def root(tmp_path):
    (tmp_path / "ivm.yaml").write_text(PROJECT)
    return tmp_path


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """A project applied (a local JVM in the `ivm` process) with orders loaded; customers never is."""
    where = tmp_path_factory.mktemp("applied")
    (where / "ivm.yaml").write_text(PROJECT)
    (where / "orders.csv").write_text("id,customer,amount\n1,ada,10.0\n2,bob,5.5\n")
    for argv in (["apply"], ["load", "orders", "orders.csv"]):
        done = ivm(where, *argv)
        assert done.returncode == 0, done.stderr
    return where


def driver_log(root) -> str:
    path = root / "warehouse" / "spark-driver.log"
    return path.read_text() if path.exists() else ""


def test_a_malformed_project_file(root):
    (root / "ivm.yaml").write_text(PROJECT.replace("key: [id]", "key: [id], keys: [customer]"))
    assert "tables.orders.keys" in one_line(ivm(root, "apply"), 2)


def test_an_unknown_name(root):
    assert "nosuch" in one_line(ivm(root, "show", "nosuch"), 2)


def test_a_missing_file(applied):
    assert "nosuch.csv" in one_line(ivm(applied, "load", "customers", "nosuch.csv"), 3)


def test_a_misspelt_column_is_found_from_the_header_before_spark_starts(applied):
    (applied / "big.csv").write_text("name,cty\n" + "".join(f"c{i},town{i}\n" for i in range(800_000)))
    before = driver_log(applied)
    started = time.perf_counter()
    line = one_line(ivm(applied, "load", "customers", "big.csv"), 3)  # (12 MB: past what pyarrow reads whole)
    assert "unknown column 'cty'" in line and "big.csv" in line
    assert time.perf_counter() - started < 15  # (a JVM's start alone takes longer; typically ~2 s)
    assert driver_log(applied) == before  # no JVM started
    (applied / "changes.csv").write_text("id,customer,amount,change_type\n3,eve,1.0,insert\n")
    assert "unknown column 'change_type'" in one_line(ivm(applied, "log", "append", "orders", "changes.csv"), 3)


def test_an_unreachable_catalog(root):
    (root / "ivm.yaml").write_text("catalog: postgresql+psycopg2://ivm:secret@127.0.0.1:9/ivm\n" + PROJECT)
    line = one_line(ivm(root, "runs"), 5)
    assert "secret" not in line


def test_an_unreachable_spark_connect_server(root):
    line = one_line(ivm(root, "apply", env={"SPARK_REMOTE": "sc://127.0.0.1:9"}), 8)
    assert "sc://127.0.0.1:9" in line


def test_a_view_another_run_is_refreshing(applied):
    from ivm import Project

    p = Project.open(str(applied / "ivm.yaml"))  # (the catalog alone: no Spark in this process)
    try:
        p.catalog.acquire_leases("held-by-the-test", ["per_customer"], datetime.timedelta(minutes=10))
        line = one_line(ivm(applied, "refresh", "per_customer", "--mode", "full"), 4)
        assert "per_customer is being refreshed by run held-by-the-test" in line
    finally:
        p.catalog.release_leases("held-by-the-test")
        p.close()


def test_a_view_whose_expectations_fail(applied):
    line = one_line(ivm(applied, "refresh", "checked"), 7)
    assert "view checked" in line and "nothing was published" in line


def test_a_bad_change_refused_by_a_refresh_on_local_spark(applied):
    """The JVM starts in the `ivm` process (local Spark): its console goes to spark-driver.log."""
    (applied / "bad.csv").write_text("id,customer,amount,_change_type\n9,zed,1.0,delete\n")
    assert ivm(applied, "log", "append", "orders", "bad.csv").returncode == 0
    before = driver_log(applied)
    line = one_line(ivm(applied, "refresh"), 3)
    assert "commit version 1" in line and "id=9" in line and "ivm log quarantine orders --version 1" in line
    assert "incubator" in driver_log(applied)[len(before):]  # (the JVM did start, and said so there)


def test_a_failure_inside_spark_is_its_cause_in_one_line(root):
    """What Spark itself refuses at a refresh (here ANSI SQL's CAST of 'ada' to INT, a view the user's data
    does not fit) ends in one line naming Spark's cause, not a py4j trace."""
    (root / "ivm.yaml").write_text(PROJECT.replace(
        "views:\n", "views:\n  as_number: {sql: \"SELECT id, CAST(customer AS INT) AS n FROM orders\"}\n"))
    (root / "orders.csv").write_text("id,customer,amount\n1,ada,10.0\n")
    for argv in (["apply"], ["load", "orders", "orders.csv"]):
        assert ivm(root, *argv).returncode == 0
    line = one_line(ivm(root, "refresh", "as_number"), 1)
    assert "refresh: Spark failed: " in line and "CAST_INVALID_INPUT" in line and "'ada'" in line, line
    assert "Traceback" not in line and "py4j" not in line


def test_a_reader_that_leaves_early(root):
    proc = subprocess.Popen([str(BIN / "ivm"), "--project", str(root / "ivm.yaml"), "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    proc.stdout.close()  # (the reader is gone before a byte is written: `ivm ... | head -0`)
    assert proc.wait(timeout=60) == 0 and proc.stderr.read() == ""
