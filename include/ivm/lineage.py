"""OpenLineage run events of a refresh: what it read and what it wrote, at which versions.

A refresh's **inputs** are the tables whose changes it consumed — a Delta source at its location (or its
Spark catalog name) with the Delta version the run read up to, a table ivm keeps at its change log in the
warehouse with the commit version — and its **outputs** the views it wrote: each view's Delta table with
the Delta version the sink committed (`ivm.sinks`), or, without Delta tables (``storage.delta_views:
false``), the view's layers in the warehouse with its catalog version. Datasets are named as the
OpenLineage naming specification names files (`dataset_id`: ``file`` and the absolute path, ``s3://bucket``
and the key, ...); a name in the Spark catalog is a ``symlinks`` facet of the dataset.

Two emitters, one set of datasets:

* `ivm refresh` / `ivm backfill` (ivm.refresh.stages.refresh) send a START event once the run is planned
  and COMPLETE (or FAIL, with the error) when it ends, through the OpenLineage client, when a transport is
  configured: the project file's ``lineage.transport`` or the client's own configuration
  (``OPENLINEAGE_CONFIG``, an ``openlineage.yml``, ``OPENLINEAGE__TRANSPORT__*``, ``OPENLINEAGE_URL``;
  ``OPENLINEAGE_DISABLED=true`` turns it off). Without one nothing is sent — not even the client's
  fallback to printing events on the console.
* The DAG's tasks report through Airflow's OpenLineage provider (ivm.orchestration.operators): the trim
  task's inputs, the sink task's outputs; the provider sends the task's START/COMPLETE/FAIL events with
  them, configured as the provider is (``[openlineage] transport``).

A lineage transport that fails never fails the refresh: the client logs it (the data is published).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    dataset_version_dataset,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    output_statistics_output_dataset,
    processing_engine_run,
    schema_dataset,
    symlinks_dataset,
    tags_run,
)
from openlineage.client.transport.noop import NoopConfig, NoopTransport

from ivm import __version__
from ivm.config import ProjectConfig, resolve_location
from ivm.errors import ConfigError, one_line

if TYPE_CHECKING:
    from ivm.context import RunContext
    from ivm.refresh.record import Plan

log = logging.getLogger(__name__)

#: the ``producer`` of ivm's events (a URI, as the specification asks)
PRODUCER = f"urn:ivm:{__version__}"
#: the integration name in the ``jobType`` facet and the run's tags
INTEGRATION = "IVM"


def dataset_id(location: str) -> tuple[str, str]:
    """A file location as OpenLineage's naming specification names it: (namespace, name).

    >>> dataset_id("/data/views/q3"), dataset_id("s3a://lake/views/q3/"), dataset_id("hdfs://nn:8020/w/t")
    (('file', '/data/views/q3'), ('s3://lake', 'views/q3'), ('hdfs://nn:8020', '/w/t'))
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return "file", os.path.abspath(parsed.path or location).rstrip("/") or "/"
    scheme = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}.get(parsed.scheme, parsed.scheme)
    path = parsed.path.rstrip("/")
    if scheme in ("s3", "gs"):  # object stores: the key, without its leading slash
        path = path.lstrip("/")
    return f"{scheme}://{parsed.netloc}", path


def catalog_namespace(config: ProjectConfig) -> str:
    """The namespace of a name in the project's Spark catalog: its Hive metastore service
    (``hive://host:port``), else the session catalog of the project's Spark (``spark_catalog``)."""
    if config.spark.metastore:
        return "hive://" + urlparse(config.spark.metastore).netloc
    return "spark_catalog"


def _symlink(config: ProjectConfig, name: str) -> dict[str, Any]:
    return {"symlinks": symlinks_dataset.SymlinksDatasetFacet(identifiers=[symlinks_dataset.Identifier(
        namespace=catalog_namespace(config), name=name, type="TABLE")])}


def _schema(columns: dict[str, str]) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(fields=[schema_dataset.SchemaDatasetFacetFields(name=c, type=t)
                                                     for c, t in columns.items()])


