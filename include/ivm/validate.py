"""Validation by sampled recomputation (docs/design.md §7).

For a view's new state (staged by a run, or published), a sample of its keys is recomputed from the
base tables and compared, row by row with counts, with the state:

* the keys this run's delta touched, up to the sample size (a wrong delta shows there first);
* a uniform sample of all keys, drawn on *both* sides at once: a key is in it when a hash of its
  columns (seeded per run) falls below the sample fraction. Drawn from the state, it catches wrong and
  extra rows; drawn from the recomputation, rows the state is missing.

The recomputation is the view's full plan (ivm.maintain.recompute) restricted to those keys by one
filter on the key columns' hash (in the sampled range, or one of the touched keys' hashes). Catalyst
pushes it below projections, through joins to the side that has the key columns, and below
aggregates when the keys are the grouping columns (PushPredicateThroughNonJoin and its join
counterpart), down to the scans; where it cannot (a recursive view's fixpoint), the view is
recomputed and then filtered. A hash skips nothing in a scan, so a refresh samples a view larger than
its sample on the values of a key column its tables are sorted by, where it has one (`value_sample`):
an IN filter the Parquet reader skips row groups by, the recomputation reading the tables at the
sampled keys only. An SQL view's recomputation is its own SQL text run by Spark SQL (`SqlText`):
independent of ivm's compiled rules, so a mistake of the front end or of a rewrite, which a
recomputation from those rules shares with maintenance, shows there. Each view's sample is compared
once (`_sampled`): with its SQL text where Spark SQL runs it and SQL sees every count the state holds
(a bag's multiplicities, a set stored by presence); else — a Datalog view, a text Spark SQL cannot
run, a set whose derivation counts maintenance keeps — with the compiled rules; and with the compiled
rules as well when the text's comparison finds rows that differ, so the check says whether
maintenance or the translation of the text is wrong.

A view's own expectations (``validate.expectations``) run over its whole new state (`_on_view`), after
every run that changed it, recomputed views included.

The keys of a view are its declared ``key``, else its GROUP BY columns, else all its columns (but
its DOUBLE and FLOAT ones, when it has others). The comparison holds about twice the sample in rows and
is what Great Expectations validates (ivm.expectations); it is the only thing brought to the driver,
bounded by the sample size. DOUBLE and FLOAT values agree within the view's ``validate.tolerance``
(`reconcile`): a sum kept incrementally adds its terms in another order than a recompute does.

Validation never ends a refresh with a traceback: whatever it records is made JSON (`jsonable`), and
an unforeseen error while checking a view is that view's failed (or, under ``warn``, warned) check,
with the error's first line as its problem.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import hashlib
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DecimalType, DoubleType, FloatType, IntegralType, StringType, StructType

from ivm.aggregates import used_by
from ivm.config import COUNT_COLUMN
from ivm.errors import IvmError, one_line
from ivm.expectations import EXPECTED, STAGED
from ivm.ir import GroupBy, Program, Var
from ivm.lang.sql import union_in_recursion
from ivm.spark import adaptive, side_session
from ivm.storage import Scratch
from ivm.vocabulary import Form, Outcome
from ivm.zset import (
    VALUES_ON_DRIVER,
    as_used,
    at_values,
    consolidate,
    expand,
    one_partition,
    quote,
    restrict,
    small_change,
    sql_literal,
    union_all,
)

if TYPE_CHECKING:
    import pandas as pd

    from ivm.context import RunContext

log = logging.getLogger(__name__)

#: the hash sample's resolution: fractions are multiples of 1 / BUCKETS
BUCKETS = 1_000_000
#: rows of the comparison brought to the driver, per key asked for (each side's row of a key, with slack)
ROWS_PER_KEY = 4


def jsonable(v):
    """A value of a comparison row (pandas, numpy, or Spark's Python types) as JSON holds it: dates and
    timestamps in ISO 8601, DECIMAL as its exact text, binary as base64, arrays and structs as lists and
    objects, NULL and NaN as null; anything else as its text.

    >>> jsonable({"d": dt.date(1998, 9, 2), "x": decimal.Decimal("1.10"), "b": b"ok", "n": float("nan")})
    {'d': '1998-09-02', 'x': '1.10', 'b': 'b2s=', 'n': None}
    """
    if hasattr(v, "asDict"):  # a struct (pyspark Row)
        v = v.asDict(recursive=False)
    elif hasattr(v, "tolist"):  # numpy scalars and arrays
        v = v.tolist()
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) else v if math.isfinite(v) else str(v)
    if isinstance(v, dt.date | dt.datetime | dt.time):  # (pandas' Timestamp is a datetime)
        return None if str(v) == "NaT" else v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [jsonable(x) for x in v]
    return None if str(v) in ("NaT", "<NA>") else str(v)


def close(a, b, tolerance: float) -> bool:
    """Whether two DOUBLE/FLOAT values agree: both NULL (or NaN), or |a − b| ≤ tolerance × max(1, |a|, |b|).

    >>> close(0.1 + 0.2, 0.3, 1e-9), close(1e-12, 0.0, 1e-9), close(1.0, 1.001, 1e-9), close(None, 0.0, 1e-9)
    (True, True, False, False)
    """
    a, b = jsonable(a), jsonable(b)
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def reconcile(rows: pd.DataFrame, floats: Sequence[str], tolerance: float) -> pd.DataFrame:
    """The comparison with rows that differ only in DOUBLE/FLOAT columns, within ``tolerance``, taken
    for one: each unit of a row the state holds beyond the recomputation is matched with a unit of a
    row the recomputation holds beyond the state, equal in every other column and `close` in the
    floating ones; the match moves that recomputed count onto the state's row (a row left with no
    count on either side goes). Exact columns group the candidates; the frame is bounded by the sample."""
    if not floats or rows.empty:
        return rows
    diff = rows[STAGED] - rows[EXPECTED]
    off = rows.index[diff != 0]
    if len(off) == 0:
        return rows
    rows = rows.copy()
    exact = [c for c in rows.columns if c not in floats and c not in (STAGED, EXPECTED)]
    groups: dict[tuple, tuple[list, list]] = defaultdict(lambda: ([], []))
    for i in off:
        group = tuple(repr(jsonable(rows.at[i, c])) for c in exact)
        groups[group][0 if diff[i] > 0 else 1].append(i)
    gone = []
    for surplus, deficit in groups.values():
        for i in surplus:
            for j in deficit:
                need, spare = rows.at[i, STAGED] - rows.at[i, EXPECTED], rows.at[j, EXPECTED] - rows.at[j, STAGED]
                if need <= 0:
                    break
                if spare > 0 and all(close(rows.at[i, c], rows.at[j, c], tolerance) for c in floats):
                    n = min(need, spare)
                    rows.at[i, EXPECTED] += n
                    rows.at[j, EXPECTED] -= n
                    if rows.at[j, STAGED] == 0 and rows.at[j, EXPECTED] == 0:
                        gone.append(j)
    return rows.drop(index=gone)


def floating(schema: StructType) -> list[str]:
    """The DOUBLE and FLOAT columns of a schema (compared within a tolerance)."""
    return [f.name for f in schema.fields if isinstance(f.dataType, DoubleType | FloatType)]


@dataclass
class Comparison:
    """A view's sampled comparison: the rows (view columns, ``__staged``, ``__expected`` counts; 0 where
    a side lacks the row) as a pandas frame, and what was asked for. The rows are reconciled
    (`reconcile`) on the ``floats`` columns within ``tolerance`` before the mismatches are found."""

    view: str
    keys: list[str]
    sample: int
    touched: int
    rows: pd.DataFrame
    truncated: bool
    seconds: float = 0.0
    floats: Sequence[str] = ()
    tolerance: float = 0.0
    mismatches: pd.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.rows = reconcile(self.rows, self.floats, self.tolerance)
        self.mismatches = self.rows[self.rows[STAGED] != self.rows[EXPECTED]]

    def examples(self, limit: int = 10) -> list[dict]:
        """The first mismatching rows: the row's columns, its count in the state and in the recomputation."""
        out = []
        for rec in self.mismatches.head(limit).to_dict("records"):
            row = {k: jsonable(v) for k, v in rec.items() if k not in (STAGED, EXPECTED)}
            out.append({"row": row, "staged": int(rec[STAGED]), "expected": int(rec[EXPECTED])})
        return out

    def describe(self, limit: int = 3) -> str:
        """The mismatches in one line: how many, and the first rows with both counts."""
        shown = "; ".join(f"{_row(e['row'])} has count {e['staged']}, recomputed {e['expected']}"
                          for e in self.examples(limit))
        more = len(self.mismatches) - min(limit, len(self.mismatches))
        return f"{len(self.mismatches)} of {len(self.rows)} sampled rows differ from the recomputation: {shown}" + (
            f" (and {more} more)" if more > 0 else "")


