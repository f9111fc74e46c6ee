"""Every view published as a Delta Lake table that anyone can query (Spark SQL, delta-rs, a BI tool):
its ``sink`` (a path or URI, relative to the project file; by default ``<warehouse>/delta/<view>``).

Every view's table has Delta's change data feed on and says what it holds (`table_properties`: the
view, its project, its definition's hash), so another pipeline — a second ivm project, a Structured
Streaming job — reads a view's changes as ivm reads its Delta sources'. After a run's publish (the
catalog's commit, ivm.refresh.publish) the sink stage writes each view the run refreshed in **one
Delta commit** that writes only the rows that changed, so the feed between two refreshes is the view's
delta:

* a view with a ``key`` maintained incrementally: a ``MERGE`` by the key of the keys the run's delta
  touched, each with its row in the view's new state (updated where it differs, or inserted) or without
  one (deleted);
* the same view after a full recompute, or a sink that is not at the view's previous version: a
  ``MERGE`` of its whole new state by the key (rows the table holds and the view no longer does
  deleted). A set (SELECT DISTINCT, a Datalog view) holds each row once, so its columns are its key and
  it is merged as a keyed view is;
* a keyless bag (it may hold a row twice: no identity to merge one copy by) and a view whose columns
  changed: the new state replaces the table (an overwrite: the feed lists the old rows deleted and
  the new ones inserted).

A view small enough (`storage.sink_without_jvm_mb`) is written the same way by delta-rs, without a JVM.
Each commit's ``userMetadata`` names the ivm run and snapshot it holds (`commit_metadata`).

Each commit is idempotent (Delta's ``txnAppId`` ``ivm:<view>`` and ``txnVersion`` the catalog's version
of the view): a retried stage does not write twice, and the table's transaction version says which
catalog version of the view it holds (`held`). The catalog stays the commit point: a crash between the
catalog's commit and a sink's leaves the sink at the view's previous version until the next sink stage
brings it up to date (docs/guide.md "Delta Lake").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from ivm.catalog.store import StageRecord
from ivm.changes import delta
from ivm.config import COUNT_COLUMN, resolve_location
from ivm.context import RunContext
from ivm.errors import ChangeDataError, ConfigError, IvmError, one_line
from ivm.spark import spark_errors
from ivm.storage import SPARK_SCHEMA
from ivm.vocabulary import StageName
from ivm.zset import consolidate, negate, quote

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkWrite:
    view: str
    location: str
    how: str  # merge | overwrite | current
    delta_version: int | None
    seconds: float
    #: another writer's commit the write undid (`outside_write`)
    outside: dict | None = None


def location(ctx: RunContext, view: str) -> str:
    sink = ctx.config.views[view].sink
    return resolve_location(sink, ctx.config.root) if sink else f"{ctx.warehouse.uri.rstrip('/')}/delta/{view}"


def app_id(view: str) -> str:
    return f"ivm:{view}"


def _delta_table(where: str):
    from deltalake import DeltaTable

    local = delta.local_path(where)
    return DeltaTable(local) if DeltaTable.is_deltatable(local) else None


def _columns(dt) -> list:
    """A Delta table's columns as (name, Spark type): its schema's JSON is Spark's."""
    return [(f.name, f.dataType) for f in StructType.fromJson(json.loads(dt.schema().to_json())).fields]


@contextmanager
def _idempotent(spark, view: str, version: int, metadata: str):
    """Delta's idempotent writes for the DML run inside (MERGE): the session's txnAppId/txnVersion, and
    the commit's ``userMetadata``."""
    settings = {"spark.databricks.delta.write.txnAppId": app_id(view),
                "spark.databricks.delta.write.txnVersion": str(version),
                "spark.databricks.delta.commitInfo.userMetadata": metadata}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k in settings:
            spark.conf.unset(k)


#: a view's Delta table says what it is (#67): its change data feed on, so that other pipelines read the
#: view's changes as ivm reads its sources'; and the view, the project and the definition it holds
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def table_properties(ctx: RunContext, view: str) -> dict[str, str]:
    return {CHANGE_DATA_FEED: "true", "ivm.project": ctx.config.project_name, "ivm.view": view,
            "ivm.definition_sha256": ctx.config.views[view].definition_sha256()}


def prepare(ctx: RunContext, view: str, where: str, schema: StructType | None = None) -> None:
    """The view's Delta table made ready to take its changes, by delta-rs (no JVM): created empty with its
    schema and `table_properties` where there is none yet (`ivm apply`, or the first sink where views are
    not registered; by Spark where a column is nested), or given the properties it lacks (a table from
    before ivm set them, or a view whose definition changed): one metadata commit, before the write, so
    the feed holds that write too."""
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import to_arrow_schema

    wanted = table_properties(ctx, view)
    sink = _delta_table(where)
    schema = schema or ctx.schema(view)
    if sink is None and not any(isinstance(f.dataType, ArrayType | MapType | StructType) for f in schema.fields):
        DeltaTable.create(delta.local_path(where), to_arrow_schema(schema, timezone="UTC"), configuration=wanted,
                          raise_if_key_not_exists=False)
        return
    if sink is None:  # (nested types: by Spark, each element and field nullable as read back from layers)
        ctx.spark.createDataFrame([], _nullable(schema)).write.format("delta").save(where)
        sink = _delta_table(where)
    have = sink.metadata().configuration
    missing = {k: v for k, v in wanted.items() if have.get(k) != v}
    if missing:
        sink.alter.set_table_properties(missing, raise_if_not_exists=False)


