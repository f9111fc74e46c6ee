"""The data-quality page of the Airflow UI (docs/design.md §9, issue: validation reports): a FastAPI app the
plugin (plugins/ivm_quality.py) mounts on the Airflow 3 API server under ``/ivm``.

    /ivm/quality[?run=ID][&view=V]   the page: per view its recent runs (mode, delta sizes, timings,
                                     validation: sample, mismatches, expectations) with a chart of
                                     refresh time and rows changed over runs; one run's detail
    /ivm/quality/chart/{view}.svg    that chart alone
    /ivm/api/views                   the same figures as JSON
    /ivm/docs/{path}                 the Great Expectations Data Docs in the warehouse

    /ivm/api/docs, /ivm/openapi.json  the app's own API docs (FastAPI's), for signed-in users

Airflow 3 does not put a plugin's FastAPI app behind its authentication: every route here depends on
Airflow's ``get_user`` (the ``_token`` cookie the UI sets when a user signs in, or an
``Authorization: Bearer`` token), so an anonymous request is refused with 401. And it shows a user only
what Airflow's auth manager lets them read: a view when they may read the runs of its refresh DAG
(ivm.orchestration.dags.dag_id_for its schedule), a run when they may see one of its views, a Data Docs
page of a view's validation when they may see the view, the site's index and a run of tables alone
when they may see every view; a request for nothing they may see is refused with 403. The figures come
from the project's catalog (the project file as the CLI finds it: ``IVM_PROJECT``, else the demo
project).
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations, which name the local
# dependency ``User``, when the routes are defined
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, HTMLResponse, Response
from jinja2 import Environment, select_autoescape

from ivm.catalog import Catalog
from ivm.config import load_project
from ivm.vocabulary import RunKind, StageName

#: runs shown per view
HISTORY = 30


def signed_in_user():
    """Airflow's own dependency for a signed-in user (imported late: it needs Airflow's configuration)."""
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


def readable_dags(user, dag_ids: set[str]) -> set[str]:
    """The DAGs among ``dag_ids`` whose runs Airflow's auth manager lets ``user`` read."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    auth = get_auth_manager()
    return {d for d in dag_ids if auth.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN,
                                                         details=DagDetails(id=d), user=user)}


@dataclass
class RunRow:
    run_id: str
    kind: str
    status: str
    finished: str
    mode: str
    delta_in: int | None
    rows_changed: int | None
    seconds: float | None
    validation: dict[str, Any] | None


class QualityData:
    """Reads what the page shows from the catalog."""

    def __init__(self, project_path: str):
        self.config = load_project(project_path)
        self.project = self.config.project_name
        self.catalog = Catalog.open(self.config.catalog_url)
        self.docs_root = _local_docs_root(self.config.warehouse_uri)

    def visible(self, user) -> set[str]:
        """The views ``user`` may see: those whose refresh DAG's runs they may read."""
        from ivm.orchestration.dags import dag_id_for

        dags = {v: dag_id_for(c.schedule) for v, c in self.config.views.items()}
        readable = readable_dags(user, set(dags.values()))
        return {v for v, d in dags.items() if d in readable}

    def views(self) -> dict[str, list[RunRow]]:
        """Per view, its runs newest first: each run that maintained it, with its validation."""
        limit = 20 * HISTORY * max(1, len(self.config.views))
        checks = {(v.run_id, v.view): v for v in self.catalog.validations(limit=limit)}
        out: dict[str, list[RunRow]] = {v: [] for v in self.config.views}
        for run in self.catalog.runs(limit=20 * HISTORY):
            finished = run.finished_at.strftime("%Y-%m-%d %H:%M:%S") if run.finished_at else ""
            for stage in run.stages:
                if stage.stage == StageName.MAINTAIN and stage.relation in out and len(out[stage.relation]) < HISTORY:
                    check = checks.get((run.id, stage.relation))
                    out[stage.relation].append(RunRow(run.id, run.kind, run.status, finished, stage.mode or "",
                                                      stage.rows_in, stage.delta_rows, stage.seconds,
                                                      self.validation(check) if check else None))
            if run.kind == RunKind.VALIDATE:  # `ivm validate`: a check of published views, no maintenance
                for view in run.relations:
                    check = checks.get((run.id, view))
                    if view in out and check and len(out[view]) < HISTORY:
                        out[view].append(RunRow(run.id, run.kind, run.status, finished, "", None, None, None,
                                                self.validation(check)))
        return out

    def validation(self, v) -> dict[str, Any]:
        return {"status": v.status, "sample": v.sample_size, "mismatches": v.mismatches,
                "report": self.docs_link(v.report_uri),
                # (the rows that differ from the compiled rules' recomputation, then from the view's SQL text)
                "examples": v.summary.get("mismatches", []) + ((v.summary.get("sql") or {}).get("examples") or []),
                "problem": v.summary.get("problem"), "touched": v.summary.get("touched", 0),
                "expectations": v.summary.get("expectations", [])}

    def docs_link(self, uri: str | None) -> str | None:
        """A Data Docs page as this app serves it (local warehouses), else the URI as recorded."""
        if uri and self.docs_root and uri.startswith("file://"):
            path = Path(uri.removeprefix("file://"))
            if path.is_relative_to(self.docs_root):
                return "docs/" + path.relative_to(self.docs_root).as_posix()
        return uri

    def run(self, run_id: str):
        run = self.catalog.get_run(run_id)
        if run is None:
            raise HTTPException(status_code=404, detail=f"no ivm run {run_id}")
        return run, {v.view: self.validation(v) for v in self.catalog.validations(run_id=run_id)}


