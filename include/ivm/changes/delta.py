"""Delta Lake tables as sources: a table of the project file with ``source: {delta: PATH}`` (or
``{table: NAME}``, a Delta table in the Spark catalog) is read where it is, never copied into the
warehouse. Its changes are the table's change data feed; its state at a version is the table read by
time travel (``versionAsOf``).

**Versions.** ivm counts a table's commit versions from 1, 0 meaning that nothing of it was consumed
(the watermark of a view that holds none of it); Delta counts a table's versions from 0. So a Delta
source's ivm commit version N is its Delta version N − 1: a watermark N says "holds the table as of
Delta version N − 1". Messages to users name Delta versions.

**A refresh** of a Delta source (ivm.refresh.trim) reads the change data feed from the Delta version
after the one its watermark holds to the version current when the run planned (`changes`: Delta's
``_change_type`` and ``_commit_version`` are ivm's log columns), trims it into the net delta per key
against the table as of the watermark (002 §3, ivm.changes.trim: the same checks as a log appended to
ivm), and the run reads the table's new state as of the planned version. When no view of the run
maintains the table incrementally (a first materialization, ``--mode full``, ``ivm backfill --full``)
the change data feed is not read at all: the views are recomputed from the table as of the planned
version, so a feed whose versions were vacuumed away does not stand in their way.

**The stored state** of a Delta source in the catalog is one layer of kind ``source`` whose path names
the Delta location and version (`layer_path`); ivm.storage reads such a layer by time travel (each row
with count 1) wherever it reads layers, and neither compaction nor garbage collection touches it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ivm.changes.reader import SEQ, table_schema
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, COUNT_COLUMN, ProjectConfig, TableConfig, resolve_location
from ivm.errors import ChangeDataError, ConfigError, one_line

log = logging.getLogger(__name__)

#: the kind of a layer that is a Delta source's version (ivm.storage reads it by time travel)
SOURCE = "source"
PREFIX = "delta-version:"


def is_delta(table: TableConfig) -> bool:
    return table.source is not None


def location(config: ProjectConfig, name: str, spark: SparkSession | None = None) -> str:
    """Where the Delta source of table ``name`` lives: its path (relative to the project file), or the
    location the Spark catalog gives the named table (Spark needed then)."""
    source = config.tables[name].source
    if source.delta is not None:
        return resolve_location(source.delta, config.root)
    if spark is None:
        raise ConfigError(f"tables.{name}: source table {source.table} is found through the Spark catalog")
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {source.table}").select("location", "format").first()
    except Exception as e:  # noqa: BLE001 - Spark's analysis errors differ by version: one line each way
        raise ConfigError(f"tables.{name}: source table {source.table}: {one_line(e)}") from e
    if detail is None or (detail["format"] or "").lower() != "delta":
        raise ConfigError(f"tables.{name}: source table {source.table} is not a Delta table")
    return detail["location"]


def ivm_version(delta_version: int) -> int:
    return delta_version + 1


def delta_version(ivm_version: int) -> int:
    return ivm_version - 1


def version_noun(table: TableConfig) -> str:
    """What users call a version of the table's changes: a Delta source's Delta version."""
    return "Delta version" if is_delta(table) else "commit version"


def named_version(table: TableConfig, version: int) -> int:
    """A commit version (ivm's numbering) as users name it: a Delta source's Delta version."""
    return delta_version(version) if is_delta(table) else version


def from_named_version(table: TableConfig, named: int) -> int:
    """The commit version (ivm's numbering) of a version as users name it (`named_version`)."""
    return ivm_version(named) if is_delta(table) else named


def local_path(uri: str) -> str:
    """A location as delta-rs takes it (a local path for ``file:`` URIs)."""
    return uri[len("file:"):].replace("///", "/", 1) if uri.startswith("file:") else uri


def _table(where: str, name: str, version: int | None = None):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(local_path(where), version=version)
    except TableNotFoundError as e:
        raise ConfigError(f"tables.{name}: source {where} is not a Delta table") from e
    except Exception as e:  # noqa: BLE001 - delta-rs raises several kinds for a version it cannot load
        if version is not None:
            raise ChangeDataError(f"table {name}: Delta version {version} of {where} can no longer be read "
                                  f"({one_line(e)}); use `ivm backfill --full` for the views that read it") from e
        raise ConfigError(f"tables.{name}: source {where}: {one_line(e)}") from e


def current_version(where: str, name: str) -> int:
    """The Delta table's newest version, from its log (no JVM: delta-rs)."""
    return _table(where, name).version()


def current(where: str, name: str) -> tuple[int, str]:
    """The Delta table's newest version and its table id (`state_at`), from one read of its log (no JVM:
    delta-rs)."""
    t = _table(where, name)
    return t.version(), t.metadata().id


def state_at(where: str, name: str, version: int) -> tuple[int, str]:
    """Rows of the table as of ``version``, from the statistics of its files (no data read), and its table
    id (its metaData id), from one read of its log: a table deleted at the location and created anew, or
    replaced, has another id, and its versions and change data feed start over."""
    t = _table(where, name, version)
    actions = t.get_add_actions(flatten=True)
    column = "num_records"
    rows = int(sum(v or 0 for v in actions.column(column).to_pylist())) if column in actions.schema.names else 0
    return rows, t.metadata().id


def rows_at(where: str, name: str, version: int) -> int:
    """Rows of the table as of ``version`` (`state_at`)."""
    return state_at(where, name, version)[0]


#: Delta operations that rewrite files without changing a row: their commits hold no change data
_NO_DATA_CHANGE = ("OPTIMIZE", "REORG", "VACUUM START", "VACUUM END")


def feed_rows(operation: str, metrics: dict, rows_before: Callable[[], int]) -> int:
    """The rows one commit puts in the change data feed, from its operation metrics (as Delta Lake's
    Spark commands name them, ``numDeletedRows``, or delta-rs, ``num_deleted_rows``): each insert and
    delete one, each update two (its pre- and postimage); the rows a DML command copied unchanged into
    the files it rewrote are not changes (a MERGE that deletes 750 orders rewrites a file of a million:
    its ``numOutputRows``). A commit that removed files without counting their rows (an overwrite)
    removed, as far as its metrics tell, every row the table held before it (``rows_before()``)."""
    m = {k.replace("_", "").lower(): int(v or 0) for k, v in metrics.items() if str(v or 0).isdigit()}
    n = lambda key: m.get(key, 0)  # noqa: E731
    if operation in _NO_DATA_CHANGE:
        return 0
    if any(k in m for k in ("numtargetrowsinserted", "numtargetrowsdeleted", "numtargetrowsupdated")):  # MERGE
        return n("numtargetrowsinserted") + n("numtargetrowsdeleted") + 2 * n("numtargetrowsupdated")
    if "numdeletedrows" in m or "numupdatedrows" in m:  # DELETE, UPDATE
        return n("numdeletedrows") + 2 * n("numupdatedrows")
    written = n("numoutputrows") + n("numaddedrows")  # an append (WRITE, STREAMING UPDATE, CREATE TABLE AS SELECT)
    return written + rows_before() if n("numremovedfiles") else written


def change_rows(where: str, name: str, after: int, upto: int) -> int:
    """About how many rows the change data feed holds for the commits after Delta version ``after`` up to
    ``upto``, from the commits' metrics (`feed_rows`): what the planner weighs a change by before reading
    it, and what a trim's progress line reports."""
    if upto <= after:
        return 0
    history = _table(where, name).history(upto - max(after, -1) + 1)
    total = 0
    for commit in history:
        version = int(commit.get("version", -1))
        if after < version <= upto:
            total += feed_rows(str(commit.get("operation") or ""), commit.get("operationMetrics") or {},
                               lambda v=version: rows_at(where, name, v - 1) if v else 0)
    return total


def check_source(spark: SparkSession, name: str, table: TableConfig, where: str) -> None:
    """At ``ivm apply``: the source is a Delta table with its change data feed on, holding every declared
    column with its declared type. Raises ConfigError naming the table and saying how to fix it."""
    check_columns(spark, name, table, where, check_feed(name, where))


def check_feed(name: str, where: str) -> int:
    """The source is a Delta table with its change data feed on (delta-rs reads its log: no Spark).
    Returns its current Delta version. Raises ConfigError naming the table and saying how to fix it."""
    dt = _table(where, name)
    properties = dt.metadata().configuration or {}
    if str(properties.get("delta.enableChangeDataFeed", "false")).lower() != "true":
        raise ConfigError(
            f"tables.{name}: the change data feed of Delta table {where} is off; turn it on with "
            f"`ALTER TABLE delta.`{where}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)` "
            "(ivm reads the changes committed after that)")
    return dt.version()


def check_columns(spark: SparkSession, name: str, table: TableConfig, where: str, version: int) -> None:
    """Every declared column is in the Delta table as of ``version`` with its declared type; a dropped or
    retyped column is named (ChangeDataError: the source changed under ivm)."""
    schema = spark.read.format("delta").option("versionAsOf", version).load(where).schema
    present = {f.name: f.dataType for f in schema.fields}
    for f in table_schema(table).fields:
        if f.name not in present:
            raise ChangeDataError(f"table {name}: column {f.name} is not in Delta table {where} as of version "
                                  f"{version} (dropped or renamed?); views that read it cannot be maintained")
        if present[f.name] != f.dataType:
            raise ChangeDataError(f"table {name}: column {f.name} is {present[f.name].simpleString()} in Delta "
                                  f"table {where} as of version {version}, declared {f.dataType.simpleString()}")


def layer_path(where: str, version: int) -> str:
    """The path of the layer that stands for the Delta table as of ``version``."""
    return f"{PREFIX}{version}:{where}"


def parse_layer_path(path: str) -> tuple[str, int] | None:
    """(location, Delta version) of a `layer_path`; None for any other layer."""
    if not path.startswith(PREFIX):
        return None
    version, _, where = path[len(PREFIX):].partition(":")
    return where, int(version)


def read_version(spark: SparkSession, path: str, schema: StructType) -> DataFrame:
    """A `layer_path`'s rows as a Z-set: the declared columns of the table as of its version, count 1 (a
    column the table gained after that version, ivm.evolution: NULL)."""
    where, version = parse_layer_path(path)
    df = spark.read.format("delta").option("versionAsOf", version).load(where)
    return df.select(*[(F.col(f"`{f.name}`") if f.name in df.columns else F.lit(None)).cast(f.dataType).alias(f.name)
                       for f in schema.fields], F.lit(1).cast("long").alias(COUNT_COLUMN))


def history_gone(name: str, where: str, version: int) -> int | None:
    """None while Delta version ``version`` of the table is in its history; once its log's retention or
    VACUUM dropped it (and its change data feed with it), the oldest version left. delta-rs reads the
    commits since ``version`` only (a history with a limit), not the whole log: a table changed every few
    minutes keeps thousands of commits, and every trim and catch-up asks."""
    t = _table(where, name)
    current = t.version()
    since = [int(c["version"]) for c in t.history(limit=max(1, current - version + 1))]
    earliest = min(since, default=current)
    return None if earliest <= version else earliest


def changes(spark: SparkSession, name: str, table: TableConfig, where: str, after: int, upto: int,
            skip: Collection[int] = ()) -> DataFrame:
    """The change data feed of Delta versions ``after`` + 1 .. ``upto`` as ivm's change log (the declared
    columns, ``_change_type``, ``_commit_version`` as ivm counts it, ``_seq`` ordering each commit's
    removals before its additions), but the commits of ``skip`` (quarantined: ivm's numbers). Raises
    ChangeDataError when those versions' feed is gone."""
    earliest = history_gone(name, where, after + 1)
    if earliest is not None:
        raise ChangeDataError(
            f"table {name}: Delta versions {after + 1}..{upto} of {where} are needed but the table's history "
            f"starts at version {earliest} (log retention or VACUUM); use `ivm backfill --full` for the views "
            "that read it")
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", after + 1)
            .option("endingVersion", upto).load(where))
    # within one commit the images that remove a row go before those that add one (a Delta commit changes
    # a row once: a pre- and a postimage, a delete or an insert), so ivm's update-image pairing
    # (ivm.changes.trim) sees each preimage before its postimage
    order = F.when(F.col("_change_type").isin("update_preimage", "delete"), 0).otherwise(1)
    skip = sorted(delta_version(v) for v in skip if after < delta_version(v) <= upto)
    if skip:
        feed = feed.where(~F.col("_commit_version").isin(skip))
    return feed.select(*[F.col(f"`{c}`").cast(t).alias(c) for c, t in table.columns.items()],
                       F.col("_change_type").alias(CHANGE_TYPE),
                       (F.col("_commit_version") + 1).cast("long").alias(COMMIT_VERSION),
                       (order.cast("long") * F.lit(1 << 62) + F.monotonically_increasing_id()).alias(SEQ))
