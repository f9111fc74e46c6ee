"""Full evaluation of a program on Spark: every derived predicate as a Z-set DataFrame plan.

This is the recompute path every incremental algorithm is checked against and falls back to. Rules
are evaluated stratum by stratum (000 Definition 3.1); each rule is a join of its positive atoms on
shared variables, where counts multiply (a derivation per combination, 000 §3), then assignments,
conditions, and anti-joins for negated atoms; a predicate's rules are added up (⊎) and consolidated.
Per 000 §5, a set-semantics predicate keeps its derivation count, but is used by the predicates above
it with a count of one per tuple. GROUPBY subgoals (000 §6.2) aggregate the bag their atom denotes,
with Spark's own aggregate functions, so NULLs and empty inputs behave as SQL says.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.errors import ConfigError
from ivm.ir import (
    Assign,
    Atom,
    BodyItem,
    Condition,
    Const,
    Expr,
    GroupBy,
    Literal,
    Program,
    Rule,
    SetOf,
    Subgoal,
    Unnest,
    Var,
    Wildcard,
)
from ivm.maintain import fixpoint
from ivm.maintain.fixpoint import Absent, SubgoalRows
from ivm.maintain.groupby import with_windows
from ivm.storage import Scratch
from ivm.stratify import Strata
from ivm.vocabulary import Kind
from ivm.zset import anti_join, as_used, consolidate, expand, quote, union_all

C = COUNT_COLUMN


def set_element(s: SetOf) -> Column:
    """One element of a setof's set: the variable, or a struct of the variables (a set of tuples)."""
    if len(s.elements) == 1:
        return F.col(quote(s.elements[0].name))
    return F.struct(*[F.col(quote(e.name)) for e in s.elements])


