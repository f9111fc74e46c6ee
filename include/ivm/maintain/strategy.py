"""Which algorithm maintains a set-semantics projection view: counting (000), key-based (003) or the
reducing algorithms (004), chosen by a simple cost model unless the view's ``strategy:`` forces one.

The candidates: **counting** always applies and stores derivation counts. **keyed** (003's derived
rules) applies when the key-based analysis does (ivm.analysis) and the view is built from tables
(select expressions, EXISTS/IN/NOT EXISTS subqueries, UNION, INTERSECT). **reduce** (004) applies to
one projection–selection–join of tables under set semantics. Both store the view without counts
(each tuple once), so moving between counting and them rewrites the view: the model charges that as a
full recompute, which makes a choice sticky until the estimates differ by more than a recompute.

The cost model (estimated rows a run produces, plus a charge per Spark job) uses the tables' row
counts from the catalog and the run's change counts (one per table, from the log; `ivm explain`
assumes 0.1% of each table). Per changed reference, in 004's join order, a join into a table on a
key keeps the size, any other join multiplies it by the table's rows over its partner's (a
foreign-key guess). Counting and keyed pay the whole join chain of the changed tuples; keyed adds a
recompute when a changed table is unsafe for deletions (003 §5.4's rematerialization; the plan
cannot know yet whether the deltas hold deletions, so it assumes they do). REDUCE pays the candidate
chain and the existing chain (one unchanged tuple per changed one, all of R_1 when R_1 gives the view
no column, none past a Theorem 3 step), but
a deletion stops at Theorem 3 (the view holds R_1's key: a lookup in V) or Theorem 4 (Y_i holds the
view's key). The estimates are shown by `ivm explain` and recorded with each run.

Each strategy is one object of `REGISTRY` that owns its code (dbt's incremental strategies, one entry
each): its name and stored form, when it applies (`Strategy.applies`), its cost over one `Estimate`, the
algorithm's name (`describe`), what `ivm explain` says of it (`explain`) and its maintenance of one view
(`maintain`). The planner, `ivm explain` and the maintain stage look a strategy up once and call it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from functools import cached_property

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.analysis import Decision, analyse
from ivm.config import COUNT_COLUMN, ProjectConfig, ViewConfig
from ivm.errors import ConfigError
from ivm.ir import Condition, Literal, Program, Var
from ivm.maintain import keyed, reduce, subgoals
from ivm.maintain.count_free import CountFree
from ivm.maintain.counting import Counting, view_predicates
from ivm.maintain.fixpoint import as_set
from ivm.stratify import Strata
from ivm.vocabulary import Form, Kind, StrategyName
from ivm.zset import change_sizes, consolidate

log = logging.getLogger(__name__)
C = COUNT_COLUMN
#: rows one Spark job is worth (a small job costs ~0.1 s here; ~1M rows/s through a join)
JOB_ROWS = 100_000


@dataclass
class Candidate:
    strategy: StrategyName
    applicable: bool
    why: str
    cost: float | None = None


@dataclass
class Choice:
    view: str
    strategy: StrategyName
    reason: str
    candidates: list[Candidate] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Outcome:
    """What a strategy's maintenance of one view did beyond the delta it wrote (Feldera's habit: a
    step's statistics are a value it returns): the run record's detail and the words the maintain
    stage's progress line says after the tuples changed."""

    detail: dict[str, int] = field(default_factory=dict)
    said: str = ""


