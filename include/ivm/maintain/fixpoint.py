"""Recursive components on Spark: semi-naive evaluation to a fixpoint (000 §7, [Ull89]).

A recursive component (a strongly connected component of the dependency graph, 000 Definition 3.1)
is evaluated with set semantics, as 000 §7 requires of DRed: round 0 evaluates the rules that do not
read the component (the exit rules); each later round evaluates, for every rule and every subgoal on a
predicate of the component, the rule with that subgoal read from the tuples the previous round added
and the component's other subgoals from everything derived so far; tuples already known are removed.
The fixpoint is reached when a round adds nothing.

Every round's new tuples are written to the run's scratch space and read back, so each round's plan
starts from files: the lineage never grows with the number of rounds (no quadratic planning, no stack
overflow), and what was derived so far is one scan over the rounds' files, never rewritten. A round
costs one Spark job per predicate that changed; its row count comes from the Parquet footers.

The same round structure serves DRed's three steps (ivm.maintain.dred).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ivm.config import COUNT_COLUMN
from ivm.errors import ConfigError
from ivm.ir import Atom, BodyItem, Const, Literal, Program, Rule, Var, Wildcard
from ivm.stratify import Component
from ivm.zset import BROADCAST_BYTES, anti_join, consolidate, union_all

log = logging.getLogger(__name__)
C = COUNT_COLUMN
#: rounds a fixpoint may take before the refresh fails (per view: ``max_iterations`` in the project file)
DEFAULT_MAX_ITERATIONS = 1000

SubgoalRows = Callable[[int, BodyItem], DataFrame | None]
Absent = Callable[[int, Literal, DataFrame], DataFrame]


def recursive_positions(rule: Rule, preds: Collection[str]) -> list[int]:
    """Body positions of the rule's subgoals on predicates of the component (positive atoms: negation
    and aggregation through recursion are refused by stratification)."""
    return [i for i, item in enumerate(rule.body)
            if isinstance(item, Literal) and not item.negated and item.atom.pred in preds]


def as_set(df: DataFrame, columns: list[str]) -> DataFrame:
    """The support of a Z-set: every tuple with a positive count, once (count 1)."""
    return consolidate(df, columns).where(F.col(C) > 0).withColumn(C, F.lit(1).cast("long"))


def rederivation_rule(rule: Rule) -> Rule:
    """000 §7 step 2's Δʳ-rule ``δ⁺(p) :- δ⁻(p) & s1ᵛ & ... & snᵛ``: the rule with a leading subgoal on
    its own head (read from δ⁻(p)), so the joins start from the over-deleted tuples and bind the head's
    variables first. Computed head columns cannot bind anything: the result is restricted afterwards."""
    args = tuple(a if isinstance(a, Var | Const) else Wildcard() for a in rule.head.args)
    return Rule(rule.head, (Literal(Atom(rule.head.pred, args)), *rule.body))


def transitive_rule(program: Program, pred: str, preds: Collection[str]) -> Rule | None:
    """``p(X, Y) :- p(X, Z), p(Z, Y)`` when the rules of ``pred`` make it the transitive closure of one
    binary relation e outside the component: an exit rule ``p(X, Y) :- e(X, Y)`` and only linear
    rules ``p(X, Y) :- p(X, Z), e(Z, Y)`` or ``p(X, Y) :- e(X, Z), p(Z, Y)`` (the shape of a
    ``WITH RECURSIVE`` reachability query); else None.

    p = e⁺ is transitive, so the rule derives only tuples of p's fixpoint: added to the program it
    changes no fixpoint (000 §7's steps apply to any program; Theorem 7.1 speaks of derivations in
    E^ν, which the rule leaves alone). A round that uses it joins its delta with the whole closure on
    either side: DRed (ivm.maintain.dred) extends the tuples derived from a changed edge through the
    closure at once, p*·Δe·p* in two rounds, instead of one edge per round along every path that
    follows (the right-linear chain views of [DT92], which 000 §1 cites, by an added rule)."""
    if _linear_sides(program, pred, preds) is None:
        return None
    x, y, z = (Var(n) for n in ("X", "Y", "Z"))
    return Rule(Atom(pred, (x, y)), (Literal(Atom(pred, (x, z))), Literal(Atom(pred, (z, y)))))


def transitive_extensions(program: Program, pred: str, preds: Collection[str]) -> frozenset[int]:
    """The body positions of ``transitive_rule`` whose semi-naive term extends tuples derived from
    changed edges beyond what the linear rules' first round already gave (0: the round's tuples
    extended on the right, ``Δ(X, Z), p(Z, Y)``; 1: on the left, ``p(X, Z), Δ(Z, Y)``).

    From a changed edge (a, b), ``p(X, Y) :- p(X, Z), e(Z, Y)`` derives in the first round the tuples
    (x, b) of every x with (x, a) in p, and p is closed under transitivity: so p(X, Z), Δ(Z, Y) gives
    (w, b) for (w, x) in p, which that round holds already (w reaches a), and only the extension by
    b's successors is new; ``e(X, Z), p(Z, Y)`` is the mirror image. The other term would scan the
    whole closure for nothing. (Only speed rides on this: the linear rules' own
    semi-naive terms run in every round, so the fixpoint is the same either way.)"""
    return frozenset(_linear_sides(program, pred, preds) or ())


def _linear_sides(program: Program, pred: str, preds: Collection[str]) -> set[int] | None:
    """None unless ``pred``'s rules are a transitive closure's (``transitive_rule``); else the
    positions its recursive subgoal takes in its linear rules written as ``(X, Z), (Z, Y)``: 0 for
    ``p(X, Z), e(Z, Y)``, 1 for ``e(X, Z), p(Z, Y)``."""
    rules = program.rules_for(pred)
    exits = [r for r in rules if not recursive_positions(r, preds)]
    if len(exits) != 1 or len(rules) < 2:
        return None
    head = _pair(exits[0].head)
    body = exits[0].body
    if head is None or len(body) != 1 or _literal_pair(body[0]) != head or body[0].atom.pred in preds:
        return None
    edge = body[0].atom.pred
    sides = set()
    for rule in rules:
        if rule is exits[0]:
            continue
        x, y = _pair(rule.head) or (None, None)
        pairs = [_literal_pair(item) for item in rule.body]
        if x is None or len(pairs) != 2 or None in pairs:
            return None
        preds_of = [item.atom.pred for item in rule.body]
        first = 0 if pairs[0][0] == x else 1
        (a, z), (z2, b) = pairs[first], pairs[1 - first]
        if (a, b) != (x, y) or z != z2 or z in (x, y) or sorted(preds_of) != sorted([pred, edge]):
            return None
        sides.add(0 if preds_of[first] == pred else 1)
    return sides


def _pair(atom: Atom) -> tuple[str, str] | None:
    """The two distinct variables of a binary atom, else None."""
    args = atom.args
    if len(args) == 2 and all(isinstance(a, Var) for a in args) and args[0].name != args[1].name:
        return args[0].name, args[1].name
    return None


def _literal_pair(item: BodyItem) -> tuple[str, str] | None:
    """A positive, plainly joined (SQL =) binary literal's two distinct variables, else None."""
    if not isinstance(item, Literal) or item.negated or item.null_safe:
        return None
    return _pair(item.atom)


