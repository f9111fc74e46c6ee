"""Bringing files into the warehouse: change-log appends and initial snapshot loads.

Both read the file with Spark, check every row (one job), and only then write: a bad file stores
nothing. A small native change file is read without Spark where its rows are sure to be Spark's
(ivm.changes.arrow_reader), so `ivm log append` of a few changes starts no JVM. An append to a large
table also records where the segment's keys fall (one small query), for the trims of later refreshes.
A log append becomes one immutable Parquet segment under ``log/<table>/``; the catalog row that
records it is the commit. The same file appended twice is recognised by its content hash and applied
once (same path and content; a file with explicit commit versions cannot apply twice anyway).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ivm.catalog import Catalog
from ivm.catalog.store import PublishChange, SegmentRef, StageRecord, WrittenLayer, new_id
from ivm.changes import arrow_reader
from ivm.changes.reader import (
    BAD,
    RAW,
    SEQ,
    TRUNCATE,
    check_path,
    describe_row,
    read_cdf,
    read_debezium,
    read_snapshot,
    table_schema,
)
from ivm.changes.trim import segment_bounds, skip_column
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, COUNT_COLUMN, TableConfig
from ivm.errors import ChangeDataError
from ivm.storage import Warehouse
from ivm.vocabulary import StageName
from ivm.zset import SKIP_MIN_ROWS

log = logging.getLogger(__name__)

LOG_FORMATS = ("cdf", "debezium")


@dataclass(frozen=True)
class AppendResult:
    table: str
    segment: SegmentRef | None
    rows: int
    duplicate_of: SegmentRef | None = None

    def describe(self) -> str:
        if self.duplicate_of is not None:
            seg = self.duplicate_of
            return (f"{self.table}: this file was already appended as segment {seg.id} "
                    f"(commit versions {seg.min_commit_version}..{seg.max_commit_version}); nothing to do")
        if self.segment is None:
            return f"{self.table}: the file holds no changes; nothing appended"
        seg = self.segment
        versions = (f"commit version {seg.min_commit_version}" if seg.min_commit_version == seg.max_commit_version
                    else f"commit versions {seg.min_commit_version}..{seg.max_commit_version}")
        return f"{self.table}: appended {self.rows} changes as {versions} (segment {seg.id})"


def content_hash(path: str) -> str:
    """SHA-256 of a file, or of a directory's files in name order (a Parquet directory)."""
    digest = hashlib.sha256()
    if "://" in path:
        fs, root = pafs.FileSystem.from_uri(path)
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=False)) \
            if fs.get_file_info(root).type == pafs.FileType.Directory else [fs.get_file_info(root)]
        for info in sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path):
            with fs.open_input_stream(info.path) as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        return digest.hexdigest()
    p = Path(path)
    files = sorted(x for x in p.rglob("*") if x.is_file() and not x.name.startswith((".", "_"))) if p.is_dir() else [p]
    for file in files:
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _first_bad_row(df: DataFrame, name: str, table: TableConfig, path: str, with_version: bool) -> None:
    """Raise for the first row (in file order) the reader marked bad."""
    bad = df.where(F.col(BAD).isNotNull()).orderBy(SEQ).limit(1).collect()
    if bad:
        row = bad[0]
        version = f"commit version {row[COMMIT_VERSION]}, " if with_version and row[COMMIT_VERSION] is not None else ""
        raise ChangeDataError(f"table {name}: {path}: {version}row {row[RAW].strip()}: {row[BAD]}; "
                              "nothing was stored")