def _row(row: dict) -> str:
    return "(" + ", ".join(f"{k}={v!r}" for k, v in row.items()) + ")"


def key_columns(program: Program, view: str, declared: Sequence[str] | None, floats: Sequence[str] = ()) -> list[str]:
    """The columns a view's sample is drawn on: its declared key, else its GROUP BY columns (the
    grouping variables in the head of its one aggregate rule), else all its columns but ``floats``
    (its DOUBLE/FLOAT ones, whose rounding would put the state's and the recomputation's row of one key
    in different samples) unless they are all it has."""
    if declared:
        return list(declared)
    columns = program.predicates[view].columns
    rules = program.rules_for(view)
    if len(rules) == 1:
        groups = [item for item in rules[0].body if isinstance(item, GroupBy)]
        if len(groups) == 1 and groups[0].by:
            by = {v.name for v in groups[0].by}
            keys = [c for c, a in zip(columns, rules[0].head.args, strict=True) if isinstance(a, Var) and a.name in by]
            if len(keys) == len(by):
                return keys
    return [c for c in columns if c not in floats] or list(columns)


@dataclass
class KeySample:
    """Which keys of a view are checked: those whose seeded hash falls in the first ``fraction`` of the
    hash range, and those whose hash is one of ``touched`` (the hashes of the keys a run touched)."""

    keys: list[str]
    fraction: float
    seed: int
    touched: list[int] = field(default_factory=list)

    def hash(self):
        return F.xxhash64(*[F.col(f"`{k}`") for k in self.keys], F.lit(self.seed))

    def restrict(self, df: DataFrame) -> DataFrame:
        """The rows of ``df`` (the state or the recomputation) whose keys are in the sample: one
        deterministic filter over the key columns, the same on both sides (a key that shares a touched
        key's hash is simply sampled too), which Catalyst can push towards the scans."""
        h = self.hash()
        cond = F.pmod(h, F.lit(BUCKETS)) < int(round(self.fraction * BUCKETS))
        if self.touched:
            cond = cond | h.isin(self.touched)
        return df.where(cond)