@dataclass
class Estimate:
    """What the cost model knows of one view in one run: its shape (None: not one plain join, 004 §2),
    the tables' rows (``sizes``), each changed table's rows (``changed``), the view's declared key, and
    whether a change is one key-based maintenance must rematerialize for (003 §5.4)."""

    program: Program
    view: str
    shape: reduce.Shape | None
    changed: dict[str, float]
    sizes: dict[str, int]
    key: list[str] | None
    rematerialize: bool

    def fanout(self, atom, joined: set[str], partner: str | None) -> float:
        """How a join into ``atom`` grows a relation whose variables ``joined`` are bound: not at all on a
        key, else by the table's rows over its partner's (a foreign-key guess)."""
        if reduce.key_in_view(self.program, atom, joined) is not None:
            return 1.0
        rows = max(1, self.sizes.get(atom.pred, 1))
        return max(1.0, rows / max(1, self.sizes.get(partner, 1))) if partner else float(rows)

    def chain(self, k: int, start: float) -> list[float]:
        """Estimated sizes of the relations joined from reference k (004's order), starting at ``start``."""
        s = self.shape
        order = reduce.join_order(self.program, s, k)
        out, joined, size = [start], set(s.atoms[k].variables()), start
        for j in order[1:]:
            atom = s.atoms[j]
            partner = next((s.atoms[i].pred for i in order[:order.index(j)]
                            if s.atoms[i].variables() & atom.variables()), None)
            size *= self.fanout(atom, joined, partner)
            joined |= atom.variables()
            out.append(size)
        return out

    def changed_references(self) -> list[tuple[int, float]]:
        """The references whose table changed, with the change's rows."""
        return [(k, self.changed[a.pred]) for k, a in enumerate(self.shape.atoms) if self.changed.get(a.pred)]

    @cached_property
    def joined(self) -> float:
        """The rows the changed tuples' join chains produce, over every changed reference."""
        return sum(sum(self.chain(k, d)) for k, d in self.changed_references())

    @cached_property
    def full(self) -> float:
        """A recompute: the join from the largest table, and its jobs (the joins' stages, the base layer's
        write); without a shape, every table read."""
        if self.shape is None:
            return sum(self.sizes.values()) + 2 * JOB_ROWS
        atoms = self.shape.atoms
        first = max(range(len(atoms)), key=lambda i: self.sizes.get(atoms[i].pred, 0))
        return sum(self.chain(first, float(max(self.sizes.get(a.pred, 1) for a in atoms)))) + 2 * JOB_ROWS


class Strategy(ABC):
    """One way to maintain a view incrementally, found by its name in `REGISTRY`."""

    name: StrategyName
    #: how the strategy stores the view
    form: Form

    @property
    def count_free(self) -> bool:
        """Stores the view alone, each tuple once (no auxiliary relations, no counts)."""
        return self.form is Form.PRESENCE

    def __str__(self) -> str:
        return self.name

    @abstractmethod
    def applies(self, program: Program, strata: Strata, view: str) -> Candidate:
        """Whether the strategy can maintain the view, and why (not)."""

    @abstractmethod
    def cost(self, e: Estimate) -> float | None:
        """Estimated rows a run produces, plus `JOB_ROWS` per Spark job; None: not estimated."""

    @abstractmethod
    def describe(self, program: Program, strata: Strata, view: str, cfg: ViewConfig) -> str:
        """The algorithm, as a run's reason and ``ivm explain`` name it, for one view."""

    @abstractmethod
    def explain(self, program: Program, strata: Strata, config: ProjectConfig, view: str) -> tuple[str, list[str]]:
        """What ``ivm explain`` says: the algorithm's name and how it maintains the view, step by step."""

    @abstractmethod
    def maintain(self, counting: Counting, count_free: CountFree, view: str, cfg: ViewConfig,
                 tables: list[str]) -> Outcome:
        """The view's change in one run, written as its delta layer (and its stored relations' ones)."""