def _local_docs_root(warehouse: str) -> Path | None:
    if "://" in warehouse and not warehouse.startswith("file://"):
        return None
    return Path(warehouse.removeprefix("file://")).resolve() / "reports" / "data_docs"


def chart_svg(view: str, rows: list[RunRow]) -> str:
    """Refresh time and rows changed over the view's runs, oldest first, as an SVG (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in reversed(rows) if r.seconds is not None]
    fig, ax = plt.subplots(figsize=(6.4, 2.4), dpi=100)
    try:
        xs = list(range(1, len(runs) + 1))
        ax.plot(xs, [r.seconds for r in runs], marker="o", color="#1f77b4", label="refresh seconds")
        ax.set_xlabel("run (oldest to newest)")
        ax.set_ylabel("seconds", color="#1f77b4")
        other = ax.twinx()
        other.bar(xs, [r.rows_changed or 0 for r in runs], alpha=0.3, color="#ff7f0e", label="rows changed")
        other.set_ylabel("rows changed", color="#ff7f0e")
        ax.set_title(f"{view}: refresh time and rows changed")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


PAGE = Environment(autoescape=select_autoescape(default=True)).from_string("""<!doctype html>
<html><head><meta charset="utf-8"><title>ivm data quality: {{ project }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 90%; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; }
.passed { color: #2a7d2a; } .failed { color: #b00020; font-weight: bold; } .warned { color: #b26a00; }
section.view { margin-bottom: 2em; } .chart svg { max-width: 100%; height: auto; }
</style></head><body>
<h1>ivm data quality: {{ project }}</h1>
{% if run %}
<section id="run"><h2>Run {{ run.id }}</h2>
<p>{{ run.kind }}, {{ run.status }}{% if run.error %}: {{ run.error }}{% endif %}; snapshot
{% for t, v in run.snapshot.items() %}{{ t }}@{{ v }}{% if not loop.last %}, {% endif %}{% endfor %}</p>
<table><tr><th>view</th><th>validation</th><th>rows sampled</th><th>touched keys</th><th>mismatches</th>
<th>expectations met</th><th>report</th></tr>
{% for view, v in run_checks.items() %}
<tr class="check" data-view="{{ view }}"><td>{{ view }}</td><td class="{{ v.status }}">{{ v.status }}</td>
<td>{{ v.sample }}</td><td>{{ v.touched }}</td><td>{{ v.mismatches }}</td>
<td>{{ v.expectations | selectattr("success") | list | length }}/{{ v.expectations | length }}</td>
<td>{% if v.report %}<a href="{{ v.report }}">Data Docs</a>{% endif %}</td></tr>
{% if v.examples %}<tr><td colspan="7"><ul class="mismatches">
{% for m in v.examples %}<li>{{ m.row }}: count {{ m.staged }}, recomputed {{ m.expected }}</li>{% endfor %}
</ul></td></tr>{% endif %}
{% else %}<tr><td colspan="7">no view of this run was validated</td></tr>{% endfor %}
</table></section>
{% endif %}
{% for view, rows in views.items() %}
<section class="view" id="view-{{ view }}"><h2>{{ view }}</h2>
{% if rows %}<div class="chart">{{ charts[view] | safe }}</div>
<table><tr><th>run</th><th>finished</th><th>kind</th><th>mode</th><th>delta rows in</th><th>rows changed</th>
<th>seconds</th><th>validation</th><th>sample</th><th>mismatches</th><th>report</th></tr>
{% for r in rows %}
<tr class="run" data-run="{{ r.run_id }}"><td><a href="quality?run={{ r.run_id | urlencode }}">{{ r.run_id }}</a></td>
<td>{{ r.finished }}</td><td>{{ r.kind }}</td><td>{{ r.mode }}</td>
<td>{{ r.delta_in if r.delta_in is not none else "" }}</td>
<td>{{ r.rows_changed if r.rows_changed is not none else "" }}</td>
<td>{{ "%.2f" | format(r.seconds) if r.seconds is not none else "" }}</td>
{% if r.validation %}<td class="{{ r.validation.status }}">{{ r.validation.status }}</td>
<td>{{ r.validation.sample }}</td>
<td>{{ r.validation.mismatches }}</td>
<td>{% if r.validation.report %}<a href="{{ r.validation.report }}">Data Docs</a>{% endif %}</td>
{% else %}<td>not checked</td><td></td><td></td><td></td>{% endif %}</tr>
{% endfor %}</table>
{% else %}<p>no runs yet</p>{% endif %}
</section>
{% endfor %}
</body></html>""")


def create_app(project_path: str | None = None) -> FastAPI:
    """The app; ``project_path`` defaults to the project file the DAGs use."""
    from fastapi.openapi.docs import get_swagger_ui_html

    from ivm.orchestration.dags import project_file

    path = project_path or project_file()
    # (FastAPI's own /docs and /openapi.json would be served to anyone: they are routes below, behind login)
    app = FastAPI(title="ivm data quality", description=__doc__, docs_url=None, redoc_url=None, openapi_url=None)
    User = Annotated[Any, Depends(signed_in_user())]
    state: dict[str, QualityData] = {}

    def data() -> QualityData:
        if "data" not in state:  # opened on first use: the API server imports plugins at start
            state["data"] = QualityData(path)
        return state["data"]

    def visible(user) -> set[str]:
        """The views the user may see; 403 when none."""
        seen = data().visible(user)
        if not seen:
            raise HTTPException(status_code=403, detail="you may not read the runs of any ivm DAG")
        return seen

    @app.get("/quality", response_class=HTMLResponse)
    def page(user: User, run: Annotated[str | None, Query()] = None,
             view: Annotated[str | None, Query()] = None) -> str:
        d = data()
        seen = visible(user)
        views = {v: rows for v, rows in d.views().items() if v in seen}
        if view is not None:
            if view not in views:
                raise HTTPException(status_code=404, detail=f"no view {view}")
            views = {view: views[view]}
        detail, checks = d.run(run) if run else (None, {})
        if detail is not None:
            named = set(detail.relations) & set(d.config.views)
            if not (named & seen) and not (not named and seen == set(d.config.views)):
                raise HTTPException(status_code=403, detail=f"you may not see run {run}")
            checks = {v: c for v, c in checks.items() if v in seen}
        return PAGE.render(project=d.project, views=views, run=detail, run_checks=checks,
                           charts={v: chart_svg(v, rows) for v, rows in views.items() if rows})

    @app.get("/quality/chart/{view}.svg")
    def chart(user: User, view: str) -> Response:
        views = data().views()
        if view not in views or view not in visible(user):
            raise HTTPException(status_code=404, detail=f"no view {view}")
        return Response(chart_svg(view, views[view]), media_type="image/svg+xml")

    @app.get("/api/views")
    def api_views(user: User) -> dict[str, list[dict[str, Any]]]:
        seen = visible(user)
        return {v: [r.__dict__ for r in rows] for v, rows in data().views().items() if v in seen}

    @app.get("/docs/{page:path}")
    def docs(user: User, page: str) -> FileResponse:
        d = data()
        root = d.docs_root
        if root is None:
            raise HTTPException(status_code=404, detail="the Data Docs are not in a local warehouse")
        seen = visible(user)
        # a view's pages sit under validations/ivm/<view>/ and expectations/ivm/<view>.html (its suite is
        # ivm.<view>, ivm.expectations, and GE makes the dots folders); the index lists every view's
        parts = page.split("/")
        owner = (parts[2].removesuffix(".html")
                 if len(parts) > 2 and parts[0] in ("validations", "expectations") and parts[1] == "ivm" else None)
        if (owner is not None and owner not in seen) or (page.endswith("index.html") and owner is None
                                                          and seen != set(d.config.views)):
            raise HTTPException(status_code=403, detail=f"you may not see the Data Docs page {page}")
        target = (root / page).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise HTTPException(status_code=404, detail=f"no Data Docs page {page}")
        return FileResponse(target)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(user: User) -> dict[str, Any]:
        return app.openapi()

    @app.get("/api/docs", include_in_schema=False)
    def api_docs(user: User) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="../openapi.json", title=app.title)

    return app
