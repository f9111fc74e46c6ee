"""The warehouse: change-log segments and versioned Z-set layers of relations (docs/design.md §3).

    <warehouse>/log/<table>/<segment>.parquet      one directory per `ivm log append`
    <warehouse>/data/<relation>/<layer>/            one Parquet directory per layer
    <warehouse>/staging/<run_id>/                   a run's intermediate results (the Airflow stages);
                                                    gc removes old ones

Files are written under fresh names and only become part of a relation when the catalog records them
(the commit point), so a crash between writing and committing leaves nothing half-visible; garbage
collection removes what no catalog row references. File-system work outside Spark (sizes, deletes)
goes through pyarrow's file systems, which cover local folders, S3 and HDFS.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ivm.catalog.store import WrittenLayer, new_id
from ivm.changes import delta
from ivm.config import COUNT_COLUMN
from ivm.vocabulary import LayerKind
from ivm.zset import BROADCAST_BYTES, VALUES_ON_DRIVER, consolidate, consolidate_onto, union_all

log = logging.getLogger(__name__)


#: the footer key under which Spark writes a Parquet file's Spark schema
SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"


class Warehouse:
    """Paths and file operations under one warehouse URI."""

    #: how many DataFrames over sets of layers `read_layers` keeps for reuse
    READS_KEPT = 256

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self._reads: OrderedDict[tuple, DataFrame] = OrderedDict()
        self._reads_lock = threading.Lock()
        fs_uri = self.uri.replace("s3a://", "s3://", 1) if self.uri.startswith("s3a://") else self.uri
        if "://" in fs_uri:
            self.fs, self._root = pafs.FileSystem.from_uri(fs_uri)
        else:
            self.fs, self._root = pafs.LocalFileSystem(), fs_uri

    # -- paths ----------------------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        return "/".join([self.uri, *parts])

    def log_path(self, table: str, segment: str) -> str:
        return self.path("log", table, f"{segment}.parquet")

    def layer_path(self, relation: str, layer_id: str) -> str:
        return self.path("data", relation, layer_id)

    def _fs_path(self, path: str) -> str:
        """A warehouse path as pyarrow's file system names it."""
        assert path.startswith(self.uri), path
        return self._root + path[len(self.uri):]

    # -- file operations ----------------------------------------------------------------------------

    def ensure(self) -> None:
        self.fs.create_dir(self._fs_path(self.path("data")), recursive=True)
        self.fs.create_dir(self._fs_path(self.path("log")), recursive=True)

    def delete(self, path: str) -> None:
        self._forget_reads(path)
        info = self.fs.get_file_info(self._fs_path(path))
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self._fs_path(path))
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(self._fs_path(path))

    def write_parquet(self, path: str, rows: pa.Table) -> None:
        """A small Arrow table as a Parquet directory of one file, as Spark would write it (a log
        segment read without Spark, ivm.changes.arrow_reader); refused if ``path`` exists."""
        if self.exists(path):
            raise FileExistsError(path)
        self.fs.create_dir(self._fs_path(path), recursive=True)
        pq.write_table(rows, f"{self._fs_path(path)}/part-00000-{new_id('')}.parquet", filesystem=self.fs)

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(self._fs_path(path)).type != pafs.FileType.NotFound

    def list_dirs(self, *parts: str) -> list[tuple[str, datetime | None]]:
        """(path, modification time) of the entries directly under a warehouse folder."""
        base = self.path(*parts)
        infos = self.fs.get_file_info(pafs.FileSelector(self._fs_path(base), allow_not_found=True))
        return [(f"{base}/{i.base_name}", i.mtime) for i in infos]

    def parquet_stats(self, path: str) -> tuple[int | None, int | None]:
        """Rows and bytes of a written Parquet directory, read from the footers on the driver.

        Taking the numbers from the files just written costs no Spark job (docs/design.md §11: no
        `count()` just to log a number).
        """
        try:
            rows = size = 0
            for info, meta in self._footers(path):
                size += info.size or 0
                rows += meta.num_rows
            return rows, size
        except OSError as e:  # statistics are informative only
            log.warning("could not read statistics of %s: %s", path, e)
            return None, None

    def column_range(self, paths: str | Sequence[str], column: str) -> tuple | None:
        """(min, max) of ``column`` over a written Parquet path, or over several together, from the row
        groups' statistics in the footers (no Spark job): a path without rows (an empty delta layer) adds
        no row group. None when some row group has no statistics, when there is no row group, or when the
        files cannot be read."""
        lows, highs = [], []
        footers = (f for path in ([paths] if isinstance(paths, str) else paths) for f in self._footers(path))
        try:
            for _, meta in footers:
                # the leaf column of that name (a nested column before it has several leaves)
                index = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), None)
                for g in range(meta.num_row_groups):
                    stats = meta.row_group(g).column(index).statistics if index is not None else None
                    if stats is None or not stats.has_min_max:
                        return None
                    lows.append(stats.min)
                    highs.append(stats.max)
        except OSError as e:
            log.warning("could not read statistics of %s: %s", paths, e)
            return None
        return (min(lows), max(highs)) if lows else None

    def _files(self, path: str) -> list[pafs.FileInfo]:
        """The Parquet files under ``path`` (a directory or one file), but hidden ones (``.``/``_``), as
        Spark's reader lists them."""
        fs_path = self._fs_path(path)
        info = self.fs.get_file_info(fs_path)
        infos = [info] if info.type == pafs.FileType.File else \
            self.fs.get_file_info(pafs.FileSelector(fs_path, recursive=True))
        return [i for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                and not i.base_name.startswith((".", "_"))]

    def _footers(self, path: str):
        """(file info, Parquet metadata) of each Parquet file under ``path`` (a directory or one file)."""
        for info in self._files(path):
            with self.fs.open_input_file(info.path) as f:
                yield info, pq.ParquetFile(f).metadata

    def read_arrow(self, paths: Sequence[str], where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table | None:
        """The rows ``where`` keeps of the Parquet files under ``paths``, read on the driver by pyarrow
        (row groups pruned by their statistics); None when there is no file."""
        import pyarrow.dataset as ds

        files = [info.path for p in paths for info in self._files(p)]
        if not files:
            return None
        return ds.dataset(files, format="parquet", filesystem=self.fs).to_table(
            columns=list(columns) if columns is not None else None, filter=where)

    def distinct_values(self, paths: Sequence[str], column: str, where: pc.Expression | None = None,
                        limit: int = VALUES_ON_DRIVER) -> tuple[list, bool] | None:
        """The distinct non-NULL values of ``column`` in the Parquet files under ``paths`` (in the rows
        pyarrow's ``where`` keeps), sorted, and whether a NULL is among them: read on the driver, so a
        small change's keys reach a plan as an IN list without a Spark job. None where that is not
        plain — over ``limit`` values; a column type outside integers, strings, dates and decimals (whose
        Python values Spark takes back as they were written: a TIMESTAMP's would depend on the time
        zone); files that cannot be read — and the caller asks Spark."""
        try:
            data = self.read_arrow(paths, where, [column])
            if data is None:
                return [], False
            kind = data.schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                    or pa.types.is_date32(kind) or pa.types.is_decimal(kind)):
                return None
            found = pc.unique(data.column(column))
        except (OSError, KeyError, pa.ArrowException) as e:
            log.info("the values of %s in %s are left to Spark: %s", column, ", ".join(paths), e)
            return None
        values = pc.drop_null(found)
        if len(values) > limit:
            return None
        return sorted(values.to_pylist()), found.null_count > 0

    # -- layers ----------------------------------------------------------------------------------

    def write_layer(self, df: DataFrame, relation: str, kind: str, cluster_by: Sequence[str] | None = None,
                    files: int | None = None, run_id: str | None = None) -> WrittenLayer:
        """Write a Z-set as a new layer of ``relation``. Nothing is visible until the catalog commits it.

        A base layer is range-partitioned and sorted by ``cluster_by`` (the key, or all columns), so
        Parquet min/max statistics let a read restricted to a few keys skip files; a delta layer is
        written as it comes: it is small (O(|Δ|)).

        Within a run (``run_id``) a relation gets at most one layer of each kind, named after the run:
        a retried stage overwrites what its failed attempt wrote instead of leaving it behind.
        """
        layer_id = _layer_id(relation, kind, run_id)
        path = self.layer_path(relation, layer_id)
        if kind == LayerKind.BASE and cluster_by:
            cols = [F.col(f"`{c}`") for c in cluster_by]
            df = df.repartitionByRange(max(1, files or 1), *cols).sortWithinPartitions(*cols)
        elif files:
            df = df.coalesce(files)
        self._forget_reads(path)  # (a retried stage overwrites its layer: its old files are gone)
        df.write.mode("error" if run_id is None else "overwrite").parquet(path)
        rows, size = self.parquet_stats(path)
        log.info("wrote %s layer of %s: %s rows, %s bytes", kind, relation, rows, size)
        return WrittenLayer(layer_id, relation, kind, path, rows, size)

    def write_arrow_layer(self, rows: pa.Table, schema: StructType, relation: str, kind: str,
                          run_id: str) -> WrittenLayer:
        """`write_layer` of a small Z-set the driver holds (in the order it is to be stored), written by
        pyarrow as one file, as Spark reads it (ivm.changes.ingest: a small `ivm load` without a JVM), with
        the relation's ``schema`` in the footer where Spark puts it (`SPARK_SCHEMA`: read by
        `ivm.sinks.small_layers`)."""
        layer_id = _layer_id(relation, kind, run_id)
        path = self.layer_path(relation, layer_id)
        self.delete(path)  # (a retried stage overwrites its layer)
        metadata = {**(rows.schema.metadata or {}), SPARK_SCHEMA: with_count(schema).json().encode()}
        self.write_parquet(path, rows.replace_schema_metadata(metadata))
        log.info("wrote %s layer of %s: %s rows (pyarrow)", kind, relation, rows.num_rows)
        rows_written, size = self.parquet_stats(path)
        return WrittenLayer(layer_id, relation, kind, path, rows_written, size)

    def read_layers(self, spark: SparkSession, paths: Sequence[str], schema: StructType,
                    reuse: bool = True) -> DataFrame:
        """The ⊎ of a relation's layers, unconsolidated: one scan over all their files.

        A layer's files do not change once written, so the DataFrame over a set of layers is built
        once and reused (the last `READS_KEPT`): building it costs ~15 ms of the driver's time (the
        analyzer looks the Parquet source up among the class path's services, checks each path on a
        new thread pool and lists the files), and a refresh reads the same layers in its trim and its
        maintain, and the unchanged tables' layers in every run. Writing or deleting a layer forgets
        the DataFrames over it. ``reuse=False`` (validation: what the files hold now) lists them anew."""
        key = (id(spark), tuple(paths), schema.json())
        with self._reads_lock:
            df = self._reads.get(key) if reuse else None
            if df is not None and df.sparkSession is spark:
                self._reads.move_to_end(key)
                return df
        zschema = with_count(schema)
        # a Delta source's version (ivm.changes.delta) is read by time travel; Parquet layers in one scan
        sources = [p for p in paths if delta.parse_layer_path(p) is not None]
        files = [p for p in paths if p not in sources]
        parts = ([spark.read.schema(zschema).parquet(*files)] if files else []) + [
            delta.read_version(spark, p, schema) for p in sources]
        df = union_all(parts) if parts else spark.createDataFrame([], zschema)
        with self._reads_lock:
            self._reads[key] = df
            while len(self._reads) > self.READS_KEPT:
                self._reads.popitem(last=False)
        return df

    def _forget_reads(self, path: str) -> None:
        with self._reads_lock:
            for key in [k for k in self._reads if any(p == path or p.startswith(path + "/") for p in k[1])]:
                del self._reads[key]

    def read_consolidated(self, spark: SparkSession, layers: Sequence, schema: StructType,
                          columns: Sequence[str]) -> DataFrame:
        """The relation the ``layers`` (each with ``path``, ``kind``, ``bytes``: a LayerRef, a WrittenLayer)
        make up, consolidated. A base layer is consolidated when written: alone it is read as it is;
        followed by delta layers of at most BROADCAST_BYTES together, only its tuples that agree with
        theirs on ``columns`` (the key the base layer is sorted by) are grouped with them
        (`zset.consolidate_onto`); else every tuple is grouped."""
        paths = [x.path for x in layers]
        if not layers or layers[0].kind != LayerKind.BASE:
            return consolidate(self.read_layers(spark, paths, schema))
        if len(layers) == 1:
            return self.read_layers(spark, paths, schema)
        if sum(BROADCAST_BYTES + 1 if x.bytes is None else x.bytes for x in layers[1:]) > BROADCAST_BYTES:
            return consolidate(self.read_layers(spark, paths, schema))
        return consolidate_onto(self.read_layers(spark, paths[:1], schema),
                                self.read_layers(spark, paths[1:], schema), columns)

    def files_for(self, size_bytes: int | None, target_mb: int) -> int:
        """How many files a base layer of about ``size_bytes`` should have."""
        if not size_bytes:
            return 1
        return max(1, math.ceil(size_bytes / (target_mb * 1024 * 1024)))


