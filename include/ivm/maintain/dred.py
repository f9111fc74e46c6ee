"""DRed, Delete and Rederive (000 §7): incremental maintenance of a recursive component on Spark.

The component's predicates are sets (count 1 per tuple). Its rules read the component itself and
lower strata, which the counting algorithm has already brought to their new state in this run
(000 §7: "propagating the changes stratum by stratum"); what changed below is, per subgoal, the
presence change of its bindings: Del (-1) and Add (+1). For a positive atom that is set(Qᵛ) − set(Q);
for a negated atom Definition 6.1's Δ(¬q); for a GROUPBY or setof subgoal the changed groups
(Algorithm 6.1). Then, exactly as §7 states:

1. **Over-delete** (Δ⁻-rules): ``δ⁻(p) :- s1, ..., δ⁻(si), ..., sn`` with every other subgoal in its old
   state (the materialization, "without incorporating the deletions"), seeded by the Del of the lower
   subgoals and iterated semi-naively over δ⁻ of the component's predicates to a fixpoint.
2. **Rederive** (Δʳ-rules): ``δ⁺(p) :- δ⁻(p) & s1ᵛ & ... & snᵛ`` where the component's subgoals are
   ``Pᵛ = P − δ⁻(P)`` plus what was rederived so far and lower subgoals are new; iterated to a fixpoint
   (after the first round only derivations through a newly rederived tuple are tried).
3. **Insert** (Δ⁺-rules): ``Δ⁺(p) :- s1ᵛ, ..., Δ⁺(si), ..., snᵛ`` with every other subgoal new, seeded by
   the Add of the lower subgoals and iterated over the inserted tuples to a fixpoint; a tuple already
   in Pᵛ is not inserted.

Δ(P) = (δ⁻(P) − δ⁺(P)) as -1 ⊎ Δ⁺(P) as +1, written as a delta layer like any other (Theorem 7.1: the
result is exactly the set derivable from the new base). Stored layers of a component predicate hold
counts that sum to 1 or 0 per tuple, so the steps join them unconsolidated (joins distribute over ⊎)
and consolidate only their small results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ivm.config import COUNT_COLUMN
from ivm.ir import Atom, BodyItem, Expr, GroupBy, Literal, Program, Rule, SetOf, Subgoal, Var
from ivm.maintain.delta_rules import DELTA, NEW, OLD, render_item
from ivm.maintain.fixpoint import (
    Absent,
    Rounds,
    as_set,
    recursive_positions,
    rederivation_rule,
    seminaive_terms,
    transitive_extensions,
    transitive_rule,
)
from ivm.storage import with_count
from ivm.stratify import Component, Strata, stratify
from ivm.vocabulary import Kind
from ivm.zset import anti_join, consolidate, negate, restrict, union_all

if TYPE_CHECKING:
    from ivm.maintain.states import DeltaContext

log = logging.getLogger(__name__)
C = COUNT_COLUMN


def dred_rules(program: Program, component: Component) -> list[dict[str, str]]:
    """000 §7's rules for every rule of the component, as `ivm explain` prints them: the Δ⁻-rules
    (step 1, old states), the Δʳ-rule (step 2, new states) and the Δ⁺-rules (step 3, new states); a
    transitive closure's transitivity rule has steps 1 and 3 only (``DRed.transitive``)."""
    out = []
    for p in component.predicates:
        closure = transitive_rule(program, p, component.predicates)
        for rule in program.rules_for(p) + ([closure] if closure else []):
            subgoals = [i for i, item in enumerate(rule.body) if isinstance(item, Subgoal)]

            def body(states: dict[int, str], mark: str, rule=rule) -> str:
                return ", ".join(render_item(item, states.get(j), mark) for j, item in enumerate(rule.body))

            new = dict.fromkeys(subgoals, NEW)
            out += [{"predicate": p, "step": "1 over-delete", "rule": f"δ⁻{rule.head} :- {body({i: DELTA}, 'δ⁻')}."}
                    for i in subgoals]
            if rule is not closure:
                out.append({"predicate": p, "step": "2 rederive",
                            "rule": f"δ⁺{rule.head} :- δ⁻{rule.head}, {body(new, '')}."})
            out += [{"predicate": p, "step": "3 insert", "rule": f"Δ⁺{rule.head} :- {body(new | {i: DELTA}, 'Δ⁺')}."}
                    for i in subgoals]
    return out