class CountingStrategy(Strategy):
    """The counting algorithm (000 §4-6), DRed (000 §7) for recursive components."""

    name, form = StrategyName.COUNTING, Form.COUNTS

    def applies(self, program: Program, strata: Strata, view: str) -> Candidate:
        return Candidate(self.name, True, "000 Algorithm 4.1: every nonrecursive view, derivation counts stored")

    def cost(self, e: Estimate) -> float:
        # pays the whole join chain of the changed tuples (without a shape: the changed tuples through the
        # view's rules)
        return (sum(e.changed.values()) if e.shape is None else e.joined) + 2 * JOB_ROWS

    def describe(self, program: Program, strata: Strata, view: str, cfg: ViewConfig) -> str:
        preds = view_predicates(program, strata, view)
        recursive = [p for c in strata.recursive_among(preds) for p in c.predicates if p in preds]
        if recursive:
            return f"DRed (000 §7) for {', '.join(recursive)}, counting (000 §4-6) around it"
        return "counting (000 §4-6)"

    def explain(self, program: Program, strata: Strata, config: ProjectConfig, view: str) -> tuple[str, list[str]]:
        preds = view_predicates(program, strata, view)
        components = strata.recursive_among(preds)
        reasons = []
        for c in components:
            reasons += [f"recursive component {', '.join(c.predicates)}: evaluated semi-naively to its fixpoint "
                        "(set semantics, each round written and read back) and maintained by DRed (000 §7) in "
                        "three steps: over-delete with the Δ⁻-rules over the old states, rederive the over-deleted "
                        "tuples that keep a derivation in the new state (Δʳ-rules), insert with the Δ⁺-rules over "
                        "the new states, each to a fixpoint (the rules below)"]
        if len(components) < len(preds):
            reasons.append(("around the recursion, " if components else "nonrecursive: ")
                           + "maintained by the counting algorithm (000 Algorithm 4.1): the delta rules below, new "
                           "states before the Δ subgoal and old ones after it; each stored tuple keeps its number of "
                           "derivations in __count, so deletions need no rederivation")
        sets = [p for p in preds if program.predicates[p].semantics == "set"]
        if sets:
            reasons.append(f"set semantics ({', '.join(sets)}): derivation counts are kept, but only changes of the "
                           "set propagate upward (000 Algorithm 4.1 statement (2), §5.1)")
        reasons += subgoals.explain_lines(program, preds)  # what each subgoal kind's delta rule does
        algorithm = ("DRed" if len(components) == len(preds) else "DRed + counting") if components else "counting"
        return algorithm, reasons

    def maintain(self, counting: Counting, count_free: CountFree, view: str, cfg: ViewConfig,
                 tables: list[str]) -> Outcome:
        stats = counting.maintain_view(view)
        return Outcome(stats.detail(), stats.describe())


class _CountFreeStrategy(Strategy):
    """A strategy that stores the view alone, each tuple once (003, 004), maintained from the tables'
    set changes (ivm.maintain.count_free)."""

    form = Form.PRESENCE

    def applies(self, program: Program, strata: Strata, view: str) -> Candidate:
        refused = self.refused(program, strata, view)
        if refused is not None:
            return Candidate(self.name, False, refused)
        applicable, why = self.fits(program, view)
        return Candidate(self.name, applicable, why)

    @abstractmethod
    def fits(self, program: Program, view: str) -> tuple[bool, str]:
        """Whether the strategy maintains a set view of tables, and why (not)."""

    @staticmethod
    def refused(program: Program, strata: Strata, view: str) -> str | None:
        """Why no count-free strategy can maintain the view (recursive, a bag, reading views), or None."""
        pred = program.predicates[view]
        component = next(c for c in strata.components if view in c.predicates)
        reads_views = sorted(u for u in strata.upstream(view) if program.predicates[u].kind == Kind.VIEW and u != view)
        if component.recursive:
            return "the view is recursive (DRed maintains it, 000 §7)"
        if pred.semantics != "set":
            return "the view is a bag (no DISTINCT): only counting keeps its multiplicities"
        if reads_views:
            return f"the view reads the view {reads_views[0]}; key-based and REDUCE read tables only"
        return None

    def maintain(self, counting: Counting, count_free: CountFree, view: str, cfg: ViewConfig,
                 tables: list[str]) -> Outcome:
        changed = [t for t in tables if count_free.set_change(t) is not None]
        if not changed:
            return Outcome(said="; the tables' changes leave their sets unchanged")
        delta, detail, notes = self.change(count_free, view, cfg, changed, count_free.states.old(view))
        count_free.write(view, delta)
        return Outcome(detail, (f" ({', '.join(f'{k} {n}' for k, n in detail.items())})" if detail else "")
                       + "".join(f"; {n}" for n in notes))

    @abstractmethod
    def change(self, count_free: CountFree, view: str, cfg: ViewConfig, changed: list[str],
               old_view: DataFrame) -> tuple[DataFrame | None, dict[str, int], list[str]]:
        """The view's change (±1 a tuple), what the run's record keeps of it, and what was done, in words."""


