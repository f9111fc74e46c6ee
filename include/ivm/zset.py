"""Z-sets on Spark DataFrames: a relation's columns plus ``__count`` (DESIGN.md §2).

Positive counts are insertions or derivations, negative counts deletions (000 §3). Union (⊎) adds
counts, consolidation groups equal tuples and drops zero counts; it is done only where a consolidated
answer is needed.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN


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


def row_struct(columns: Sequence[str]) -> Column:
    """All columns of a tuple as one struct, compared null-safely with ``eqNullSafe``."""
    return F.struct(*[F.col(f"`{c}`") for c in columns])


def restrict(df: DataFrame, keys: DataFrame, columns: Sequence[str]) -> DataFrame:
    """The tuples of ``df`` whose ``columns`` occur in ``keys`` (a semi-join, null-safe); with no
    columns, all of ``df`` if ``keys`` has a row, else none."""
    if not columns:
        return df.join(keys.select(F.lit(1).alias("__k")).limit(1), how="left_semi")
    renamed = keys.select(*[F.col(f"`{c}`").alias(f"__k{i}") for i, c in enumerate(columns)])
    cond = reduce(lambda a, b: a & b, [df[f"`{c}`"].eqNullSafe(renamed[f"__k{i}"]) for i, c in enumerate(columns)])
    return df.join(renamed, cond, "left_semi")


#: ranges a skipping filter cuts the keys into, and the most keys it collects (beyond: no filter)
SKIP_RANGES = 16
SKIP_KEYS = 100_000
#: stored rows below which a skipping filter is not worth its job (a row group holds ~10⁵-10⁶ rows)
SKIP_MIN_ROWS = 1_000_000


def skipping_filter(keys: DataFrame, column: str) -> Column | None:
    """A filter on ``column`` the Parquet reader evaluates against row-group and page statistics: the
    keys' distinct values, sorted, cut into at most SKIP_RANGES ranges at their widest gaps (numbers and
    dates; other types in equal runs). A relation whose layers are sorted by ``column`` (base layers
    are sorted by their key) then skips the row groups no key falls in, where a semi-join would read
    them all; new keys past the largest and deleted old ones are two ranges. One small job; None
    when there are more than SKIP_KEYS keys (no filter). A NULL key keeps the NULL rows."""
    c = F.col(f"`{column}`")
    values = [r[0] for r in keys.select(c.alias("k")).distinct().limit(SKIP_KEYS + 2).collect()]
    if len(values) > SKIP_KEYS + 1:
        return None
    ranges = key_ranges(sorted(v for v in values if v is not None), column)  # (sorted here: no sort job)
    return ranges | c.isNull() if None in values else ranges  # restrict's semi-join is null-safe


def key_ranges(values: list, column: str) -> Column:
    """`skipping_filter`'s ranges over sorted, distinct, non-NULL ``values`` (none: nothing passes)."""
    if not values:
        return F.lit(False)
    c = F.col(f"`{column}`")
    cuts: list[int]
    if isinstance(values[0], int | float | decimal.Decimal | datetime.date):
        def gap(a, b):
            return (b - a).days if isinstance(a, datetime.date) else b - a
        widest = sorted(range(1, len(values)), key=lambda i: gap(values[i - 1], values[i]), reverse=True)
        cuts = sorted(widest[:SKIP_RANGES - 1])
    else:
        step = max(1, -(-len(values) // SKIP_RANGES))
        cuts = list(range(step, len(values), step))
    bounds = [0, *cuts, len(values)]
    ranges = [c.between(F.lit(values[a]), F.lit(values[b - 1])) for a, b in zip(bounds, bounds[1:], strict=False)]
    return reduce(lambda a, b: a | b, ranges)


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
