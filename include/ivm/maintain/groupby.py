"""Stored state of a GROUPBY subgoal, so 000 Algorithm 6.1 computes a group's new tuple from its old one.

A GROUPBY subgoal ``GROUPBY(U, Ȳ, Z̄ = ...)`` (000 §6.2) denotes a relation T with one tuple per group.
Algorithm 6.1 computes, for every group ȳ touched by Δ(U), the new tuple T_ȳᵛ "incrementally from T_ȳ
(old) and Δ(U)" and emits (T_ȳ, -1) and (T_ȳᵛ, +1) when they differ. To do that without reading U,
each GROUPBY subgoal keeps a state relation: per group its row count ``__rows`` and, per aggregate, the
incrementally computable functions it decomposes into (§6.2: "AVERAGE and VARIANCE ... can be
decomposed into incrementally computable functions"):

    COUNT(*)                         __rows
    COUNT(x)                         n (non-NULL values)
    SUM(x), AVG(x)                   n, s = Σ x
    VARIANCE/STDDEV (samp and pop)   n, s = Σ x, q = Σ x²          (as doubles)
    MIN(x), MAX(x)                   n, m (the current extreme)
    a user's inductive aggregate     st: its state (001 §2; ivm.ir.Inductive): the inserted values'
                                     state is merged in, and each deleted value retracted; without
                                     ``retract`` a group a delete touches is recomputed from U
    COUNT/SUM/AVG(DISTINCT x)        n, s over the distinct values, from an auxiliary relation of
                                     counts per (group, x): a value counts while its count is positive
    anything else (percentiles,      nothing: "not incrementally computable" (§6.2), so the touched
    mode, user-defined aggregates)   groups are recomputed from Uᵛ restricted to them; U is a relation the
                                     view stores (CReaM's auxiliary view when the subgoal reads a table,
                                     ivm.maintain.cream), so no table is read

Each state row also holds T's values (one column per aggregate, named by its variable) as they were
emitted, so the (T_ȳ, -1) of a later refresh cancels that tuple exactly, whatever the floating-point
rounding of an incremental formula.

MIN and MAX are incremental on insertion (the new extreme is the least of the old one and the inserted
values); a group is recomputed from Uᵛ only when a deleted value is at or beyond its current extreme.
The state is itself a Z-set relation: a refresh appends, per touched group, the old state row with
count -1 and the new one with +1, so Δ(T) is ``finalize`` applied to that state delta (unchanged
groups cancel when consolidated). A global aggregate (no grouping columns) always has its one row, as
SQL returns one row for an aggregate over no rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from ivm.config import COUNT_COLUMN
from ivm.ir import Aggregate, GroupBy, Program
from ivm.ir import aggregate_kind as kind
from ivm.zset import consolidate, expand, one_partition, quote, restrict

C = COUNT_COLUMN
ROWS = "__rows"


def _expr(sql: str, name: str) -> Column:
    """A SQL expression named ``name``: parsed by the JVM in one call."""
    return F.expr(sql).alias(name)


def describe(a: Aggregate) -> str:
    """One line for `ivm explain`: how Algorithm 6.1 computes this aggregate's new value."""
    how = {
        "star": "COUNT(*) from the stored row count",
        "count": "from the stored count of non-NULL values",
        "sum": "from the stored sum and count",
        "avg": "from the stored sum and count",
        "variance": "from the stored count, sum and sum of squares",
        "min": "incremental on insert; the group is recomputed when its current minimum is deleted",
        "max": "incremental on insert; the group is recomputed when its current maximum is deleted",
        "distinct": "from an auxiliary count per (group, value): a value counts while its count is positive",
        "inductive": "from its stored state (001 §2): the inserted values' state merged in, each deleted value "
                     "retracted",
        "inductive_insert": "from its stored state on insert (merged in); a group with a deleted value is "
                            "recomputed from its stored values (no retract declared)",
        "recompute": "not distributive: recomputed for the touched groups only, from their stored multisets "
                     "(the GROUP BY's input, or CReaM's auxiliary view over a table, 001 §4)",
    }[kind(a)]
    if a.windows:
        return (f"window functions {', '.join(w for _, w in a.windows)}: the partitions a change touches are "
                "recomputed from their stored rows by Spark's window functions, the others kept")
    return f"{a.call()}: {how}"