def key_sample(keys: list[str], sample: int, rows_estimate: int, touched: DataFrame | None, seed: int) -> KeySample:
    """About ``sample`` keys by hash, out of about ``rows_estimate``, plus up to ``sample`` of the keys
    in ``touched`` (e.g. the run's delta of the view): their hashes, at most ``sample`` numbers, are
    brought to the driver to become part of the filter."""
    ks = KeySample(keys, min(1.0, sample / max(1, rows_estimate)), seed)
    if touched is not None and sample > 0:
        ks.touched = sorted(r[0] for r in touched.select(ks.hash()).distinct().limit(sample).collect())
    return ks


@dataclass
class ValueSample:
    """A refresh's sample of a view whose key has a column a table's layers are sorted by (`value_sample`):
    the rows whose ``keys[0]`` holds one of ``values`` — the run's ``touched`` values and a draw from the
    state —, or NULL where ``nulls``. Its filter is an IN list with the values' ranges (`zset.at_values`),
    which Catalyst carries through the recomputation's aggregates and, by the join's equalities, to every
    table the column comes from, where the Parquet reader skips the row groups between the values."""

    keys: list[str]
    values: list
    nulls: bool
    touched: list = field(default_factory=list)

    def restrict(self, df: DataFrame) -> DataFrame:
        return at_values(df, self.keys[0], self.values, self.nulls)


#: the key column types whose values `value_sample` carries in its filter (`zset.at_values`)
_SAMPLED_TYPES = (IntegralType, StringType, DateType, DecimalType)


def value_sample(ctx: RunContext, st: ViewState, keys: list[str], changed: dict[str, str], staged: DataFrame,
                 sample: int, seed: int) -> ValueSample | None:
    """A refresh's sample of a view larger than its sample, drawn on one key column whose values come from a
    table's clustering column (`Program.origins`; base layers are sorted by it): the values the run's change
    holds there — up to ``sample`` from the view's delta and as many from the changed tables' deltas at that
    column, read on the driver (a seeded draw where there are more) — and a block of about ``sample``
    consecutive values of the state from a seeded start (`_block`). None where no key column qualifies, the
    view is within its sample (the hash sample then checks every key on both sides) or the driver cannot read
    a delta's values (`Warehouse.distinct_values`).

    Unlike the hash sample, which reads every table whole, its recomputation reads the tables at the sampled
    values only; what it gives up is the recomputation's side of the uniform draw — a key missing from the
    state that no change of this run touched is not looked for (`ivm validate` draws on both sides) — and
    the spread of a uniform draw: the state's part is one range of keys, another each run."""
    if st.rows <= sample:
        return None
    program, _ = ctx.program
    schema = ctx.schema(st.view)
    origins = {k: program.origins(st.view, k) for k in keys if isinstance(schema[k].dataType, _SAMPLED_TYPES)}
    sorted_by = {k: sum(ctx.cluster_columns(t)[:1] == [c] for t, c in cols) for k, cols in origins.items()}
    column = max(sorted_by, key=sorted_by.get, default=None)  # (the first key of the most tables)
    if column is None or not sorted_by[column]:
        return None
    # the run's values: up to ``sample`` of the view delta's (where a wrong delta shows) and up to ``sample``
    # of the changed tables' at the column (where a row the delta missed would be), a seeded draw of each
    draw = random.Random(seed)
    touched: list = []
    nulls = False
    for sources in [[([st.delta], column)] if st.delta else [],
                    [([changed[t]], c) for t, c in sorted(origins[column]) if t in changed]]:
        found: set = set()
        for paths, c in sources:
            values = ctx.warehouse.distinct_values(paths, c, limit=VALUES_ON_DRIVER)
            if values is None:
                return None
            found.update(values[0])
            nulls = nulls or values[1]
        found -= set(touched)
        touched += draw.sample(sorted(found), sample) if len(found) > sample else sorted(found)
    drawn = _block(ctx, st, column, staged, sample, draw)
    nulls = nulls or any(v is None for v in drawn)
    values = sorted({*touched, *(v for v in drawn if v is not None)})
    return ValueSample([column], values, nulls, touched)