@dataclass(frozen=True)
class RuleChange:
    """Rules removed from and added to a view's recursive predicates by `ivm apply` (000 §7: DRed also
    maintains a view "when rules defining derived relations are inserted or deleted")."""

    removed: dict[str, list[Rule]] = field(default_factory=dict)
    added: dict[str, list[Rule]] = field(default_factory=dict)

    def describe(self) -> str:
        n, m = sum(map(len, self.removed.values())), sum(map(len, self.added.values()))
        return f"{n} rule{'s' * (n != 1)} removed, {m} added"


def rule_change(old: Program, new: Program, view: str) -> RuleChange | str:
    """How the view's rules changed between the program its stored state was computed from and the
    current one, if DRed can follow the change incrementally; else why not (a full recompute then).

    DRed can when the view keeps its predicates (names, columns, semantics) and its recursive
    components, only rules of recursive predicates changed, and no changed rule aggregates (GROUPBY
    and setof states are stored per rule)."""
    from ivm.maintain.groupby import groupby_subgoals

    def own(program: Program) -> dict[str, tuple]:
        return {p: (tuple(d.columns), d.semantics) for p, d in program.predicates.items()
                if p == view or (d.kind == Kind.AUX and d.owner == view)}

    if own(old) != own(new):
        return "its predicates or their columns changed"

    def recursive(strata: Strata) -> set[tuple[str, ...]]:  # views never recurse through each other
        return {c.predicates for c in strata.components if c.recursive and set(c.predicates) <= set(own(new))}

    if recursive(stratify(old)) != recursive(stratify(new)):
        return "its recursive components changed"
    inside = {p for c in recursive(stratify(new)) for p in c}
    change = RuleChange()
    for p in own(new):
        before, after = old.rules_for(p), new.rules_for(p)
        if [str(r) for r in before] == [str(r) for r in after]:
            continue
        if p not in inside:
            return f"rules of the nonrecursive predicate {p} changed"
        removed, added = _difference(before, after), _difference(after, before)
        if any(isinstance(i, GroupBy | SetOf) for r in removed + added for i in r.body):
            return f"a changed rule of {p} aggregates"
        if ([(n, str(g)) for n, _, g in groupby_subgoals(old, p)]
                != [(n, str(g)) for n, _, g in groupby_subgoals(new, p)]):
            return f"the aggregation states of {p} moved"
        change.removed[p], change.added[p] = removed, added
    return change


def _difference(a: list[Rule], b: list[Rule]) -> list[Rule]:
    """The rules of ``a`` not in ``b`` (as multisets, compared by their text)."""
    rest = [str(r) for r in b]
    out = []
    for r in a:
        if str(r) in rest:
            rest.remove(str(r))
        else:
            out.append(r)
    return out


def _canonical(atom: Atom) -> tuple[Atom, list[str]]:
    """The atom with its variables renamed ``_v0, _v1, ...`` in order of first occurrence (constants,
    wildcards and repeats kept), and the names they replace: atoms that select the same tuples of the
    same predicate have one canonical form."""
    names = list(dict.fromkeys(a.name for a in atom.args if isinstance(a, Var)))
    return Atom(atom.pred, tuple(Var(f"_v{names.index(a.name)}") if isinstance(a, Var) else a
                                 for a in atom.args)), names


def _union(*frames: DataFrame | None) -> DataFrame:
    """⊎ of the frames that are there (None: an empty part, left out of the plan)."""
    return union_all([f for f in frames if f is not None])


def _added(rounds: Rounds, pred: str) -> DataFrame | None:
    """What the rounds added to ``pred``, None while nothing."""
    return rounds.all(pred) if rounds.rows[pred] else None


