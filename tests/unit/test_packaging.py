"""Packaging (#47, item 9): pyproject.toml declares every third-party package ivm imports — in its
dependencies or, for the Airflow side and the PostgreSQL driver, in an extra — and the pins the Airflow
image installs (requirements.txt) hold no test tool; pyspark, delta-spark, the Delta jars of pom.xml, the
pins and pyproject's ranges name one Spark/Delta pair (#67 item 5)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path
from xml.etree import ElementTree

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
TEST_TOOLS = {"pytest", "pytest-xdist", "hypothesis", "duckdb", "ruff", "selenium"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def imported_modules() -> set[str]:
    """The top-level modules include/ivm imports, besides its own and the standard library's."""
    found = set()
    for path in (REPO / "include" / "ivm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m != "ivm" and m not in sys.stdlib_module_names}


def test_every_imported_package_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    extras = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    dists = packages_distributions()
    # (py4j comes with pyspark, fastapi and jinja2 with Airflow, whose namespace package `airflow` several
    # of its distributions share; `java`/`org` are py4j's JVM gateways)
    provided = {"py4j": "pyspark", "fastapi": "apache-airflow", "jinja2": "apache-airflow", "airflow": "apache-airflow",
                "delta": "delta-spark", "java": "pyspark", "org": "pyspark"}
    missing = []
    for module in sorted(imported_modules()):
        dist = provided.get(module) or _name(dists[module][0])
        if dist not in declared | extras:
            missing.append(f"{module} ({dist})")
    assert missing == []
    assert {"apache-airflow", "apache-airflow-providers-apache-spark"} <= extras
    assert "psycopg2-binary" in {_name(r) for r in project["optional-dependencies"]["postgres"]}


def test_the_image_installs_no_test_tool():
    runtime = {_name(line) for line in (REPO / "requirements.txt").read_text().splitlines()
               if line.strip() and not line.startswith(("#", "-r"))}
    assert runtime & TEST_TOOLS == set()
    dev = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev and all(f"{tool}==" in dev for tool in TEST_TOOLS)
    assert "requirements-dev" not in (REPO / "Dockerfile").read_text()


def test_one_spark_and_delta_pair_everywhere():
    """The pins (requirements.txt, which the Dockerfile installs), the installed packages, the Delta jars
    `make venv` and the image resolve (pom.xml), the build `spark.jars.packages` fetches without them
    (ivm.spark.delta_package) and pyproject's ranges (what `pip install` may pick) agree on one release of
    Spark and one of Delta: a bump of one of them alone fails here."""
    from ivm.spark import delta_package

    lines = (REPO / "requirements.txt").read_text().splitlines()
    pins = {_name(line): line.split("==", 1)[1].strip() for line in lines if "==" in line and not line.startswith("#")}
    spark, delta = Version(pins["pyspark"]), Version(pins["delta-spark"])
    assert pins["pyspark-client"] == pins["pyspark"]
    assert (version("pyspark"), version("delta-spark")) == (pins["pyspark"], pins["delta-spark"])
    build = f"delta-spark_{spark.major}.{spark.minor}_2.13"
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    (dep,) = ElementTree.parse(REPO / "include" / "ivm" / "jvm" / "pom.xml").getroot().findall(
        "m:dependencies/m:dependency", ns)
    jars = (dep.findtext("m:artifactId", namespaces=ns), dep.findtext("m:version", namespaces=ns))
    assert jars == (build, str(delta))
    assert delta_package() == f"io.delta:{build}:{delta}"
    ranges = {r.name: r.specifier for r in map(Requirement, tomllib.loads(
        (REPO / "pyproject.toml").read_text())["project"]["dependencies"])}
    for name, pinned in [("pyspark", spark), ("delta-spark", delta)]:
        allowed = ranges[name]
        assert pinned in allowed, name
        # (another minor release is another Spark, or a Delta built for one)
        assert Version(f"{pinned.major}.{pinned.minor + 1}.0") not in allowed, name
        assert Version(f"{pinned.major}.{pinned.minor - 1}.99") not in allowed, name
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "-r /opt/ivm/requirements.txt" in dockerfile and "include/ivm/jvm/pom.xml" in dockerfile