class KeyedStrategy(_CountFreeStrategy):
    """003's derived rules (ivm.maintain.keyed), or its rematerialization rule (§5.4)."""

    name = StrategyName.KEYED

    def fits(self, program: Program, view: str) -> tuple[bool, str]:
        a = analyse(program, view)
        structure = keyed.set_structure(program, view)
        # subqueries and set-operator sides: joins of tables with conditions (a side may negate: it becomes
        # part of its select expression)
        own = [p for p, d in program.predicates.items() if d.kind == Kind.AUX and d.owner == view]
        nested = [p for p in own if program.predicates[p].role not in ("exists", "in", "setop") or any(
            not isinstance(i, Literal | Condition) or (isinstance(i, Literal) and i.negated
                                                       and program.predicates[p].role != "setop")
            for r in program.rules_for(p) for i in r.body)]
        if not a.applicable:
            return False, a.reason
        if isinstance(structure, str):
            return False, structure
        if nested:
            return False, f"the auxiliary predicate {nested[0]} is not a join of tables with conditions"
        rem = sorted({t for t, op, d, _ in a.table() if d is Decision.REMATERIALIZE})
        return True, "003's derived rules" + (
            f"; rematerializes on unsafe operations of {', '.join(rem)}" if rem else "; every reference safe")

    def cost(self, e: Estimate) -> float:
        # the whole join chain of the changed tuples, and a recompute when a changed table is unsafe for
        # deletions (003 §5.4's rematerialization; the plan cannot know yet whether the deltas hold any)
        if e.shape is None:
            return sum(e.changed.values()) + 4 * JOB_ROWS
        return e.joined + 3 * JOB_ROWS + (e.full if e.rematerialize else 0.0)

    def describe(self, program: Program, strata: Strata, view: str, cfg: ViewConfig) -> str:
        return "key-based (003 §5.4)"

    def explain(self, program: Program, strata: Strata, config: ProjectConfig, view: str) -> tuple[str, list[str]]:
        return "key-based (003)", [
            "the view is stored without counts; each refresh computes the tuples leaving it from the deleted "
            "tuples (other tables at their old state) and the tuples entering it from the inserted ones (new "
            "state), deletes before inserts, inserts only of tuples not in the view (003 §5.4, §9)",
            "NOT EXISTS: insertions into the subquery's tables delete, deletions insert (003 §7.2); UNION: a "
            "tuple leaves only if no other select expression produces it, INTERSECT: enters only if all do "
            "(003 §8)",
            "an operation the analysis below marks rematerialize recomputes the view when a run's delta holds "
            "it (the rematerialization rule); its difference from the stored view is the delta"]

    def change(self, count_free: CountFree, view: str, cfg: ViewConfig, changed: list[str],
               old_view: DataFrame) -> tuple[DataFrame | None, dict[str, int], list[str]]:
        program = count_free.program
        kb = keyed.KeyBased(program, view, lambda t: count_free.set_change(t) if t in changed else None, old_view,
                            count_free.evaluator("old"), count_free.evaluator("new"))
        unsafe = kb.unsafe({t: self._operations(count_free, t) for t in changed})
        if unsafe:
            # 003 §5.4's rematerialization rule: the view recomputed; its change against V is the delta
            log.info("%s: rematerializing (003 §5.4): %s", view, "; ".join(unsafe))
            columns = list(program.predicates[view].columns)
            new = as_set(count_free.evaluator("new").relation(view), columns)
            old = as_set(old_view, columns).withColumn(C, F.lit(-1).cast("long"))
            return consolidate(new.unionByName(old)), {"rematerialized": 1}, [f"rematerialized: {'; '.join(unsafe)}"]
        return kb.run(changed), {"rematerialized": 0}, []

    @staticmethod
    def _operations(count_free: CountFree, table: str) -> set[str]:
        """Which operations a table's set change holds (one small job)."""
        inserted, deleted = change_sizes(count_free.set_change(table))
        return {op for op, n in (("insert", inserted), ("delete", deleted)) if n}