@dataclass(frozen=True)
class _Route:
    """How `write_view` brings a view's table up to date (worked out from the catalog, the table's Delta
    log and the layers' Parquet footers: no JVM)."""

    how: str  # current | small | overwrite | merge (copies) | merge (whole state) | merge
    schema: StructType | None  # the view's columns
    key: list[str] | None
    #: the view's delta layer, to merge the keys or rows it touched (None: the whole state against the table)
    delta_path: str | None = None
    #: a small keyless bag's change for delta-rs: (copies it gains, rows that lose copies), pyarrow Tables;
    #: (None, None) for all its rows into an empty table
    bag: tuple | None = None
    #: a commit of another writer since ivm's last (`outside_write`): the table is brought back to the view
    #: from its whole state
    outside: dict | None = None


#: Delta operations that change no row — a table's upkeep, by ivm or anyone: never an outside write
NO_DATA_CHANGE = frozenset({"CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES",
                            "UNSET TBLPROPERTIES", "ADD CONSTRAINT", "DROP CONSTRAINT", "UPGRADE PROTOCOL",
                            "REORG", "ADD COLUMNS", "CHANGE COLUMN"})


def outside_write(sink, view: str, since: int | None) -> dict | None:
    """The first commit of a view's Delta table after version ``since`` (the one ivm's last sink wrote)
    that changed rows and is not ivm's (its ``userMetadata`` names no ivm run of this view): a notebook's
    UPDATE, a mistaken INSERT. None when ``since`` is unknown (never written by ivm), when every commit
    since is ivm's or changes no row (`NO_DATA_CHANGE`), or when a RESTORE to ``since`` undid the ones
    before it. From the Delta log (delta-rs): no JVM."""
    if sink is None or since is None or sink.version() <= since:
        return None
    found = None
    for h in sorted(sink.history(sink.version() - since), key=lambda h: h["version"]):
        operation = h.get("operation")
        if operation == "RESTORE" and str((h.get("operationParameters") or {}).get("version")) == str(since):
            found = None  # (restored to ivm's own version: what came between is undone)
        elif not (h["version"] <= since or operation in NO_DATA_CHANGE or _ours(h.get("userMetadata"), view)):
            found = found or {"delta_version": h["version"], "operation": operation, "timestamp": h.get("timestamp")}
    return found


def _ours(metadata: str | None, view: str) -> bool:
    try:
        return json.loads(metadata or "{}").get("ivm", {}).get("view") == view
    except (ValueError, AttributeError):
        return False


def _outside(ctx: RunContext, view: str, where: str, sink) -> dict | None:
    """`outside_write` of the view's table since ivm's last sink of it; under ``storage.on_outside_write:
    fail`` a refusal in one line, with the way out."""
    record = ctx.catalog.latest_stage("sink", view)
    found = outside_write(sink, view, record.detail.get("delta_version") if record is not None else None)
    if found is not None and ctx.config.storage.on_outside_write == "fail":
        raise ChangeDataError(
            f"view {view}: its Delta table {where} was changed outside ivm at Delta version {found['delta_version']} "
            f"({found['operation']}); not written (storage.on_outside_write: fail). Restore it (RESTORE TABLE "
            f"delta.`{where}` TO VERSION AS OF {record.detail['delta_version']}) or set on_outside_write: rewrite; "
            "the next `ivm refresh` writes it")
    return found


def _route(ctx: RunContext, view: str, previous: int | None, delta_path: str | None, full: bool) -> _Route:
    where = location(ctx, view)
    version = ctx.catalog.state(view).version_id
    sink = _delta_table(where)
    now = None if sink is None else sink.transaction_version(app_id(view))
    if now == version:
        return _Route("current", None, None)
    outside = _outside(ctx, view, where, sink)
    small = small_layers(ctx, view)
    schema = StructType([f for f in small[1].fields if f.name != COUNT_COLUMN]) if small else ctx.schema(view)
    key = merge_key(ctx, view, schema)
    # (a view whose columns changed, ivm.evolution; or a table from an older ivm whose nested types were
    # not all nullable: written whole, once)
    whole = sink is not None and _columns(sink) != [(f.name, _nullable(f.dataType)) for f in schema.fields]
    # (another writer's commit: the whole state against the table, which undoes it row by row)
    stale = full or delta_path is None or now is None or now != previous or outside is not None
    if small is not None and stale and not whole and sink is not None \
            and sum(x.rows or 0 for x in ctx.catalog.state(view).layers) > WHOLE_STATE_ROWS:
        small = None  # (the whole state against the table: Spark's MERGE, see WHOLE_STATE_ROWS)
    # a small keyless bag's change, read from its delta layer (or its whole state into an empty table)
    bag = None
    if small is not None and not key and not whole:
        bag = (_bag_change(schema, delta_path) if not stale else  # ((None, None): all its rows, appended)
               (None, None) if sink is None or not sink.get_add_actions(flatten=True).num_rows else
               _bag_against(ctx, view, schema, sink))
    changed = None if stale else delta_path
    if small is not None and (key or whole or bag is not None):
        return _Route("small", schema, None if whole else key, changed, bag, outside)
    if whole or (not key and not _comparable(schema)):
        return _Route("overwrite", schema, key, outside=outside)
    if not key:
        return _Route("merge (copies)", schema, None, changed, outside=outside)
    return _Route("merge" if changed else "merge (whole state)", schema, key, changed, outside=outside)


