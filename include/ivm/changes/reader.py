"""Reading change files and snapshot files into a table's normalized form, on Spark.

Native change format (docs/design.md §4, modelled on Delta Lake's change data feed): the table's columns,
``_change_type`` (insert, delete, update_preimage, update_postimage) and optionally
``_commit_version``. Files are Parquet, CSV or JSON lines. Debezium change events (JSON lines, one
envelope a line, with or without the Kafka Connect ``schema``/``payload`` wrapper) are read by
`read_debezium`.

Every reader returns the table's columns cast to their declared types, plus:
  ``_seq``   the row's position in the file (for ordering changes within a commit and naming rows)
  ``_bad``   why the row is invalid, or NULL (a value that does not cast, a NULL key, a bad change type)
  ``_raw``   the row as it stands in the file (JSON text), for error messages
Whole-file problems (unknown or missing columns, an unreadable file) raise `ChangeDataError` at once.
A column added to the table after it held data (ivm.evolution) may be missing from a change file:
its values are NULL then.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.types import StructType, _parse_datatype_string
from sqlglot import exp

from ivm.config import CHANGE_TYPE, COMMIT_VERSION, TableConfig
from ivm.errors import ChangeDataError

CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")
#: a log row of this change type (its columns NULL) deletes every row the table holds at its position
#: (a Debezium ``op: t``; the trim, ivm.changes.trim, reads the whole table for it)
TRUNCATE = "truncate"
SEQ = "_seq"
BAD = "_bad"
RAW = "_raw"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
           ".ndjson": "json"}


def table_schema(table: TableConfig) -> StructType:
    """The table's columns as Spark types: built here from sqlglot's reading of the declared types (no
    JVM: `ivm show` of a table needs none), else, for a type not built here, parsed by Spark."""
    fields = [_field(c, exp.DataType.build(t, dialect="spark")) for c, t in table.columns.items()]
    if all(f is not None for f in fields):
        return StructType(fields)
    schema = _parse_datatype_string(table.ddl())
    assert isinstance(schema, StructType)
    return schema


#: the Spark types of sqlglot's types (of a declared type, canonical: ivm.config.spark_type) that
#: `table_schema` builds without the JVM; tests/spark/test_ingest.py compares them with Spark's parser
_TYPES = {exp.DataType.Type.BOOLEAN: T.BooleanType, exp.DataType.Type.TINYINT: T.ByteType,
          exp.DataType.Type.SMALLINT: T.ShortType, exp.DataType.Type.INT: T.IntegerType,
          exp.DataType.Type.BIGINT: T.LongType, exp.DataType.Type.FLOAT: T.FloatType,
          exp.DataType.Type.DOUBLE: T.DoubleType, exp.DataType.Type.TEXT: T.StringType,
          exp.DataType.Type.BINARY: T.BinaryType, exp.DataType.Type.DATE: T.DateType,
          exp.DataType.Type.TIMESTAMPTZ: T.TimestampType, exp.DataType.Type.TIMESTAMPNTZ: T.TimestampNTZType}


def _field(name: str, t: exp.DataType) -> T.StructField | None:
    dtype = _spark_type(t)
    return None if dtype is None else T.StructField(name, dtype, True)


def _spark_type(t: exp.DataType) -> T.DataType | None:
    """The Spark type of a sqlglot type, as Spark's DDL parser gives it; None for one not built here."""
    if t.this in _TYPES and not t.expressions:
        return _TYPES[t.this]()
    if t.this == exp.DataType.Type.DECIMAL and len(t.expressions) <= 2:
        params = [int(p.this.this) for p in t.expressions]
        return T.DecimalType(*(params + [10, 0][len(params):]))  # (Spark's DECIMAL: (10, 0); DECIMAL(p): (p, 0))
    if t.this == exp.DataType.Type.ARRAY and len(t.expressions) == 1:
        element = _spark_type(t.expressions[0])
        return None if element is None else T.ArrayType(element, True)
    if t.this == exp.DataType.Type.STRUCT and all(isinstance(c, exp.ColumnDef) and not c.args.get("constraints")
                                                  for c in t.expressions):  # (NOT NULL, COMMENT: Spark's)
        fields = [_field(c.name, c.args["kind"]) for c in t.expressions]
        return None if any(f is None for f in fields) else T.StructType(fields)
    return None


def file_format(path: str) -> str:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in FORMATS:
        return FORMATS[suffix]
    if p.is_dir() and any(p.glob("*.parquet")):
        return "parquet"
    raise ChangeDataError(f"{path}: unknown file format {suffix or '(no extension)'!r}; "
                          "use .parquet, .csv or .json/.jsonl (JSON lines)")