class ReduceStrategy(_CountFreeStrategy):
    """004's reducing algorithms (ivm.maintain.reduce)."""

    name = StrategyName.REDUCE

    def fits(self, program: Program, view: str) -> tuple[bool, str]:
        s = reduce.shape(program, view)
        return not isinstance(s, str), s if isinstance(s, str) else \
            "004: one projection–selection–join of tables under set semantics"

    def cost(self, e: Estimate) -> float | None:
        if e.shape is None:
            return None
        s = e.shape
        head = set(s.head_vars)
        cols = e.program.predicates[e.view].columns
        key_vars = {a.name for a, c in zip(s.rule.head.args, cols, strict=True)
                    if isinstance(a, Var) and c in (e.key or [])}
        total = 0.0
        for k, d in e.changed_references():
            atom, chain, order = s.atoms[k], e.chain(k, d), reduce.join_order(e.program, s, k)
            # deletions' existing chain until a Theorem 3 step: V_E^1 is the unchanged tuples agreeing with
            # the changed ones on Y_1, about one each, all of R_1 when the reference contributes no view
            # column (Y_1 = ∅)
            existing, joined = 0.0, set()
            siblings = 0.0 if reduce.key_in_view(e.program, atom, head) else \
                d / 2 if atom.variables() & head else float(e.sizes.get(atom.pred, 1))
            size = siblings
            for n, j in enumerate(order):
                joined |= s.atoms[j].variables()
                if n and reduce.key_in_view(e.program, s.atoms[j], head):
                    size = 0.0
                existing += size
                if n + 1 < len(order):
                    size *= e.fanout(s.atoms[order[n + 1]], joined, atom.pred)
            # (REDUCE and REDUCE+ build no existing relation for insertions: their targets are looked up in V)
            ins = sum(chain) / 2 + d / 2
            # deletions: Theorem 3 at R_1 reads V; Theorem 4 stops where Y_i holds the view's key
            if reduce.key_in_view(e.program, atom, head):
                dele = d / 2
            else:
                stop, joined = len(order), set()
                for n, j in enumerate(order):
                    joined |= s.atoms[j].variables()
                    if key_vars and key_vars <= joined & head and not s.conditions:
                        stop = n + 1
                        break
                dele = sum(chain[:stop]) / 2 + existing
            # jobs: both kinds' relations are one plan (ivm.maintain.reduce._Update): per step a join and an
            # aggregate, and V_E^1's lookup and V's for the targets
            total += ins + dele + (2 + 2 * len(order)) * JOB_ROWS
        return total

    def describe(self, program: Program, strata: Strata, view: str, cfg: ViewConfig) -> str:
        return f"{cfg.reduce.algorithm} (004) with {cfg.reduce.multiple_updates}"

    def explain(self, program: Program, strata: Strata, config: ProjectConfig, view: str) -> tuple[str, list[str]]:
        cfg = config.views[view].reduce
        s = reduce.shape(program, view)
        head = set(s.head_vars) if not isinstance(s, str) else set()
        keyed_refs = [a.pred for a in s.atoms if reduce.key_in_view(program, a, head)] if not isinstance(s, str) else []
        out = [f"{cfg.algorithm} (004 Algorithm {cfg.algorithm.number}) with {cfg.multiple_updates} (Algorithm "
               f"{cfg.multiple_updates.number}): per changed table, the candidate relation V_C^i (what the changed "
               "tuples derive) and the existing relation V_E^i (what the unchanged tuples agreeing with them on the "
               "view's columns derive) are joined table by table; the target V_T leaves (deletion) or enters "
               "(insertion, §5) the view, stored without counts",
               "both kinds' relations are one relation with a count per side and the steps one Spark plan: each "
               "step joins the next table once for all of them; once no candidate is left the existing tuples go "
               "too (RIE, or a test of the step's relation where RIE does not apply) and the update quits: the "
               "joins above an empty relation read nothing (§3 after Lemma 2; Spark's adaptive execution)",
               "insertions build no existing relation: their targets are the candidates' view tuples not in V (§5)",
               "§7, a reduction skipped where it cannot pay: RIC at a step with no existing relation left to "
               "compare with; under REDUCE and REDUCE+, RIE at the last step (V_T reads no V_E^n)"]
        if not isinstance(s, str):
            out.append("join order per changed table (004 §4, §7: a table whose key the view holds first, Theorem 3; "
                       "then the most view columns): " + "; ".join(
                           " → ".join(s.atoms[j].pred for j in reduce.join_order(program, s, k))
                           for k in range(len(s.atoms))))
        if keyed_refs and cfg.algorithm.reduces_both:
            out.append(f"Theorem 3: the view holds a key of {', '.join(keyed_refs)}: no existing relation past that "
                       "step; a deletion from it is looked up in the view")
        if config.views[view].key and cfg.algorithm.reduces_both:
            out.append(f"Theorem 4: once Y_i holds the view's key ({', '.join(config.views[view].key)}) and no "
                       "selection is left, a deletion's targets are read from the view and an insertion builds no "
                       "further existing relation")
        return f"REDUCE family (004): {cfg.algorithm}, {cfg.multiple_updates}", out

    def change(self, count_free: CountFree, view: str, cfg: ViewConfig, changed: list[str],
               old_view: DataFrame) -> tuple[DataFrame | None, dict[str, int], list[str]]:
        """Over the tables' layers as they are: each step settles what it joined, so no table is
        consolidated first (a shuffle of all of it)."""
        s = reduce.shape(count_free.program, view)
        assert not isinstance(s, str), s
        r = reduce.Reducer(count_free.program, s, cfg.reduce.algorithm, cfg.reduce.multiple_updates, cfg.key,
                           count_free.counting.joined, lambda t: count_free.set_change(t) if t in changed else None,
                           old_view, count_free.states.scratch, count_free.evaluator("old"),
                           count_free.states.broadcastable)
        delta = r.run()
        # (the relations' sizes are not counted: a job each; the run's rows written are its delta's)
        detail = {"join steps": sum(len(t.steps) for t in r.traces), "relations written": r.writes}
        return delta, detail, [f"{t.table} {t.kind}: {t.shortcut}" for t in r.traces if t.shortcut]


