"""Every view published as a Delta Lake table that anyone can query (Spark SQL, delta-rs, a BI tool):
its ``sink`` (a path or URI, relative to the project file; by default ``<warehouse>/delta/<view>``).

After a run's publish (the catalog's commit, ivm.refresh.publish) the sink stage writes each view the
run refreshed in **one Delta commit**:

* a view with a ``key`` maintained incrementally: a ``MERGE`` by the key of the keys the run's delta
  touched, each with its row in the view's new state (updated or inserted) or without one (deleted);
* a full recompute, a view without a key, a new sink, or a sink that is not at the view's previous
  version: the view's new state replaces the table (an overwrite: Delta keeps the old versions for
  time travel). A keyless view has no identity to merge rows by (a bag may hold a row twice), so the
  overwrite is the cheapest write that is right for it.

Each commit is idempotent (Delta's ``txnAppId`` ``ivm:<view>`` and ``txnVersion`` the catalog's version
of the view): a retried stage does not write twice, and the table's transaction version says which
catalog version of the view it holds (`held`). The catalog stays the commit point: a crash between the
catalog's commit and a sink's leaves the sink at the view's previous version until the next sink stage
brings it up to date (README "Delta Lake").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.catalog.store import StageRecord
from ivm.changes import delta
from ivm.config import resolve_location
from ivm.context import RunContext
from ivm.zset import quote

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkWrite:
    view: str
    location: str
    how: str  # merge | overwrite | current
    delta_version: int | None
    seconds: float


def location(ctx: RunContext, view: str) -> str:
    sink = ctx.config.views[view].sink
    return resolve_location(sink, ctx.config.root) if sink else f"{ctx.warehouse.uri.rstrip('/')}/delta/{view}"


def app_id(view: str) -> str:
    return f"ivm:{view}"


def _delta_table(where: str):
    from deltalake import DeltaTable

    local = delta.local_path(where)
    return DeltaTable(local) if DeltaTable.is_deltatable(local) else None


def held(where: str, view: str) -> int | None:
    """The catalog version of ``view`` the sink at ``where`` holds (its last ivm commit); None: none."""
    dt = _delta_table(where)
    return None if dt is None else dt.transaction_version(app_id(view))


@contextmanager
def _idempotent(spark, view: str, version: int):
    """Delta's idempotent writes for the DML run inside (MERGE): the session's txnAppId/txnVersion."""
    spark.conf.set("spark.databricks.delta.write.txnAppId", app_id(view))
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(version))
    try:
        yield
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")


def write_view(ctx: RunContext, view: str, previous: int | None, delta_path: str | None,
               full: bool) -> SinkWrite:
    """Bring the sink of ``view`` to the view's published version: a MERGE of the keys in its delta layer
    ``delta_path`` when the sink holds the ``previous`` version and the view has a key, else an
    overwrite with the whole state."""
    started = time.perf_counter()
    where = location(ctx, view)
    version = ctx.catalog.state(view).version_id
    now = held(where, view)
    key = ctx.config.views[view].key
    if now == version:
        how = "current"
    elif full or not key or delta_path is None or now is None or now != previous:
        _overwrite(ctx.read_state(view), where, view, version)
        how = "overwrite"
    else:
        _merge(ctx, view, where, key, delta_path, version)
        how = "merge"
    dt = _delta_table(where)
    out = SinkWrite(view, where, how, dt.version() if dt is not None else None, time.perf_counter() - started)
    log.info("sink %s: %s at %s, Delta version %s (%.2f s)", view, how, where, out.delta_version, out.seconds)
    return out


def _overwrite(rows: DataFrame, where: str, view: str, version: int) -> None:
    (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("txnAppId", app_id(view)).option("txnVersion", version).save(where))


def _merge(ctx: RunContext, view: str, where: str, key: list[str], delta_path: str, version: int) -> None:
    """One MERGE: the keys the view's delta touched, each with its new row or marked gone."""
    from delta.tables import DeltaTable

    spark = ctx.spark
    schema = ctx.schema(view)
    touched = ctx.warehouse.read_layers(spark, [delta_path], schema, reuse=False).select(
        *[F.col(quote(k)) for k in key]).distinct()
    rows = ctx.read_state(view)
    cond = None
    for k in key:
        c = rows[quote(k)].eqNullSafe(touched[quote(k)])
        cond = c if cond is None else cond & c
    present = rows.join(F.broadcast(touched), cond, "left_semi").withColumn("__present", F.lit(True))
    gone = touched.join(rows, [touched[quote(k)].eqNullSafe(rows[quote(k)]) for k in key], "left_anti")
    source = present.unionByName(gone.select(
        *[F.col(quote(f.name)) if f.name in key else F.lit(None).cast(f.dataType).alias(f.name)
          for f in schema.fields], F.lit(False).alias("__present")))
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in key)
    values = {quote(f.name): f"s.{quote(f.name)}" for f in schema.fields}
    with _idempotent(spark, view, version):
        (DeltaTable.forPath(spark, where).alias("t").merge(source.alias("s"), on)
         .whenMatchedDelete("NOT s.__present")
         .whenMatchedUpdate("s.__present", values)
         .whenNotMatchedInsert("s.__present", values)
         .execute())