def _layer_id(relation: str, kind: str, run_id: str | None) -> str:
    """A new layer's name. Within a run (``run_id``) a relation gets at most one layer of each kind,
    named after the run: a retried stage overwrites what its failed attempt wrote."""
    if run_id is None:
        return new_id(f"{kind}-")
    digest = hashlib.sha1(f"{run_id}/{relation}".encode()).hexdigest()[:12]
    return f"{kind}-{run_id[:40]}-{digest}"


class Scratch:
    """A run's scratch space under ``staging/<run_id>/``: intermediate results written as Parquet and
    read back, so a long computation (a fixpoint, a set change used twice) is cut into short plans
    whose inputs are files (lineage truncated, nothing recomputed). A retried stage overwrites its own
    names; the run deletes the folder after publishing, gc removes what a failed run left."""

    def __init__(self, warehouse: Warehouse, spark: SparkSession, run_id: str):
        self.warehouse, self.spark, self.run_id = warehouse, spark, run_id

    def put(self, name: str, df: DataFrame) -> tuple[str, int, int]:
        """Write ``df`` as ``name``; (path, rows, bytes) with the numbers from the footers (no extra job)."""
        path = self.warehouse.path("staging", self.run_id, name)
        df.write.mode("overwrite").parquet(path)
        rows, size = self.warehouse.parquet_stats(path)
        return path, rows or 0, size or 0

    def put_signed(self, name: str, df: DataFrame) -> dict[int, tuple[str, int, int]]:
        """Write a Z-set's negative and positive tuples apart in one job (partitioned by the sign of
        ``__count``, which the parts do not keep): sign -> (path, rows, bytes) of its part (rows 0 and no
        files when it has none)."""
        path = self.warehouse.path("staging", self.run_id, name)
        parts = df.where(F.col(COUNT_COLUMN) != 0).withColumn("__sign", F.signum(COUNT_COLUMN).cast("int"))
        parts.drop(COUNT_COLUMN).write.mode("overwrite").partitionBy("__sign").parquet(path)
        out = {}
        for sign in (-1, 1):
            part = f"{path}/__sign={sign}"
            rows, size = self.warehouse.parquet_stats(part) if self.warehouse.exists(part) else (0, 0)
            out[sign] = (part, rows or 0, size or 0)
        return out

    def read(self, paths: Sequence[str], schema: StructType) -> DataFrame:
        """Several written results as one scan (``schema``: their columns, ``__count`` included)."""
        if not paths:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*paths)


def with_count(schema: StructType) -> StructType:
    """A relation's schema plus the ``__count`` column of its Z-set."""
    return StructType([*schema.fields, StructField(COUNT_COLUMN, LongType(), False)])