class Rounds:
    """Rounds of one fixpoint: the written tuples of each predicate (one Parquet folder per round),
    the iteration limit, and progress in the log."""

    def __init__(self, ev, component: Component, step: str, schemas: Mapping[str, StructType]):
        self.ev = ev
        self.preds = component.predicates
        self.step = step
        self.schemas = schemas
        self.paths: dict[str, list[str]] = {p: [] for p in self.preds}
        self.rows: dict[str, int] = dict.fromkeys(self.preds, 0)
        self.round = 0
        owner = ev.program.predicates[self.preds[0]]
        self.view = owner.owner or owner.name
        self.limit = ev.max_iterations(self.view)
        self.started = time.perf_counter()

    def columns(self, pred: str) -> list[str]:
        return [f.name for f in self.schemas[pred].fields if f.name != C]

    def all(self, pred: str) -> DataFrame:
        """Everything the rounds added to ``pred`` so far: one scan over the rounds' files."""
        return self.ev.scratch.read(self.paths[pred], self.schemas[pred])

    def add(self, candidates: Mapping[str, DataFrame], known: Callable[[str, DataFrame], DataFrame] | None = None
            ) -> dict[str, DataFrame]:
        """One round: per predicate, the candidate tuples (a set) less those added before (and less
        ``known(pred, new)``'s tuples, when given), written; returns the non-empty ones, read back."""
        self.round += 1
        if self.round > self.limit:
            raise ConfigError(f"views.{self.view}: the fixpoint of {', '.join(self.preds)} ({self.step}) did not "
                              f"converge within {self.limit} rounds; raise max_iterations for the view if the "
                              "recursion is meant to run longer (arithmetic in a recursive rule can make it "
                              "endless)")
        out, added = {}, {}
        for pred, cand in candidates.items():
            new = cand.select(*[F.col(f"`{f.name}`").cast(f.dataType) for f in self.schemas[pred].fields])
            if self.paths[pred]:
                new = anti_join(new, self.all(pred), null_safe=True)
            if known is not None:
                new = known(pred, new)
            path, rows, size = self.ev.scratch.put(f"{pred}__{self.step}{self.round}", new)
            added[pred] = rows
            if rows:
                self.paths[pred].append(path)
                self.rows[pred] += rows
                written = self.ev.scratch.read([path], self.schemas[pred])
                out[pred] = F.broadcast(written) if size <= BROADCAST_BYTES else written
        log.info("%s: %s round %d: %s (%.2f s)", self.view, self.step, self.round,
                 ", ".join(f"{p} +{n} ({self.rows[p]} in all)" for p, n in added.items()),
                 time.perf_counter() - self.started)
        return out