def _block(ctx: RunContext, st: ViewState, column: str, staged: DataFrame, sample: int, draw: random.Random) -> list:
    """About ``sample`` values of ``column`` in the state: the first ``sample`` from a seeded random start
    between its lowest and highest value (the layers' Parquet statistics, no Spark job; the values below the
    start make up the number where fewer lie above it), so they are one
    range of the tables' sort order, whose row groups alone the recomputation reads (a block sample, as
    TABLESAMPLE by blocks; values spread by a hash would leave no row group to skip); a string column, or
    one without statistics, by a seeded hash of the column. One Spark job over the state either way."""
    c = F.col(quote(column))
    bounds = ctx.warehouse.column_range(st.paths, column)
    start = None
    if bounds is not None:
        low, high = bounds
        share = draw.random() * max(0.0, 1.0 - sample / st.rows)
        if isinstance(low, dt.date) and not isinstance(low, dt.datetime):
            start = low + dt.timedelta(days=int((high - low).days * share))
        elif isinstance(low, int) and not isinstance(low, bool):
            start = low + int((high - low) * share)
        elif isinstance(low, decimal.Decimal):
            start = low + (high - low) * decimal.Decimal(repr(share))
    if start is None:  # (twice the share: a draw of a few keys seldom falls short of ``sample``)
        fraction = min(1.0, 2 * sample / st.rows)
        hashed = KeySample([column], fraction, draw.randrange(1 << 31)).restrict(staged.select(c))
        return [r[0] for r in hashed.distinct().limit(sample).collect()]
    # (from the start up, and as many below it for a start in a gap of the keys or near the highest: one job)
    at = F.expr(sql_literal(start))
    keys = staged.select(c).distinct()
    up = keys.where(c >= at).orderBy(c).limit(sample)
    down = keys.where(c < at).orderBy(c.desc()).limit(sample)
    found = [r[0] for r in up.unionByName(down).collect()]
    above = sorted(v for v in found if v >= start)
    return above + sorted((v for v in found if v < start), reverse=True)[:max(0, sample - len(above))]


def compare(staged: DataFrame, expected: DataFrame, view: str, ks: KeySample | ValueSample, sample: int,
            tolerance: float = 0.0) -> Comparison:
    """Compare the consolidated Z-sets ``staged`` (the view's state) and ``expected`` (its
    recomputation, unrestricted) on the keys of ``ks``: one Spark job, its result on the driver, where
    DOUBLE/FLOAT columns agree within ``tolerance`` (`reconcile`)."""
    started = time.perf_counter()
    columns = [F.col(f"`{c}`") for c in staged.columns if c != COUNT_COLUMN]
    zero = F.lit(0).cast("long")
    s = ks.restrict(staged).select(*columns, F.col(COUNT_COLUMN).alias(STAGED), zero.alias(EXPECTED))
    e = ks.restrict(expected).select(*columns, zero.alias(STAGED), F.col(COUNT_COLUMN).alias(EXPECTED))
    both = (s.unionByName(e).groupBy(*columns)
             .agg(F.sum(STAGED).cast("long").alias(STAGED), F.sum(EXPECTED).cast("long").alias(EXPECTED)))
    cap = ROWS_PER_KEY * (sample + len(ks.touched)) + 100
    # the mismatches first, so a truncated comparison still holds them
    rows = both.orderBy((F.col(STAGED) == F.col(EXPECTED)).asc()).limit(cap + 1).toPandas()
    truncated = len(rows) > cap
    if truncated:
        log.warning("validate: %s: the comparison has more than %d rows; checked the first %d", view, cap, cap)
        rows = rows.head(cap)
    return Comparison(view, ks.keys, sample, len(ks.touched), rows, truncated, time.perf_counter() - started,
                      floating(staged.schema), tolerance)


