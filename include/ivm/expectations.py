"""Great Expectations 1.x over a view's sampled comparison (docs/design.md §7, ivm.validate).

Per view, a suite (``ivm.<view>``) checks the comparison frame (the view's columns, ``__staged`` and
``__expected`` counts of each sampled row):

* ``expect_column_pair_values_to_be_equal(__staged, __expected)``: no mismatching row;
* ``expect_column_values_to_be_between(__staged, min 1)`` over the rows the state holds (the
  row condition ``__staged != 0``): no negative or zero count;
* with a declared ``key``: its columns not null and unique over the rows the state holds.

The comparison is a pandas frame of about twice the sample (ivm.validate brings it to the driver): GE's
pandas engine checks it in milliseconds, where its Spark engine would launch a job per metric. The
view's own ``validate.expectations`` from the project file (GE's ``{type, kwargs}`` form) are a second
suite (``ivm.<view>.view``), run by GE's Spark engine over the view's whole new state as SQL returns it
(`run_on_view`) — the state the run publishes, whether maintained or recomputed.

Each runs through a Checkpoint whose UpdateDataDocsAction writes the Data Docs to
``<warehouse>/reports/data_docs`` (a local folder or S3); each view's result page is its report. For a
local warehouse the context is a file data context in ``<warehouse>/reports/gx``: suites and every
run's validation results persist there, so each Data Docs build lists every earlier run and no page a
link points at goes away (processes take a lock on it one at a time). For a warehouse on S3 it is
ephemeral (the results of the process; its pages stay on S3, the index lists the process's runs). It
is made once per process: importing GE takes seconds.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ivm.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

SITE = "ivm"
#: the comparison frame's count columns: the view's state, and the recomputation (ivm.validate)
STAGED, EXPECTED = "__staged", "__expected"
#: the kwargs of an expectation that name columns
COLUMN_ARGS = ("column", "column_A", "column_B")
COLUMN_LIST_ARGS = ("column_list",)


@dataclass
class SuiteResult:
    success: bool
    #: per expectation: type, kwargs, success, unexpected count or observed value
    results: list[dict[str, Any]]
    report_uri: str | None


def docs_site(warehouse_uri: str) -> dict | None:
    """The Data Docs site config for a warehouse: a local folder or an S3 prefix (else None: no docs)."""
    base = warehouse_uri.rstrip("/") + "/reports/data_docs"
    if base.startswith(("s3://", "s3a://")):
        bucket, _, prefix = base.split("://", 1)[1].partition("/")
        backend = {"class_name": "TupleS3StoreBackend", "bucket": bucket, "prefix": prefix}
    elif "://" not in base or base.startswith("file://"):
        backend = {"class_name": "TupleFilesystemStoreBackend", "base_directory": base.removeprefix("file://")}
    else:
        log.warning("validate: no Data Docs for a warehouse at %s (local folders and S3 only)", warehouse_uri)
        return None
    return {"class_name": "SiteBuilder", "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": backend}


def user_expectation(spec: dict[str, Any], view: str, columns: list[str], held_only: bool = True):
    """A ``{type, kwargs}`` expectation of the project file as a GE expectation (``held_only``: restricted
    to the rows of a comparison frame the view's state holds); a one-line ConfigError naming the view
    when GE or the columns disagree."""
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    kwargs = dict(spec.get("kwargs") or {})
    named = [kwargs[a] for a in COLUMN_ARGS if a in kwargs] + [c for a in COLUMN_LIST_ARGS for c in kwargs.get(a, [])]
    unknown = [c for c in named if c not in columns]
    if unknown:
        raise ConfigError(f"views.{view}.validate.expectations: {spec['type']}: unknown column {unknown[0]!r}")
    if held_only and "row_condition" not in kwargs:
        kwargs["row_condition"] = held()
    try:
        return ExpectationConfiguration(type=spec["type"], kwargs=kwargs).to_domain_obj()
    except Exception as e:  # noqa: BLE001 - GE raises several kinds for an unknown type or bad kwargs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"views.{view}.validate.expectations: {spec['type']}: {first}") from e


def held():
    """The rows of the comparison the view's state holds (the others are rows only the recomputation has)."""
    from great_expectations.expectations.row_conditions import Column

    return Column(STAGED) != 0


def suite_expectations(key: list[str] | None) -> list:
    """The comparison frame's suite (the view's own expectations run over its whole state instead:
    `run_on_view`)."""
    import great_expectations.expectations as gxe

    out = [gxe.ExpectColumnPairValuesToBeEqual(column_A=STAGED, column_B=EXPECTED,
                                               description="the view's state equals its recomputation"),
           gxe.ExpectColumnValuesToBeBetween(column=STAGED, min_value=1, row_condition=held(),
                                             description="no tuple is held with a negative or zero count")]
    for c in key or []:
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=c, row_condition=held()))
    if key and len(key) == 1:
        out.append(gxe.ExpectColumnValuesToBeUnique(column=key[0], row_condition=held()))
    elif key:
        out.append(gxe.ExpectCompoundColumnsToBeUnique(column_list=list(key), row_condition=held()))
    return out


