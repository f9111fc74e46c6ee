"""The ivm plugin for the Airflow 3 UI: the data-quality page (ivm.orchestration.quality) mounted on the
API server under /ivm, a "Data quality" entry in the Browse menu that shows it inside the UI, and the
validate tasks' extra link to it (ivm.orchestration.links)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from ivm.orchestration.links import URL_PREFIX, DataQualityLink
from ivm.orchestration.quality import create_app


class IvmQualityPlugin(AirflowPlugin):
    name = "ivm_quality"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "ivm data quality"}]
    external_views = [{"name": "Data quality", "href": f"{URL_PREFIX}/quality", "destination": "nav",
                       "category": "browse", "url_route": "ivm-quality"}]
    operator_extra_links = [DataQualityLink()]