# -- checking views: the validate stage of a run, and `ivm validate` ------------------------------------


@dataclass
class ViewState:
    """A view's state to check: its layers (staged or published), their rows (an upper bound of the
    state's), and the run's delta layer of it, whose keys are checked first."""

    view: str
    paths: list[str]
    rows: int
    delta: str | None = None
    #: counts (derivation counts, compared with the recomputation's) or presence (each tuple once)
    form: str = Form.COUNTS
    #: rows of the delta layer
    delta_rows: int = 0
    #: a full recompute (a first materialization): no sampled comparison — it is its own recomputation —
    #: only the view's expectations over its state
    recompute: bool = False


@dataclass
class ViewCheck:
    view: str
    status: str  # passed | failed | warned
    sample: int
    problem: str | None = None
    comparison: Comparison | None = None
    #: an SQL view's sampled comparison with its own SQL text run by Spark SQL (None: not an SQL view, or
    #: Spark SQL cannot run it: `sql_note` says why); `comparison` is the one with ivm's compiled rules
    #: (None: the text's comparison was enough, `_sampled`)
    sql_comparison: Comparison | None = None
    sql_note: str | None = None
    expectations: list[dict] = field(default_factory=list)
    report_uri: str | None = None
    seconds: float = 0.0

    @property
    def sampled(self) -> Comparison | None:
        """The sample's comparison (with the compiled rules if they were compared, else with the SQL
        text): its keys, its rows — what Great Expectations validates."""
        return self.comparison if self.comparison is not None else self.sql_comparison

    @property
    def rows(self) -> int:
        """Rows of the sample's comparison (0: none was made)."""
        return len(self.sampled.rows) if self.sampled is not None else 0

    def summary(self) -> dict:
        """What the catalog keeps of the check (ivm_validations.summary): ``against`` names what the sample
        was compared with, ``mismatches`` the rows that differ from the compiled rules, ``sql`` from the
        SQL text."""
        c, q, s = self.comparison, self.sql_comparison, self.sampled
        return jsonable({"problem": self.problem, "sample": self.sample, "seconds": round(self.seconds, 3),
                         "keys": s.keys if s else [], "touched": s.touched if s else 0,
                         "rows": self.rows, "truncated": s.truncated if s else False,
                         "against": [what for what, x in [("rules", c), ("sql", q)] if x is not None],
                         "mismatches": c.examples() if c else [],
                         "sql": ({"rows": len(q.rows), "mismatches": len(q.mismatches), "examples": q.examples()} if q
                                 else {"note": self.sql_note} if self.sql_note else None),
                         "expectations": self.expectations})

    @property
    def mismatches(self) -> int:
        """Rows that differ: the most either comparison found (against the compiled rules, against the
        view's SQL text; mostly the same rows)."""
        return max([len(c.mismatches) for c in (self.comparison, self.sql_comparison) if c is not None], default=0)


def _zset(ctx: RunContext, spark: SparkSession, name: str, paths: list[str]) -> DataFrame:
    """Relation ``name`` held in the layers at ``paths``, consolidated, read anew (what is on disk)."""
    return consolidate(ctx.warehouse.read_layers(spark, paths, ctx.schema(name), reuse=False))


def _as_sql(ctx: RunContext, spark: SparkSession, name: str, paths: list[str]) -> DataFrame:
    """Relation ``name`` held in the layers at ``paths`` as SQL returns it (as `RunContext.read_state`
    does for the published state): bag rows repeated, set rows once, no counts."""

    return expand(as_used(ctx.program[0].predicates[name], _zset(ctx, spark, name, paths)))