def without_jvm(ctx: RunContext, view: str, previous: int | None, delta_path: str | None, full: bool) -> bool:
    """Whether `write_view` writes the view by delta-rs alone (or has nothing to write)."""
    return _route(ctx, view, previous, delta_path, full).how in ("current", "small")


def write_view(ctx: RunContext, view: str, previous: int | None, delta_path: str | None, full: bool,
               metadata: str = "") -> SinkWrite:
    """Bring the sink of ``view`` to the view's published version in one Delta commit carrying
    ``metadata`` (its ``userMetadata``), writing only the rows that changed (so the table's change data
    feed lists the view's delta): for a view with a key (`merge_key`) a MERGE — of the keys in its delta
    layer ``delta_path`` when the sink holds the ``previous`` version, else of its whole state against the
    table (after a full recompute, a sink left behind), each row updated only where it differs; for a
    keyless bag a MERGE by every column of the rows whose multiplicity changed (`_merge_bag`). A view
    whose columns changed (ivm.evolution), or a bag with a map column (no equality to merge by), is
    written whole. A small view is written by delta-rs (`_write_small`), else by Spark (`_route`)."""
    started = time.perf_counter()
    where = location(ctx, view)
    version = ctx.catalog.state(view).version_id
    route = _route(ctx, view, previous, delta_path, full)
    how = route.how
    if how != "current":
        prepare(ctx, view, where, route.schema)
    if how == "small":
        # (a keyed view's rows at the keys its delta layer touched; the whole state when there is none)
        at = _delta_keys(route.schema, route.delta_path, route.key) if route.key and route.delta_path else None
        how = _write_small(where, view, version, state_without_jvm(ctx, view, at=at), route.key, route.bag,
                           metadata, at)
    elif how == "overwrite":
        _overwrite(_as_written(ctx.read_state(view), route.schema), where, view, version, metadata)
    elif how == "merge (copies)":
        _merge_bag(ctx, view, where, route.delta_path, version, metadata)
    elif how != "current":
        _merge(ctx, view, where, route.key, route.delta_path, version, metadata)
    dt = _delta_table(where)
    out = SinkWrite(view, where, how, dt.version() if dt is not None else None, time.perf_counter() - started,
                    route.outside)
    log.info("sink %s: %s at %s, Delta version %s (%.2f s)", view, how, where, out.delta_version, out.seconds)
    return out