def seminaive_terms(ev, rule: Rule, preds: Collection[str], changed: Mapping[str, DataFrame],
                    whole: Callable[[str], DataFrame], other: SubgoalRows, absent: Absent | None = None,
                    skip: Collection[int] = (), lead: int | None = None) -> list[DataFrame]:
    """One semi-naive round of ``rule``: for every subgoal on a component predicate that changed in the
    previous round, the rule with that subgoal read from the change (the joins start there) and the
    component's other subgoals from ``whole``; ``other(j, item)`` gives the remaining subgoals and the
    positions in ``skip``. ``lead``: a restricting item to start the joins from (DRed's δ⁻(p))."""
    terms = []
    for i in recursive_positions(rule, preds):
        if i in skip or rule.body[i].atom.pred not in changed:
            continue

        def subgoal(j: int, item: BodyItem, i: int = i) -> DataFrame | None:
            if j == i:
                return ev.atom(item.atom, changed[item.atom.pred])
            if j not in skip and isinstance(item, Literal) and not item.negated and item.atom.pred in preds:
                return ev.atom(item.atom, whole(item.atom.pred))
            return other(j, item)

        terms.append(ev.rule(rule, subgoal, absent, first=i if lead is None else lead,
                             restrict_first=lead is not None))
    return terms


def plans(ev, component: Component) -> dict[str, DataFrame]:
    """Plans with the component's column types and no fixpoint (for schemas; no Spark job runs): the
    exit rules, then the rules whose component subgoals already have a plan, until every predicate has
    one."""
    preds = component.predicates
    have: dict[str, DataFrame] = {}
    progress = True
    while progress and len(have) < len(preds):
        progress = False
        for p in preds:
            if p in have:
                continue
            rules = [r for r in ev.program.rules_for(p)
                     if all(r.body[i].atom.pred in have for i in recursive_positions(r, preds))]
            if rules:
                frames = [t for r in rules for t in seminaive_terms(ev, r, preds, have, have.__getitem__, ev.subgoal)
                          or [ev.rule(r)]]
                have[p] = as_set(union_all(frames), list(ev.program.predicates[p].columns))
                progress = True
    missing = [p for p in preds if p not in have]
    if missing:
        owner = ev.program.predicates[missing[0]]
        raise ConfigError(f"views.{owner.owner or owner.name}: {missing[0]} has no rule that does not depend on "
                          "itself: the recursion has no base case, so it is always empty")
    return have


def evaluate(ev, component: Component) -> dict[str, DataFrame]:
    """Every predicate of the recursive component at its least fixpoint, as a set (count 1)."""
    preds = component.predicates
    schemas = {p: df.schema for p, df in plans(ev, component).items()}
    rounds = Rounds(ev, component, "fixpoint", schemas)
    candidates: dict[str, DataFrame] = {}
    for p in preds:  # round 0: the exit rules
        frames = [ev.rule(r) for r in ev.program.rules_for(p) if not recursive_positions(r, preds)]
        if frames:
            candidates[p] = as_set(union_all(frames), rounds.columns(p))
    while candidates:
        changed = rounds.add(candidates)
        candidates = {}
        for p in preds:
            terms = [t for r in ev.program.rules_for(p)
                     for t in seminaive_terms(ev, r, preds, changed, rounds.all, ev.subgoal)]
            if terms:
                candidates[p] = as_set(union_all(terms), rounds.columns(p))
    log.info("%s: fixpoint of %s after %d rounds: %s", rounds.view, ", ".join(preds), rounds.round,
             ", ".join(f"{p} {rounds.rows[p]} tuples" for p in preds))
    return {p: rounds.all(p) for p in preds}