def write_views(ctx: RunContext, run_id: str, views: list[tuple[str, int | None, str | None, bool]],
                progress: Callable[[str], None] = lambda _: None) -> list[SinkWrite]:
    """`write_view` for each (view, its previous catalog version, its delta layer, recomputed in full),
    each recorded in the run (what `snapshot` reads)."""
    done = []
    for view, previous, delta_path, full in views:
        w = write_view(ctx, view, previous, delta_path, full)
        ctx.catalog.save_stage(run_id, StageRecord("sink", view, seconds=round(w.seconds, 3), detail={
            "location": w.location, "how": w.how, "delta_version": w.delta_version,
            "view_version": ctx.catalog.state(view).version_id}))
        progress(f"sink: {view}: {w.how} -> {w.location} (Delta version {w.delta_version}, {w.seconds:.2f} s)")
        done.append(w)
    return done


@dataclass(frozen=True)
class SinkState:
    view: str
    location: str
    #: the Delta version holding the view's current (catalog) version; None: the table is behind
    delta_version: int | None
    note: str

    def sql(self) -> str:
        return f"SELECT * FROM delta.`{self.location}` VERSION AS OF {self.delta_version}"


def snapshot(ctx: RunContext) -> list[SinkState]:
    """`ivm snapshot`: per view, the Delta version of its table that holds the view as the catalog's
    current snapshot does (from the sink stages' records; no JVM). Reading each table ``VERSION AS OF``
    its version reads one consistent set of views."""
    out = []
    for view in ctx.config.views:
        where = location(ctx, view)
        current = ctx.catalog.state(view).version_id
        record = ctx.catalog.latest_stage("sink", view)
        if current is None:
            out.append(SinkState(view, where, None, "not materialized yet"))
        elif record is None or record.detail.get("view_version") != current:
            out.append(SinkState(view, where, None, "its Delta table is behind the catalog: the next refresh "
                                                    "writes it (or it is not published: storage.delta_views)"))
        else:
            out.append(SinkState(view, where, record.detail["delta_version"], "current"))
    return out


def optimize(ctx: RunContext, views: list[str] | None = None,
             progress: Callable[[str], None] = lambda _: None) -> list[str]:
    """`ivm compact`: Delta's OPTIMIZE (small files into larger ones) on the views' Delta tables, by
    delta-rs: no JVM (ivm creates the tables with Delta's base protocol, which delta-rs writes)."""
    done = []
    for view in views or list(ctx.config.views):
        dt = _delta_table(location(ctx, view))
        if dt is None:
            continue
        started = time.perf_counter()
        metrics = dt.optimize.compact()
        progress(f"compact: {view}'s Delta table optimized: {metrics.get('numFilesRemoved', 0)} files into "
                 f"{metrics.get('numFilesAdded', 0)} ({time.perf_counter() - started:.2f} s)")
        done.append(view)
    return done


def vacuum(ctx: RunContext, progress: Callable[[str], None] = lambda _: None) -> list[str]:
    """`ivm gc`: Delta's VACUUM on the views' Delta tables by delta-rs (no JVM), deleting the files no
    version within ``storage.retention_hours`` needs (that setting rules, not the table's own
    ``delta.deletedFileRetentionDuration``: ivm's retention is the one its users set)."""
    done = []
    hours = ctx.config.storage.retention_hours
    for view in ctx.config.views:
        dt = _delta_table(location(ctx, view))
        if dt is None:
            continue
        deleted = dt.vacuum(retention_hours=int(hours), dry_run=False, enforce_retention_duration=False)
        progress(f"gc: {view}'s Delta table vacuumed: {len(deleted)} files older than {hours:g} hours deleted")
        done.append(view)
    return done