def _write_small(where: str, view: str, version: int, rows, key: list[str] | None, bag: tuple | None,
                 metadata: str, at=None) -> str:
    """A small view's new state ``rows`` (a pyarrow Table) into its table by delta-rs, in one commit: with a
    ``key``, a MERGE by it — of the keys ``at`` its delta layer touched (``rows`` their rows now; a key
    with none is deleted), else of the whole state (rows inserted, updated where they differ, deleted
    where gone); a keyless bag's change (`_bag_change`) appended where it only gains copies (all of
    ``rows`` into an empty table), else merged by every column as Spark's `_merge_bag` does; otherwise
    (new columns) an overwrite."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    commit = CommitProperties(custom_metadata={"userMetadata": metadata} if metadata else None,
                              app_transactions=[Transaction(app_id(view), version)])
    local = delta.local_path(where)
    same = lambda c: f"(t.{quote(c)} IS NOT DISTINCT FROM s.{quote(c)})"  # noqa: E731 - null-safe, DataFusion's
    if bag is not None:
        gained, lost = bag
        gained = rows if gained is None else gained
        if lost is None or not lost.num_rows:
            write_deltalake(local, gained, mode="append", commit_properties=commit)
            return "append (delta-rs)"
        kept = rows.filter(pc.is_in(_row_keys(rows), value_set=_row_keys(lost)))
        source = pa.concat_tables([t.append_column("__reset", pa.array([r] * t.num_rows, pa.bool_()))
                                   for t, r in [(lost, True), (gained, False), (kept, False)]])
        (DeltaTable(local)
         .merge(source, predicate=" AND ".join(["s.__reset", *(same(c) for c in rows.column_names)]),
                source_alias="s", target_alias="t", commit_properties=commit)
         .when_matched_delete()
         .when_not_matched_insert({c: f"s.{quote(c)}" for c in rows.column_names}, predicate="NOT s.__reset")
         .execute())
        return "merge (copies, delta-rs)"
    if key is None:
        write_deltalake(local, rows, mode="overwrite", schema_mode="overwrite", commit_properties=commit)
        return "overwrite (delta-rs)"
    differs = f"NOT ({' AND '.join(same(c) for c in rows.column_names)})"
    if at is not None:  # (the work of the delta's size: a whole-state MERGE joins every row of the table)
        gone = at.filter(pc.invert(pc.is_in(_row_keys(at), value_set=_row_keys(rows.select(key)))))
        deleted = pa.table([gone.column(c) if c in key else pa.nulls(gone.num_rows, rows.schema.field(c).type)
                            for c in rows.column_names], schema=rows.schema)
        source = pa.concat_tables([t.append_column(GONE, pa.array([g] * t.num_rows, pa.bool_()))
                                   for t, g in [(rows, False), (deleted, True)]])
        values = {c: f"s.{quote(c)}" for c in rows.column_names}
        (DeltaTable(local)
         .merge(source, predicate=" AND ".join(same(k) for k in key), source_alias="s", target_alias="t",
                commit_properties=commit)
         .when_matched_delete(predicate=f"s.{GONE}")
         .when_matched_update(values, predicate=f"NOT s.{GONE} AND {differs}")
         .when_not_matched_insert(values, predicate=f"NOT s.{GONE}")
         .execute())
        return "merge of the delta's keys (delta-rs)"
    (DeltaTable(local)
     .merge(rows, predicate=" AND ".join(same(k) for k in key), source_alias="s", target_alias="t",
            commit_properties=commit)
     .when_matched_update_all(predicate=differs)
     .when_not_matched_insert_all()
     .when_not_matched_by_source_delete()
     .execute())
    return "merge (delta-rs)"


def _typed(table, schema: StructType):
    """``table``'s columns of ``schema`` (a pyarrow Table), cast to the view's Arrow types (a TIMESTAMP is an
    instant: Delta's timestamp, UTC)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")
    return pa.table([table.column(f.name).cast(f.type) for f in arrow], schema=arrow)


def _local_layer(path: str, columns: list[str] | None = None):
    """A layer's rows (``columns`` of them) read by pyarrow, as stored; None where it is not a local file."""
    import pyarrow.dataset as ds

    local = delta.local_path(path)
    return None if "://" in local else ds.dataset(local, format="parquet").to_table(columns=columns)


def _delta_keys(schema: StructType, delta_path: str, key: list[str]):
    """The distinct ``key`` values of a view's delta layer, in the view's Arrow types (a pyarrow Table);
    None where the layer is not a local file."""
    layer = _local_layer(delta_path, key)
    if layer is None:
        return None
    keys = _typed(layer, StructType([schema[k] for k in key]))
    return keys.group_by(key, use_threads=False).aggregate([]).select(key)


def _row_keys(rows):
    """Each row of a pyarrow Table as one string, equal for equal rows, NULLs included (pyarrow's joins and
    set lookups never match a NULL): each column's text, or a mark for NULL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [pc.fill_null(pc.binary_join_element_wise("v", pc.cast(rows.column(c), pa.string()), ""), "n")
             for c in rows.column_names]
    return pc.binary_join_element_wise(*parts, "\x1f")


#: rows of a small view's state above which its whole state is merged into its table by Spark, not
#: delta-rs (after a full recompute, a table left behind): a whole-state MERGE joins every row of the
#: table, which delta-rs does on one core at ~8 µs a row (0.8 s for 100,000 rows, 4.7 s for 600,000,
#: measured here) where Spark's takes a second or two; a refresh's MERGE of its delta's keys stays delta-rs's
WHOLE_STATE_ROWS = 100_000
#: the column of `_write_small`'s MERGE source marking a key to delete
GONE = "__ivm_gone"


def _bag_change(schema: StructType, delta_path: str) -> tuple | None:
    """A small keyless bag's delta layer read by pyarrow: (the copies it gains, each row its count times;
    the rows that lose copies), in the view's Arrow types; None where the layer is not a local file."""
    import numpy as np
    import pyarrow.compute as pc

    layer = _local_layer(delta_path)
    if layer is None:
        return None
    rows = _typed(layer, schema)
    counts = layer.column(COUNT_COLUMN).to_numpy(zero_copy_only=False)
    return (rows.take(np.repeat(np.arange(len(counts)), np.maximum(counts, 0))),
            rows.filter(pc.less(layer.column(COUNT_COLUMN), 0)))