def append_log(spark: Callable[[], SparkSession], catalog: Catalog, warehouse: Warehouse, name: str,
               table: TableConfig, path: str, fmt: str = "cdf", optional: Collection[str] = (),
               time_zone: str = "UTC") -> AppendResult:
    """`ivm log append`: validate a change file and store it as the table's next log segment. The
    ``optional`` columns (added since the table held data, ivm.evolution) may be missing from it.
    ``spark`` starts Spark, for a file the Arrow reader declines (``time_zone``: Spark's session's)."""
    if fmt not in LOG_FORMATS:
        raise ChangeDataError(f"unknown change format {fmt!r}; use one of {', '.join(LOG_FORMATS)}")
    check_path(path)
    if "://" not in path:
        path = str(Path(path).resolve())
    # a retried append (same path, same content) applies once; another file with the same content is
    # another transaction (a bag table may legitimately receive the same insert twice)
    digest = content_hash(path)
    earlier = catalog.appended_segment(name, path, digest)
    if earlier is not None:
        return AppendResult(name, None, 0, duplicate_of=earlier)
    local = arrow_reader.read(fmt, table, path, optional, time_zone)
    if local is not None:
        return _append_arrow(catalog, warehouse, name, table, local, path, fmt, digest)
    arrow_reader.check_columns(name, table, path, fmt, optional)  # (a file the Arrow reader declined: before Spark)
    changes = (read_cdf if fmt == "cdf" else read_debezium)(spark(), name, table, path, optional).cache()
    try:
        # one job for the whole file: row count, bad rows, commit-version range
        truncate = F.col(CHANGE_TYPE) == TRUNCATE
        stats = changes.agg(F.count(F.lit(1)).alias("rows"),
                            F.count(BAD).alias("bad"),
                            F.min(COMMIT_VERSION).alias("lo"), F.max(COMMIT_VERSION).alias("hi"),
                            F.count(COMMIT_VERSION).alias("versioned"),
                            F.collect_list(F.when(truncate, F.struct(COMMIT_VERSION, SEQ))).alias("truncates")
                            ).collect()[0]
        if stats.bad:
            _first_bad_row(changes, name, table, path, with_version=True)
        if stats.rows == 0:
            return AppendResult(name, None, 0)
        last = catalog.last_commit_version(name)
        if stats.versioned == 0:
            # a file without _commit_version is one transaction with the next number (docs/design.md §4)
            lo = hi = last + 1
        elif stats.versioned != stats.rows:
            missing = changes.where(F.col(COMMIT_VERSION).isNull()).orderBy(SEQ).limit(1).collect()[0]
            raise ChangeDataError(f"table {name}: {path}: row {describe_row(missing, table.columns)} has no "
                                  f"{COMMIT_VERSION} while other rows do; nothing was stored")
        else:  # the catalog checks the range when it records the segment
            lo, hi = int(stats.lo), int(stats.hi)
        truncates = [(lo if t[COMMIT_VERSION] is None else t[COMMIT_VERSION], t[SEQ]) for t in stats.truncates]
        segment = write_segment(catalog, warehouse, name, table, changes, lo, hi, int(stats.rows), path, fmt, digest,
                                truncates=truncates)
    finally:
        changes.unpersist()
    log.info("appended %s rows to the log of %s as segment %s", stats.rows, name, segment.id)
    return AppendResult(name, segment, int(stats.rows))


def _append_arrow(catalog: Catalog, warehouse: Warehouse, name: str, table: TableConfig, changes: pa.Table,
                  path: str, fmt: str, digest: str) -> AppendResult:
    """`append_log` of the rows the Arrow reader read (all of them good, all or none versioned)."""
    if changes.num_rows == 0:
        return AppendResult(name, None, 0)
    versions = changes.column(COMMIT_VERSION)
    if versions.null_count:  # a file without _commit_version is one transaction with the next number
        lo = hi = catalog.last_commit_version(name) + 1
    else:
        lo, hi = pc.min(versions).as_py(), pc.max(versions).as_py()
    found = changes.filter(pc.equal(changes.column(CHANGE_TYPE), TRUNCATE))
    truncates = [(lo if v is None else v, i) for v, i in zip(found.column(COMMIT_VERSION).to_pylist(),
                                                            found.column(SEQ).to_pylist(), strict=True)]
    segment = write_segment(catalog, warehouse, name, table, changes, lo, hi, changes.num_rows, path, fmt, digest,
                            truncates=truncates)
    log.info("appended %s rows to the log of %s as segment %s (read without Spark)", changes.num_rows, name,
             segment.id)
    return AppendResult(name, segment, changes.num_rows)


def write_segment(catalog: Catalog, warehouse: Warehouse, name: str, table: TableConfig,
                  changes: DataFrame | pa.Table, lo: int, hi: int, rows: int, source: str, fmt: str, digest: str,
                  restores: int | None = None, truncates: Sequence[tuple[int, int]] = ()) -> SegmentRef:
    """Write checked changes (the table's columns, ``_change_type``, ``_seq``, ``_commit_version`` or
    NULL for ``lo``; a DataFrame, or an Arrow table the Arrow reader read) as one Parquet segment and
    record it: the commit point of an append. The file goes again if the catalog refuses it.
    ``truncates``: the positions of its truncates (commit version, ``_seq``); ``restores``: see
    `Catalog.add_segment`."""
    bounds = segment_key_bounds(catalog, name, table, changes)
    segment_path = warehouse.log_path(name, new_id(f"{lo:020d}-"))
    if isinstance(changes, pa.Table):  # (the same columns, in the same order, as Spark writes them)
        versions = pc.fill_null(changes.column(COMMIT_VERSION), pa.scalar(lo, pa.int64()))
        warehouse.write_parquet(segment_path, changes.set_column(
            changes.column_names.index(COMMIT_VERSION), COMMIT_VERSION, versions)
            .select([*table.columns, CHANGE_TYPE, COMMIT_VERSION, SEQ]))
    else:
        (changes.select(*[F.col(f"`{c}`") for c in table.columns], F.col(CHANGE_TYPE),
                        F.coalesce(F.col(COMMIT_VERSION), F.lit(lo).cast("long")).alias(COMMIT_VERSION), F.col(SEQ))
                .coalesce(1).write.mode("error").parquet(segment_path))
    try:
        return catalog.add_segment(name, segment_path, source, fmt, digest, lo, hi, rows, bounds, restores, truncates)
    except BaseException:
        warehouse.delete(segment_path)
        raise