def check_path(path: str) -> None:
    if "://" not in path and not Path(path).exists():
        raise ChangeDataError(f"file {path!r} not found")


def check_file_columns(name: str, table: TableConfig, present: list[str], extra_allowed: set[str], where: str,
                       optional: Collection[str] = ()) -> None:
    unknown = [c for c in present if c not in table.columns and c not in extra_allowed]
    if unknown:
        raise ChangeDataError(f"table {name}: {where} has unknown column {unknown[0]!r}"
                              f" (columns are {', '.join(table.columns)})")
    missing = [c for c in table.columns if c not in present and c not in optional]
    if missing:
        raise ChangeDataError(f"table {name}: {where} lacks column {missing[0]!r}")


def _first_problem(checks: list[tuple[Column, str]]) -> Column:
    """The first failing check's message, or NULL."""
    expr = F.lit(None).cast("string")
    for cond, message in reversed(checks):
        expr = F.when(cond, message).otherwise(expr)
    return expr


def _typed_columns(df: DataFrame, name: str, table: TableConfig, raw_present: dict[str, Column],
                   parsed: dict[str, Column]) -> tuple[list[Column], list[tuple[Column, str]]]:
    """The declared columns and the checks that a present value survived the cast and keys are set."""
    cols, checks = [], []
    for col, dtype in table.columns.items():
        cols.append(parsed[col].alias(col))
        checks.append((raw_present[col] & parsed[col].isNull(),
                       f"column {col}: value does not cast to {dtype}"))
    for col in table.key or []:
        checks.append((parsed[col].isNull(), f"key column {col} is NULL"))
    return cols, checks


