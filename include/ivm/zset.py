"""Z-sets on Spark DataFrames: a relation's columns plus ``__count`` (docs/design.md §2).

Positive counts are insertions or derivations, negative counts deletions (000 §3). Union (⊎) adds
counts, consolidation groups equal tuples and drops zero counts; it is done only where a consolidated
answer is needed.
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, NumericType

from ivm import ir
from ivm.config import COUNT_COLUMN


def quote(name: str) -> str:
    """A column name quoted for Spark (names may hold dots, spaces or reserved words).

    >>> quote("o.id")
    '`o.id`'
    """
    return f"`{name}`"


def negate(df: DataFrame) -> DataFrame:
    """The Z-set with every count negated: what a delta subtracts (-R)."""
    return df.withColumn(COUNT_COLUMN, -F.col(COUNT_COLUMN))


def data_columns(df: DataFrame) -> list[str]:
    """The relation's own columns: everything but ``__count``."""
    return [c for c in df.columns if c != COUNT_COLUMN]


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """⊎ without consolidation: the counts of equal tuples add up when consolidated later."""
    return reduce(lambda a, b: a.unionByName(b), frames)


def consolidate(df: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """Group equal tuples, sum their counts, drop the tuples whose count is zero."""
    cols = list(columns) if columns is not None else data_columns(df)
    return (df.groupBy(*cols)
              .agg(F.sum(COUNT_COLUMN).cast("long").alias(COUNT_COLUMN))
              .where(F.col(COUNT_COLUMN) != 0))


#: a delta (a round's new tuples, a delta layer) up to this size in Parquet bytes is broadcast into the
#: joins that read it, so the large relations it joins are scanned once and never shuffled
BROADCAST_BYTES = 64 * 2**20


def difference(after: DataFrame, before: DataFrame) -> DataFrame:
    """The change from ``before`` to ``after`` (000 §3: Pᵛ = P ⊎ Δ(P), so Δ(P) = Pᵛ ⊎ −P), consolidated."""
    return consolidate(after.unionByName(negate(before)))


def consolidate_onto(base: DataFrame, delta: DataFrame, columns: Sequence[str]) -> DataFrame:
    """consolidate(base ⊎ delta) for a consolidated ``base`` and a ``delta`` small enough to broadcast:
    only the tuples of ``base`` whose ``columns`` occur in ``delta`` are grouped with it, the others
    are consolidated already and pass as they are. Any columns will do (a tuple of ``delta`` equal to
    one of ``base`` agrees with it on all of them); a key sends the fewest tuples to be grouped. Two
    scans of ``base``, each with a broadcast join, where consolidating all of it shuffles every tuple
    by every column."""
    keys = F.broadcast(delta.select(*[F.col(f"`{c}`").alias(f"__k{i}") for i, c in enumerate(columns)]))
    cond = reduce(lambda a, b: a & b, [base[f"`{c}`"].eqNullSafe(keys[f"__k{i}"]) for i, c in enumerate(columns)])
    touched = base.join(keys, cond, "left_semi")
    return base.join(keys, cond, "left_anti").unionByName(consolidate(touched.unionByName(delta)))


def row_struct(columns: Sequence[str]) -> Column:
    """All columns of a tuple as one struct, compared null-safely with ``eqNullSafe``."""
    return F.struct(*[F.col(f"`{c}`") for c in columns])


def restrict(df: DataFrame, keys: DataFrame, columns: Sequence[str], small: bool = False,
             stored_rows: int = 0, local: bool = False) -> DataFrame:
    """The tuples of ``df`` whose ``columns`` occur in ``keys`` (a semi-join, null-safe); with no
    columns, all of ``df`` if ``keys`` has a row, else none. ``small``: the keys are a small change's
    (`one_partition`): they are broadcast and the tuples found gathered in one partition, so what
    follows (consolidating them, joining them with the change) needs no shuffle; ``df`` is read in
    that one task, or when it holds ``stored_rows`` ≥ SKIP_MIN_ROWS (a large table, read through its
    row-group ranges), scanned in parallel and what it finds shuffled into the one partition.
    ``local``: ``df`` is a small change's frame in one partition too: the keys (distinct) are joined
    to it inside that partition (`local_join`; an inner join, which Spark's optimizer leaves above
    ``df``'s `one_partition`, where it pushes a semi-join below it, out of the partition)."""
    if not columns:
        found = df.join(keys.select(F.lit(1).alias("__k")).limit(1), how="left_semi")
    else:
        renamed = keys.select(*[F.col(f"`{c}`").alias(f"__k{i}") for i, c in enumerate(columns)])
        cond = reduce(lambda a, b: a & b,
                      [df[f"`{c}`"].eqNullSafe(renamed[f"__k{i}"]) for i, c in enumerate(columns)])
        if local:
            return one_partition(df.join(local_join(renamed.distinct()), cond).drop(*renamed.columns))
        found = df.join(F.broadcast(renamed) if small else renamed, cond, "left_semi")
    if not small:
        return found
    return found.repartition(1) if stored_rows >= SKIP_MIN_ROWS else one_partition(found)


def local_join(df: DataFrame) -> DataFrame:
    """``df`` as the build side of a shuffled hash join with another frame in one partition: two
    `one_partition` frames (each already all of its rows in one place) join in the same stage, where a
    broadcast of one of them is a Spark job of its own (collected to the driver, sent back) and the
    small refresh's jobs add up (the performance issue's "few jobs per small refresh")."""
    return df.hint("shuffle_hash")


def small_change(rows: int, limit: int) -> bool:
    """Whether a change of ``rows`` rows is planned in one partition under ``spark.single_partition_rows``
    = ``limit`` (0: never)."""
    return 0 < limit and rows <= limit


def one_partition(df: DataFrame) -> DataFrame:
    """A small change's frame in one partition (narrow: no shuffle). Spark plans what follows from it
    alone — an aggregate, a join or union of such frames, a window — in the same stage, where the
    distributed plan shuffles before each of them: a chain of Spark stages (under adaptive execution,
    each submitted after the one before, ~0.1 s apiece) for a few thousand rows. A join that
    broadcasts the other side keeps the frame's one partition; a join that streams a large relation
    against the frame (broadcast) takes that relation's partitioning, so large results stay
    distributed. A run is small under ``spark.single_partition_rows`` (the project file)."""
    return df.coalesce(1)


#: ranges a skipping filter cuts the keys into
SKIP_RANGES = 16
#: stored rows below which a skipping filter is not worth its job (a row group holds ~10⁵-10⁶ rows)
SKIP_MIN_ROWS = 1_000_000


@dataclass(frozen=True)
class KeyBounds:
    """Where a change's keys fall in one column: at most SKIP_RANGES (low, high) ranges, sorted and
    disjoint, and whether a key is NULL. `key_bounds` finds them with one small query; a log segment
    keeps its own in the catalog (found when it is appended), so a trim merges its segments' bounds
    (`merged`) instead of querying its keys, the way a table format keeps per-file statistics."""

    ranges: tuple[tuple, ...]
    nulls: bool = False

    def filter(self, column: str) -> Column:
        """``column`` within the ranges (or NULL, if a key is): the skipping filter."""
        c = F.col(f"`{column}`")
        if not self.ranges:
            return c.isNull() if self.nulls else F.lit(False)
        ranges = _between(column, self.ranges)
        return ranges | c.isNull() if self.nulls else ranges

    def as_json(self) -> dict | None:
        """The bounds as the catalog keeps them; None for keys cut in equal runs (strings and other
        types without a distance between them: their ranges cannot be merged at the widest gaps)."""
        values = [v for r in self.ranges for v in r]
        # (timestamps and non-finite floats have no exact JSON form here: not kept)
        if not all(_gapped(v) and not isinstance(v, datetime.datetime)
                   and not (isinstance(v, float) and not math.isfinite(v)) for v in values):
            return None
        kinds = {"date" if isinstance(v, datetime.date) else "decimal" if isinstance(v, decimal.Decimal)
                 else "number" for v in values}
        if len(kinds) > 1:
            return None
        kind = kinds.pop() if kinds else "number"
        out = (lambda v: v.isoformat()) if kind == "date" else str if kind == "decimal" else (lambda v: v)
        return {"type": kind, "ranges": [[out(lo), out(hi)] for lo, hi in self.ranges], "nulls": self.nulls}

    @staticmethod
    def from_json(d: dict) -> KeyBounds:
        read = {"date": datetime.date.fromisoformat, "decimal": decimal.Decimal}.get(d["type"], lambda v: v)
        return KeyBounds(tuple((read(lo), read(hi)) for lo, hi in d["ranges"]), bool(d["nulls"]))

    @staticmethod
    def of(values: Sequence, nulls: bool) -> KeyBounds | None:
        """`key_bounds` of keys the driver holds already (a small change file's): their distinct values
        cut at the widest gaps; None for keys `key_bounds` cuts in equal runs (strings, booleans)."""
        distinct = sorted(set(values))
        if not all(_gapped(v) and not isinstance(v, bool) for v in distinct):
            return None
        return KeyBounds.merged([KeyBounds(tuple((v, v) for v in distinct), nulls)])

    @staticmethod
    def merged(parts: Sequence[KeyBounds]) -> KeyBounds:
        """Bounds holding every key of each part: their ranges joined where they overlap, then cut to
        SKIP_RANGES at the widest gaps between them (`_cut`)."""
        joined: list[tuple] = []
        for lo, hi in sorted(r for p in parts for r in p.ranges):
            if joined and lo <= joined[-1][1]:
                joined[-1] = (joined[-1][0], max(joined[-1][1], hi))
            else:
                joined.append((lo, hi))
        return KeyBounds(tuple(_cut(joined)), any(p.nulls for p in parts))


def key_bounds(keys: DataFrame, column: str) -> KeyBounds:
    """The keys' distinct values in ``column``, sorted, cut into at most SKIP_RANGES ranges at their
    widest gaps (numbers and dates; other types in equal runs), and whether one is NULL.

    One small query whatever the number of keys: Spark sorts the distinct keys (a change's, in one
    partition) and hands the driver at most SKIP_RANGES + 2 rows: the lowest and the highest key, the
    widest gaps between neighbours (or the bounds of equal runs), whether a key is NULL. (Collecting
    the keys to cut them here took seconds at 10⁵ keys: a Python object per key.)"""
    c, k = F.col(f"`{column}`"), F.col("k")
    distinct = keys.select(c.alias("k")).distinct()
    kind = distinct.schema["k"].dataType
    order = Window.orderBy(k.asc_nulls_last())  # (the NULL key, if any, last)
    if isinstance(kind, NumericType | DateType):
        prev, following = F.lag(k).over(order), F.lead(k).over(order)
        rows = distinct.select(k, prev.alias("prev"), following.alias("next"))
        prev, following = F.col("prev"), F.col("next")
        gap = F.when(k.isNotNull() & prev.isNotNull(),
                     F.datediff(k, prev) if isinstance(kind, DateType) else k - prev)
        end = k.isNull() | prev.isNull() | following.isNull()  # NULL, lowest, highest
        # the ends first, then the widest gaps: the SKIP_RANGES - 1 widest are among these rows (the
        # highest key's gap is one of them either way)
        found = (rows.select(k, prev, following, gap.alias("gap"), end.alias("end"))
                     .orderBy(F.col("end").desc(), F.col("gap").desc_nulls_last()).limit(SKIP_RANGES + 2).collect())
        nulls = any(r["k"] is None for r in found)
        lows = [r["k"] for r in found if r["k"] is not None and r["prev"] is None]
        if not lows:
            return KeyBounds((), nulls)
        [high] = [r["k"] for r in found if r["k"] is not None and r["next"] is None]
        widest = sorted((r for r in found if r["gap"] is not None), key=lambda r: r["gap"], reverse=True)
        cuts = sorted((r["prev"], r["k"]) for r in widest[:SKIP_RANGES - 1])
        bounds = list(zip([lows[0], *[b for _, b in cuts]], [*[a for a, _ in cuts], high], strict=True))
    else:
        runs = (distinct.select(k, F.ntile(SKIP_RANGES).over(order).alias("run")).groupBy("run")
                        .agg(F.min(k).alias("lo"), F.max(k).alias("hi"), F.max(k.isNull()).alias("nulls")).collect())
        nulls = any(r["nulls"] for r in runs)
        bounds = sorted((r["lo"], r["hi"]) for r in runs if r["lo"] is not None)
    return KeyBounds(tuple(bounds), nulls)


def skipping_filter(keys: DataFrame, column: str) -> Column:
    """A filter on ``column`` the Parquet reader evaluates against row-group and page statistics: the
    ranges of `key_bounds`. A relation whose layers are sorted by ``column`` (base layers are sorted by
    their key) then skips the row groups no key falls in, where a semi-join would read them all; new
    keys past the largest and deleted old ones are two ranges. A NULL key keeps the NULL rows
    (restrict's semi-join is null-safe)."""
    return key_bounds(keys, column).filter(column)


def _gapped(value) -> bool:
    """Whether keys of this type are cut at their widest gaps (else in equal runs)."""
    return isinstance(value, int | float | decimal.Decimal | datetime.date)


def _between(column: str, bounds: Sequence[tuple]) -> Column:
    """``column`` within any of the (low, high) ``bounds`` (none: nothing passes)."""
    c = F.col(f"`{column}`")
    return reduce(lambda a, b: a | b, [c.between(_bound(lo), _bound(hi)) for lo, hi in bounds], F.lit(False))


def _bound(value) -> Column:
    """A range's bound as a literal: by its SQL text where `sql_literal` has one (PySpark's ``lit`` of a
    date before the year 1000 fails: it formats the year in fewer than four digits), else ``lit``."""
    try:
        return F.expr(sql_literal(value))
    except TypeError:  # (a float, a timestamp, a boolean)
        return F.lit(value)


def _gap(a, b):
    """The distance from ``a`` up to ``b`` (numbers; dates in days)."""
    return (b - a).days if isinstance(a, datetime.date) else b - a


def _cut(ranges: list[tuple]) -> list[tuple]:
    """Sorted, disjoint (low, high) ``ranges`` of gapped values joined into at most SKIP_RANGES, cut at
    the widest gaps between neighbours."""
    if len(ranges) <= SKIP_RANGES:
        return ranges
    widest = sorted(range(1, len(ranges)), key=lambda i: _gap(ranges[i - 1][1], ranges[i][0]), reverse=True)
    cuts = sorted(widest[:SKIP_RANGES - 1])
    return [(ranges[a][0], ranges[b - 1][1]) for a, b in zip([0, *cuts], [*cuts, len(ranges)], strict=True)]


def key_ranges(values: list, column: str) -> Column:
    """`skipping_filter`'s ranges over sorted, distinct, non-NULL ``values`` the driver holds already
    (none: nothing passes)."""
    if not values:
        return F.lit(False)
    if _gapped(values[0]):
        return _between(column, _cut([(v, v) for v in values]))
    step = max(1, -(-len(values) // SKIP_RANGES))
    bounds = [0, *range(step, len(values), step), len(values)]
    return _between(column, [(values[a], values[b - 1]) for a, b in zip(bounds, bounds[1:], strict=False)])


#: values a plan carries as an IN list the driver holds (a small change's keys); beyond that, a semi-join
VALUES_ON_DRIVER = 10_000


def at_values(df: DataFrame, column: str, values: list, nulls: bool = False) -> DataFrame:
    """The tuples of ``df`` whose ``column`` is one of ``values`` (sorted, distinct, non-NULL, held by
    the driver: integers, strings, dates or decimals), or NULL when ``nulls``: an IN filter — no Spark
    job for the keys, as a broadcast semi-join takes one —, with the values' ranges for the Parquet
    reader (which turns a long IN list into one min..max range): layers sorted by the column skip the
    row groups between the values. The list is SQL text, parsed by Spark at once: PySpark's ``isin``
    makes a py4j call per value (3,000 keys: 1.0-2.0 s to build the filter, against 0.06 s)."""
    if not values:
        found = F.lit(False)
    else:
        found = F.expr(f"{quote(column)} IN ({', '.join(map(sql_literal, values))})") & key_ranges(values, column)
    return df.where(found | F.col(quote(column)).isNull() if nulls else found)


def sql_literal(value) -> str:
    """An integer, string, date or decimal the driver holds as a Spark SQL literal (a string as the CAST
    of its UTF-8 bytes, which no escaping setting of the parser reads otherwise)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return f"{value:f}BD"
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return f"DATE'{value.isoformat()}'"
    if isinstance(value, str):
        return f"CAST(X'{value.encode().hex()}' AS STRING)"
    raise TypeError(f"no SQL literal for {value!r}")


def anti_join(left: DataFrame, right: DataFrame, null_safe: bool) -> DataFrame:
    """The tuples of ``left`` with no match in ``right`` on their shared columns: ``not p(...)`` (000
    Definition 6.1's negation, SQL NOT EXISTS) with ``=``, a set difference with ``null_safe``."""
    shared = [c for c in right.columns if c != COUNT_COLUMN and c in left.columns]
    if not shared:  # nothing correlates: any tuple on the right removes every tuple on the left
        return left.join(right.select(F.lit(1).alias("__any")).limit(1), how="left_anti")
    r = right.select(*[F.col(f"`{c}`").alias(f"__r_{c}") for c in shared])  # duplicates do not matter
    cond = [(left[f"`{c}`"].eqNullSafe(r[f"`__r_{c}`"]) if null_safe else left[f"`{c}`"] == r[f"`__r_{c}`"])
            for c in shared]
    return left.join(r, reduce(lambda a, b: a & b, cond), "left_anti")


def expand(df: DataFrame) -> DataFrame:
    """A consolidated Z-set with positive counts as the bag SQL returns: each tuple ``__count`` times."""
    cols = data_columns(df)
    return (df.where(F.col(COUNT_COLUMN) > 0)
              .withColumn("__n", F.explode(F.sequence(F.lit(1), F.col(COUNT_COLUMN).cast("int"))))
              .select(*[F.col(f"`{c}`") for c in cols]))


def change_sizes(df: DataFrame) -> tuple[int, int]:
    """(tuples with a positive count, tuples with a negative count) of a Z-set: one small job."""
    row = df.agg(F.sum((F.col(COUNT_COLUMN) > 0).cast("long")).alias("i"),
                 F.sum((F.col(COUNT_COLUMN) < 0).cast("long")).alias("d")).first()
    return row["i"] or 0, row["d"] or 0


def as_used(pred: ir.Predicate, zset: DataFrame) -> DataFrame:
    """How a relation enters the rules above it: a set with count 1 per tuple, a bag with its counts."""
    if pred.semantics == "set":
        return zset.where(F.col(COUNT_COLUMN) > 0).withColumn(COUNT_COLUMN, F.lit(1).cast("long"))
    return zset
