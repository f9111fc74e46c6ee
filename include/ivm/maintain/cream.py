"""CReaM (001 §4, Figure 1): views over sets and user-defined aggregates, maintained from auxiliary views.

A view with a setof subgoal ``v(X̄, A) :- setof(Ȳ, φ(X̄, Ȳ, Z̄), W), agg(W, A)`` is maintained in the four
steps of Figure 1:

  Step 1  **Rewrite** the view over an auxiliary view that keeps every non-aggregated variable:
          ``v_a(X̄, Z̄, W) :- setof(Ȳ, φ(X̄, Ȳ, Z̄), W)`` and ``v(X̄, A) :- v_a(X̄, Z̄, W), agg(W, A)``
          (ivm.lang.auxiliary_views, at compile time; one auxiliary view per setof subgoal, 001 §4's k-subgoal case).
  Step 2  **Materialize** v_a: it is an auxiliary predicate of the view, stored like any other.
  Step 3  **Count** the derivations of v's tuples: v keeps ``__count`` (the counting algorithm, 000 §4).
  Step 4  **Maintain** v_a with the differential rules Δ1–Δ6 of 001 §3 (Case 1: every variable bound
          outside the setof is in v_a's head), which join only v_a and φ⁺/φ⁻ (``set_delta``); then v by
          counting from v_a⁺/v_a⁻ (the setof subgoal's Δ in 000 Definition 4.1's delta rules).

**How v_a is stored.** Unnested: one row per element, ``v_a(X̄, Z̄, Ȳ)`` with the element's number of
derivations in ``__count`` (W = {Ȳ | v_a(x̄, z̄, Ȳ)}). Two reasons. 001's Datalog predicates are sets,
but Spark tables are bags and an atom may project columns away, so "is ȳ still in the set after this
delete" needs the element's count; with it, φ⁺ and φ⁻ (the elements that appeared and vanished) are
000 Algorithm 4.1 statement (2) over v_a itself, with no access to φ. And a delta layer of v_a holds the
changed elements only, not every changed set in full (a one-element change to a set of a million
elements writes one row). The set W' of a touched group is read back from v_a restricted to that group.

**Case 1** (001 §3): a rule ``v(X̄, W) :- setof(Ȳ, φ(X̄, Ȳ), W)`` whose head has every variable bound
outside the setof, over a set predicate read without projection, needs no auxiliary view: v is its own
v_a, and Δ1–Δ6 run over v's stored sets and φ's set changes.

**Aggregates over grouped sets.** A GROUPBY subgoal (000 §6.2) with a non-distributive aggregate —
median, percentile, mode, collect_set/collect_list, a user-defined aggregate, and MIN/MAX under
deletion — cannot be computed from its old value and the delta; Algorithm 6.1 recomputes the touched
groups. Over a table that would read the table, so the same rewrite gives the subgoal an auxiliary view
holding each group's multiset of arguments (bag semantics: the multiplicities are the multiset), and
the touched groups are recomputed from it. SQL views have one already: the GROUP BY's input predicate.
COUNT/SUM/AVG(DISTINCT) keep their per-(group, value) counts in the GROUPBY state (ivm.maintain.groupby).

With ``auxiliary_views: false`` a view gets no auxiliary view: its setof subgoals over a bag or a
projection are maintained by re-reading the touched groups from φ before and after the change (what
001 §3's Γ1–Γ6 do), and non-distributive aggregates recompute touched groups from the grouped input.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, BodyItem, GroupBy, Literal, Program, Rule, SetOf, Subgoal
from ivm.ir import aggregate_kind as kind
from ivm.lang.auxiliary_views import RECOMPUTED, ROLE, set_changes_known
from ivm.maintain.recompute import set_element
from ivm.vocabulary import Kind
from ivm.zset import quote

C = COUNT_COLUMN


# -- Step 4: Δ1–Δ6 ----------------------------------------------------------------------------------------


def set_delta(s: SetOf, changes: DataFrame, old_sets: Callable[[DataFrame | None], DataFrame]) -> DataFrame:
    """001 §3 Δ1–Δ6: the setof subgoal's change, v_a⁻ (count -1) and v_a⁺ (+1), from φ⁺ and φ⁻ and v_a.

    ``changes``: φ⁺ (count > 0) and φ⁻ (count < 0) as the atom's variables, set changes (each element
    appeared or vanished). ``old_sets(groups)``: (outer variables, W') of v_a for the touched groups
    (None: the one global group). Per touched group, with W⁺ = setof(Ȳ, φ⁺) and W⁻ = setof(Ȳ, φ⁻):

      Δ1  v_a⁺(X̄, W⁺)            the group is new (no W')
      Δ2  v_a⁺(X̄, W' ∪ W⁺)        elements inserted into an existing set ...
      Δ3  v_a⁺(X̄, W' ∖ W⁻)        ... and deleted from it (one batch may do both: (W' ∪ W⁺) ∖ W⁻)
      Δ4  v_a⁻(X̄, W')             W⁻ takes the last elements: the group leaves (no v_a⁺)
      Δ5  v_a⁻(X̄, W')             the set W' is replaced after an insert ...
      Δ6  v_a⁻(X̄, W')             ... or a delete
    """
    group = [v.name for v in s.group()]
    w = s.result.name
    e = set_element(s)
    c = F.col(C)
    if group:  # a NULL element is no element (as in the full evaluation's setof)
        changes = changes.where(e.isNotNull())
    sets = [F.array_sort(F.collect_set(F.when(c > 0, e))).alias("__plus"),
            F.array_sort(F.collect_set(F.when(c < 0, e))).alias("__minus")]
    per_group = changes.groupBy(*[F.col(quote(g)) for g in group]).agg(*sets) if group else changes.agg(*sets)
    old = old_sets(per_group.select(*[F.col(quote(g)) for g in group]) if group else None)
    old = old.select(*[F.col(quote(g)).alias(f"__o_{g}") for g in group], F.col(quote(w)).alias("__old"))
    if group:
        cond = reduce(lambda a, b: a & b, [per_group[quote(g)].eqNullSafe(old[quote(f"__o_{g}")]) for g in group])
        joined = per_group.join(old, cond, "left")
    else:
        joined = per_group.crossJoin(old)
    plus, minus, before = F.col("__plus"), F.col("__minus"), F.col("__old")
    after = F.array_sort(F.when(before.isNull(), F.array_except(plus, minus))                     # Δ1
                         .otherwise(F.array_except(F.array_union(before, plus), minus)))           # Δ2, Δ3
    keys = [F.col(quote(g)) for g in group]
    removed = joined.where(before.isNotNull()).select(*keys, before.alias(w), F.lit(-1).cast("long").alias(C))
    # Δ4: an emptied group has no v_a⁺ (a global setof keeps its one row, as the full evaluation does)
    added = joined.select(*keys, after.alias(w), F.lit(1).cast("long").alias(C))
    if group:
        added = added.where(F.size(F.col(quote(w))) > 0)
    return removed.unionByName(added)                                                            # Δ4–Δ6: W' out


# -- what `ivm explain` says --------------------------------------------------------------------------------


def auxiliary_views(program: Program, view: str) -> list[dict]:
    """The view's CReaM auxiliary views, each with the rewrite in 001's notation: what v_a stands for
    and the view's rule over it (Figure 1, Step 1)."""
    out = []
    for rule in program.rules:
        if program.owner(rule.head.pred) != view:
            continue
        for item in rule.body:
            if not isinstance(item, SetOf | GroupBy) or program.predicates[item.atom.pred].role != ROLE:
                continue
            va = item.atom.pred
            ((lit,),) = [r.body for r in program.rules_for(va)]
            phi = lit.atom
            if isinstance(item, SetOf):
                outer = ", ".join(v.name for v in item.group())
                setof = SetOf(item.elements, phi, item.result)
                stands = f"{va}({outer}{', ' if outer else ''}{item.result}) :- {setof}"
                used = Atom(va, (*item.group(), item.result))
                over = Rule(rule.head, tuple(used if i is item else i for i in rule.body))
                how = ("Δ1–Δ6 (001 §3) over v_a and φ⁺/φ⁻; stored unnested, one row per element with its "
                       "derivation count")
            else:
                stands = f"{va}({', '.join(map(str, item.atom.args))}) :- {phi}  (each group's multiset of arguments)"
                over = rule
                how = "the GROUPBY's touched groups are recomputed from v_a, not from the table"
            out.append({"name": va, "auxiliary_view": stands, "view_rule": str(over), "maintenance": how})
    return out


def tables_read(program: Program, view_preds: list[str], recursive: set[str]) -> dict[str, str]:
    """The tables an incremental refresh of the view reads besides their deltas, with the reason; empty
    when the view is self-maintainable (001 §5: maintained from its own stored relations and the deltas)."""
    out: dict[str, str] = {}

    def base(item: BodyItem) -> str | None:
        atom = item.atom if isinstance(item, Subgoal) else None
        return atom.pred if atom is not None and program.predicates[atom.pred].kind == Kind.BASE else None

    for pred in view_preds:
        for rule in program.rules_for(pred):
            items = [i for i in rule.body if isinstance(i, Subgoal)]
            for item in items:
                table = base(item)
                if table is None:
                    continue
                if pred in recursive:
                    out.setdefault(table, "a recursive rule's subgoal, read in DRed's steps")
                elif len(items) > 1:
                    out.setdefault(table, f"joined with the delta of another subgoal of `{rule}`")
                elif isinstance(item, Literal) and item.negated:
                    out.setdefault(table, "a negated subgoal: Δ(¬q) checks the table's old rows")
                elif isinstance(item, SetOf) and not set_changes_known(program, item):
                    out.setdefault(table, "setof without an auxiliary view: the touched groups are re-read")
                elif isinstance(item, GroupBy) and any(kind(a) in RECOMPUTED for a in item.aggregates):
                    out.setdefault(table, "a non-distributive aggregate without an auxiliary view: the touched "
                                          "groups are recomputed from the table")
    return out
