"""The counting algorithm (000 §4-6) on Spark: incremental maintenance of nonrecursive predicates.

Algorithm 4.1 processes the derived predicates in stratum order. For each rule ``p :- s1, ..., sn``
it evaluates the delta rules of Definition 4.1 (statement (1))

    Δ(p) :- s1ᵛ, ..., s(i-1)ᵛ, Δ(si), s(i+1), ..., sn

new states before the Δ subgoal, old states after it, and adds their results up (⊎) into Δ(P);
then ``Pᵛ = P ⊎ Δ(P)``. Every derived predicate is materialized with ``__count``, its number of
derivations (§3), so deletions need no rederivation. Only delta rules whose Δ subgoal actually changed
in this run are evaluated.

* **Set semantics** (§5.1, statement (2)): a set predicate keeps its derivation count, but the
  predicates above it see each of its tuples once, so what propagates upward is
  ``set(Pᵛ) - set(P)``: +1 for a tuple whose count became positive, -1 for one whose count dropped to
  zero. A change of count that keeps a tuple present stops there.
* **Negation** (§6.1): a negated subgoal after the Δ subgoal is an anti-join against the old Q, before
  it against Qᵛ (Lemma 6.1); a Δ(¬q) subgoal is Definition 6.1's relation: +1 for the tuples of Δ(Q)
  no longer in Qᵛ, -1 for those not in Q before.
* **Aggregation** (§6.2, Algorithm 6.1): a Δ(GROUPBY) subgoal is the changed groups of T, computed
  from the stored state of the subgoal (ivm.maintain.groupby); a GROUPBY subgoal in old/new position
  is T or Tᵛ. A setof subgoal (001) in Δ position is v_a⁺/v_a⁻, computed by CReaM's differential rules
  Δ1–Δ6 from the auxiliary view and φ's set changes (ivm.maintain.cream).

* **Nested data** (002): an extraction subgoal's Δ is its parent's delta, extracted and consolidated
  (only the changed elements), its old/new states the parent's, extracted; a delta rule reaching an
  owner index from its Δ subgoal probes it with the changed collection ids (ivm.maintain.nested).

* **Keyed tables and foreign keys**: a positive subgoal whose state at the values the Δ subgoal binds
  is known from the run's deltas (a keyed table at its changed keys; a table referencing the Δ
  subgoal's key, at inserted and deleted keys) is taken from them (ivm.maintain.references).

Presence checks (negation, statement (2), distinct values) consolidate the stored layers restricted to
the keys in the delta, never a whole relation; positive subgoals read the layers as they are, since
joins distribute over ⊎ (docs/design.md §3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, BodyItem, GroupBy, Literal, Program, SetOf, Subgoal, Var, Wildcard
from ivm.lang.auxiliary_views import case1, set_changes_known
from ivm.lang.nested import EXTRACTION, extractions
from ivm.maintain import cream, nested, references, subgoals
from ivm.maintain.delta_rules import DELTA, NEW, OLD, DeltaRule, delta_rules
from ivm.maintain.dred import DRed, RuleChange
from ivm.maintain.groupby import GroupByState, distinct_args, distinct_name, groupby_subgoals
from ivm.maintain.recompute import Evaluator, connected, join_order
from ivm.maintain.states import RunStates
from ivm.maintain.stats import MaintainStats
from ivm.stratify import Component, Strata
from ivm.vocabulary import Kind, ShortcutKind
from ivm.zset import (
    anti_join,
    as_used,
    consolidate,
    difference,
    local_join,
    negate,
    one_partition,
    quote,
    restrict,
    small_change,
    union_all,
)

log = logging.getLogger(__name__)
C = COUNT_COLUMN


# -- the relations a view stores ----------------------------------------------------------------------


def _uses(program: Program) -> dict[str, list[BodyItem]]:
    """Each predicate's uses in the program's rule bodies: the atoms, GROUPBY and setof subgoals over it."""
    uses: dict[str, list[BodyItem]] = {}
    for rule in program.rules:
        for item in rule.body:
            if isinstance(item, Subgoal):
                uses.setdefault(item.atom.pred, []).append(item)
    return uses


def ephemeral(program: Program, strata: Strata) -> set[str]:
    """Auxiliary predicates that are not stored: bag predicates outside recursion whose one use in the
    program is a GROUPBY subgoal that maintains every aggregate from Δ(U) and its stored state alone
    (COUNT, SUM, AVG, VARIANCE: 000 §6.2's incrementally computable functions). Algorithm 6.1 then
    never reads U (no MIN/MAX whose extreme may leave, no group recomputed), so U's rows (a join's
    result before its GROUP BY, as large as the join) would be written and kept for nothing: the full
    evaluation computes U inside the state's plan, a refresh passes Δ(U) to the state as a plan (dbt's
    "ephemeral" models: inlined into what reads them)."""
    uses = _uses(program)
    recursive = {p for c in strata.components if c.recursive for p in c.predicates}
    return {p for p, d in program.predicates.items()
            if d.kind == Kind.AUX and d.semantics == "bag" and p not in recursive and len(uses.get(p, [])) == 1
            and isinstance(uses[p][0], GroupBy) and GroupByState.self_maintainable(uses[p][0])}


def weighted(program: Program, strata: Strata) -> set[str]:
    """The `ephemeral` predicates whose GROUPBY (their one use) is linear (`GroupByState.linear`): a full
    evaluation may feed them unconsolidated tables (ivm.maintain.recompute.Evaluator's ``weighted``)."""
    uses = _uses(program)
    return {p for p in ephemeral(program, strata) if GroupByState.linear(uses[p][0])}


def view_predicates(program: Program, strata: Strata, view: str) -> list[str]:
    """The view's own predicates (its auxiliary ones, then itself) in evaluation order."""
    own = [p for p, d in program.predicates.items() if d.kind == Kind.AUX and d.owner == view] + [view]
    order = {p: i for i, comp in enumerate(strata.components) for p in comp.predicates}
    return sorted(own, key=lambda p: order[p])


def groupby_states(program: Program, empty: Evaluator) -> dict[str, GroupByState]:
    """The state relation of every GROUPBY subgoal of the program; T's column types come from the
    full evaluation's plan over empty tables (Spark analyses it; no job runs)."""
    states = {}
    for pred in program.predicates:
        for name, _, g in groupby_subgoals(program, pred):
            types = {f.name: f.dataType for f in empty.groupby(g).schema.fields}
            states[name] = GroupByState(name, g, types)
    return states


def stored_relations(program: Program, strata: Strata, view: str) -> list[str]:
    """Every relation maintaining ``view`` stores: its predicates (not the ephemeral ones), GROUPBY
    states, distinct-value counts. Names only, from the program: no Spark (the plan and publish stages
    of a DAG run need them and start no Spark application)."""
    out = []
    unstored = ephemeral(program, strata)
    for pred in view_predicates(program, strata, view):
        if pred not in unstored:
            out.append(pred)
        for name, _, g in groupby_subgoals(program, pred):
            out += [name, *(distinct_name(name, v) for v in distinct_args(g))]
    return out


def materialize(ev: Evaluator, states: dict[str, GroupByState], view: str):
    """Full evaluation of everything ``view`` stores, as (relation, Z-set) pairs in evaluation order:
    each GROUPBY state and distinct-value count from the grouped rows, then the predicate from its
    rules. The caller writes each pair before the next is computed; a predicate's GROUPBY subgoal
    whose state was written (``ev.groupby_tables``) is read from it: the state holds T's values as the
    full evaluation computes them, so the grouped rows are aggregated once. An ephemeral predicate is
    evaluated inside what reads it, never on its own."""
    unstored = ephemeral(ev.program, ev.strata)
    for pred in view_predicates(ev.program, ev.strata, view):
        if pred in unstored:
            continue
        for name, _, g in groupby_subgoals(ev.program, pred):
            st = states[name]
            rows = ev.atom(g.atom)  # the grouped relation as used (Evaluator.grouped_only, Evaluator.weighted)
            yield name, st.full(rows, weighted=g.atom.pred in ev.weighted)
            for var in st.distinct_args():
                yield st.distinct_name(var), st.distinct_rows(rows, var)
        yield pred, ev.relation(pred)


def presence_change(old_rows: DataFrame, delta_rows: DataFrame, columns: list[str], small: bool = False) -> DataFrame:
    """For each tuple of ``delta_rows``: +1 if it was absent (count ≤ 0) and is present after the
    delta, -1 if it was present and is not; tuples whose presence did not change are dropped.

    This is statement (2) of 000 Algorithm 4.1 (``set(Pᵛ) - set(P)``) and, negated, Definition 6.1's
    Δ(Q̄). The old counts are consolidated only for the keys in the delta (``small``: a small
    change's, `zset.restrict`).
    """
    cols = [F.col(quote(c)) for c in columns]
    keys = delta_rows.select(*cols).distinct()
    old = restrict(old_rows, keys, columns, small).select(*cols, F.col(C).alias("__o"),
                                                          F.lit(0).cast("long").alias("__d"))
    new = delta_rows.select(*cols, F.lit(0).cast("long").alias("__o"), F.col(C).alias("__d"))
    counts = old.unionByName(new).groupBy(*cols).agg(F.sum("__o").alias("__o"), F.sum("__d").alias("__d"))
    before, after = F.col("__o") > 0, (F.col("__o") + F.col("__d")) > 0
    change = F.when(~before & after, 1).when(before & ~after, -1).otherwise(0).cast("long")
    return counts.select(*cols, change.alias(C)).where(F.col(C) != 0)


class Maintained(NamedTuple):
    """What maintaining a predicate, or one term of its delta rules, returns: Δ (None: nothing changed)
    and what it counted beyond it."""

    delta: DataFrame | None
    stats: MaintainStats


class Counting:
    """Algorithm 4.1 over one run's states. ``maintain(pred)`` computes, writes and returns Δ(pred)."""

    def __init__(self, program: Program, strata: Strata, states: RunStates, groupbys: dict[str, GroupByState],
                 schemas: Callable[[str], object], limits: dict[str, int] | None = None,
                 updated_keys: dict[str, int] | None = None):
        self.program = program
        self.strata = strata
        self.states = states
        self.groupbys = groupbys
        self.schemas = schemas
        self.ev = Evaluator(program, strata, {}, scratch=states.scratch, limits=limits)
        #: auxiliary predicates no layer holds: only their Δ exists in a run
        self.ephemeral = ephemeral(program, strata)
        #: predicates of recursive components (maintained by DRed, ``maintain``)
        self.recursive = {p for c in strata.components if c.recursive for p in c.predicates}
        #: Δ of every predicate as the predicates above it use it (statement (2) for set predicates);
        #: absent: unchanged in this run
        self.used_delta: dict[str, DataFrame] = {}
        #: Δ of each GROUPBY / setof subgoal, computed once (its state delta is written once)
        self._subgoal_deltas: dict[str, DataFrame] = {}
        #: the GROUPBY states whose delta layer came out empty in this run (Δ(T) = ∅)
        self._unchanged_states: set[str] = set()
        #: rules `ivm apply` removed or added since the stored state was computed (the view's change, for
        #: each of its predicates)
        self.rule_changes: dict[str, RuleChange] = {}
        #: what DRed did to each recursive component it maintained in this run
        self.dred_stats: dict[Component, dict[str, int]] = {}
        #: tuples of each extraction function's delta in this run (002 §2.2: the changed elements)
        self.extraction_rows: dict[str, int] = {}
        #: the extraction functions whose Δe_S this run computed (once, whether or not it came out empty)
        self._extracted: set[str] = set()
        #: the keys each shortcut reads from storage in this run
        self.shortcut_keys: dict[references.Shortcut, references.KeysRead] = {}
        #: keys of a keyed table's net delta that are updates (both images), as its trim observed them
        #: (absent: not known); none means a foreign key's "read for updated keys" reads nothing
        self.updated_keys: dict[str, int] = dict(updated_keys or {})

    # -- states of a subgoal's predicate ---------------------------------------------------------------

    def changed(self, pred: str) -> bool:
        if pred not in self.used_delta and self.program.predicates[pred].kind == EXTRACTION \
                and pred not in self._extracted:  # (002 §2.2's Δe_S, computed once a run)
            self._extracted.add(pred)
            extracted = nested.extraction_delta(self, pred)
            if extracted is not None:
                self.extraction_rows[pred] = extracted.elements
                if extracted.rows is not None:
                    self.states.delta_bytes[pred], self.states.delta_rows[pred] = extracted.bytes, extracted.elements
                    self.used_delta[pred] = extracted.rows
        return pred in self.used_delta

    def note_delta(self, pred: str, delta: DataFrame | None, set_change: bool = False) -> None:
        """Record Δ(pred) (a base table's net delta, or a predicate's written delta layer) as the
        predicates above it will use it; ``set_change``: it is one already (a count-free strategy's
        view, ±1 a tuple)."""
        if delta is None:
            return
        p = self.program.predicates[pred]
        # 000 Algorithm 4.1 statement (2): only set changes propagate upward
        if p.semantics == "set" and not set_change and not self.set_changes(pred):
            path, rows, _ = self.states.scratch.put(f"{pred}__set_change",
                                                    presence_change(self.states.old(pred), delta, list(p.columns),
                                                                    self.states.small))
            if not rows:
                log.info("%s: counts changed but not the set; nothing propagates upward (statement (2))", pred)
                return
            delta = self.states.read_written(pred, [path])
        self.used_delta[pred] = delta

    def set_changes(self, pred: str) -> bool:
        """Whether the predicate's stored tuples count 1 and its Δ is already ``set(Pᵛ) − set(P)``, with
        no stored state to read: a keyed table's net delta (trimming refused an insert of a present key
        and a delete of an absent row; one key is one tuple) and DRed's Δ of a recursive predicate (000
        §7: what is gone was present, Δ⁺ holds absent tuples only)."""
        p = self.program.predicates[pred]
        return (p.kind == Kind.BASE and p.semantics == "set") or pred in self.recursive

    def used(self, pred: str, state: str) -> DataFrame:
        """The predicate in a subgoal at ``state``: as the rules above it use it (sets: count 1)."""
        if state == DELTA:
            return self.used_delta[pred]
        self._stored(pred)
        p = self.program.predicates[pred]
        if p.kind == EXTRACTION:  # e_S at the parent's state (002 §2.2: e is not stored)
            [rule] = self.program.rules_for(pred)
            return self.ev.rule(rule, lambda j, item: self.ev.atom(item.atom, self.joined(item.atom.pred, state)))
        rows = self.states.new(pred) if state == NEW else self.states.old(pred)
        return as_used(p, consolidate(rows)) if p.semantics == "set" else rows

    def joined(self, pred: str, state: str) -> DataFrame:
        """The predicate as a positive subgoal of a delta rule joins it. A table's layers are joined as
        they are: joins distribute over ⊎ (docs/design.md §3), and a keyed table's counts add up to 0 or 1
        per tuple (trimming refused anything else), so consolidating it first (a shuffle of the whole
        table in every delta rule that reads it) would change nothing."""
        if state != DELTA and self.program.predicates[pred].kind == Kind.BASE:
            return self.states.new(pred) if state == NEW else self.states.old(pred)
        return self.used(pred, state)

    def _stored(self, pred: str) -> None:
        if pred in self.ephemeral:  # (`ephemeral` admits no use that reads the state: a bug if reached)
            raise RuntimeError(f"{pred} is not stored (an ephemeral auxiliary predicate): only its Δ exists")

    def source(self, atom: Atom, state: str, groups: DataFrame | None = None,
               group_vars: list[str] | None = None) -> DataFrame:
        """The atom's predicate at ``state`` as used, consolidated (positive counts), restricted before
        consolidating to the tuples whose ``group_vars`` occur in ``groups``."""
        self._stored(atom.pred)
        p = self.program.predicates[atom.pred]
        raw = self.states.new(atom.pred) if state == NEW else self.states.old(atom.pred)
        if groups is not None and group_vars:
            position = {a.name: c for c, a in zip(p.columns, atom.args, strict=True) if isinstance(a, Var)}
            keys = groups.select(*[F.col(quote(v)).alias(position[v]) for v in group_vars])
            raw = restrict(raw, keys, [position[v] for v in group_vars], self.states.small)
        return as_used(p, consolidate(raw))

    def rows(self, atom: Atom, state: str, groups: DataFrame | None = None,
             group_vars: list[str] | None = None) -> DataFrame:
        """Like ``source``, as the atom's variables + ``__count``."""
        return consolidate(self.ev.atom(atom, self.source(atom, state, groups, group_vars)))

    # -- Algorithm 4.1 --------------------------------------------------------------------------------

    def maintain_view(self, view: str) -> MaintainStats:
        """Δ of each of the view's predicates (`maintain`), and what it took beyond the deltas: the
        counts its delta rules returned, DRed's over its recursive components, and 002 §2.2's changed
        elements of the extraction functions it reads."""
        preds = view_predicates(self.program, self.strata, view)
        stats = sum((self.maintain(pred).stats for pred in preds), MaintainStats())
        for component, dred in self.dred_stats.items():
            if set(preds) & set(component.predicates):
                stats += MaintainStats(dred=dred)
        changed = {e: self.extraction_rows[e] for e in extractions(self.program, self.strata.upstream(view))
                   if e in self.extraction_rows}  # (002 §2.2: only the elements that changed)
        return stats + MaintainStats(changed_elements=changed)

    def maintain(self, pred: str) -> Maintained:
        """Δ(pred) from the delta rules whose Δ subgoal changed; written as a delta layer of ``pred``
        (and of its GROUPBY states); None when nothing changed. A predicate of a recursive component
        is maintained with its whole component by DRed (000 §7). With what its delta rules' terms
        counted (`MaintainStats`: subgoals taken from the deltas, joined once, probed ids)."""
        component = next(c for c in self.strata.components if pred in c.predicates)
        if component.recursive:
            if component not in self.dred_stats:
                change = next((self.rule_changes[p] for p in component.predicates if p in self.rule_changes), None)
                dred = DRed(self, component, change)
                for p, delta in dred.run().items():
                    delta = self.states.put_delta(p, delta) if delta is not None else None
                    self.note_delta(p, delta)
                self.dred_stats[component] = dred.stats
            return Maintained(self.states.delta(pred), MaintainStats())
        terms: list[Maintained] = []
        for r, rule in enumerate(self.program.rules_for(pred)):
            ds = [(d, d.states.index(DELTA)) for d in delta_rules(rule)]
            ds = [(d, i) for d, i in ds if self.changed(d.rule.body[i].atom.pred)
                  and not subgoals.rule_for(self.program, d.rule.body[i]).empty(self, pred, r, i, d.rule.body[i])]
            shared = self.factored(pred, r, ds)
            terms += [shared] if shared is not None else [self.delta_rule(pred, r, d, i) for d, i in ds]
        stats = sum((t.stats for t in terms), MaintainStats())
        if not terms:
            return Maintained(None, stats)
        delta = consolidate(union_all([t.delta for t in terms]), self.program.predicates[pred].columns)
        if pred in self.ephemeral:  # not stored: Δ(pred) enters its one GROUPBY subgoal's state delta as a plan
            self.used_delta[pred] = delta
            return Maintained(delta, stats)
        delta = self.states.put_delta(pred, delta)
        self.note_delta(pred, delta)
        return Maintained(delta, stats)

    def delta_rule(self, pred: str, r: int, d: DeltaRule, i: int) -> Maintained:
        """One term of Definition 4.1 as a Spark plan, starting the joins from the Δ subgoal; with the
        subgoals it took from the deltas and the collection ids it probed owner indexes with."""
        probed, ids = nested.probe_indexes(self, d, i, lambda j, item, state: self.subgoal(pred, r, j, item, state))
        taken = references.apply(self, d, i)
        stats = MaintainStats(from_deltas=len(taken), probed_ids=ids)
        order = join_order(d.rule.body, i, set(range(len(d.rule.body))))
        subgoal, local = self.term_subgoals(pred, r, d, i, probed | taken, order, set(taken))
        df = self.ev.rule(d.rule, subgoal, lambda j, item, df: self.absent(item, df, d.states[j]), first=i)
        return Maintained(one_partition(df) if local else df, stats)

    def term_subgoals(self, pred: str, r: int, d: DeltaRule, i: int, probed: dict[int, DataFrame],
                      order: list[int], taken: set[int]) -> tuple[Callable[[int, BodyItem], DataFrame | None], bool]:
        """The relations the joins ``order`` of delta rule ``d`` (Δ subgoal ``i``) read: ``probed`` ones
        as given, the others by `subgoal`; and whether the joins are local. They are in a small run
        where every subgoal after the Δ one is ``taken`` from the deltas (ivm.maintain.references: in
        one partition, as the Δ subgoal is): joined inside that partition (`zset.local_join`), the Δ
        subgoal not broadcast (a broadcast is a Spark job of its own); the caller marks the result as in
        one partition (`zset.one_partition`), which Spark does not tell from a join's two sides."""
        local = self.states.small and len(order) > 1 and all(j in taken for j in order if j != i)

        def subgoal(j: int, item: BodyItem) -> DataFrame | None:
            if j in probed:
                return local_join(probed[j]) if local else probed[j]
            return self.subgoal(pred, r, j, item, d.states[j], broadcast=not local)

        return subgoal, local

    def factored(self, pred: str, r: int, ds: list[tuple[DeltaRule, int]]) -> Maintained | None:
        """The delta rules ``ds`` of one rule (Δ subgoal positions given) as one plan when they share
        subgoals that did not change in this run; None when they do not (evaluate them one by one).

        An unchanged subgoal is the same relation at its old and new state, so every term of 000
        Definition 4.1 joins it the same way, and joins distribute over ⊎:
        ``⊎ᵢ (Tᵢ ⋈ U) = (⊎ᵢ Tᵢ) ⋈ U``. The terms are joined over the changed subgoals alone, added up,
        and the unchanged subgoals joined once (Q3: ``(Δo ⋈ L ⊎ Oᵛ ⋈ Δl) ⋈ C`` reads customer once,
        not per term). Only where each term's changed subgoals join without a cross product; a
        subgoal a term takes from the deltas through a foreign key (a read at a few keys) stays in the
        terms. Rules with negation, aggregation, sets of values, nested data's extraction functions or
        owner indexes, or set operators' null-safe joins are evaluated term by term (an UNNEST is applied
        after all joins either way, so it distributes like the joins)."""
        if len(ds) < 2:
            return None
        rule = ds[0][0].rule
        body = rule.body

        def plain(item: BodyItem) -> bool:  # a positive join the terms share or not, nothing else
            entry = subgoals.rule_for(self.program, item)
            if entry is None:  # a condition, an assignment, an unnest
                return True
            return entry.joins and not item.null_safe and self.program.predicates[item.atom.pred].role is None

        if not all(plain(item) for item in body):
            return None
        taken = [references.shortcuts(self.program, d, i) for d, i in ds]
        shared = {j for j, item in enumerate(body) if isinstance(item, Literal) and not self.changed(item.atom.pred)
                  and all(t.get(j) is None or t[j].kind is ShortcutKind.LOOKUP for t in taken)}
        inner = {j for j, item in enumerate(body) if isinstance(item, Literal)} - shared
        if not shared or not all(connected(body, join_order(body, i, inner)) for _, i in ds):
            return None
        parts, from_deltas = [], 0
        for d, i in ds:
            probed = references.apply(self, d, i, inner)
            from_deltas += len(probed)
            order = join_order(body, i, inner)
            subgoal, local = self.term_subgoals(pred, r, d, i, probed, order, set(probed))
            df, _, _ = self.ev.joins(rule, subgoal, order)
            parts.append(one_partition(df) if local else df)
        terms = union_all(parts)
        bound = frozenset(c for c in terms.columns if c != C)
        df, _, _ = self.ev.joins(rule, lambda j, item: self.subgoal(pred, r, j, item, OLD),
                                 join_order(body, among=shared, bound=bound), df=terms)
        log.info("%s: %d delta rules joined once with %s (unchanged)", pred, len(ds),
                 ", ".join(body[j].atom.pred for j in sorted(shared)))
        return Maintained(self.ev.finish(rule, df, inner | shared, self.ev.absent),
                          MaintainStats(from_deltas=from_deltas,
                                        joined_once={pred: sorted(body[j].atom.pred for j in shared)}))

    def subgoal(self, pred: str, r: int, j: int, item: BodyItem, state: str,
                broadcast: bool = True) -> DataFrame | None:
        """The relation body item ``j`` of rule ``r`` of ``pred`` joins at ``state`` (old, new or Δ), as its
        kind's delta rule reads it (ivm.maintain.subgoals); None for a negated atom outside the Δ position
        (an anti-join, ``absent``). A small Δ is broadcast into the joins unless ``broadcast`` is False
        (`term_subgoals`)."""
        rule = subgoals.RULES[subgoals.kind(self.program, item)]
        if state == DELTA:
            return rule.delta(self, pred, r, j, item, broadcast)
        return rule.state(self, pred, r, j, item, state)

    def absent(self, item: Literal, df: DataFrame, state: str) -> DataFrame:
        """``not quote(...)`` applied to ``df``: 000 §6.1 cases 1 and 2, Q̄ from the old Q after the Δ
        subgoal, from Qᵛ before it (restricted to the keys of ``df``)."""
        shared = [v for v in item.atom.variables() if v in df.columns]
        rows = self.states.new(item.atom.pred) if state == NEW else self.states.old(item.atom.pred)
        q = self.ev.atom(item.atom, rows)
        if shared:
            q = restrict(q, df.select(*[F.col(quote(v)) for v in shared]).distinct(), shared, self.states.small)
        return anti_join(df, consolidate(q).where(F.col(C) > 0), item.null_safe)

    def negation_delta(self, atom: Atom) -> DataFrame:
        """000 Definition 6.1: Δ(Q̄) = +1 for tuples of Δ(Q) not in Q ⊎ Δ(Q), -1 for those not in Q."""
        delta = consolidate(self.ev.atom(atom, self.states.delta(atom.pred)))
        if self.set_changes(atom.pred) and not any(isinstance(a, Wildcard) for a in atom.args):
            # Q's tuples count 1 and its Δ is set(Qᵛ) − set(Q) (`set_changes`); so is a selection of it
            # (constants, repeated variables): -1 tuples were present and are gone, +1 ones the reverse
            return negate(delta)
        variables = [a.name for a in dict.fromkeys(x for x in atom.args if isinstance(x, Var))]
        old = self.ev.atom(atom, self.states.old(atom.pred))
        # the raw Δ(Q), not the set change: presence is judged on Q's own counts
        change = presence_change(old, delta, variables, self.states.small)
        return negate(change)

    def groupby_unchanged(self, name: str, g: GroupBy) -> bool:
        """Whether the GROUPBY state ``name``'s Δ(T) is empty in this run (computed and written first, as
        000 Algorithm 6.1 does before any term over it is planned)."""
        self.groupby_delta(name, g)
        return name in self._unchanged_states

    def groupby_delta(self, name: str, g: GroupBy) -> DataFrame:
        """000 Algorithm 6.1: Δ(T) for the groups Δ(U) touches, from the stored state (written once, as
        a delta layer of the state relation ``name``)."""
        if name not in self._subgoal_deltas:
            self._subgoal_deltas[name] = self._groupby_delta(name, g)
        return self._subgoal_deltas[name]

    def _groupby_delta(self, name: str, g: GroupBy) -> DataFrame:
        st = self.groupbys[name]
        delta_rows = consolidate(self.ev.atom(g.atom, self.used_delta[g.atom.pred]))
        changes = {}
        for var in st.distinct_args():  # the (group, value) counts behind COUNT/SUM/AVG(DISTINCT x)
            dname = st.distinct_name(var)
            dd = self.states.put_delta(dname, st.distinct_rows(delta_rows, var))
            if dd is not None:
                changes[var] = presence_change(self.states.old(dname), dd, [*st.by, var], self.states.small)

        def new_rows(groups: DataFrame | None) -> DataFrame:
            return self.rows(g.atom, NEW, groups, st.by)

        partial, small, whole = st.partial(delta_rows, changes), self.states.small, self.states.fits_one_partition(name)
        if not small and self.states.single_partition_rows:
            # (not read whole then: the touched groups are a written file's, their broadcast one short job)
            partial, small = self._settled(name, partial)
        dstate = st.delta(partial, self.states.old(name), new_rows, self.schemas(name), small, whole)
        written = self.states.put_delta(name, dstate)
        if written is None:
            self._unchanged_states.add(name)
        return consolidate(st.finalize(written if written is not None else self.states.read(name, [])))

    def _settled(self, name: str, partial: DataFrame) -> tuple[DataFrame, bool]:
        """A large run's Δ(U) per group, written first (a scratch result) and read back, with whether it
        is small (`spark.single_partition_rows`). A large change often touches few groups (a join's
        filters drop most of it, a GROUP BY has few keys: Q3's 750k changed rows at SF 10 touch ~1,000);
        its size known, the pairing with the old state is planned in one partition (the state's rows at
        the groups' broadcast keys gathered into it) where the distributed plan ran a chain of Spark
        stages, each a job, over a few thousand rows — and computed the partial twice (for the touched
        groups and for the pairing)."""
        path, rows, _ = self.states.scratch.put(f"{name}__partial", partial)
        small = small_change(rows, self.states.single_partition_rows)
        back = self.states.scratch.read([path], partial.schema)
        log.info("%s: Δ(U) touches %d groups: paired with the state in %s", name, rows,
                 "one partition" if small else "a distributed plan")
        return (one_partition(back) if small else back), small

    def setof_delta(self, pred: str, r: int | str, j: int, s: SetOf) -> DataFrame:
        """A setof subgoal's changed groups: each touched group's set before (-1) and after (+1)."""
        name = f"{pred}__setof{r}_{j}"
        if name not in self._subgoal_deltas:
            self._subgoal_deltas[name] = self._setof_delta(pred, r, s)
        return self._subgoal_deltas[name]

    def _setof_delta(self, pred: str, r: int | str, s: SetOf) -> DataFrame:
        group = [v.name for v in s.group()]
        if not set_changes_known(self.program, s):
            # no auxiliary view (`auxiliary_views: false`) over a bag or a projection: the touched groups'
            # sets are read from φ before and after the change, as 001 §3's Γ1–Γ6 do
            touched = self.ev.atom(s.atom, self.used_delta[s.atom.pred]).select(*[F.col(quote(v)) for v in group]) \
                .distinct() if group else None
            before = self.ev.setof(s, self.source(s.atom, OLD, touched, group))
            after = self.ev.setof(s, self.source(s.atom, NEW, touched, group))
            return difference(after, before)
        # CReaM Step 4 (001 Figure 1): Δ1–Δ6 over v_a and φ's set changes φ⁺/φ⁻
        changes = self.ev.atom(s.atom, self.used_delta[s.atom.pred])
        rule = self.program.rules_for(pred)[r] if isinstance(r, int) else None
        if rule is not None and case1(self.program, rule, s):
            def old_sets(groups: DataFrame | None) -> DataFrame:  # Case 1: v holds the sets itself
                sets = self.ev.atom(rule.head, self.states.old(pred))
                if groups is not None:  # the touched groups' tuples, consolidated (not all of the view)
                    sets = restrict(sets, groups, group, self.states.small)
                return consolidate(sets).where(F.col(C) > 0)
        else:
            def old_sets(groups: DataFrame | None) -> DataFrame:  # W' of the touched groups, from v_a
                return self.ev.setof(s, self.source(s.atom, OLD, groups, group))
        return cream.set_delta(s, changes, old_sets)