def negative_counts(ctx: RunContext, states: list[ViewState]) -> dict[str, str]:
    """No tuple a run changed may end with a count below zero (a delta deleting what was not there):
    for all views in one Spark job over their changed tuples only (one stage when the deltas are a small
    change: `spark.single_partition_rows`; a view whose layers hold at most that many rows too is read
    whole into that stage, where restricting it to the delta's tuples first would broadcast them in a
    job of their own). The layers are listed anew (`Warehouse.read_layers`): what is on disk is
    checked. View -> its first bad tuple."""
    checks = []
    limit = ctx.config.spark.single_partition_rows
    small = small_change(sum(st.delta_rows for st in states if st.delta), limit)
    for st in states:
        if st.delta is None:
            continue
        schema = ctx.schema(st.view)
        delta = ctx.warehouse.read_layers(ctx.spark, [st.delta], schema, reuse=False)
        cols = [c for c in delta.columns if c != COUNT_COLUMN]
        tuple_ = [F.col(f"`{c}`") for c in cols]
        new = ctx.warehouse.read_layers(ctx.spark, st.paths, schema, reuse=False)
        if small and small_change(st.rows, limit):
            # the view's counts, each tuple marked whether the delta holds it, in the one partition
            both = one_partition(new.select("*", F.lit(False).alias("__changed")).unionByName(
                delta.select(*tuple_, F.lit(0).cast("long").alias(COUNT_COLUMN), F.lit(True).alias("__changed"))))
            counts = both.groupBy(*tuple_).agg(
                F.sum(COUNT_COLUMN).alias(COUNT_COLUMN), F.max("__changed").alias("__changed")).where("__changed")
        else:  # (a semi-join needs no distinct keys: no shuffle of the delta for them)
            counts = consolidate(restrict(new, delta.select(*tuple_), cols, small), cols)
        checks.append(counts.where(F.col(COUNT_COLUMN) < 0).limit(1).select(
            F.lit(st.view).alias("view"), F.to_json(F.struct(*tuple_)).alias("row"), F.col(COUNT_COLUMN)))
    if not checks:
        return {}
    with adaptive(ctx.spark, not small):  # (a small change's one-partition plan: ivm.spark.adaptive)
        rows = union_all(checks).collect()  # at most one row per view
    return {r["view"]: f"tuple {r['row']} would have count {r[COUNT_COLUMN]}" for r in rows}


def check_views(ctx: RunContext, run_id: str, states: list[ViewState], tables: dict[str, list[str]],
                sample: int | None = None, progress: Callable[[str], None] = lambda _: None,
                changed: dict[str, str] | None = None) -> list[ViewCheck]:
    """Check each view's state: no negative counts among the tuples its delta changed, and (unless its
    sample is 0) its sampled comparison with the recomputation from ``tables`` (table -> the layers of
    its state at the same snapshot), validated by its Great Expectations suite. Each result goes to
    the catalog (ivm_validations) with the view's policy applied: failed, or warned under ``warn``.
    ``sample`` overrides the views' ``validate.sample``. ``changed`` (a refresh's: table -> the delta
    layer its run wrote) lets a view's sample be drawn on a column the tables are sorted by
    (`value_sample`); without it (`ivm validate`) every sample is the hash sample. An error of the
    checking itself (not a problem of the project, which stays an IvmError) is the view's problem, in
    one line."""
    from ivm.maintain.recompute import Evaluator

    program, strata = ctx.program
    scratch = Scratch(ctx.warehouse, ctx.spark, f"{run_id}/validate")
    try:
        negative, broken = negative_counts(ctx, states), None
    except IvmError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the check is the views' failed validation
        log.warning("validate: the negative-count check could not run", exc_info=True)
        negative, broken = {}, f"the negative-count check could not run: {one_line(e)}"
    seed = int(hashlib.sha1(run_id.encode()).hexdigest()[:8], 16)

    @functools.cache
    def full() -> Evaluator:  # the recomputation, built for the first view that samples
        return Evaluator(program, strata, {t: _zset(ctx, ctx.spark, t, paths) for t, paths in tables.items()},
                         scratch=scratch, limits=ctx.max_iterations)

    sql = SqlText(ctx, tables, {st.view: st.paths for st in states})
    sampled = functools.partial(_sampled, full=full, seed=seed, sql=sql, changed=changed or {})
    checks = []
    for st in states:
        started = time.perf_counter()
        config = ctx.config.views[st.view]
        n = config.validate_.sample if sample is None else sample
        check = ViewCheck(st.view, Outcome.PASSED, 0 if st.recompute else n, negative.get(st.view, broken))
        for what, step, wanted in [("the sampled recomputation", sampled, n > 0 and not st.recompute),
                                   ("the view's expectations", _on_view, bool(config.validate_.expectations))]:
            if not wanted:
                continue
            try:
                step(ctx, run_id, st, check)
            except IvmError:
                raise
            except Exception as e:  # noqa: BLE001 - as above: one line, the view's failed validation
                log.warning("validate: %s: %s could not run", st.view, what, exc_info=True)
                check.problem = "; ".join(filter(None, [check.problem, f"{what} could not run: {one_line(e)}"]))
        if check.problem is not None:
            check.status = Outcome.WARNED if config.validate_.policy == "warn" else Outcome.FAILED
        check.seconds = time.perf_counter() - started
        c = check.sampled
        ctx.catalog.save_validation(run_id, st.view, check.rows, check.mismatches,
                                    check.status, check.report_uri, check.summary())
        met = f"{sum(r['success'] for r in check.expectations)}/{len(check.expectations)} expectations met"
        progress(f"validate: {st.view}: {check.status}"
                 + (f", {check.rows} sampled rows ({c.touched} touched keys) against the recomputation, {met}"
                    if c else f", a full recompute: {met} over its state" if st.recompute
                    else ", no sampled recomputation (sample 0)" if n == 0 else "")
                 + (f": {check.problem}" if check.problem else "") + f" ({check.seconds:.2f} s)")
        checks.append(check)
    return checks