COUNTING, KEYED, REDUCE = CountingStrategy(), KeyedStrategy(), ReduceStrategy()
#: every strategy, in the order the cost model prefers one on a tie
REGISTRY: dict[StrategyName, Strategy] = {s.name: s for s in (COUNTING, KEYED, REDUCE)}


def lookup(name: str) -> Strategy:
    """The strategy named ``name``.

    >>> lookup("reduce").form
    <Form.PRESENCE: 'presence'>
    """
    try:
        return REGISTRY[StrategyName(name)]
    except ValueError:
        raise ConfigError(f"unknown strategy {name!r}; use one of {', '.join(REGISTRY)}") from None


def stored_form(strategy: str) -> Form:
    """How the view is stored: ``counts`` (derivation counts, 000) or ``presence`` (each tuple once)."""
    return lookup(strategy).form


def applicability(program: Program, strata: Strata, view: str) -> list[Candidate]:
    """Which strategies can maintain the view, and why not where they cannot."""
    return [s.applies(program, strata, view) for s in REGISTRY.values()]


def choose(program: Program, strata: Strata, view: str, forced: str | None, key: list[str] | None,
           sizes: dict[str, int], changed: dict[str, float], current: str | None) -> Choice:
    """The strategy for one run. ``current``: the stored form of the view's state (None: none yet)."""
    cands = applicability(program, strata, view)
    usable = {c.strategy for c in cands if c.applicable}
    if forced is not None and forced not in usable:
        why = next(c.why for c in cands if c.strategy == forced)
        raise ValueError(f"views.{view}: strategy {forced} does not apply: {why}")
    if usable != {COUNTING.name}:
        s = reduce.shape(program, view)
        rem = any(d is Decision.REMATERIALIZE and op == "delete" and changed.get(t) for t, op, d, _ in
                  analyse(program, view).table())
        e = Estimate(program, view, None if isinstance(s, str) else s, changed, sizes, key, rem)
        for c in cands:
            cost = REGISTRY[c.strategy].cost(e) if c.applicable else None
            if cost is not None:
                switch = e.full if current is not None and REGISTRY[c.strategy].form != current else 0.0
                c.cost = round(cost + switch)
    if forced is not None:
        return Choice(view, StrategyName(forced), "forced by the view's strategy option", cands)
    if usable == {COUNTING.name}:
        return Choice(view, COUNTING.name, "the only applicable strategy", cands)
    if any(d.kind == Kind.AUX and d.owner == view for d in program.predicates.values()):
        # counting stores the subqueries' and set operators' relations; a choice per run would leave
        # them behind whenever it moved away from counting
        return Choice(view, COUNTING.name, "the view has auxiliary predicates (subqueries, set operators), which "
                                           "counting stores: key-based maintenance runs when `strategy: keyed` "
                                           "is set", cands)
    order = list(REGISTRY)
    best = min((c for c in cands if c.cost is not None), key=lambda c: (c.cost, order.index(c.strategy)))
    detail = ", ".join(f"{c.strategy} {c.cost:,.0f}" for c in cands if c.cost is not None)
    return Choice(view, best.strategy, f"lowest estimated cost (rows + {JOB_ROWS:,} per Spark job, a change of "
                                       f"stored form counted as a recompute): {detail}", cands)