class Evaluator:
    """Evaluates derived predicates over given Z-sets of the base predicates (and any others).

    Recursive components run to their fixpoint (ivm.maintain.fixpoint), writing each round to
    ``scratch``; ``plans_only`` builds plans with the right column types without running any job
    (a recursive component then gets the plan of its exit rules and one unfolding). ``grouped_only``:
    bag predicates whose rows only a GROUPBY reads (counting.ephemeral), left unconsolidated — for
    relations given consolidated with positive counts (a full refresh's states), where every derived
    count is positive too and grouping the rows adds their counts up anyway: consolidating them would
    shuffle every row of a join or projection by all its columns for nothing. ``weighted``: those of them
    whose GROUPBY is linear (`GroupByState.linear`) read the tables in ``layers`` — each table's layers
    as stored, unconsolidated — instead of their consolidated states: their rules join, filter and
    project, all linear in each input (000 §3), so the rows' counts add up to what the consolidated
    tables give as used (a bag's counts; a keyed table, a set, holds each key once with count 1: the
    trim and the load refuse a second), and the GROUPBY sums them weighted (`GroupByState.full`): a full
    refresh of a SUM or AVG over a table with delta layers scans its layers once, grouping no tuples.
    """

    def __init__(self, program: Program, strata: Strata, relations: Mapping[str, DataFrame],
                 scratch: Scratch | None = None, limits: Mapping[str, int] | None = None, plans_only: bool = False,
                 grouped_only: frozenset[str] = frozenset(), weighted: frozenset[str] = frozenset()):
        self.program = program
        self.strata = strata
        self.relations: dict[str, DataFrame] = dict(relations)
        self.grouped_only = grouped_only
        self.weighted = weighted
        #: tables as their layers' unconsolidated union, read by the ``weighted`` predicates' rules
        self.layers: dict[str, DataFrame] = {}
        self._scratch = scratch
        self.limits = dict(limits or {})
        self.plans_only = plans_only
        #: T of GROUPBY subgoals already computed, read instead of aggregating again (a full refresh
        #: writes each GROUPBY state first: it holds T's values, ivm.maintain.counting.materialize)
        self.groupby_tables: dict[GroupBy, DataFrame] = {}

    @property
    def scratch(self) -> Scratch:
        if self._scratch is None:
            raise RuntimeError("evaluating a recursive view needs scratch space (Evaluator(..., scratch=...))")
        return self._scratch

    def max_iterations(self, view: str) -> int:
        return self.limits.get(view, fixpoint.DEFAULT_MAX_ITERATIONS)

    def relation(self, pred: str) -> DataFrame:
        """The consolidated Z-set of ``pred``, evaluating it (and what it needs) on first use."""
        if pred not in self.relations:
            p = self.program.predicates[pred]
            if p.kind == Kind.BASE:
                raise KeyError(f"no input given for table {pred}")
            component = next(c for c in self.strata.components if pred in c.predicates)
            if component.recursive:  # 000 §7: set semantics, semi-naive to the fixpoint
                results = fixpoint.plans(self, component) if self.plans_only else fixpoint.evaluate(self, component)
                self.relations.update(results)
                return self.relations[pred]
            frames = [self.rule(r, self._layered if pred in self.weighted else None)
                      for r in self.program.rules_for(pred)]
            # an extraction function (002 §2.2) is joined as it comes: consolidating every element of
            # every collection would be a shuffle of the whole extension for nothing (joins distribute)
            self.relations[pred] = union_all(frames) if p.kind == "extraction" or pred in self.grouped_only else \
                consolidate(union_all(frames), p.columns)
        return self.relations[pred]

    def used(self, pred: str) -> DataFrame:
        return as_used(self.program.predicates[pred], self.relation(pred))

    # -- one rule ----------------------------------------------------------------------------------

    def atom(self, atom: Atom, source: DataFrame | None = None) -> DataFrame:
        """The atom's predicate with columns renamed to its variables, constants selected."""
        pred = self.program.predicates[atom.pred]
        df = source if source is not None else self.used(atom.pred)
        cols, conds, seen = [], [], {}
        for col, arg in zip(pred.columns, atom.args, strict=True):
            if isinstance(arg, Var):
                if arg.name in seen:  # p(X, X): both positions equal (SQL =: NULL never matches)
                    conds.append(F.col(quote(col)) == F.col(quote(seen[arg.name])))
                else:
                    seen[arg.name] = col
                    cols.append(F.col(quote(col)).alias(arg.name))
            elif isinstance(arg, Const):
                conds.append(F.col(quote(col)).isNull() if arg.value is None else F.col(quote(col)) == F.lit(arg.value))
            elif isinstance(arg, Expr):
                conds.append(F.col(quote(col)) == F.expr(str(arg)))  # only constant expressions reach here
            elif not isinstance(arg, Wildcard):
                raise TypeError(arg)
        for c in conds:
            df = df.where(c)
        return df.select(*cols, F.col(C))

    def groupby(self, g: GroupBy, source: DataFrame | None = None) -> DataFrame:
        """000 §6.2: one tuple per group of the atom's bag, with the aggregates; count 1. ``source``:
        the grouped relation as used, consolidated (default: this evaluator's, or T as computed already)."""
        if source is None and g in self.groupby_tables:
            return self.groupby_tables[g]
        rows = self.atom(g.atom, source)
        if source is None and g.atom.pred in self.weighted:  # (unconsolidated: its tables' layers)
            rows = consolidate(rows, [c for c in rows.columns if c != C])
        rows = with_windows(expand(rows), g.aggregates)
        aggs = [F.expr(a.call()).alias(a.var.name) for a in g.aggregates]
        grouped = rows.groupBy(*[F.col(quote(v.name)) for v in g.by]).agg(*aggs) if g.by else rows.agg(*aggs)
        return grouped.withColumn(C, F.lit(1).cast("long"))

    def setof(self, s: SetOf, source: DataFrame | None = None) -> DataFrame:
        """001 Definition 1: per binding of the atom's other variables, the set of the elements, as a
        sorted array (a set has one canonical form, so equal sets are equal values); count 1. A NULL
        element is no element (Datalog has no NULL); a tuple element may hold NULLs."""
        rows = self.atom(s.atom, source)
        element = set_element(s)
        agg = F.array_sort(F.collect_set(element)).alias(s.result.name)
        group = [F.col(quote(v.name)) for v in s.group()]
        if group:  # sets hold no NULL: a binding whose only elements are NULL has no set
            rows = rows.where(element.isNotNull())
        grouped = rows.groupBy(*group).agg(agg) if group else rows.agg(agg)
        return grouped.withColumn(C, F.lit(1).cast("long"))

    def subgoal(self, index: int, item: BodyItem) -> DataFrame | None:
        """The relation a body item joins: a positive atom, a GROUPBY or setof subgoal; None for a negated
        atom (an anti-join, applied after the joins)."""
        if isinstance(item, Literal):
            return None if item.negated else self.atom(item.atom)
        return self.groupby(item) if isinstance(item, GroupBy) else self.setof(item)

    def _layered(self, index: int, item: BodyItem) -> DataFrame | None:
        """A body item of a ``weighted`` predicate's rule: a table as its layers, else as `subgoal`."""
        if isinstance(item, Literal) and not item.negated and item.atom.pred in self.layers:
            return self.atom(item.atom, self.layers[item.atom.pred])
        return self.subgoal(index, item)

    def absent(self, index: int, item: Literal, df: DataFrame) -> DataFrame:
        """``not p(...)``: the tuples of ``df`` with no match in p."""
        return anti_join(df, self.atom(item.atom), item.null_safe)

    def rule(self, rule: Rule, subgoal: SubgoalRows | None = None, absent: Absent | None = None,
             first: int | None = None, restrict_first: bool = False) -> DataFrame:
        """The Z-set of the rule's head: one derivation per combination of its positive subgoals.

        ``subgoal(i, item)`` gives the relation the i-th body item joins (None: not joined) and
        ``absent(i, item, df)`` applies a negated atom that is not joined; the delta rules of the
        counting algorithm pass their own, choosing old, new or Δ states (000 Definition 4.1).
        ``first``: the body item to start the joins from (the Δ subgoal, the smallest).
        ``restrict_first``: the first item only restricts the rule to known tuples (DRed's δ⁻(p) in a
        Δʳ-rule): its variables match whole tuples, NULLs equal, until a body item binds them.
        """
        subgoal, absent = subgoal or self.subgoal, absent or self.absent
        df, joined, lead = self.joins(rule, subgoal, join_order(rule.body, first), restrict_first=restrict_first)
        return self.finish(rule, df, joined, absent, lead)

    def joins(self, rule: Rule, subgoal: SubgoalRows, order: list[int], df: DataFrame | None = None,
              restrict_first: bool = False) -> tuple[DataFrame | None, set[int], set[str]]:
        """The joins of ``rule``'s subgoals in ``order`` (body indexes; other body items are skipped),
        onto ``df`` if given: (the joined relation, the body items joined, the variables bound by a
        restricting first item alone)."""
        joined: set[int] = set()
        null_safe = null_safe_variables(rule)
        lead: set[str] = set()  # variables bound by the restricting first item alone
        for i in order:
            item = rule.body[i]
            if isinstance(item, Subgoal):
                right = subgoal(i, item)
                if right is not None:
                    start = df is None
                    df = natural_join(df, right, lead | (null_safe if isinstance(item, Literal) else set()))
                    lead = {c for c in right.columns if c != C} if start and restrict_first else \
                        lead - set(right.columns)
                    joined.add(i)
        return df, joined, lead

    def finish(self, rule: Rule, df: DataFrame | None, joined: set[int], absent: Absent,
               lead: set[str] = frozenset()) -> DataFrame:
        """The rule's head from its joined subgoals ``df``: assignments, unnests, conditions, the
        negated atoms not joined (``absent``), the head's columns."""
        if df is None:  # a rule of conditions only: one empty tuple
            df = self._unit()
        pending = [i for i in rule.body if isinstance(i, Assign | Unnest)]
        while pending:  # assignments and unnests in dependency order
            ready = [a for a in pending if (a.expr if isinstance(a, Assign) else a.array).variables()
                     <= set(df.columns)]
            if not ready:
                raise ConfigError(f"rule `{rule}`: assignments depend on each other")
            for a in ready:
                df = _assign(df, a, lead) if isinstance(a, Assign) else _unnest(df, a, lead)
                pending.remove(a)
        for item in rule.body:
            if isinstance(item, Condition):
                df = df.where(F.expr(str(item)))
        for i, item in enumerate(rule.body):
            if isinstance(item, Literal) and item.negated and i not in joined:
                df = absent(i, item, df)
        head = self.program.predicates[rule.head.pred]
        return df.select(*[_head_column(a, col) for a, col in zip(rule.head.args, head.columns, strict=True)],
                         F.col(C))

    def _unit(self) -> DataFrame:
        any_rel = next(iter(self.relations.values()))
        return any_rel.sparkSession.range(1).select(F.lit(1).cast("long").alias(C))