def _sampled(ctx: RunContext, run_id: str, st: ViewState, check: ViewCheck, full: Callable, seed: int,
             sql: SqlText, changed: dict[str, str]) -> None:
    """A view's sampled comparison with the recomputation — an SQL view's own SQL text (``sql``), or the
    compiled rules (``full()``: the evaluator over the tables' states), or both (the module's docstring
    says when) — and its Great Expectations suite, into ``check``: on the values of a column the tables
    are sorted by where a refresh's change allows (`value_sample`), else on the hash of its keys
    (`key_sample`)."""
    from ivm.expectations import run_suite

    program, _ = ctx.program
    config = ctx.config.views[st.view]
    schema = ctx.schema(st.view)
    # (as the negative-count check, the comparison lists the layers' files anew: what is on disk)
    staged = _zset(ctx, ctx.spark, st.view, st.paths)
    keys = key_columns(program, st.view, config.key, floating(schema))
    ks = value_sample(ctx, st, keys, changed, staged, check.sample, seed) if changed else None
    if ks is None:
        touched = ctx.warehouse.read_layers(ctx.spark, [st.delta], schema, reuse=False) if st.delta else None
        ks = key_sample(keys, check.sample, st.rows, touched, seed)
    # One comparison per view (the performance issue's item 4: each costs a recomputation at the sampled
    # keys): its SQL text where Spark SQL runs it and SQL sees every count the state holds; the compiled
    # rules where it does not, and beside a text that finds a difference (which side is wrong).
    sql_sees_counts = program.predicates[st.view].semantics == "bag" or st.form == Form.PRESENCE
    q = sql.compare(st.view, ks, check) if config.sql is not None else None
    if q is None or not sql_sees_counts or len(q.mismatches):
        expected = full().relation(st.view)
        if st.form == Form.PRESENCE:  # stored without counts: each tuple once
            expected = as_used(program.predicates[st.view], expected)
        check.comparison = compare(staged, expected, st.view, ks, check.sample, config.validate_.tolerance)
    suite = run_suite(ctx.warehouse.uri, run_id, st.view, check.sampled.rows, config.key)
    check.expectations, check.report_uri = [{**r, "on": "sample"} for r in suite.results], suite.report_uri
    differ = [what + x.describe() for what, x in [("", check.comparison), ("against its SQL text (Spark SQL): ", q)]
              if x is not None and len(x.mismatches)]
    if differ:
        check.problem = "; ".join(filter(None, [check.problem, *differ]))
    else:
        _failed_expectations(check, suite.results)