class DRed:
    """The three steps of 000 §7 for one recursive component, over one run's states."""

    def __init__(self, counting: DeltaContext, component: Component, change: RuleChange | None = None):
        self.c = counting
        self.ev = counting.ev
        self.preds = component.predicates
        self.component = component
        self.change = change or RuleChange()
        #: the rules now (steps 2 and 3), labelled by their position, and the rules the stored state was
        #: derived with (step 1): the current ones less the added, plus the removed
        self.rules = {p: list(enumerate(counting.program.rules_for(p))) for p in self.preds}
        self.old_rules = {p: [(r, rule) for r, rule in self.rules[p]
                              if rule not in self.change.added.get(p, [])]
                          + [(f"removed{k}", rule) for k, rule in enumerate(self.change.removed.get(p, []))]
                          for p in self.preds}
        self.schemas = {p: with_count(counting.schemas(p)) for p in self.preds}
        #: p(X, Y) :- p(X, Z), p(Z, Y) for a predicate that is a transitive closure (steps 1 and 3 only:
        #: its Δʳ-rule would join Pᵛ with itself), unless its rules changed since the stored state
        self.transitive = {p: rule for p in self.preds if not self.change.added.get(p)
                           and not self.change.removed.get(p)
                           and (rule := transitive_rule(counting.program, p, self.preds)) is not None}
        #: its body positions the first round's tuples are not taken at (``fixpoint.transitive_extensions``)
        self.transitive_skip = {p: frozenset({0, 1}) - transitive_extensions(counting.program, p, self.preds)
                                for p in self.transitive}
        #: tuples over-deleted, rederived and inserted (after ``run``)
        self.stats: dict[str, int] = {}
        #: the Del and Add of each changed lower atom (canonical, ``_canonical``) and GROUPBY or setof
        #: subgoal (pred, rule, position), written once; None: empty
        self._changes: dict[tuple, dict[int, DataFrame | None]] = {}

    def columns(self, pred: str) -> list[str]:
        return list(self.c.program.predicates[pred].columns)

    def old(self, pred: str) -> DataFrame:
        """The stored materialization P (its layers, counts summing to 1 per tuple)."""
        return self.c.states.old(pred)

    def absent(self, state: str) -> Absent:
        return lambda j, item, df: self.c.absent(item, df, state)

    # -- what changed below the component ------------------------------------------------------------

    def lower_changes(self, pred: str, r: int | str, rule: Rule, sign: int) -> dict[int, DataFrame]:
        """Per subgoal of rule ``r`` of ``pred`` outside the component whose input changed in this run,
        the bindings it gained (sign +1, Add) or lost (sign -1, Del), count 1; written once to the
        scratch space, empty ones left out. An atom's change is written once for every rule and step
        that reads it (``edge(X, Y)`` in the exit rule and ``edge(Z, Y)`` in the linear one are one
        change, its columns renamed)."""
        inside = recursive_positions(rule, self.preds)
        out = {}
        for j, item in enumerate(rule.body):
            if j in inside or not isinstance(item, Subgoal) or not self.c.changed(item.atom.pred):
                continue
            if isinstance(item, Literal):
                canon, names = _canonical(item.atom)
                parts = self._written(canon, lambda canon=canon: negate(self.c.negation_delta(canon)))
                # Definition 6.1 is +1 for "now absent": a positive atom's Add is its negation's Del
                part = parts[-sign if item.negated else sign]
                if part is not None:
                    out[j] = part.select(*[F.col(f"_v{i}").alias(n) for i, n in enumerate(names)], C)
            else:  # Algorithm 6.1 / setof: -1 for a group's old tuple, +1 for its new one
                part = self._written((pred, r, j), lambda item=item, j=j: self.c.subgoal(pred, r, j, item, DELTA))[sign]
                if part is not None:
                    out[j] = part
        return out

    def _written(self, key: tuple, change: Callable[[], DataFrame]) -> dict[int, DataFrame | None]:
        """The Del (-1) and Add (+1) of a change, written in one job, apart, and read back with count 1
        (None: empty); once per ``key``."""
        if key not in self._changes:
            df = change()
            parts = self.c.states.scratch.put_signed(f"{self.preds[0]}__dred_change{len(self._changes)}", df)
            schema = StructType([f for f in df.schema.fields if f.name != C])
            self._changes[key] = {s: self.c.states.scratch.read([path], schema).withColumn(C, F.lit(1).cast("long"))
                                  if rows else None for s, (path, rows, _) in parts.items()}
        return self._changes[key]

    def seeds(self, sign: int, whole: Callable[[str], DataFrame], state: str) -> dict[str, DataFrame]:
        """The first round of step 1 (sign -1: Del of the lower subgoals, everything else old, over the
        old rules; and every derivation of a removed rule) or step 3 (sign +1: Add, everything else
        new; and every derivation of an added rule): one term per rule and changed lower subgoal."""
        out = {}
        for p in self.preds:
            terms = []
            for r, rule in self.old_rules[p] if sign < 0 else self.rules[p]:
                for j, part in self.lower_changes(p, r, rule, sign).items():
                    terms.append(self.ev.rule(rule, self._subgoals(p, r, rule, state, whole, {j: part}),
                                              self.absent(state), first=j))
            changed = self.change.removed if sign < 0 else self.change.added
            for k, rule in enumerate(changed.get(p, [])):
                terms.append(self.ev.rule(rule, self._subgoals(p, f"changed{k}", rule, state, whole, {}),
                                          self.absent(state)))
            if terms:
                out[p] = as_set(union_all(terms), self.columns(p))
        return out

    def _subgoals(self, pred: str, r: int | str, rule: Rule, state: str, whole: Callable[[str], DataFrame],
                  given: dict[int, DataFrame], shift: int = 0) -> Callable[[int, BodyItem], DataFrame | None]:
        """Body items of rule ``r``: ``given`` positions as given, the component's subgoals from
        ``whole``, lower subgoals at ``state``. ``shift``: leading items added to the rule's body."""
        inside = {i + shift for i in recursive_positions(rule, self.preds)}

        def subgoal(j: int, item: BodyItem) -> DataFrame | None:
            if j in given:
                return given[j]
            if j in inside:
                return self.ev.atom(item.atom, whole(item.atom.pred))
            return self.c.subgoal(pred, r, j - shift, item, state)

        return subgoal

    def _rounds(self, rounds: Rounds, candidates: dict[str, DataFrame], whole: Callable[[str], DataFrame],
                state: str, known: Callable[[str, DataFrame], DataFrame] | None = None) -> None:
        """Semi-naive rounds to the fixpoint: each round's new tuples at the Δ position of the
        component's subgoals, ``whole`` at the others, lower subgoals at ``state`` (the old rules in the
        old state, step 1).

        The first round's tuples (derived from the changes below) of a transitive closure are also
        extended by its transitivity rule (``fixpoint.transitive_rule``): through the whole closure at
        once, so the tuples a changed edge adds or over-deletes are found in two rounds, not one per
        edge along the paths that follow it. Later rounds use the rules as written: their tuples'
        extensions through the closure came with the first round's, and joining every round with the
        whole closure would grow with the cube of a long path. In step 1 the rule over-deletes nothing
        the Δ⁻-rules would not: δ⁻(p) ⋈ P and P ⋈ δ⁻(p) are old tuples with an old derivation through
        an over-deleted tuple. Of its two terms only the one that reaches past the linear rules' first
        round runs (``fixpoint.transitive_extensions``: with ``p(X, Z), e(Z, Y)``, the tuples are extended
        by the successors of their ends), so the round scans the closure once. When no path takes two
        changed edges the second round is the last (``closed_after_extension``): the semi-naive round
        after it, which would find nothing, is not run."""
        plain = self.old_rules if state == OLD else self.rules
        rules = {p: plain[p] + ([("transitive", self.transitive[p])] if p in self.transitive else [])
                 for p in self.preds}  # the first round's
        closed = False  # the second round ends the fixpoint (``closed_after_extension``)
        while candidates:
            changed = rounds.add(candidates, known)
            if closed:
                log.info("%s: %s complete after round 2: no path takes two changed edges, so no round of "
                         "the fixpoint can add more (DRed.closed_after_extension)", rounds.view, rounds.step)
                return
            if rounds.round == 1:
                closed = all(p in self.transitive for p in self.preds) and \
                    all(self.closed_after_extension(p, changed[p], state) for p in changed)
            candidates = {}
            for p in self.preds:
                terms = [t for r, rule in rules[p]
                         for t in seminaive_terms(self.ev, rule, self.preds, changed, whole,
                                                  self._subgoals(p, r, rule, state, whole, {}), self.absent(state),
                                                  skip=self.transitive_skip[p] if r == "transitive" else ())]
                if terms:
                    candidates[p] = as_set(union_all(terms), self.columns(p))
            rules = plain

    def closed_after_extension(self, p: str, first: DataFrame, state: str) -> bool:
        """Whether the first two rounds of step 1 or 3 on the transitive closure ``p`` (``transitive_rule``)
        reach the fixpoint, so that the semi-naive round that would only prove it is not run.

        With ``p(X, Z), e(Z, Y)`` the first round holds, for each changed edge (a, b), (a, b) and the
        (x, b) of every (x, a) in the closure the step reads (less, in step 3, the tuples of Pᵛ); the
        second extends them by the closure on the right. A path x →* a → b →* y with one changed edge is
        then complete: (x, b) is in the first round or in the closure, and (b, y) in the closure.
        Step 1 (old state): over-deleted are the old paths through a deleted edge; cut at the first
        one, the rest of the path is old, so every one is a path with one changed edge to extend, and
        the two rounds hold them all. Step 3 (new state): a new pair whose every path takes k ≥ 2
        inserted edges, a₁ → b₁ →* a₂ → b₂ with old edges between, puts (b₁, b₂) into the first round
        (b₁ reaches a₂ in Pᵛ or is a₂; and (b₁, b₂) is not in Pᵛ, else a path with fewer inserted edges
        would exist): so if no tuple of the first round starts where an inserted edge ends, every new
        pair has a path with one inserted edge. ``e(X, Z), p(Z, Y)`` is the mirror image (a tuple that
        ends where an inserted edge starts). The check is one small semi-join of the first round with
        the inserted edges; the round it saves joins the second round with the edges and the closure."""
        if state == OLD:
            return True
        r, exit_rule = next((r, rule) for r, rule in self.rules[p] if not recursive_positions(rule, self.preds))
        inserted = self.lower_changes(p, r, exit_rule, +1).get(0)
        if inserted is None:
            return True
        x, y = (a.name for a in exit_rule.head.args)  # e(X, Y): the inserted edges' columns (_linear_sides)
        right = 0 not in self.transitive_skip[p]  # p(X, Z), e(Z, Y): the round's tuples extend on the right
        at, end = (x, y) if right else (y, x)
        ends = inserted.select(F.col(end).alias(at))  # (a semi-join needs no distinct keys)
        return self.ev.atom(exit_rule.head, first).join(ends, at, "left_semi").isEmpty()

    # -- the three steps ------------------------------------------------------------------------------

    def overdelete(self) -> Rounds:
        """Step 1: δ⁻ of every predicate of the component, the Δ⁻-rules over old states to a fixpoint."""
        rounds = Rounds(self.ev, self.component, "dred_delete", self.schemas)
        self._rounds(rounds, self.seeds(-1, self.old, OLD), self.old, OLD)
        return rounds

    def rederive(self, deleted: Rounds) -> Rounds:
        """Step 2: the over-deleted tuples with a derivation in the new state, by the Δʳ-rules."""
        rounds = Rounds(self.ev, self.component, "dred_rederive", self.schemas)
        over = {p: deleted.all(p) for p in self.preds if deleted.rows[p]}

        def whole(q: str) -> DataFrame:  # Pᵛ: P less δ⁻(P), plus what was rederived so far
            return _union(self.old(q), negate(deleted.all(q)) if deleted.rows[q] else None, _added(rounds, q))

        def terms(p: str, changed: dict[str, DataFrame] | None) -> list[DataFrame]:
            out = []
            for r, rule in self.rules[p]:
                ext = rederivation_rule(rule)  # body item 0 is δ⁻(p): the rule's own items shift by one
                lead = {0: self.ev.atom(ext.body[0].atom, over[p])}
                other = self._subgoals(p, r, rule, NEW, whole, lead, shift=1)
                frames = [self.ev.rule(ext, other, self.absent(NEW), first=0, restrict_first=True)] \
                    if changed is None else seminaive_terms(self.ev, ext, self.preds, changed, whole, other,
                                                            self.absent(NEW), skip={0}, lead=0)
                if any(isinstance(a, Expr) for a in rule.head.args):  # computed head columns bind nothing
                    frames = [restrict(f, over[p], self.columns(p)) for f in frames]
                out += frames
            return out

        candidates = {p: as_set(union_all(terms(p, None)), self.columns(p)) for p in over}
        while candidates:
            changed = rounds.add(candidates)
            candidates = {p: as_set(union_all(t), self.columns(p)) for p in over if (t := terms(p, changed))}
        return rounds

    def insert(self, gone: dict[str, DataFrame]) -> Rounds:
        """Step 3: new tuples by the Δ⁺-rules over the new states, to a fixpoint."""
        rounds = Rounds(self.ev, self.component, "dred_insert", self.schemas)

        def current(q: str) -> DataFrame:  # Pᵛ after step 2
            return _union(self.old(q), negate(gone[q]) if q in gone else None)

        def whole(q: str) -> DataFrame:
            return _union(current(q), _added(rounds, q))

        def known(p: str, new: DataFrame) -> DataFrame:  # already in Pᵛ: not an insertion
            cols = self.columns(p)
            small = self.c.states.small
            present = consolidate(restrict(current(p), new, cols, small), cols).where(F.col(C) > 0)
            # (small: the tuples found are at most the round's, so the round is not shuffled against them)
            return anti_join(new, F.broadcast(present) if small else present, null_safe=True)

        self._rounds(rounds, self.seeds(+1, whole, NEW), whole, NEW, known)
        return rounds

    def run(self) -> dict[str, DataFrame | None]:
        """Δ of every predicate of the component: -1 for the deleted tuples, +1 for the inserted ones."""
        started = time.perf_counter()
        deleted = self.overdelete()
        rederived = self.rederive(deleted)
        gone = {}  # what step 3 starts from: P less it (absent: nothing of the predicate is gone)
        for p in self.preds:
            if deleted.rows[p] and not rederived.rows[p]:  # nothing rederived: what step 1 deleted is gone
                gone[p] = deleted.all(p)
            elif deleted.rows[p] > rederived.rows[p]:
                path = self.c.states.scratch.put(f"{p}__dred_gone",
                                                 anti_join(deleted.all(p), rederived.all(p), null_safe=True))[0]
                gone[p] = self.c.states.scratch.read([path], self.schemas[p])
        inserted = self.insert(gone)
        self.stats = {"over-deleted": sum(deleted.rows.values()), "rederived": sum(rederived.rows.values()),
                      "inserted": sum(inserted.rows.values())}
        log.info("%s: DRed (000 §7): over-deleted %s, rederived %s, inserted %s (%.2f s)", ", ".join(self.preds),
                 deleted.rows, rederived.rows, inserted.rows, time.perf_counter() - started)
        out: dict[str, DataFrame | None] = {}
        for p in self.preds:
            if deleted.rows[p] == rederived.rows[p] and not inserted.rows[p]:
                out[p] = None
            else:
                out[p] = consolidate(_union(negate(gone[p]) if p in gone else None, _added(inserted, p)),
                                     self.columns(p))
        return out