def inputs(ctx: RunContext, plan: Plan) -> list[InputDataset]:
    """The tables run ``plan`` consumed changes of, each with the version it read up to (a Delta source's
    Delta version, else the commit version of ivm's change log) and the change rows it read."""
    from ivm.changes.delta import named_version

    out = []
    for t in plan.tables:
        cfg = ctx.config.tables[t.table]
        facets: dict[str, Any] = {"schema": _schema(cfg.columns),
                                  "version": dataset_version_dataset.DatasetVersionDatasetFacet(
                                      datasetVersion=str(named_version(cfg, t.to_version)))}
        if cfg.source is not None and cfg.source.table is not None:
            namespace, name = catalog_namespace(ctx.config), cfg.source.table
        else:
            where = ctx.source_location(t.table) if cfg.source is not None else ctx.warehouse.path("log", t.table)
            namespace, name = dataset_id(where)
        out.append(InputDataset(namespace, name, facets=facets, inputFacets={
            "inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet(rowCount=t.log_rows)}))
    return out


def outputs(ctx: RunContext, run_id: str) -> list[OutputDataset]:
    """The views run ``run_id`` wrote: each view's Delta table at the Delta version its sink committed
    (the sink stage's records), or — without Delta tables — its layers at the catalog version the run
    published; with the rows the run changed (None after a recompute, which does not count them)."""
    from ivm import sinks
    from ivm.modes import Mode
    from ivm.refresh.plan import load_plan

    p, _ = load_plan(ctx, run_id)
    changed = {w.view: (None if w.mode is Mode.FULL else w.rows_changed) for w in p.views}
    written = sinks.written(ctx, run_id)
    out = []
    for view in sorted(changed):
        if ctx.config.storage.delta_views:
            if view not in written:  # (the sink did not write it: the run left it as it was)
                continue
            detail = written[view]
            namespace, name = dataset_id(detail["location"] or sinks.location(ctx, view))
            version = detail.get("delta_version")
        else:
            namespace, name = dataset_id(ctx.warehouse.path("data", view))
            version = ctx.catalog.state(view).version_id
        facets: dict[str, Any] = {"version": dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=str(version))}
        if ctx.config.storage.delta_views and ctx.config.storage.register_views:
            facets.update(_symlink(ctx.config, f"{ctx.config.database}.{view}"))
        out.append(OutputDataset(namespace, name, facets=facets, outputFacets={
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=changed[view])}))
    return out


def run_uuid(config: ProjectConfig, run_id: str) -> str:
    """The OpenLineage run id of ivm run ``run_id``: a UUID derived from the project and the run, the same
    for every event of the run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"ivm://{config.project_name}/runs/{run_id}"))


def run_facets(run_id: str) -> dict[str, Any]:
    """The facets every event of ivm run ``run_id`` carries: its ivm run id (a tag) and ivm's version."""
    return {"tags": tags_run.TagsRunFacet(tags=[tags_run.TagsRunFacetFields(key="ivm.run_id", value=run_id,
                                                                             source=INTEGRATION)]),
            "processing_engine": processing_engine_run.ProcessingEngineRunFacet(version=__version__, name="ivm")}


class Emitter:
    """The run events of `ivm refresh`/`ivm backfill` through one OpenLineage client (`for_project`)."""

    def __init__(self, config: ProjectConfig, client: OpenLineageClient):
        self.config = config
        self.client = client

    @classmethod
    def for_project(cls, config: ProjectConfig) -> Emitter | None:
        """The project's emitter, or None when no transport is configured (see the module's docstring). A
        transport the client cannot build is a one-line ConfigError naming ``lineage``."""
        own = None
        if config.lineage.transport:
            transport = dict(config.lineage.transport)
            if transport.get("log_file_path"):  # (a file transport's path: relative to the project file)
                transport["log_file_path"] = resolve_location(transport["log_file_path"], config.root)
            own = {"transport": transport}
        try:
            probe = OpenLineageClient(transport=NoopTransport(NoopConfig()), config=own)
            if not ((probe.config.transport or {}).get("type") or os.environ.get("OPENLINEAGE_URL")):
                return None
            return cls(config, OpenLineageClient(config=own))
        except Exception as e:  # noqa: BLE001 - the client raises what its transports raise: one line each
            raise ConfigError(f"lineage: the OpenLineage client cannot start: {one_line(e)}") from e

    def _send(self, state: RunState, run_id: str, kind: str, ins: list, outs: list, error: str | None = None):
        facets = run_facets(run_id)
        if error is not None:
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(message=error, programmingLanguage="python")
        job = Job(self.config.lineage.namespace, f"{self.config.project_name}.{kind}", facets={
            "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration=INTEGRATION,
                                                    jobType=kind.upper())})
        event = RunEvent(eventType=state, eventTime=datetime.now(UTC).isoformat(), producer=PRODUCER,
                         run=Run(run_uuid(self.config, run_id), facets=facets), job=job, inputs=ins, outputs=outs)
        try:
            self.client.emit(event)
        except Exception as e:  # noqa: BLE001 - lineage never fails a refresh whose data is published
            log.warning("lineage: the %s event of run %s was not sent: %s", state.value, run_id, one_line(e))

    @contextmanager
    def reporting(self, ctx: RunContext, plan: Plan, kind: str) -> Iterator[None]:
        """START now, COMPLETE when the block ends or FAIL (with its one-line error) when it raises; the
        client closed either way."""
        self.start(ctx, plan, kind)
        try:
            yield
        except BaseException as e:
            self.fail(ctx, plan, kind, e)
            raise
        else:
            self.complete(ctx, plan, kind)
        finally:
            self.close()

    def start(self, ctx: RunContext, plan: Plan, kind: str) -> None:
        self._send(RunState.START, plan.run_id, kind, inputs(ctx, plan), [])

    def complete(self, ctx: RunContext, plan: Plan, kind: str) -> None:
        self._send(RunState.COMPLETE, plan.run_id, kind, inputs(ctx, plan), outputs(ctx, plan.run_id))

    def fail(self, ctx: RunContext, plan: Plan, kind: str, error: BaseException) -> None:
        self._send(RunState.FAIL, plan.run_id, kind, inputs(ctx, plan), [], error=one_line(error))

    def close(self) -> None:
        self.client.close(timeout=10)