def _read_flat(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    try:
        if fmt == "parquet":
            return spark.read.parquet(path)
        # CSV: every value as text, cast below, so a bad value is reported instead of silently nulled
        return spark.read.option("header", "true").option("inferSchema", "false").option("mode", "FAILFAST").csv(path)
    except AnalysisException as e:
        raise ChangeDataError(f"{path}: cannot read as {fmt}: {e.getMessage().splitlines()[0]}") from e


def _read_json_lines(spark: SparkSession, path: str) -> DataFrame:
    """JSON lines as text, one row per non-empty line, with its position."""
    return (spark.read.text(path)
                 .withColumn(SEQ, F.monotonically_increasing_id())
                 .where(F.trim("value") != ""))


def _json_fields(df: DataFrame, name: str, table: TableConfig, source: Column, extra: set[str],
                 where: str, optional: Collection[str] = ()) -> dict[str, Column]:
    """Check that every line is a JSON object with the table's columns (two small jobs); return each
    column's raw JSON value."""
    malformed = df.where(F.json_object_keys(source).isNull()).orderBy(SEQ).limit(1).select(F.col("value")).collect()
    if malformed:
        raise ChangeDataError(f"table {name}: {where}: row {malformed[0].value.strip()}: not a JSON object; "
                              "nothing was stored")
    keys = (df.select(F.explode(F.json_object_keys(source)).alias("k")).distinct()
              .limit(len(table.columns) + len(extra) + 50).collect())
    present = [r.k for r in keys]
    if present:  # a column no line mentions is missing; a line may leave out a NULL value
        check_file_columns(name, table, present, extra, where, optional)
    return {c: F.get_json_object(source, f"$.{c}") for c in table.columns}


def read_cdf(spark: SparkSession, name: str, table: TableConfig, path: str,
             optional: Collection[str] = ()) -> DataFrame:
    """A native change file: table columns + ``_change_type`` + ``_commit_version`` (NULL if absent);
    the ``optional`` columns (added since the table held data) NULL where the file lacks them."""
    check_path(path)
    fmt = file_format(path)
    extra = {CHANGE_TYPE, COMMIT_VERSION}
    if fmt == "json":
        text = _read_json_lines(spark, path)
        raw = _json_fields(text, name, table, F.col("value"), extra, path, optional)
        schema = f"{table.ddl()}, `{CHANGE_TYPE}` STRING, `{COMMIT_VERSION}` STRING"
        parsed_struct = F.from_json("value", schema)
        df = text.withColumn("__p", parsed_struct)
        parsed = {c: F.col("__p").getField(c) for c in table.columns}
        raw_present = {c: raw[c].isNotNull() for c in table.columns}
        change_raw = F.get_json_object("value", f"$.{CHANGE_TYPE}")
        version_raw = F.get_json_object("value", f"$.{COMMIT_VERSION}")
        checks_extra = [(F.col("__p").isNull(), "not a JSON object")]
        raw_text = F.col("value")
    else:
        df = _read_flat(spark, path, fmt).withColumn(SEQ, F.monotonically_increasing_id())
        check_file_columns(name, table, [c for c in df.columns if c != SEQ], extra, path, optional)
        raw_text = _as_json([c for c in df.columns if c != SEQ])
        df = df.select("*", *[F.lit(None).cast("string").alias(c) for c in table.columns if c not in df.columns])
        if fmt == "csv":
            complex_cols = [c for c, t in table.columns.items() if t.startswith(("ARRAY", "STRUCT"))]
            if complex_cols:
                raise ChangeDataError(f"table {name}: column {complex_cols[0]} is nested; CSV cannot hold it "
                                      "(use Parquet or JSON lines)")
        parsed = {c: F.col(f"`{c}`").try_cast(t) for c, t in table.columns.items()}
        raw_present = {c: F.col(f"`{c}`").isNotNull() for c in table.columns}
        change_raw = F.col(CHANGE_TYPE).cast("string") if CHANGE_TYPE in df.columns else F.lit(None).cast("string")
        version_raw = (F.col(COMMIT_VERSION).cast("string") if COMMIT_VERSION in df.columns
                       else F.lit(None).cast("string"))
        checks_extra = []
        if CHANGE_TYPE not in df.columns:
            raise ChangeDataError(f"table {name}: {path} lacks column {CHANGE_TYPE!r}")
    cols, checks = _typed_columns(df, name, table, raw_present, parsed)
    version = version_raw.try_cast("long")
    checks = checks_extra + checks + [
        (~F.lower(F.trim(change_raw)).isin(*CHANGE_TYPES) | change_raw.isNull(),
         f"{CHANGE_TYPE} must be one of {', '.join(CHANGE_TYPES)}"),
        (version_raw.isNotNull() & version.isNull(), f"{COMMIT_VERSION} is not a whole number"),
    ]
    return df.select(*cols,
                     F.lower(F.trim(change_raw)).alias(CHANGE_TYPE),
                     version.alias(COMMIT_VERSION),
                     F.col(SEQ),
                     _first_problem(checks).alias(BAD),
                     raw_text.alias(RAW))


def read_debezium(spark: SparkSession, name: str, table: TableConfig, path: str,
                  optional: Collection[str] = ()) -> DataFrame:
    """Debezium change events: c/r insert ``after``, d deletes ``before``, u gives ``before`` as the
    update preimage and ``after`` as the postimage (key changes included); on a keyed table a ``before``
    with the key alone (the other fields null) or none at all (an update) names the row by its key.
    t (a truncate) becomes one `TRUNCATE` row, its columns NULL. Tombstones (empty or ``null`` lines, a
    wrapper whose payload is null) and transaction metadata records (BEGIN/END) are skipped. The commit
    version is ``source.lsn``, else ``ts_ms``."""
    check_path(path)
    text = _read_json_lines(spark, path).where(F.trim("value") != "null")
    # a tombstone is a null message, or a Kafka Connect wrapper whose payload is null
    wrapped = F.array_contains(F.coalesce(F.json_object_keys("value"), F.array()), "payload")
    text = text.where(~(wrapped & F.get_json_object("value", "$.payload").isNull()))
    envelope = F.when(wrapped, F.get_json_object("value", "$.payload")).otherwise(F.col("value"))
    text = text.withColumn("__env", envelope)
    # Debezium's transaction metadata (`provide.transaction.metadata`): BEGIN/END records beside the
    # events, with a status and no op, are not changes (an event's own `transaction` block is ignored too)
    text = text.where(~(F.get_json_object("__env", "$.status").isin("BEGIN", "END")
                        & F.get_json_object("__env", "$.op").isNull()))
    for image in ("before", "after"):
        image_json = F.get_json_object("__env", f"$.{image}")
        _json_fields(text.where(image_json.isNotNull()), name, table, image_json, set(), f"{path} ({image})",
                     optional)
    image_type = f"struct<{', '.join(f'`{c}`: {t}' for c, t in table.columns.items())}>"
    schema = (f"before {image_type}, after {image_type}, op STRING, ts_ms BIGINT, "
              "source struct<lsn: BIGINT, ts_ms: BIGINT>")
    ev = text.withColumn("__p", F.from_json("__env", schema))
    op = F.col("__p.op")
    # u becomes two rows (preimage, postimage); their order within the event is kept in _seq
    images = F.when(op.isin("c", "r"), F.array(F.struct(F.lit("insert").alias("t"), F.lit("after").alias("img"))))
    images = images.when(op == "d", F.array(F.struct(F.lit("delete").alias("t"), F.lit("before").alias("img"))))
    images = images.when(op == "u", F.array(
        F.struct(F.lit("update_preimage").alias("t"), F.lit("before").alias("img")),
        F.struct(F.lit("update_postimage").alias("t"), F.lit("after").alias("img"))))
    images = images.when(op == "t", F.array(F.struct(F.lit(TRUNCATE).alias("t"), F.lit(None).cast("string")
                                                     .alias("img"))))
    images = images.otherwise(F.array(F.struct(F.lit(None).cast("string").alias("t"),
                                               F.lit("after").alias("img"))))
    ev = ev.select("*", F.posexplode(images).alias("__pos", "__img"))
    use_before = F.col("__img.img") == "before"
    image_json = F.when(use_before, F.get_json_object("__env", "$.before")).otherwise(
        F.get_json_object("__env", "$.after"))
    image = F.when(use_before, F.col("__p.before")).when(F.col("__img.img") == "after", F.col("__p.after"))
    parsed = {c: image.getField(c) for c in table.columns}
    raw_present = {c: F.get_json_object(image_json, f"$.{c}").isNotNull() for c in table.columns}
    if table.keyed:
        # an update without a before image (PostgreSQL's default replica identity, MySQL's minimal row
        # image): its preimage is the key alone, taken from the after image — the trim removes the row
        # that key holds (ivm.changes.trim); a keyless table has no such row to name
        no_before = use_before & (op == "u") & F.get_json_object("__env", "$.before").isNull()
        after_json = F.get_json_object("__env", "$.after")
        for c in table.key:
            parsed[c] = F.when(no_before, F.col("__p.after").getField(c)).otherwise(parsed[c])
            raw_present[c] = F.when(no_before, F.get_json_object(after_json, f"$.{c}").isNotNull()
                                    ).otherwise(raw_present[c])
        image_json = F.when(no_before, after_json).otherwise(image_json)
    cols, checks = _typed_columns(ev, name, table, raw_present, parsed)
    version = F.coalesce(F.col("__p.source.lsn"), F.col("__p.ts_ms"), F.col("__p.source.ts_ms"))
    imaged = F.col("__img.img").isNotNull()  # (a truncate has no image: its row's columns are NULL)
    checks = [
        (F.col("__p").isNull() | op.isNull(), "not a Debezium change event (no op)"),
        (F.col("__img.t").isNull(), "op must be one of c, r, u, d, t"),
        (imaged & image_json.isNull(), "the event has no " + "before/after image for its op"),
        (version.isNull(), "the event has neither source.lsn nor ts_ms"),
    ] + [(imaged & check, message) for check, message in checks]
    return ev.select(*cols,
                     F.col("__img.t").alias(CHANGE_TYPE),
                     version.alias(COMMIT_VERSION),
                     (F.col(SEQ) * 2 + F.col("__pos")).alias(SEQ),
                     _first_problem(checks).alias(BAD),
                     F.col("value").alias(RAW))


def read_snapshot(spark: SparkSession, name: str, table: TableConfig, path: str) -> DataFrame:
    """A snapshot file for `ivm load`: exactly the table's columns."""
    check_path(path)
    fmt = file_format(path)
    if fmt == "json":
        text = _read_json_lines(spark, path)
        raw = _json_fields(text, name, table, F.col("value"), set(), path)
        df = text.withColumn("__p", F.from_json("value", table.ddl()))
        parsed = {c: F.col("__p").getField(c) for c in table.columns}
        raw_present = {c: raw[c].isNotNull() for c in table.columns}
        extra = [(F.col("__p").isNull(), "not a JSON object")]
        raw_text = F.col("value")
    else:
        df = _read_flat(spark, path, fmt).withColumn(SEQ, F.monotonically_increasing_id())
        check_file_columns(name, table, [c for c in df.columns if c != SEQ], set(), path)
        raw_text = _as_json([c for c in df.columns if c != SEQ])
        parsed = {c: F.col(f"`{c}`").try_cast(t) for c, t in table.columns.items()}
        raw_present = {c: F.col(f"`{c}`").isNotNull() for c in table.columns}
        extra = []
    cols, checks = _typed_columns(df, name, table, raw_present, parsed)
    return df.select(*cols, F.col(SEQ), _first_problem(extra + checks).alias(BAD), raw_text.alias(RAW))


def _as_json(columns: list[str]) -> Column:
    """A flat file's row as JSON text, with its values as they are in the file."""
    return F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]), {"ignoreNullFields": "false"})


def describe_row(row, columns) -> str:
    """A row for an error message: ``(src=a, dst=NULL)``."""
    def show(v):
        return "NULL" if v is None else repr(v) if isinstance(v, str) else str(v)
    return "(" + ", ".join(f"{c}={show(row[c])}" for c in columns) + ")"
