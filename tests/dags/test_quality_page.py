"""The data-quality page (ivm.orchestration.quality, plugins/ivm_quality.py): served on loopback as the
Airflow API server mounts it, it refuses anonymous requests (its API docs too) and users Airflow's auth
manager does not let read the views' DAGs, shows a user only the views whose DAGs they may read, and
shows, to a signed-in user, each view's runs and the run whose validation failed; headless Chromium
(Debian's chromium and chromium-driver, .ci/chromium.sh) renders the page with its chart and follows
the link to the Data Docs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest
from fastapi import FastAPI

from ivm.errors import ValidationError
from ivm.orchestration.links import URL_PREFIX, quality_url
from ivm.refresh import validate_stage
from tests.conftest import write_project
from tests.helpers import BIN, REPO, free_port, lines, load_and_change, stage_up_to_validate, views
from tests.helpers import KV_TABLES as TABLES

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")

#: a request's time limit: the first ones to a server that just started import its page's libraries
#: (a few seconds, more on a loaded 2-core machine); the readiness probe keeps its short one
REQUEST_TIMEOUT = 60


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, timeout=REQUEST_TIMEOUT, **kwargs)


@pytest.fixture(scope="module")
def project(tmp_path_factory, spark):
    """Validated refreshes (the load, the first changes), then a run whose validation of per_k failed
    (injected errors). One project for the module: the tests only read it."""
    from ivm import Project

    root = tmp_path_factory.mktemp("quality")
    # per_k is refreshed by ivm_refresh_hourly, joined by ivm_refresh: a user may read one and not the other
    project_views = views("fail")
    project_views["per_k"]["schedule"] = "@hourly"
    path = write_project(root / "project", TABLES, views=project_views)
    p = Project.open(str(path))
    p.apply()
    load_and_change(p, root)
    p.refresh()
    p.append("t", lines(root / "c2.jsonl", [("b", 7), ("e", 8)], "insert", cols=("k", "v")))
    stage_up_to_validate(p, "bad-run")
    with pytest.raises(ValidationError):
        validate_stage(p.ctx, "bad-run")
    p.catalog.finish_run("bad-run", "failed", "validate: view per_k: 3 rows differ")
    yield p, str(path)
    p.close()


SERVE = """
import sys
import uvicorn
from fastapi import FastAPI
from airflow.api_fastapi.app import init_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from ivm.orchestration.quality import create_app