def join_order(body: tuple[BodyItem, ...], first: int | None = None, among: set[int] | None = None,
               bound: frozenset[str] = frozenset(),
               prefer: Callable[[int, set[str]], object] | None = None) -> list[int]:
    """The order a rule's subgoals are joined in: ``first`` (a delta rule's Δ subgoal; else the first
    subgoal, or with variables ``bound`` already, the first sharing one), then each next subgoal that
    shares a variable with those joined (in body order among them), so a join is a cross product only
    where the rule is one; the other body items after them. ``among``: only these body items.
    ``prefer(i, joined variables)``: among the subgoals that may come next, the least first (REDUCE's
    order, `ivm.maintain.reduce.join_order`); without it, body order.
    Spark does not reorder these joins itself: the projections between them hide the join graph."""
    joinable = [i for i, x in enumerate(body)
                if (among is None or i in among)
                and (isinstance(x, GroupBy | SetOf) or (isinstance(x, Literal) and (not x.negated or i == first)))]
    if not joinable:
        return list(range(len(body))) if among is None else []
    order, rest = [], list(joinable)
    if first is not None:
        order.append(first)
        rest.remove(first)
    seen = set(bound) | (_variables(body[first]) if first is not None else set())
    while rest:
        joinable = [i for i in rest if _variables(body[i]) & seen] or rest[:1]
        nxt = min(joinable, key=lambda i: prefer(i, seen)) if prefer else joinable[0]
        order.append(nxt)
        rest.remove(nxt)
        seen |= _variables(body[nxt])
    return order + ([i for i in range(len(body)) if i not in order] if among is None else [])