def _bag_against(ctx: RunContext, view: str, schema: StructType, sink) -> tuple | None:
    """A small keyless bag's change against the rows its Delta table ``sink`` holds (after a full
    recompute, or a table that is not at the view's previous version): (the copies it gains, the rows that
    lose copies) as `_bag_change` gives a delta layer's, from each row's copies in the view's state and in
    the table, counted by pyarrow on the driver (both are small: `small_layers`); None where reading the
    table takes Spark (a reader feature such as deletion vectors, a type Arrow reads otherwise)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = state_without_jvm(ctx, view)
    held = None if rows is None else _delta_rows(sink, f"sink {view}")
    if held is None:
        return None
    try:  # (the table's columns are the view's: a view whose columns changed is written whole)
        held = _typed(held, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        log.info("sink %s: the table's rows read through Spark (%s)", view, e)
        return None
    new, old = _row_keys(rows), _row_keys(held)
    counts = (pa.table({"k": new}).group_by("k").aggregate([("k", "count")])
              .join(pa.table({"k": old}).group_by("k").aggregate([("k", "count")]), "k", join_type="full outer",
                    left_suffix="_new", right_suffix="_old"))
    gain = pc.subtract(pc.fill_null(counts.column("k_count_new"), 0), pc.fill_null(counts.column("k_count_old"), 0))
    gaining, losing = counts.filter(pc.greater(gain, 0)), counts.filter(pc.less(gain, 0))
    # (each gaining row's first copy in the state, as many times as it gains; each losing row once)
    first = pc.index_in(gaining.column("k"), value_set=new).to_numpy(zero_copy_only=False)
    copies = pc.filter(gain, pc.greater(gain, 0)).to_numpy(zero_copy_only=False)
    return (rows.take(np.repeat(first, copies)),
            held.take(pc.index_in(losing.column("k"), value_set=old)))


def _nullable(t: DataType) -> DataType:
    """``t`` with every array element, map value and struct field nullable: the view's rows as the sink
    writes them (read back from Parquet layers, Spark marks them so), which a MERGE into the table must
    match (Spark casts no array of nullable elements to one of non-null ones)."""
    if isinstance(t, ArrayType):
        return ArrayType(_nullable(t.elementType), True)
    if isinstance(t, MapType):
        return MapType(_nullable(t.keyType), _nullable(t.valueType), True)
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in t.fields])
    return t


def _as_written(rows: DataFrame, schema: StructType) -> DataFrame:
    """``rows`` with the view's nested columns cast to their `_nullable` types, as its table holds them
    (a widening: always allowed)."""
    return rows.select(*[F.col(quote(c)).cast(_nullable(schema[c].dataType)).alias(c) if c in schema.names
                         and _nullable(schema[c].dataType) != schema[c].dataType else F.col(quote(c))
                         for c in rows.columns])


def _comparable(schema: StructType) -> bool:
    """Whether rows of ``schema`` compare for equality in Spark (a map column does not)."""
    def ok(t) -> bool:
        if isinstance(t, MapType):
            return False
        if isinstance(t, ArrayType):
            return ok(t.elementType)
        if isinstance(t, StructType):
            return all(ok(f.dataType) for f in t.fields)
        return True
    return ok(schema)


def small_layers(ctx: RunContext, view: str, limit_mb: int | None = None) -> tuple[list[str], StructType] | None:
    """The Parquet files of the view's (or a table's) published layers and their Spark schema (from the
    files' footers) when delta-rs may write the view without a JVM (`state_without_jvm`); None when that
    takes Spark: ``limit_mb`` (default ``storage.sink_without_jvm_mb``) is 0 or below the layers' size, a
    layer is not local, the layers' columns differ (a column added since, ivm.evolution; nullability
    aside) or a column is nested (arrays, structs and maps: their Delta types would differ from Spark's
    in nullability alone)."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    limit = ctx.config.storage.sink_without_jvm_mb if limit_mb is None else limit_mb
    layers = ctx.catalog.state(view).layers
    paths = [delta.local_path(x.path) for x in layers]
    if (not limit or not layers or any(x.bytes is None for x in layers)
            or sum(x.bytes for x in layers) > limit * 2**20 or any("://" in p for p in paths)):
        return None
    files = [f for p in paths for f in ds.dataset(p, format="parquet").files]
    footers = {(pq.read_schema(f).metadata or {}).get(SPARK_SCHEMA) for f in files}
    if None in footers:
        return None
    # (layers written by different plans may differ in a column's nullability alone, e.g. a REDUCE
    # delta's __count: the same columns; a column is nullable if it is in any layer)
    schemas = [StructType.fromJson(json.loads(f)) for f in footers]
    if len({tuple((f.name, f.dataType.simpleString()) for f in s.fields) for s in schemas}) != 1:
        return None
    schema = StructType([StructField(f.name, f.dataType, any(s[f.name].nullable for s in schemas))
                         for f in schemas[0].fields])
    if any(isinstance(f.dataType, ArrayType | MapType | StructType) for f in schema.fields):
        return None
    return files, schema