def distinct_args(g: GroupBy) -> list[str]:
    """The argument variables of ``g`` that need a distinct-value relation."""
    return sorted({next(iter(a.arg.variables())) for a in g.aggregates if kind(a) == "distinct"})


def distinct_name(state: str, var: str) -> str:
    """The distinct-value relation of ``var`` beside the state relation ``state``."""
    return f"{state}__d_{var}"


@dataclass
class GroupByState:
    """The state relation of one GROUPBY subgoal (see the module docstring)."""

    name: str
    subgoal: GroupBy
    #: Spark types of T's aggregate columns, as the full evaluation produces them
    out_types: dict[str, DataType]

    #: aggregate kinds whose new value comes from the old state and Δ(U) alone, in every case
    SELF_MAINTAINABLE = frozenset({"star", "count", "sum", "avg", "variance", "inductive"})

    @staticmethod
    def self_maintainable(g: GroupBy) -> bool:
        """Whether Algorithm 6.1 maintains the subgoal without ever reading U: no MIN/MAX (a deleted
        extreme sends its group back to U), no DISTINCT (its own relation of values) and nothing that is
        not incrementally computable (recomputed from U)."""
        return all(kind(a) in GroupByState.SELF_MAINTAINABLE for a in g.aggregates)

    #: aggregate kinds whose decomposed functions are sums over U's rows weighted by their counts
    LINEAR = frozenset({"star", "count", "sum", "avg", "variance"})

    @staticmethod
    def linear(g: GroupBy) -> bool:
        """Whether every decomposed function of the subgoal is a sum of U's rows weighted by their counts,
        so its state follows from U as an unconsolidated Z-set: tuples that cancel add nothing to the sums
        (000 §3: counts add up under ⊎; a join's multiply, so its result is as linear in each input)."""
        return all(kind(a) in GroupByState.LINEAR and not a.windows for a in g.aggregates)

    @property
    def by(self) -> list[str]:
        return [v.name for v in self.subgoal.by]

    @property
    def aggregates(self) -> tuple[Aggregate, ...]:
        return self.subgoal.aggregates

    def arg(self, a: Aggregate) -> Column:
        return F.expr(str(a.arg))

    def distinct_args(self) -> list[str]:
        return distinct_args(self.subgoal)

    def distinct_name(self, var: str) -> str:
        return distinct_name(self.name, var)

    def distinct_rows(self, rows: DataFrame, var: str) -> DataFrame:
        """The (group, value) counts of ``var``'s non-NULL values behind a DISTINCT aggregate."""
        cols = [*self.by, var]
        return consolidate(rows.where(F.col(quote(var)).isNotNull()).select(*[F.col(quote(c)) for c in cols], F.col(C)),
                           cols)

    # -- full computation -----------------------------------------------------------------------------

    def full(self, rows: DataFrame, weighted: bool = False) -> DataFrame:
        """The state of every group from U's rows (variables + ``__count``, all positive; consolidated or
        not: equal rows add up in the groups either way), in one aggregation over one scan of U.

        ``weighted`` (a `linear` subgoal's): ``rows`` is U as an unconsolidated Z-set, negative counts
        included (its tables' layers as stored, ivm.maintain.recompute.Evaluator.weighted): the state is
        Algorithm 6.1's partial over all of U, as over a Δ(U) that starts from no group, and T's values
        follow from it as an incremental refresh computes them (`_value`) — no consolidation of U, no
        second pass over its rows as a bag."""
        if weighted:
            state = self._partial(rows)
            if self.by:  # a group all of whose rows cancel is no group; the global one always has its row
                state = state.where(F.col(ROWS) > 0)
            state = state.select("*", *[self._value(a).alias(a.var.name) for a in self.aggregates])
            return state.select(*[F.col(quote(b)) for b in self.by], *[F.col(quote(c)) for c in self.columns()],
                                F.lit(1).cast("long").alias(C))
        # T's values as the full evaluation computes them (Spark's own aggregates over the bag), kept in
        # the state so that a later (T_ȳ, -1) cancels exactly the tuple emitted now; and the DISTINCT
        # decompositions, over the bag too (an inductive aggregate's value is final(state), its state the
        # fold of the group's sorted values, as the full evaluation's call folds them)
        extra = [F.expr(a.call()).alias(a.var.name) for a in self.aggregates if not _inductive(a)]
        for a in self.aggregates:
            if kind(a) == "distinct":
                x = self.arg(a)
                extra += [F.count_distinct(x).cast("long").alias(f"{a.var.name}__n")]
                if a.func != "count":
                    extra.append(F.sum_distinct(x).alias(f"{a.var.name}__s"))
        # the decomposed functions over the same bag, one row each (`_partial`'s unit form: Spark computes
        # count(x), sum(x), min(x) once where T's values call them too), cast to the types Algorithm 6.1's
        # weighted sums over Δ(U) have (the plan over U analysed, no job). A partial aggregate and the
        # values apart would be two scans of U and a join (#49: a full refresh reads each input once).
        types = {f.name: f.dataType for f in self._partial(rows).schema.fields}
        bag = with_windows(expand(rows), self.aggregates)
        state = self._partial(bag, unit=True, extra=extra)
        state = state.select(*[F.col(quote(f.name)) if f.name not in types or f.dataType == types[f.name]
                               else F.col(quote(f.name)).cast(types[f.name]).alias(f.name)
                               for f in state.schema.fields])
        state = state.select("*", *[self._value(a).alias(a.var.name) for a in self.aggregates if _inductive(a)])
        return state.select(*[F.col(quote(b)) for b in self.by], *[F.col(quote(c)) for c in self.columns()],
                            F.lit(1).cast("long").alias(C))

    def columns(self) -> list[str]:
        """The state relation's columns after the grouping ones."""
        out = [ROWS]
        for a in self.aggregates:
            out += [f"{a.var.name}__{part}" for part in _PARTS[kind(a)](a)]
        return out + [a.var.name for a in self.aggregates]

    def schema(self, empty_rows: DataFrame) -> StructType:
        """The state relation's columns and types (Spark analyses the plan over empty input; no job)."""
        return StructType([f for f in self.full(empty_rows).schema.fields if f.name != C])

    # -- Algorithm 6.1 ----------------------------------------------------------------------------------

    def partial(self, delta_rows: DataFrame, distinct_changes: dict[str, DataFrame]) -> DataFrame:
        """Algorithm 6.1's Δ(U) per touched group: one row per group, each decomposed function's change.

        ``delta_rows``: Δ(U) as variables + ``__count``, consolidated. ``distinct_changes``: per DISTINCT
        argument, the set changes (±1) of its (group, value) relation."""
        partial = self._partial(delta_rows)
        for var in self.distinct_args():
            if var not in distinct_changes:  # no (group, value) pair appeared or vanished: nothing to add
                partial = partial.select("*", *[F.lit(None).alias(n) for n in self._distinct_names(var)])
                continue
            part = self._distinct_partial(var, distinct_changes[var])
            partial = _join_groups(partial, part, self.by, "full_outer") if self.by else partial.crossJoin(part)
        return partial

    def delta(self, partial: DataFrame, old_state: DataFrame, new_rows: Callable[[DataFrame], DataFrame],
              schema: StructType, small: bool = False, whole: bool = False) -> DataFrame:
        """The state delta of the groups Δ(U) touches: (old state, -1) and (new state, +1).

        ``partial``: Δ(U) per group (`partial`). ``old_state``: the stored state (unconsolidated
        layers). ``new_rows(groups)``: Uᵛ's consolidated rows restricted to ``groups``, for the groups
        that must be recomputed (never called for a self-maintainable subgoal). ``small``: the partial
        is a small change's: the old state of its groups is gathered in one partition. ``whole``: the
        stored state is small too (`RunStates.fits_one_partition`): read whole into that partition and
        paired there, not restricted to the touched groups first (a semi-join that broadcasts the
        groups: a second wave of Spark jobs, computing Δ(U)'s groups once more).
        """
        by = self.by
        groups = partial.select(*[F.col(quote(b)) for b in by]) if by else None
        if groups is None or (small and whole):  # the global aggregate's one row, or a small state
            old = one_partition(old_state) if small else old_state
        else:
            old = restrict(old_state, groups, by, small)
        old = consolidate(old).where(F.col(C) > 0).drop(C)
        paired = self._pair(partial, old, small)
        merged = paired.select(*[F.col(quote(b)) for b in by], *self._merge(schema),
                               *[F.col(quote(f"o__{a.var.name}")).alias(a.var.name) for a in self.aggregates
                                 if kind(a) == "recompute"],  # replaced: the group is recomputed
                               self._must_recompute().alias("__recompute"),
                               *[F.col(quote(f"o__{f.name}")) for f in schema.fields if f.name not in by])
        merged = merged.select("*", *[self._value(a).alias(a.var.name) for a in self.aggregates
                                      if kind(a) != "recompute"])
        names = [f.name for f in schema.fields]
        # per group, its new tuple (+1; unless recomputed below) and its old one (-1; unless it is new), as
        # two rows of one pass over the pairs (the -1 rows were a second subplan over the old state)
        new_row = F.when(~F.col("__recompute") & ((F.col(ROWS) > 0) if by else F.lit(True)),  # an emptied
                         F.struct(*[F.col(quote(n)) for n in names], F.lit(1).cast("long").alias(C)))  # group is gone
        old_row = F.when(F.col(quote(f"o__{ROWS}")).isNotNull(), F.struct(
            *[F.col(quote(n if n in by else f"o__{n}")).alias(n) for n in names], F.lit(-1).cast("long").alias(C)))
        rows = merged.select(F.explode(F.array(new_row, old_row)).alias("__t")).where(F.col("__t").isNotNull()) \
            .select("__t.*")
        if not self.self_maintainable(self.subgoal):  # the flagged groups' new state, from Uᵛ (U is read only here)
            recomputed = self._recomputed(merged.where(F.col("__recompute")), new_rows)
            if by:
                recomputed = recomputed.where(F.col(ROWS) > 0)
            rows = rows.unionByName(recomputed.select(*[F.col(quote(n)) for n in names])
                                    .withColumn(C, F.lit(1).cast("long")))
            rows = one_partition(rows) if small else rows
        return consolidate(rows)

    def _pair(self, partial: DataFrame, old: DataFrame, small: bool) -> DataFrame:
        """Algorithm 6.1's pairing of each touched group's Δ(U) (``partial``, one row per group: its
        columns as ``p__*``) with its old tuple T_ȳ (``old``, at most one row per group: its columns
        as ``o__*``, NULL for a new group; groups the partial lacks are dropped). An aggregate over the
        union of the two, where a join would broadcast or shuffle one side to the other: in a small
        change's one partition it needs no exchange, so the state write is one wave of Spark jobs
        shorter."""
        by = self.by
        keys = [F.col(quote(b)) for b in by]
        p = partial.select(*keys, F.struct(*[F.col(quote(c)).alias(f"p__{c}") for c in partial.columns
                                             if c not in by]).alias("__p"))
        o = old.select(*keys, F.struct(*[F.col(quote(c)).alias(f"o__{c}") for c in old.columns]).alias("__o"))
        both = p.unionByName(o, allowMissingColumns=True)
        both = one_partition(both) if small else both
        # (each side holds one row per group: `first` ignoring NULLs picks it; GROUP BY puts NULL keys in
        # one group, as the null-safe join did)
        pick = [F.first("__p", ignorenulls=True).alias("__p"), F.first("__o", ignorenulls=True).alias("__o")]
        # (a group the partial lacks is untouched: one of a state read whole, `delta`'s ``whole``)
        return ((both.groupBy(*keys).agg(*pick) if by else both.agg(*pick)).where(F.col("__p").isNotNull())
                .select(*keys, "__p.*", "__o.*"))

    def _recomputed(self, flagged: DataFrame, new_rows: Callable[[DataFrame], DataFrame]) -> DataFrame:
        """The new state of the flagged groups, from Uᵛ's rows."""
        if self.by:
            return self.full(new_rows(flagged.select(*[F.col(quote(b)) for b in self.by]))).drop(C)
        # the one global group: recomputed over the whole new input, only if flagged
        return (self.full(new_rows(None)).drop(C)
                .crossJoin(flagged.select(F.lit(1).alias("__f")).limit(1)).drop("__f"))

    def _partial(self, rows: DataFrame, unit: bool = False, extra: Sequence[Column] = ()) -> DataFrame:
        """Per group, the rows' contribution to each decomposed function (Δ(U)'s, or all of U's in
        ``full``); ``__del`` is the extreme among deleted values (negative counts). ``unit``: ``rows`` is a
        bag, each row once (`full`'s), so COUNT, SUM, MIN and MAX are Spark's own calls over it — the
        same values as the weighted sums, and computed once with an equal call among ``extra`` (more
        columns of the same aggregation: Spark deduplicates its aggregate expressions).

        Each column is one SQL expression (`_expr`): built from Column functions it took ~20 py4j round
        trips to the JVM (three per function), 150 for Q1's eight aggregates, on every refresh."""
        c = "CAST(1 AS BIGINT)" if unit else quote(C)
        cols: list[Column] = [_expr("count(1)" if unit else f"CAST(coalesce(sum({c}), 0) AS BIGINT)", ROWS)]
        for a in self.aggregates:
            k, v = kind(a), a.var.name
            x = f"({a.arg})" if a.arg is not None else None
            if k in ("count", "sum", "avg", "variance", "min", "max"):
                cols.append(_expr(f"count({x})" if unit else
                                  f"CAST(coalesce(sum(CASE WHEN {x} IS NOT NULL THEN {c} ELSE 0 END), 0) AS BIGINT)",
                                  f"{v}__n"))
            if k in ("sum", "avg"):
                # (a row counted once adds x as it is: a wide DECIMAL product per row cost Q1's full
                # refresh a quarter of its time; the IF's type is the product's, so the state's is unchanged)
                cols.append(_expr(f"sum({x})" if unit else f"sum(IF({c} = 1, {x}, {x} * {c}))", f"{v}__s"))
            if k == "variance":
                d = f"CAST({x} AS DOUBLE)"
                cols += [_expr(f"sum({d} * {c})", f"{v}__s"), _expr(f"sum({d} * {d} * {c})", f"{v}__q")]
            if k in ("min", "max"):
                cols += [_expr(f"{k}({x})" if unit else f"{k}(CASE WHEN {c} > 0 THEN {x} END)", f"{v}__m"),
                         _expr(f"{k}(CASE WHEN {c} < 0 THEN {x} END)", f"{v}__del")]
            if _inductive(a):  # the inserted values' state; the deleted values (or how many were deleted)
                values = "array_sort(flatten(collect_list(CASE WHEN {c} {sign} 0 AND {x} IS NOT NULL " \
                         "THEN array_repeat({x}, CAST({abs}{c} AS INT)) END)))"
                cols.append(_expr(a.inductive.fold(values.format(c=c, x=x, sign=">", abs=""), final=False),
                                  f"{v}__st"))
                cols.append(_expr(values.format(c=c, x=x, sign="<", abs="-"), f"{v}__dels") if k == "inductive" else
                            _expr(f"CAST(coalesce(sum(CASE WHEN {c} < 0 AND {x} IS NOT NULL THEN -{c} END), 0) "
                                  "AS BIGINT)", f"{v}__ndel"))
        cols += extra
        return rows.groupBy(*[F.col(quote(b)) for b in self.by]).agg(*cols) if self.by else rows.agg(*cols)

    def _distinct_names(self, var: str) -> list[str]:
        """The partial's columns for the DISTINCT aggregates over ``var``: count and sum changes."""
        return [f"{a.var.name}__{x}" for a in self.aggregates
                if kind(a) == "distinct" and next(iter(a.arg.variables())) == var
                for x in (["dn"] if a.func == "count" else ["dn", "ds"])]

    def _distinct_partial(self, var: str, change: DataFrame) -> DataFrame:
        """Per group, the change of the distinct count and sum: values that appeared minus vanished."""
        cols = []
        for a in self.aggregates:
            if kind(a) == "distinct" and next(iter(a.arg.variables())) == var:
                cols.append(F.sum(C).cast("long").alias(f"{a.var.name}__dn"))
                if a.func != "count":
                    cols.append(F.sum(F.col(quote(var)) * F.col(C)).alias(f"{a.var.name}__ds"))
        return change.groupBy(*[F.col(quote(b)) for b in self.by]).agg(*cols) if self.by else change.agg(*cols)

    def _merge(self, schema: StructType) -> list[Column]:
        """The new state from the old one (``o__*``, NULL for a new group) and the partial (``p__*``)."""
        types = {f.name: f.dataType for f in schema.fields}

        def add(old: str, part: str) -> Column:  # (one SQL expression: see `_partial`)
            return F.expr(f"coalesce({quote(old)}, 0) + coalesce({quote(part)}, 0)")

        cols = {ROWS: add(f"o__{ROWS}", f"p__{ROWS}")}
        for a in self.aggregates:
            k, v = kind(a), a.var.name
            if k in ("count", "sum", "avg", "variance", "min", "max"):
                cols[f"{v}__n"] = add(f"o__{v}__n", f"p__{v}__n")
            if k in ("sum", "avg", "variance"):
                cols[f"{v}__s"] = add(f"o__{v}__s", f"p__{v}__s")
            if k == "variance":
                cols[f"{v}__q"] = add(f"o__{v}__q", f"p__{v}__q")
            if k in ("min", "max"):
                pick = F.least if k == "min" else F.greatest
                cols[f"{v}__m"] = pick(F.col(f"o__{v}__m"), F.col(f"p__{v}__m"))
            if k == "distinct":
                cols[f"{v}__n"] = add(f"o__{v}__n", f"p__{v}__dn")
                if a.func != "count":
                    cols[f"{v}__s"] = add(f"o__{v}__s", f"p__{v}__ds")
            if _inductive(a):  # 001 §2: the old state merged with the inserted values', then each deleted value
                f = a.inductive  # retracted (without retract the group is recomputed: `_must_recompute`)
                st = f.merged(f"coalesce({quote(f'o__{v}__st')}, {f.initial})",
                              f"coalesce({quote(f'p__{v}__st')}, {f.initial})")
                cols[f"{v}__st"] = F.expr(f.retracted(quote(f"p__{v}__dels"), st) if k == "inductive" else st)
        # sums and counts keep the state's types; extremes, a user's states and recomputed values keep their
        # own (a cast of an array or struct read from Parquet to the plan's type would fail on nullability alone)
        return [(expr if name.endswith(("__m", "__st")) else expr.cast(types[name])).alias(name)
                for name, expr in cols.items()]

    def _must_recompute(self) -> Column:
        """A group is recomputed from Uᵛ when it has a non-decomposable aggregate, or a deleted value at
        or beyond its current MIN/MAX (only then can the extreme have left the group)."""
        flags: list[Column] = []
        for a in self.aggregates:
            k, v = kind(a), a.var.name
            if k == "recompute":
                flags.append(F.lit(True))
            elif k in ("min", "max"):
                deleted, current = F.col(f"p__{v}__del"), F.col(f"o__{v}__m")
                beyond = deleted <= current if k == "min" else deleted >= current
                flags.append(deleted.isNotNull() & (current.isNull() | beyond))
            elif k == "inductive_insert":  # no retract: a deleted value sends its group back to U
                flags.append(F.col(f"p__{v}__ndel") > 0)
        return reduce(lambda x, y: x | y, flags) if flags else F.lit(False)

    # -- T from the state ----------------------------------------------------------------------------------

    def _value(self, a: Aggregate) -> Column:
        """T's value of a decomposable aggregate from the decomposed functions of a state row."""
        k, v = kind(a), a.var.name
        n, s, q = F.col(f"{v}__n"), F.col(f"{v}__s"), F.col(f"{v}__q")
        if k == "star":
            value = F.col(ROWS)
        elif k == "count" or (k == "distinct" and a.func == "count"):
            value = n
        elif k == "sum" or (k == "distinct" and a.func == "sum"):
            value = F.when(n > 0, s)
        elif k == "avg" or k == "distinct":
            value = F.when(n > 0, s / n)
        elif k == "variance":
            m2 = F.greatest(q - s * s / n, F.lit(0.0))
            samp = a.func in ("var_samp", "variance", "stddev", "stddev_samp", "std")
            var = F.when(n > 1, m2 / (n - 1)) if samp else F.when(n > 0, m2 / n)
            value = F.sqrt(var) if a.func.startswith("std") else var
        elif _inductive(a):  # final(state), in the type the fold gives it
            return F.expr(a.inductive.value(quote(f"{v}__st")))
        else:  # min, max: the extreme itself, in its own type
            return F.col(f"{v}__m")
        return value.cast(self.out_types[v])

    def finalize(self, state: DataFrame) -> DataFrame:
        """T: the grouping variables and each aggregate's value, from state rows (counts kept)."""
        return state.select(*[F.col(quote(b)) for b in self.by], *[F.col(quote(a.var.name)) for a in self.aggregates],
                            F.col(C))