def connected(body: tuple[BodyItem, ...], order: list[int], bound: frozenset[str] = frozenset()) -> bool:
    """Whether joining ``order``'s subgoals in turn (after variables ``bound``) is never a cross product."""
    seen = set(bound)
    for n, i in enumerate(order):
        if (n or seen) and not _variables(body[i]) & seen:
            return False
        seen |= _variables(body[i])
    return True


def _variables(item: BodyItem) -> set[str]:
    return item.atom.variables() if isinstance(item, Literal) else item.variables()


def _equal(a, b, null_safe: bool):
    return a.eqNullSafe(b) if null_safe else a == b


def _assign(df: DataFrame, a: Assign, lead: set[str] = frozenset()) -> DataFrame:
    """``X = expr``: a new column; if a subgoal joined earlier bound X already (a delta rule may start
    from a Δ(¬q) subgoal over X), the assignment is an equality test instead (SQL =; NULLs equal when
    only a restricting first item bound X)."""
    if a.var.name in df.columns:
        return df.where(_equal(F.col(quote(a.var.name)), F.expr(str(a.expr)), a.var.name in lead))
    return df.withColumn(a.var.name, F.expr(str(a.expr)))


def _unnest(df: DataFrame, u: Unnest, lead: set[str] = frozenset()) -> DataFrame:
    """002 §2.2's extraction: one row per element, the row's count kept (each element a derivation).
    Elements already bound by an earlier join are compared with the extracted ones (SQL =)."""
    generator = f"{u.kind}{'_outer' if u.outer else ''}({u.array})"
    bound = [v.name for v in u.elements if v.name in df.columns]
    names = ", ".join(quote(f"__u_{v.name}" if v.name in bound else v.name) for v in u.elements)
    out = df.selectExpr("*", f"{generator} AS ({names})")
    for v in bound:
        out = out.where(_equal(F.col(quote(v)), F.col(quote(f"__u_{v}")), v in lead)).drop(f"__u_{v}")
    return out


def _head_column(arg, name: str):
    if isinstance(arg, Var):
        return F.col(quote(arg.name)).alias(name)
    if isinstance(arg, Const):
        return F.lit(arg.value).alias(name)
    if isinstance(arg, Expr):
        return F.expr(str(arg)).alias(name)
    raise ConfigError(f"_ cannot appear in a rule head (column {name})")


def null_safe_variables(rule: Rule) -> set[str]:
    """The variables a rule's joins match with NULLs equal: those of a NULL-safe literal (a set operator's
    other side, compared as whole tuples; a correlation read through a probe of outer rows that may hold
    NULL) that at most one other positive literal binds. Where two others bind one, SQL equated them with
    ``=`` and it is never NULL, whichever side the joins start from."""
    bound = Counter(a.name for i in rule.body if isinstance(i, Literal) and not i.negated and not i.null_safe
                    for a in set(i.atom.args) if isinstance(a, Var))
    return {a.name for i in rule.body if isinstance(i, Literal) and i.null_safe for a in i.atom.args
            if isinstance(a, Var) and bound[a.name] <= 1}


def natural_join(left: DataFrame | None, right: DataFrame, null_safe: Collection[str] = frozenset()) -> DataFrame:
    """Natural join on shared variables; Z-set counts multiply. Variables in ``null_safe`` (of a NULL-safe
    literal, `null_safe_variables`; bound by a restricting first item alone) match with NULLs equal."""
    if left is None:
        return right
    shared = [c for c in right.columns if c != C and c in left.columns]
    r = right.withColumnRenamed(C, "__rc")
    for c in shared:
        r = r.withColumnRenamed(c, f"__r_{c}")
    cond = [_equal(left[quote(c)], r[quote(f"__r_{c}")], c in null_safe) for c in shared]
    joined = left.join(r, reduce(lambda a, b: a & b, cond), "inner") if cond else left.crossJoin(r)
    return (joined.withColumn(C, F.col(C) * F.col("__rc"))
                  .drop("__rc", *[f"__r_{c}" for c in shared]))