def state_without_jvm(ctx: RunContext, view: str, limit_mb: int | None = None, at=None):
    """The view's (or a table's) published state as SQL returns it (`RunContext.read_state`: bag rows
    repeated, set rows once), read from its layers by pyarrow and consolidated there (counts summed per
    row, rows at zero dropped), in its Spark types, as a pyarrow Table; None when this takes Spark
    (`small_layers`). ``at`` (a pyarrow Table of some of its columns): only the rows agreeing with one of
    its rows (a delta layer's keys), NULLs equal."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    small = small_layers(ctx, view, limit_mb)
    if small is None:
        return None
    files, schema = small
    table = _typed(ds.dataset(files, format="parquet").to_table(), schema)
    if at is not None:  # (first by one column, a cheap lookup; then by all of them, NULLs equal)
        first = at.column_names[0]
        table = table.filter(pc.or_kleene(pc.is_in(table.column(first), value_set=at.column(first)),
                                          pc.is_null(table.column(first))))
        table = table.filter(pc.is_in(_row_keys(table.select(at.column_names)), value_set=_row_keys(at)))
    columns = [f.name for f in schema.fields if f.name != COUNT_COLUMN]
    summed = table.group_by(columns, use_threads=False).aggregate([(COUNT_COLUMN, "sum")])
    counts = summed.column(f"{COUNT_COLUMN}_sum").to_numpy(zero_copy_only=False)
    if view in ctx.config.views and ctx.program[0].predicates[view].semantics == "set":
        counts = np.minimum(counts, 1)
    return summed.select(columns).take(np.repeat(np.arange(len(counts)), np.maximum(counts, 0)))


def merge_key(ctx: RunContext, view: str, schema: StructType | None = None) -> list[str] | None:
    """The columns a MERGE identifies the view's rows by: its declared ``key``, or for a set (SELECT
    DISTINCT, a Datalog view; every row once) all its columns (of ``schema``, else the view's); None for a
    keyless bag."""
    key = ctx.config.views[view].key
    if key:
        return key
    if ctx.program[0].predicates[view].semantics != "set":
        return None
    return list((schema or ctx.schema(view)).names)


def _overwrite(rows: DataFrame, where: str, view: str, version: int, metadata: str) -> None:
    (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("txnAppId", app_id(view)).option("txnVersion", version).option("userMetadata", metadata).save(where))


def _merge(ctx: RunContext, view: str, where: str, key: list[str], delta_path: str | None, version: int,
           metadata: str) -> None:
    """One MERGE by ``key`` (Delta's ``MERGE INTO`` in Spark SQL, the source a DataFrame argument of the
    query: classic and Connect sessions alike). With ``delta_path``, the keys the view's delta touched,
    each with its new row or marked gone; without, the view's whole new state, and rows of the table it
    no longer holds deleted. A row is updated only where it differs (null-safe): the change data feed
    holds the view's delta, nothing unchanged."""
    spark = ctx.spark
    schema = ctx.schema(view)
    rows = _as_written(ctx.read_state(view), schema)
    columns = [quote(f.name) for f in schema.fields]
    if delta_path is None:
        source, gone = rows.withColumn("__present", F.lit(True)), "WHEN NOT MATCHED BY SOURCE THEN DELETE"
    else:
        touched = ctx.warehouse.read_layers(spark, [delta_path], schema, reuse=False).select(
            *[F.col(quote(k)) for k in key]).distinct()
        cond = None
        for k in key:
            c = rows[quote(k)].eqNullSafe(touched[quote(k)])
            cond = c if cond is None else cond & c
        present = rows.join(F.broadcast(touched), cond, "left_semi").withColumn("__present", F.lit(True))
        missing = touched.join(rows, [touched[quote(k)].eqNullSafe(rows[quote(k)]) for k in key], "left_anti")
        source = present.unionByName(missing.select(
            *[F.col(quote(f.name)) if f.name in key else F.lit(None).cast(f.dataType).alias(f.name)
              for f in schema.fields], F.lit(False).alias("__present")))
        gone = ""
    on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in key)
    differs = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in columns)
    with _idempotent(spark, view, version, metadata):
        spark.sql(f"MERGE INTO delta.{quote(where)} t USING {{source}} s ON {on} "
                  "WHEN MATCHED AND NOT s.__present THEN DELETE "
                  f"WHEN MATCHED AND s.__present AND ({differs}) THEN UPDATE SET "
                  f"{', '.join(f't.{c} = s.{c}' for c in columns)} "
                  f"WHEN NOT MATCHED AND s.__present THEN INSERT ({', '.join(columns)}) "
                  f"VALUES ({', '.join(f's.{c}' for c in columns)}) {gone}", source=source)


def _merge_bag(ctx: RunContext, view: str, where: str, delta_path: str | None, version: int, metadata: str) -> None:
    """A keyless bag's change in one MERGE, by every column (null-safe): a row whose multiplicity grew by
    k gets k copies inserted (the feed: k inserts); a row that lost copies has all of them deleted and
    those it keeps inserted again (Delta has no identity for one of several equal rows, so a copy cannot
    be deleted alone: the feed nets to the loss). Rows that did not change are not touched. The change
    is the view's delta layer ``delta_path``, or without it its new state against the table's rows."""
    spark = ctx.spark
    schema = ctx.schema(view)
    columns = [quote(f.name) for f in schema.fields]
    now = _as_written(ctx.read_zset(view), schema)
    if delta_path is not None:
        change = consolidate(ctx.warehouse.read_layers(spark, [delta_path], schema, reuse=False))
    else:
        held = (spark.read.format("delta").load(where).groupBy(*columns)
                .agg(F.count(F.lit(1)).cast("long").alias(COUNT_COLUMN)))
        change = consolidate(now.select(*columns, COUNT_COLUMN).unionByName(negate(held)))
    copies = lambda rows: rows.select(  # noqa: E731 - each row its __count times
        *columns, F.explode(F.sequence(F.lit(1), F.col(COUNT_COLUMN).cast("int"))).alias("__copy"))
    lost = change.where(F.col(COUNT_COLUMN) < 0).select(*columns)
    kept = now.join(lost, [now[c].eqNullSafe(lost[c]) for c in columns], "left_semi")
    source = (lost.withColumn("__reset", F.lit(True))
              .unionByName(copies(change.where(F.col(COUNT_COLUMN) > 0)).drop("__copy")
                           .withColumn("__reset", F.lit(False)))
              .unionByName(copies(kept).drop("__copy").withColumn("__reset", F.lit(False))))
    on = " AND ".join(f"t.{c} <=> s.{c}" for c in columns)
    with _idempotent(spark, view, version, metadata):
        spark.sql(f"MERGE INTO delta.{quote(where)} t USING {{source}} s ON s.__reset AND {on} "
                  "WHEN MATCHED THEN DELETE "
                  f"WHEN NOT MATCHED AND NOT s.__reset THEN INSERT ({', '.join(columns)}) "
                  f"VALUES ({', '.join(f's.{c}' for c in columns)})", source=source)


def commit_metadata(ctx: RunContext, run_id: str, snapshot: dict[str, int], view: str) -> str:
    """A view's Delta commit's ``userMetadata``: the ivm run and snapshot it holds, as JSON (the view's
    catalog version, and the tables' commit versions of the run's snapshot)."""
    return json.dumps({"ivm": {"project": ctx.config.project_name, "view": view, "run": run_id,
                               "view_version": ctx.catalog.state(view).version_id,
                               "snapshot": {t: v for t, v in sorted(snapshot.items()) if t in ctx.config.tables}}},
                      separators=(",", ":"))


