"""The validate tasks' extra link to the run's data-quality report (docs/design.md §9).

Airflow 3 resolves a task's extra links when the task finishes and keeps each URL as an XCom
(``_link_DataQualityLink``), so the UI shows the button without importing this module."""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from ivm.orchestration.stages import run_id_for

#: where the plugin (plugins/ivm_quality.py) mounts its app on the Airflow API server
URL_PREFIX = "/ivm"


def quality_url(ivm_run: str | None = None) -> str:
    """The data-quality page (of one ivm run), under the API server's base URL."""
    from airflow.configuration import conf

    base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    return f"{base}{URL_PREFIX}/quality" + (f"?run={quote(ivm_run)}" if ivm_run else "")


class DataQualityLink(BaseOperatorLink):
    """From a validate task to the page showing its run's validation of each view."""

    name = "Data quality"

    def get_link(self, operator, *, ti_key) -> str:
        return quality_url(run_id_for(ti_key.dag_id, ti_key.run_id))