auth = init_auth_manager()
token = auth.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
open(sys.argv[3], "w").write(token)
# a signed-in user with no role: the simple auth manager lets them read no DAG
open(sys.argv[3] + ".nobody", "w").write(auth.generate_jwt(SimpleAuthManagerUser(username="nobody", role=None)))
root = FastAPI()
root.mount("/ivm", create_app(sys.argv[1]))  # as the API server mounts a plugin's app
uvicorn.run(root, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


@contextmanager
def _serve(project_path: str, tmp_path, script: str, settings: dict[str, str]):
    """``script`` (the app under /ivm, with Airflow's auth manager) served on loopback by a process with
    its own Airflow home and database (``airflow db migrate``: the token check and FAB's users read it);
    yields its base URL once it answers."""
    home = tmp_path / "airflow"
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
           "AIRFLOW__API_AUTH__JWT_SECRET": "ivm-test-" + "s" * 64, **settings}
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", script, project_path, str(port), str(tmp_path / "token")],
                            env=env, stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(base + "/ivm/quality", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(project, tmp_path_factory):
    """The plugin's app under /ivm, and a signed-in user's token from Airflow's simple auth manager (the
    default)."""
    tmp_path = tmp_path_factory.mktemp("server")
    home = tmp_path / "airflow"
    with _serve(project[1], tmp_path, SERVE, {
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json")}) as base:
        yield base, (tmp_path / "token").read_text(), (tmp_path / "token.nobody").read_text()


#: the compose stack's auth manager (docker-compose.yaml): Flask AppBuilder's, users with roles
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"

SERVE_FAB = """
import sys
import uvicorn
from fastapi import FastAPI
from airflow.api_fastapi.app import init_auth_manager
from ivm.orchestration.quality import create_app

auth = init_auth_manager()
root = FastAPI()
root.mount("/auth", auth.get_fastapi_app())  # FAB's login, POST /auth/token, as the API server mounts it
with auth.flask_app.app_context():
    sm = auth.security_manager
    # per_k_reader may read the runs of ivm_refresh_hourly (per_k's DAG), not of ivm_refresh (joined's)
    role = sm.add_role("per_k_reader")
    for action, resource in [("can_read", "DAG:ivm_refresh_hourly"), ("can_read", "DAG Runs")]:
        sm.add_permission_to_role(role, sm.create_permission(action, resource))
    sm.add_user("reader", "Per", "Reader", "reader@ivm.test", role, password="reader-pw")
    sm.add_user("nobody", "No", "Body", "nobody@ivm.test", sm.find_role("Public"), password="nobody-pw")
    sm.add_user("admin", "Ad", "Min", "admin@ivm.test", sm.find_role("Admin"), password="admin-pw")
root.mount("/ivm", create_app(sys.argv[1]))  # as the API server mounts a plugin's app
uvicorn.run(root, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def test_fab_users_without_the_dag_are_refused(project, tmp_path_factory):
    """With FAB's auth manager, as the compose stack runs Airflow: users log in with a password (FAB's
    POST /auth/token); one whose role may read per_k's DAG sees per_k and is refused joined; one whose role
    reads no DAG (Public) is refused the page; an admin sees both."""
    tmp_path = tmp_path_factory.mktemp("fab")

    def login(base: str, user: str, password: str) -> dict[str, str]:
        answer = httpx.post(base + "/auth/token", json={"username": user, "password": password},
                            timeout=REQUEST_TIMEOUT)
        assert answer.status_code == 201, answer.text
        return {"Authorization": f"Bearer {answer.json()['access_token']}"}

    with _serve(project[1], tmp_path, SERVE_FAB, {"AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER}) as base:
        wrong = httpx.post(base + "/auth/token", json={"username": "reader", "password": "guess"},
                           timeout=REQUEST_TIMEOUT)
        assert wrong.status_code == 401
        reader, nobody, admin = (login(base, u, f"{u}-pw") for u in ("reader", "nobody", "admin"))
        assert set(get(base + "/ivm/api/views", headers=reader).json()) == {"per_k"}
        assert get(base + "/ivm/quality/chart/per_k.svg", headers=reader).status_code == 200
        assert get(base + "/ivm/quality/chart/joined.svg", headers=reader).status_code == 404
        assert get(base + "/ivm/quality?view=joined", headers=reader).status_code == 404
        assert get(base + "/ivm/docs/expectations/ivm/joined.html", headers=reader).status_code == 403
        for path in ["/ivm/quality", "/ivm/api/views", "/ivm/quality/chart/per_k.svg"]:
            refused = get(base + path, headers=nobody)
            assert refused.status_code in (403, 404) and "you may not" in refused.text + "no view", path
        assert set(get(base + "/ivm/api/views", headers=admin).json()) == {"per_k", "joined"}


def test_anonymous_requests_and_users_without_dag_access_are_refused(server):
    base, token, nobody = server
    for path in ["/ivm/quality", "/ivm/api/views", "/ivm/quality/chart/per_k.svg", "/ivm/docs/index.html",
                 "/ivm/openapi.json", "/ivm/api/docs"]:
        assert get(base + path).status_code == 401, path
        assert get(base + path, cookies={"_token": "not-a-token"}).status_code == 403, path
    for path in ["/ivm/quality", "/ivm/api/views", "/ivm/quality/chart/per_k.svg", "/ivm/docs/index.html",
                 "/ivm/quality?run=bad-run"]:
        refused = get(base + path, cookies={"_token": nobody})
        assert refused.status_code in (403, 404) and "you may not" in refused.text + "no view", path
    assert get(base + "/ivm/api/views", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    spec = get(base + "/ivm/openapi.json", cookies={"_token": token})
    assert spec.status_code == 200 and "/quality" in spec.json()["paths"]
    assert "swagger" in get(base + "/ivm/api/docs", cookies={"_token": token}).text.lower()


def test_a_user_sees_only_the_views_of_the_dags_they_may_read(project, monkeypatch):
    """Airflow's auth manager lets the user read ivm_refresh_hourly (per_k's DAG) and not ivm_refresh
    (joined's): the page, the API, the charts, a run and the Data Docs show per_k only."""
    from fastapi.testclient import TestClient

    from ivm.orchestration import quality

    asked = []

    def readable(user, dag_ids):
        asked.append((user, sorted(dag_ids)))
        return {d for d in dag_ids if d == "ivm_refresh_hourly"}

    monkeypatch.setattr(quality, "readable_dags", readable)
    app = quality.create_app(project[1])
    app.dependency_overrides[quality.signed_in_user()] = lambda: "analyst"
    client = TestClient(app)
    assert set(client.get("/api/views").json()) == {"per_k"}
    assert asked[0] == ("analyst", ["ivm_refresh", "ivm_refresh_hourly"])
    page = client.get("/quality?run=bad-run")
    assert page.status_code == 200 and 'id="view-per_k"' in page.text and 'id="view-joined"' not in page.text
    assert 'data-view="joined"' not in page.text
    assert client.get("/quality?view=joined").status_code == 404
    assert client.get("/quality/chart/joined.svg").status_code == 404
    assert client.get("/quality/chart/per_k.svg").status_code == 200
    assert client.get("/docs/index.html").status_code == 403  # (the index lists every view's results)
    assert client.get("/docs/validations/ivm/joined/bad-run/x.html").status_code == 403
    assert client.get("/docs/expectations/ivm/joined.html").status_code == 403
    assert client.get("/docs/expectations/ivm/per_k.html").status_code == 200
    monkeypatch.setattr(quality, "readable_dags", lambda user, dag_ids: set(dag_ids))
    assert set(client.get("/api/views").json()) == {"per_k", "joined"}


def test_the_page_shows_runs_and_the_failed_validation(server, project):
    base, token, _ = server
    p, _ = project
    views = get(base + "/ivm/api/views", cookies={"_token": token}).json()
    assert set(views) == {"per_k", "joined"}
    runs = {r["run_id"]: r for r in views["per_k"]}
    assert runs["bad-run"]["validation"]["status"] == "failed" and runs["bad-run"]["validation"]["mismatches"] == 3
    passed = [r for r in views["per_k"] if r["validation"] and r["validation"]["status"] == "passed"]
    # (the first materialization too: per_k's own expectation checked over its recomputed state)
    assert {r["mode"] for r in passed} == {"full", "incremental"}
    # the validate task's extra link (its path under the API server) resolves to this run's detail
    link = quality_url("bad-run")
    assert link.endswith("/ivm/quality?run=bad-run")
    page = get(base + link[link.index(URL_PREFIX):], cookies={"_token": token})
    assert page.status_code == 200 and "Run bad-run" in page.text
    assert "&#39;k&#39;: &#39;zz&#39;" in page.text and "count 1, recomputed 0" in page.text
    svg = get(base + "/ivm/quality/chart/per_k.svg", cookies={"_token": token})
    assert svg.headers["content-type"].startswith("image/svg+xml") and svg.text.startswith("<svg")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"),
                    reason="needs Debian's chromium and chromium-driver (.ci/chromium.sh installs them; CI runs it)")
def test_headless_chromium_renders_the_page(server):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    base, token, _ = server
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(base + "/ivm/quality")
        assert "Not authenticated" in driver.page_source  # signed out: refused
        driver.add_cookie({"name": "_token", "value": token, "path": "/"})  # what signing in to Airflow sets
        driver.get(base + "/ivm/quality?run=bad-run")
        assert driver.title == "ivm data quality: project"
        failed = driver.find_element(By.CSS_SELECTOR, "#run tr.check[data-view='per_k'] td.failed")
        assert failed.text == "failed"
        mismatches = driver.find_element(By.CSS_SELECTOR, "#run ul.mismatches").text
        assert "'zz'" in mismatches and "count 1, recomputed 0" in mismatches
        rows = driver.find_elements(By.CSS_SELECTOR, "#view-per_k tr.run")
        assert {r.get_attribute("data-run") for r in rows} >= {"bad-run"} and len(rows) >= 3
        assert driver.find_elements(By.CSS_SELECTOR, "#view-per_k .chart svg")
        driver.find_element(By.CSS_SELECTOR, "#run tr.check[data-view='per_k'] a").click()  # its Data Docs
        assert "/ivm/docs/validations/" in driver.current_url and "Great Expectations" in driver.page_source
    finally:
        driver.quit()


def test_the_plugin_mounts_the_app_and_adds_the_link():
    spec = importlib.util.spec_from_file_location("ivm_quality", REPO / "plugins" / "ivm_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.plugins_manager import is_valid_plugin

    plugin = module.IvmQualityPlugin
    assert is_valid_plugin(plugin)
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/ivm" and isinstance(app["app"], FastAPI)
    assert {r.path for r in app["app"].routes} >= {"/quality", "/api/views", "/docs/{page:path}"}
    assert plugin.external_views[0]["href"] == "/ivm/quality"
    assert [link.name for link in plugin.operator_extra_links] == ["Data quality"]