def write_views(ctx: RunContext, run_id: str, views: list[tuple[str, int | None, str | None, bool]],
                progress: Callable[[str], None] = lambda _: None) -> list[SinkWrite]:
    """`write_view` for each (view, its previous catalog version, its delta layer, recomputed in full),
    each recorded in the run (what `snapshot` reads)."""
    done = []
    run = ctx.catalog.get_run(run_id)
    snapshot = (run.snapshot or {}) if run is not None else {}
    for view, previous, delta_path, full in views:
        w = write_view(ctx, view, previous, delta_path, full, commit_metadata(ctx, run_id, snapshot, view))
        ctx.catalog.save_stage(run_id, StageRecord(StageName.SINK, view, seconds=round(w.seconds, 3), detail={
            "location": w.location, "how": w.how, "delta_version": w.delta_version,
            "view_version": ctx.catalog.state(view).version_id, "outside_write": w.outside}))
        if w.outside is not None:
            progress(f"sink: {view}: warning: its Delta table was changed outside ivm at Delta version "
                     f"{w.outside['delta_version']} ({w.outside['operation']}); brought back to the view")
        progress(f"sink: {view}: {w.how} -> {w.location} (Delta version {w.delta_version}, {w.seconds:.2f} s)")
        done.append(w)
    return done


def written(ctx: RunContext, run_id: str) -> dict[str, dict]:
    """What run ``run_id``'s sink stage wrote, by view: its record's detail (location, how, Delta version,
    the view's catalog version)."""
    run = ctx.catalog.get_run(run_id)
    return {s.relation: s.detail for s in (run.stages if run else []) if s.stage == StageName.SINK and s.relation}


@dataclass(frozen=True)
class SinkState:
    view: str
    location: str
    #: the Delta version holding the view's current (catalog) version; None: the table is behind
    delta_version: int | None
    note: str
    #: the view's current catalog version; None: not materialized yet
    view_version: int | None = None

    def sql(self) -> str:
        return f"SELECT * FROM delta.`{self.location}` VERSION AS OF {self.delta_version}"

    def changes_sql(self, name: str | None = None) -> str:
        """The view's changes from its current Delta version on, by Delta's change data feed (a later
        version reads what refreshes since changed): by catalog ``name``, else by path."""
        if name:
            return f"SELECT * FROM table_changes('{name}', {self.delta_version})"
        return f"SELECT * FROM table_changes_by_path('{self.location}', {self.delta_version})"


def state(ctx: RunContext, view: str) -> SinkState:
    """The Delta version of the view's table that holds the view as the catalog's current snapshot does
    (from the sink stages' records; no JVM)."""
    where = location(ctx, view)
    current = ctx.catalog.state(view).version_id
    record = ctx.catalog.latest_stage("sink", view)
    if current is None:
        return SinkState(view, where, None, "not materialized yet")
    if record is None or record.detail.get("view_version") != current:
        return SinkState(view, where, None, "its Delta table is behind the catalog: the next refresh writes it "
                                            "(or it is not published: storage.delta_views)", current)
    return SinkState(view, where, record.detail["delta_version"], "current", current)


def behind(ctx: RunContext) -> list[str]:
    """The materialized views whose Delta tables do not hold their catalog version (a sink stage that
    died between two views' Delta commits, ivm.refresh.publish.sink_stage): the next refresh writes
    them, whether or not it has anything else to do. From the catalog only (no JVM)."""
    if not ctx.config.storage.delta_views:
        return []
    return [s.view for s in snapshot(ctx) if s.delta_version is None and s.view_version is not None]


def snapshot(ctx: RunContext) -> list[SinkState]:
    """`ivm snapshot`: `state` of every view. Reading each table ``VERSION AS OF`` its version reads one
    consistent set of views."""
    return [state(ctx, view) for view in ctx.config.views]


#: `ivm show` reads a view's Delta table with delta-rs, without starting a JVM, up to this size
SHOW_WITHOUT_JVM_MB = 64


def read_without_jvm(ctx: RunContext, view: str):
    """The view's current rows as a pyarrow Table sorted by every column (as `ivm show` prints them),
    read without a JVM from its Delta table at the version holding the catalog's current snapshot; None
    when that needs Spark: the table is behind the catalog, larger than `SHOW_WITHOUT_JVM_MB`, uses a
    reader feature (deletion vectors, column mapping: reader version above 1), or has a column Arrow
    cannot sort (arrays, maps, structs).

    delta-rs gives the version's files, schema and size; pyarrow reads the Parquet files
    (`_delta_rows`)."""
    import pyarrow as pa
    from deltalake import DeltaTable

    s = state(ctx, view)
    local = delta.local_path(s.location)
    if s.delta_version is None or "://" in local:  # (a remote table: through Spark)
        return None
    dt = DeltaTable(local, version=s.delta_version)
    size = sum(dt.get_add_actions(flatten=True).column("size_bytes").to_pylist())
    if size > SHOW_WITHOUT_JVM_MB * 2**20 or any(pa.types.is_nested(f.type) for f in pa.schema(dt.schema().to_arrow())):
        return None
    rows = _delta_rows(dt, f"ivm show {view}")
    return None if rows is None else _as_shown(rows)