class SqlText:
    """An SQL view's rows as its own SQL text returns them, run by Spark SQL — not through ivm's
    compiled rules, so a mistake of the front end or of a rewrite shows as a difference (#45, item 3).
    The tables (their states at the run's snapshot, as SQL sees them) and the SQL views it reads (their
    own SQL texts) are temporary views of a Spark session of its own (`ivm.spark.side_session`: the
    same cluster, its own temporary views, so no name of the user's session is shadowed). A view that
    reads a Datalog view, or whose text Spark SQL cannot run (a recursive CTE with UNION, which Spark
    runs with UNION ALL only; a user-defined aggregate), is compared with the compiled rules alone, and
    the check says so."""

    def __init__(self, ctx: RunContext, tables: dict[str, list[str]], views: dict[str, list[str]]):
        #: the tables' layers at the snapshot, and the checked views' (their new states)
        self.ctx, self.tables, self.views = ctx, tables, views
        self._session = None
        self._registered: set[str] = set()

    @property
    def session(self):
        from ivm.aggregates import register

        if self._session is None:
            self._session = side_session(self.ctx.spark)
            register(self._session, self.ctx.config.aggregates)
        return self._session

    def _register(self, name: str) -> None:
        """Table ``name``'s state, or SQL view ``name`` by its text, as the session's temporary view."""
        if name in self._registered:
            return
        if name in self.ctx.config.tables:
            _as_sql(self.ctx, self.session, name, self.tables[name]).createOrReplaceTempView(name)
        else:
            self.session.sql(self.ctx.config.views[name].sql).createOrReplaceTempView(name)
        self._registered.add(name)

    def relation(self, view: str) -> DataFrame | str:
        """The view as a Z-set of its SQL text's multiplicities, in the state's columns and types; or
        why its text is not run."""
        _, strata = self.ctx.program
        config = self.ctx.config
        # (the tables and views it reads; auxiliary predicates of ivm's rules are no business of its text)
        read = sorted((r for r in strata.upstream(view) if r != view and (r in config.tables or r in config.views)),
                      key=lambda r: strata.stratum_of[r])
        datalog = [r for r in read if r in config.views and config.views[r].sql is None]
        if datalog:
            return f"it reads the Datalog view {datalog[0]}"
        missing = [r for r in read if r in config.tables and r not in self.tables]
        if missing:
            return f"the state of {missing[0]} is not at hand"
        udas = [a for r in [view, *read] if r in config.views for a in used_by(config.aggregates, config.views[r].sql)]
        if udas:  # (asked first: Spark's analysis error would be logged whole before it is caught)
            return f"it calls the user-defined aggregate {udas[0]}, which Spark SQL does not know"
        recursive = next(((r, cte) for r in [view, *read] if r in config.views
                          if (cte := union_in_recursion(config.views[r].sql))), None)
        if recursive:  # (likewise)
            return (f"Spark SQL cannot run its text: {recursive[0]}'s recursive CTE {recursive[1]} combines with "
                    "UNION, which Spark SQL runs with UNION ALL only")
        schema = self.ctx.schema(view)
        names = [f.name for f in schema.fields if f.name != COUNT_COLUMN]
        try:
            for r in read:
                self._register(r)
            rows = self.session.sql(config.views[view].sql)
        except Exception as e:  # noqa: BLE001 - Spark's analysis errors differ by version: one line each way
            return f"Spark SQL cannot run its text ({one_line(e)})"
        if len(rows.columns) != len(names):
            return f"its text returns {len(rows.columns)} columns, its state holds {len(names)}"
        typed = rows.select(*[F.col(f"`{c}`").cast(schema[n].dataType).alias(n)
                              for c, n in zip(rows.columns, names, strict=True)])
        return typed.groupBy(*[F.col(f"`{n}`") for n in names]).agg(F.count(F.lit(1)).alias(COUNT_COLUMN))

    def compare(self, view: str, ks: KeySample | ValueSample, check: ViewCheck) -> Comparison | None:
        """The sampled comparison of the view's state (as SQL sees it: its counts as used) with its SQL
        text, into ``check`` and returned; None (and the check's ``sql_note``) when the text is not run."""

        expected = self.relation(view)
        if isinstance(expected, str):
            check.sql_note = f"compared with ivm's compiled rules only: {expected}"
            log.info("validate: %s: %s", view, check.sql_note)
            return None
        state = as_used(self.ctx.program[0].predicates[view], _zset(self.ctx, self.session, view, self.views[view]))
        check.sql_comparison = compare(state, expected, view, ks, check.sample,
                                       self.ctx.config.views[view].validate_.tolerance)
        return check.sql_comparison


def _on_view(ctx: RunContext, run_id: str, st: ViewState, check: ViewCheck) -> None:
    """The project's expectations of the view over its whole new state as SQL returns it (GE's Spark
    engine: ivm.expectations.run_on_view), into ``check``: what the run publishes, maintained or
    recomputed."""
    from ivm.expectations import run_on_view

    suite = run_on_view(ctx.warehouse.uri, run_id, st.view, _as_sql(ctx, ctx.spark, st.view, st.paths),
                        [e.model_dump() for e in ctx.config.views[st.view].validate_.expectations])
    check.expectations += [{**r, "on": "view"} for r in suite.results]
    check.report_uri = check.report_uri or suite.report_uri
    _failed_expectations(check, suite.results)


def _failed_expectations(check: ViewCheck, results: list[dict]) -> None:
    """The first failed expectations of ``results`` as the check's problem, unless it has one."""
    failed = [r for r in results if not r["success"]]
    if failed and check.problem is None:
        check.problem = "expectation " + "; ".join(
            f"{r['expectation']}"
            f"({', '.join(f'{k}={v}' for k, v in r['kwargs'].items() if k.startswith('column'))})"
            f" failed for {r['unexpected'] if r['unexpected'] is not None else r['observed']} rows"
            for r in failed[:3])