#: the decomposed functions stored per aggregate kind (see the module docstring)
_PARTS: dict[str, Callable[[Aggregate], tuple[str, ...]]] = {
    "star": lambda a: (), "count": lambda a: ("n",), "sum": lambda a: ("n", "s"), "avg": lambda a: ("n", "s"),
    "variance": lambda a: ("n", "s", "q"), "min": lambda a: ("n", "m"), "max": lambda a: ("n", "m"),
    "distinct": lambda a: ("n",) if a.func == "count" else ("n", "s"), "recompute": lambda a: (),
    "inductive": lambda a: ("st",), "inductive_insert": lambda a: ("st",),
}


def _inductive(a: Aggregate) -> bool:
    """A user's inductive aggregate kept from its state (not one recomputed under DISTINCT)."""
    return kind(a) in ("inductive", "inductive_insert")


def _join_groups(left: DataFrame, right: DataFrame, by: list[str], how: str) -> DataFrame:
    """Join two per-group frames on the grouping columns, null-safely (GROUP BY puts NULLs in one
    group); the right side's grouping columns are renamed first, as both sides may share lineage."""
    r = right.select(*[F.col(quote(c)).alias(f"__r_{c}") if c in by else F.col(quote(c)) for c in right.columns])
    cond = reduce(lambda x, y: x & y, [left[quote(b)].eqNullSafe(r[quote(f"__r_{b}")]) for b in by])
    keys = [F.coalesce(left[quote(b)], r[quote(f"__r_{b}")]).alias(b) if how == "full_outer" else left[quote(b)]
            for b in by]
    return left.join(r, cond, how).select(*keys, *[left[quote(c)] for c in left.columns if c not in by],
                                          *[r[quote(c)] for c in r.columns if c not in by and not c.startswith("__r_")])


def with_windows(rows: DataFrame, aggregates: tuple[Aggregate, ...]) -> DataFrame:
    """The group's rows (expanded: one per derivation) with the window values the aggregates collect
    (ivm.lang.window_functions): Spark's own window functions, partitioned by the grouping variables."""
    windows = [F.expr(sql).alias(var) for a in aggregates for var, sql in a.windows]
    return rows.select("*", *windows) if windows else rows


def state_name(pred: str, r: int, j: int) -> str:
    """The state relation of the GROUPBY subgoal at body index ``j`` of rule ``r`` of ``pred``."""
    return f"{pred}__agg{r}_{j}"


def groupby_subgoals(program: Program, pred: str) -> list[tuple[str, int, GroupBy]]:
    """(state relation name, body index, subgoal) of every GROUPBY subgoal in the rules of ``pred``."""
    out = []
    for r, rule in enumerate(program.rules_for(pred)):
        for j, item in enumerate(rule.body):
            if isinstance(item, GroupBy):
                out.append((state_name(pred, r, j), j, item))
    return out