def _delta_rows(dt, what: str):
    """The rows of the Delta table version ``dt`` (a delta-rs DeltaTable) read by pyarrow from the Parquet
    files delta-rs lists, in the table's own Arrow schema; None where that takes Spark: a remote table, a
    reader feature (deletion vectors, column mapping: reader version above 1), or a type Arrow reads
    otherwise (``what`` names the reader in the log). (delta-rs's own `to_pyarrow_table` scans through a
    Python file system over its Rust store whose threads outlive the scan: about one `ivm show` in five
    aborted at exit with "terminate called without an active exception", delta-io/delta-rs#2184; the plain
    file list does not.)"""
    import pyarrow as pa
    import pyarrow.dataset as ds

    files = [delta.local_path(u) for u in dt.file_uris()]
    if dt.protocol().min_reader_version > 1 or any("://" in f for f in files):
        return None
    try:
        return ds.dataset(files, schema=pa.schema(dt.schema().to_arrow()), format="parquet").to_table()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:  # a type Arrow reads differently: Spark does
        log.info("%s: reading through Spark (%s)", what, e)
        return None


def layers_without_jvm(ctx: RunContext, relation: str):
    """A table's or view's current rows as `read_without_jvm` gives a view's, consolidated from its
    layers by pyarrow (`state_without_jvm`) when they hold at most `SHOW_WITHOUT_JVM_MB`; None when that
    needs Spark. `ivm show` reads a table so, and a view whose Delta table `read_without_jvm` cannot
    read (``storage.delta_views`` off, or the table behind the catalog)."""
    rows = state_without_jvm(ctx, relation, SHOW_WITHOUT_JVM_MB)
    return None if rows is None else _as_shown(rows)


def _as_shown(rows):
    """Rows as `ivm show` prints them: sorted by every column, NULLs first (Spark's ORDER BY), a TIMESTAMP
    as ivm's Spark sessions (UTC) show it: the UTC wall clock, no zone."""
    import pyarrow as pa

    rows = rows.cast(pa.schema([f.with_type(pa.timestamp(f.type.unit)) if pa.types.is_timestamp(f.type) else f
                                for f in rows.schema]))
    return rows.sort_by([(c, "ascending", "at_start") for c in rows.column_names])


def register(ctx: RunContext, progress: Callable[[str], None] = lambda _: None) -> list[str]:
    """`ivm apply`: each view's Delta table in the Spark catalog as ``<database>.<view>`` (an external
    table: the catalog holds its name and location, the Delta log its schema and data), so any session
    with Delta's extension and the same metastore reads it by name. A view without a Delta table yet gets
    an empty one with its schema (apply is the DDL, a refresh the DML). A name already taken by a table
    ivm did not make (a managed table) is refused before anything is registered; one of ivm's pointing
    elsewhere (a moved ``sink``) is pointed anew. What ivm registers is a name only: dropping it keeps
    the files. A catalog Spark cannot open (an embedded Derby metastore another JVM holds) ends with
    one line."""
    spark = ctx.spark
    db = ctx.config.database
    try:
        taken = _registered(spark, db)
        if taken is None:
            spark.sql(f"CREATE DATABASE {quote(db)}")
            taken = {}
        for view in ctx.config.views:
            if taken.get(view.lower(), ("", ""))[0] == "MANAGED":
                raise ConfigError(f"views.{view}: the Spark catalog's {db}.{view} is a managed table ivm did not "
                                  "make; drop it or choose another database (storage.database)")
        done = []
        for view in ctx.config.views:
            where = location(ctx, view)
            prepare(ctx, view, where)
            name = f"{quote(db)}.{quote(view)}"
            if view.lower() in taken:
                if delta.local_path(taken[view.lower()][1]) == delta.local_path(where):
                    continue
                spark.sql(f"DROP TABLE {name}")  # (external: its files stay)
            path = where.replace("\\", "\\\\").replace("'", "\\'")
            spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{path}'")
            progress(f"views.{view}: registered as {db}.{view} ({where})")
            done.append(f"{db}.{view}")
        return done
    except (AnalysisException, *spark_errors()) as e:
        raise IvmError(f"the Spark catalog cannot register the views in database {db}: {one_line(e)} (an embedded "
                       "Derby metastore opens in one JVM at a time; storage.register_views: false skips this)") from e


def _registered(spark, db: str) -> dict[str, tuple[str, str]] | None:
    """The tables of database ``db`` in the Spark catalog (None: no such database): lower-cased name ->
    (type, location), from one ``SHOW TABLE EXTENDED`` (its ``information`` column holds ``Type: EXTERNAL``
    and ``Location: ...`` lines). One query for all the views: a metastore look-up per view and Delta's
    ``DESCRIBE DETAIL`` of each took ~2 s a view on an embedded Derby metastore (`ivm apply` of the demo
    45 s). (`CREATE DATABASE IF NOT EXISTS` of a database there logs a warning that it "was created
    concurrently": it is created only when this finds none.)"""
    if not spark.catalog.databaseExists(db):
        return None
    tables = {}
    for row in spark.sql(f"SHOW TABLE EXTENDED IN {quote(db)} LIKE '*'").collect():
        info = dict(line.split(": ", 1) for line in row.information.splitlines() if ": " in line)
        where = info.get("Location", "")  # (a URI: a space in a local path is %20 there)
        tables[row.tableName.lower()] = (info.get("Type", ""), unquote(where) if where.startswith("file:") else where)
    return tables


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