def local_root(warehouse_uri: str) -> Path | None:
    """Where a local warehouse's GE project lives (its ``gx`` folder): ``<warehouse>/reports``."""
    if "://" in warehouse_uri and not warehouse_uri.startswith("file://"):
        return None
    return Path(warehouse_uri.removeprefix("file://")) / "reports"


@contextmanager
def _locked(warehouse_uri: str) -> Iterator[None]:
    """One process at a time in a local warehouse's GE project (validate tasks of several DAG runs)."""
    root = local_root(warehouse_uri)
    if root is None:
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".gx.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@lru_cache(maxsize=1)
def import_ahead() -> None:
    """Import Great Expectations on a thread of its own, once a process: it takes 5-8 s, and the run meanwhile
    trims, maintains and recomputes its samples, its main thread waiting on Spark (a socket: the GIL is free).
    The first suite then finds it imported, or waits for the rest of it (Python's import lock). A failed import
    is left for that first suite to report."""

    def load() -> None:
        try:
            import great_expectations.expectations  # noqa: F401 (the suites' module; imports the package)
        except Exception:  # noqa: BLE001 - `_context` imports it again and says what is wrong
            log.debug("importing Great Expectations ahead failed", exc_info=True)

    # (not a daemon: a process that ends before its first suite waits for the import's rest, rather than
    # stopping a thread halfway through an import at interpreter shutdown)
    threading.Thread(target=load, name="ivm-import-great-expectations").start()


@lru_cache(maxsize=4)  # a process validates a project or a few; each context holds its last batches
def _context(warehouse_uri: str):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root = local_root(warehouse_uri)
    context = (gx.get_context(mode="file", project_root_dir=str(root)) if root is not None
               else gx.get_context(mode="ephemeral"))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    site = docs_site(warehouse_uri)
    if site is not None and SITE not in (context.variables.data_docs_sites or {}):
        context.add_data_docs_site(site_name=SITE, site_config=site)
    return context, site is not None


def _checkpoint(context, docs: bool, name: str, batch, expectations: list, run_id: str, parameters: dict):
    """Run ``expectations`` as suite ``name`` over ``batch`` through a Checkpoint that updates the Data
    Docs; the outcomes and the report page."""
    import great_expectations as gx

    suite = context.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=expectations))
    definition = context.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch,
                                                                                      suite=suite))
    actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[SITE])] if docs else []
    checkpoint = context.checkpoints.add_or_update(gx.Checkpoint(
        name=name, validation_definitions=[definition], actions=actions, result_format={"result_format": "SUMMARY"}))
    result = checkpoint.run(batch_parameters=parameters, run_id=gx.RunIdentifier(run_name=run_id))
    (identifier, validation), = result.run_results.items()
    outcomes = []
    for r in validation.results:
        config = r.expectation_config
        outcomes.append({"expectation": config.type,
                         "kwargs": {k: v for k, v in config.kwargs.items() if k not in ("batch_id",)},
                         "success": bool(r.success),
                         "unexpected": r.result.get("unexpected_count"),
                         "observed": _json(r.result.get("observed_value"))})
    uri = None
    if docs:
        urls = context.get_docs_sites_urls(resource_identifier=identifier, site_names=[SITE])
        uri = urls[0]["site_url"] if urls else None
    return SuiteResult(bool(result.success), outcomes, uri)


def _batch(source, name: str):
    """The whole-dataframe batch definition ``name`` of ``source`` (made on first use)."""
    try:
        asset = source.get_asset(name)
    except LookupError:
        asset = source.add_dataframe_asset(name=name)
    try:
        return asset.get_batch_definition(name)
    except (KeyError, LookupError, ValueError):
        return asset.add_batch_definition_whole_dataframe(name)


def run_suite(warehouse_uri: str, run_id: str, view: str, frame: pd.DataFrame, key: list[str] | None) -> SuiteResult:
    """Validate ``frame`` (a view's sampled comparison) with the view's suite; each expectation's outcome
    and the view's report page."""
    with _locked(warehouse_uri):
        context, docs = _context(warehouse_uri)
        source = context.data_sources.add_or_update_pandas(name="ivm")
        name = f"ivm.{view}"
        return _checkpoint(context, docs, name, _batch(source, name), suite_expectations(key),
                           run_id, {"dataframe": frame})


def run_on_view(warehouse_uri: str, run_id: str, view: str, df: DataFrame, user: list[dict[str, Any]]) -> SuiteResult:
    """The project's expectations of ``view`` over ``df``, its whole state as SQL returns it, with GE's
    Spark engine on the running session (a Spark job per metric; nothing collected to the driver)."""
    with _locked(warehouse_uri):
        context, docs = _context(warehouse_uri)
        source = context.data_sources.add_or_update_spark(name="ivm_spark", persist=False)
        name = f"ivm.{view}.view"
        return _checkpoint(context, docs, name, _batch(source, name),
                           [user_expectation(spec, view, df.columns, held_only=False) for spec in user], run_id,
                           {"dataframe": df})


def _json(v):
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)