def segment_key_bounds(catalog: Catalog, name: str, table: TableConfig,
                       changes: DataFrame | pa.Table) -> dict | None:
    """Where a new segment's keys fall (`ivm.changes.trim.segment_bounds`: one small query), for a
    table large enough that its trims read the stored rows through a skipping filter (SKIP_MIN_ROWS):
    found here, once per segment, the trim of a refresh merges its segments' bounds instead of
    querying its log range for them, so the query leaves the refresh's critical path. None for a
    smaller table (its trims read it whole)."""
    if sum(x.rows or 0 for x in catalog.state(name).layers) < SKIP_MIN_ROWS:
        return None
    return segment_bounds(table, changes)


def read_log(spark: SparkSession, table: TableConfig, segments: list[SegmentRef], after: int, upto: int,
             skip: Collection[int] = ()) -> DataFrame:
    """The changes of the given segments with commit versions in (after, upto] but ``skip`` (the
    quarantined ones), in one scan; filtered by version only when a segment reaches past the range or
    holds a skipped commit (a filter's literals are compiled into the scan's generated code, which would
    differ, and compile again, in every refresh)."""
    schema = f"{table.ddl()}, `{CHANGE_TYPE}` STRING, `{COMMIT_VERSION}` BIGINT, `{SEQ}` BIGINT"
    if not segments:
        return spark.createDataFrame([], schema)
    changes = spark.read.schema(schema).parquet(*[s.path for s in segments])
    skip = sorted(v for v in skip if after < v <= upto)
    if skip:
        changes = changes.where(~F.col(COMMIT_VERSION).isin(skip))
    if all(after < s.min_commit_version and s.max_commit_version <= upto for s in segments):
        return changes
    return changes.where((F.col(COMMIT_VERSION) > after) & (F.col(COMMIT_VERSION) <= upto))


def log_keys(warehouse: Warehouse, table: TableConfig, segments: list[SegmentRef], after: int, upto: int,
             skip: Collection[int] = ()) -> tuple[list, bool] | None:
    """The distinct values of the table's `skip_column` among the changes `read_log` reads (commit
    versions in (after, upto] but ``skip``), and whether one is NULL, read by pyarrow on the driver
    (`Warehouse.distinct_values`): a small change's trim finds the stored rows at them with an IN list,
    no Spark job for its keys. None when Spark finds them (`Warehouse.distinct_values` declines)."""
    return warehouse.distinct_values([s.path for s in segments], skip_column(table), log_range(after, upto, skip))


def log_range(after: int, upto: int, skip: Collection[int] = ()) -> pc.Expression:
    """pyarrow's filter of `read_log`'s changes: commit versions in (after, upto] but ``skip``."""
    version = pc.field(COMMIT_VERSION)
    where = (version > after) & (version <= upto)
    skip = sorted(v for v in skip if after < v <= upto)
    return where & ~version.isin(skip) if skip else where


#: segments whose footers are read to rule out update images in a log range; past this many (each a
#: file open, a round trip on object storage) the range is assumed to hold some
FOOTERS_MAX = 64


def has_update_images(warehouse: Warehouse, segments: list[SegmentRef]) -> bool:
    """Whether the segments may hold update images: a segment's footers bound its change types
    ("delete" < "insert" < "update_postimage" < "update_preimage"), so a maximum below "update" means
    inserts and deletes only. A segment without statistics may hold anything."""
    if len(segments) > FOOTERS_MAX:
        return True
    for s in segments:
        bounds = warehouse.column_range(s.path, CHANGE_TYPE)
        if bounds is None or bounds[1] >= "update":
            return True
    return False


