"""Packaging (#47, item 9): pyproject.toml declares every third-party package ivm imports — in its
dependencies or, for the Airflow side and the PostgreSQL driver, in an extra — and the pins the Airflow
image installs (requirements.txt) hold no test tool."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

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