def load_snapshot(spark: Callable[[], SparkSession], catalog: Catalog, warehouse: Warehouse, name: str,
                  table: TableConfig, path: str, run_id: str, target_file_mb: int,
                  time_zone: str = "UTC") -> tuple[int, int]:
    """`ivm load`: a table's initial snapshot as its base layer, at commit version 0.

    Refused when the table already has data or a log: later changes go through the log so every view
    can absorb them. Keys must be unique and non-NULL. Returns (rows, new version). A small local file
    the Arrow reader takes (ivm.changes.arrow_reader) is loaded without Spark; ``spark`` starts Spark for
    any other (``time_zone``: its session's).
    """
    state = catalog.state(name)
    if state.layers or catalog.last_commit_version(name) > 0:
        raise ChangeDataError(f"table {name} already has data or changes; append changes to its log instead")
    check_path(path)
    local = arrow_reader.read_snapshot(table, path, time_zone)
    if local is not None:
        rows, written = local.num_rows, _load_arrow(warehouse, name, table, path, local, run_id)
    else:
        arrow_reader.check_columns(name, table, path, changes=False)  # (a file the Arrow reader declined: before Spark)
        rows, written = _load_spark(spark(), warehouse, name, table, path, run_id, target_file_mb)
    published = catalog.publish(run_id, [PublishChange(name, state.version_id, [written], replace=True)],
                                {(name, name): 0},
                                [StageRecord(StageName.LOAD, name, rows_in=rows, rows_out=written.rows)])
    return rows, published[name]


def _load_spark(spark: SparkSession, warehouse: Warehouse, name: str, table: TableConfig, path: str, run_id: str,
                target_file_mb: int) -> tuple[int, WrittenLayer]:
    """`load_snapshot` read, checked and written by Spark: (rows, the base layer). The rows read are kept
    for the three passes on local disk, not in memory: a snapshot is as large as the table, and caching it
    in memory (Spark's default level) took the memory the key check's aggregation needs — SF 10's lineitem
    (60M rows) failed with UNABLE_TO_ACQUIRE_MEMORY in a 4g driver, its partitions unrolled in memory
    before they spilled."""
    rows = read_snapshot(spark, name, table, path).persist(StorageLevel.DISK_ONLY)
    try:
        stats = rows.agg(F.count(F.lit(1)).alias("rows"), F.count(BAD).alias("bad")).collect()[0]
        if stats.bad:
            _first_bad_row(rows, name, table, path, with_version=False)
        columns = [F.col(f"`{c}`") for c in table.columns]
        if table.keyed:
            key = [F.col(f"`{c}`") for c in table.key or []]
            dup = rows.groupBy(*key).count().where(F.col("count") > 1).limit(1).collect()
            if dup:
                _duplicate_key(name, table, path, dup[0], dup[0]["count"])
            zset = rows.select(*columns, F.lit(1).cast("long").alias(COUNT_COLUMN))
        else:
            zset = rows.groupBy(*columns).agg(F.count(F.lit(1)).alias(COUNT_COLUMN))
        written = warehouse.write_layer(zset, name, "base", cluster_by=table.key or list(table.columns),
                                        files=warehouse.files_for(_input_bytes(path), target_file_mb),
                                        run_id=run_id)
    finally:
        rows.unpersist()
    return int(stats.rows), written


def _load_arrow(warehouse: Warehouse, name: str, table: TableConfig, path: str, rows: pa.Table,
                run_id: str) -> WrittenLayer:
    """`load_snapshot` of the rows the Arrow reader read (all of them good, no NULL key), as Spark would
    store them: a keyed table's rows with count 1 (a repeated key refused as Spark refuses it), a bag's
    equal rows as one with their number (-0.0 grouped with 0.0, as Spark's grouping normalizes it)."""
    columns = list(table.columns)
    if table.keyed:
        key = list(table.key or [])
        counts = rows.group_by(key, use_threads=False).aggregate([([], "count_all")])
        dup = counts.filter(pc.greater(counts["count_all"], 1))
        if dup.num_rows:
            first = dup.slice(0, 1).to_pylist()[0]  # (a TIMESTAMP named by its UTC wall clock, as Spark's row has it)
            first = {k: v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v for k, v in first.items()}
            _duplicate_key(name, table, path, first, first["count_all"])
        zset = rows.select(columns).append_column(COUNT_COLUMN, pa.array([1] * rows.num_rows, pa.int64()))
    else:
        rows = rows.select(columns)
        for i, c in enumerate(columns):  # (0.0 == -0.0: the zero written as 0.0)
            if pa.types.is_floating(rows.column(c).type):
                rows = rows.set_column(i, c, pc.if_else(pc.equal(rows[c], 0), pa.scalar(0.0, rows[c].type), rows[c]))
        counts = rows.group_by(columns, use_threads=False).aggregate([([], "count_all")])
        zset = counts.select(columns).append_column(COUNT_COLUMN, counts["count_all"].cast(pa.int64()))
    cluster = table.key or columns
    zset = zset.sort_by([(c, "ascending", "at_start") for c in cluster])
    return warehouse.write_arrow_layer(zset, table_schema(table), name, "base", run_id)


def _duplicate_key(name: str, table: TableConfig, path: str, row, times: int) -> None:
    raise ChangeDataError(f"table {name}: {path}: key {describe_row(row, table.key or [])} occurs {times} times; "
                          "nothing was stored")


def _input_bytes(path: str) -> int | None:
    p = Path(path)
    if "://" in path or not p.exists():
        return None
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
