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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from ivm.analysis import Decision, analyse
from ivm.config import ViewConfig
from ivm.errors import ConfigError
from ivm.ir import Condition, Const, Literal, Program, Var
from ivm.maintain import keyed, reduce
from ivm.maintain.counting import view_predicates
from ivm.stratify import Strata
from ivm.vocabulary import Kind

#: rows one Spark job is worth (a small job costs ~0.1 s here; ~1M rows/s through a join)
JOB_ROWS = 100_000


class Form(StrEnum):
    """How a view's tuples are stored (the catalog's ``RelationVersion.form``)."""

    #: with their derivation counts (000 §3)
    COUNTS = "counts"
    #: each tuple once, without counts (003, 004)
    PRESENCE = "presence"


def _counting_algorithm(program: Program, strata: Strata, view: str, _: ViewConfig) -> str:
    """Counting, with DRed for the view's recursive components."""
    recursive = [p for c in strata.components if c.recursive for p in c.predicates
                 if p in view_predicates(program, strata, view)]
    if recursive:
        return f"DRed (000 §7) for {', '.join(recursive)}, counting (000 §4-6) around it"
    return "counting (000 §4-6)"


@dataclass(frozen=True)
class Strategy:
    """One way to maintain a view incrementally, found by its name in `REGISTRY` (dbt's incremental
    strategies: a name checked against a registry, then looked up; never compared as a string)."""

    name: str
    #: how the strategy stores the view
    form: Form
    #: the algorithm as a run's reason and ``ivm explain`` name it, for one view
    describe: Callable[[Program, Strata, str, ViewConfig], str]

    @property
    def count_free(self) -> bool:
        """Stores the view alone, each tuple once (no auxiliary relations, no counts)."""
        return self.form is Form.PRESENCE

    def __str__(self) -> str:
        return self.name


COUNTING = Strategy("counting", Form.COUNTS, _counting_algorithm)
KEYED = Strategy("keyed", Form.PRESENCE, lambda *_: "key-based (003 §5.4)")
REDUCE = Strategy("reduce", Form.PRESENCE,
                  lambda _p, _s, _v, cfg: f"{cfg.reduce.algorithm} (004) with {cfg.reduce.multiple_updates}")
REGISTRY: dict[str, Strategy] = {s.name: s for s in (COUNTING, KEYED, REDUCE)}
STRATEGIES = tuple(REGISTRY)


def lookup(name: str) -> Strategy:
    """The strategy named ``name``.

    >>> lookup("reduce").form
    <Form.PRESENCE: 'presence'>
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; use one of {', '.join(REGISTRY)}") from None


def stored_form(strategy: str) -> Form:
    """How the view is stored: ``counts`` (derivation counts, 000) or ``presence`` (each tuple once)."""
    return lookup(strategy).form


@dataclass
class Candidate:
    strategy: str
    applicable: bool
    why: str
    cost: float | None = None


@dataclass
class Choice:
    view: str
    strategy: str
    reason: str
    candidates: list[Candidate] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def applicability(program: Program, strata: Strata, view: str) -> list[Candidate]:
    """Which strategies can maintain the view, and why not where they cannot."""
    out = [Candidate(COUNTING.name, True, "000 Algorithm 4.1: every nonrecursive view, derivation counts stored")]
    pred = program.predicates[view]
    component = next(c for c in strata.components if view in c.predicates)
    reads_views = sorted(u for u in strata.upstream(view) if program.predicates[u].kind == Kind.VIEW and u != view)
    own = [p for p, d in program.predicates.items() if d.kind == Kind.AUX and d.owner == view]
    base = None
    if component.recursive:
        base = "the view is recursive (DRed maintains it, 000 §7)"
    elif pred.semantics != "set":
        base = "the view is a bag (no DISTINCT): only counting keeps its multiplicities"
    elif reads_views:
        base = f"the view reads the view {reads_views[0]}; key-based and REDUCE read tables only"
    if base is not None:
        return out + [Candidate(KEYED.name, False, base), Candidate(REDUCE.name, False, base)]
    a = analyse(program, view)
    structure = keyed.set_structure(program, view)
    # subqueries and set-operator sides: joins of tables with conditions (a side may negate: it becomes
    # part of its select expression)
    nested = [p for p in own if program.predicates[p].role not in ("exists", "in", "setop") or any(
        not isinstance(i, Literal | Condition) or (isinstance(i, Literal) and i.negated
                                                   and program.predicates[p].role != "setop")
        for r in program.rules_for(p) for i in r.body)]
    if not a.applicable:
        out.append(Candidate(KEYED.name, False, a.reason))
    elif isinstance(structure, str):
        out.append(Candidate(KEYED.name, False, structure))
    elif nested:
        out.append(Candidate(KEYED.name, False,
                             f"the auxiliary predicate {nested[0]} is not a join of tables with conditions"))
    else:
        rem = sorted({t for t, op, d, _ in a.table() if d is Decision.REMATERIALIZE})
        out.append(Candidate(KEYED.name, True, "003's derived rules" + (
            f"; rematerializes on unsafe operations of {', '.join(rem)}" if rem else "; every reference safe")))
    s = reduce.shape(program, view)
    out.append(Candidate(REDUCE.name, not isinstance(s, str), s if isinstance(s, str) else
                         "004: one projection–selection–join of tables under set semantics"))
    return out


def _fanout(program: Program, atom, joined: set[str], sizes: dict[str, int], partner: str | None) -> float:
    pred = program.predicates[atom.pred]
    for key in pred.keys:
        args = [atom.args[pred.columns.index(c)] for c in key]
        if all(isinstance(x, Const) or (isinstance(x, Var) and x.name in joined) for x in args):
            return 1.0
    rows = max(1, sizes.get(atom.pred, 1))
    return max(1.0, rows / max(1, sizes.get(partner, 1))) if partner else float(rows)


def _chain(program: Program, s: reduce.Shape, k: int, start: float, sizes: dict[str, int]) -> list[float]:
    """Estimated sizes of the relations joined from reference k (004's order), starting at ``start``."""
    order = reduce.join_order(s, k)
    out, joined, size = [start], set(s.atoms[k].variables()), start
    for j in order[1:]:
        atom = s.atoms[j]
        partner = next((s.atoms[i].pred for i in order[:order.index(j)] if s.atoms[i].variables() & atom.variables()),
                       None)
        size *= _fanout(program, atom, joined, sizes, partner)
        joined |= atom.variables()
        out.append(size)
    return out


def _costs(program: Program, view: str, s: reduce.Shape | None, changed: dict[str, float], sizes: dict[str, int],
           key: list[str] | None, rematerialize: bool) -> dict[str, float]:
    if s is None:  # not a plain join: every strategy pays the changed tuples through the view's rules
        d = sum(changed.values())
        return {COUNTING.name: d + 2 * JOB_ROWS, KEYED.name: d + 4 * JOB_ROWS}
    head = set(s.head_vars)
    cols = program.predicates[view].columns
    key_vars = {a.name for a, c in zip(s.rule.head.args, cols, strict=True) if isinstance(a, Var) and c in (key or [])}
    counting = keyed_cost = reduce_cost = 0.0
    for k, atom in enumerate(s.atoms):
        d = changed.get(atom.pred, 0.0)
        if not d:
            continue
        chain = _chain(program, s, k, d, sizes)
        counting += sum(chain)
        keyed_cost += sum(chain)
        order = reduce.join_order(s, k)
        # deletions' existing chain until a Theorem 3 step: V_E^1 is the unchanged tuples agreeing with the
        # changed ones on Y_1, about one each, all of R_1 when the reference contributes no view column
        # (Y_1 = ∅)
        existing, joined = 0.0, set()
        siblings = 0.0 if reduce.key_in_view(program, atom, head) else \
            d / 2 if atom.variables() & head else float(sizes.get(atom.pred, 1))
        e = siblings
        for n, j in enumerate(order):
            joined |= s.atoms[j].variables()
            if n and reduce.key_in_view(program, s.atoms[j], head):
                e = 0.0
            existing += e
            if n + 1 < len(order):
                e *= _fanout(program, s.atoms[order[n + 1]], joined, sizes, atom.pred)
        # (REDUCE and REDUCE+ build no existing relation for insertions: their targets are looked up in V)
        ins = sum(chain) / 2 + d / 2
        # deletions: Theorem 3 at R_1 reads V; Theorem 4 stops where Y_i holds the view's key
        if reduce.key_in_view(program, atom, head):
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
        reduce_cost += ins + dele + (2 + 2 * len(order)) * JOB_ROWS
    # a recompute: the join from the largest table, and its jobs (the joins' stages, the base layer's write)
    full = sum(_chain(program, s, max(range(len(s.atoms)), key=lambda i: sizes.get(s.atoms[i].pred, 0)),
                      float(max(sizes.get(a.pred, 1) for a in s.atoms)), sizes)) + 2 * JOB_ROWS
    return {COUNTING.name: counting + 2 * JOB_ROWS,
            KEYED.name: keyed_cost + 3 * JOB_ROWS + (full if rematerialize else 0.0),
            REDUCE.name: reduce_cost, "full": full}


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
        costs = _costs(program, view, None if isinstance(s, str) else s, changed, sizes, key, rem)
        full = costs.get("full", sum(sizes.values()) + 2 * JOB_ROWS)
        for c in cands:
            if c.applicable and c.strategy in costs:
                switch = full if current is not None and stored_form(c.strategy) != current else 0.0
                c.cost = round(costs[c.strategy] + switch)
    if forced is not None:
        return Choice(view, forced, "forced by the view's strategy option", cands)
    if usable == {COUNTING.name}:
        return Choice(view, COUNTING.name, "the only applicable strategy", cands)
    if any(d.kind == Kind.AUX and d.owner == view for d in program.predicates.values()):
        # counting stores the subqueries' and set operators' relations; a choice per run would leave
        # them behind whenever it moved away from counting
        return Choice(view, COUNTING.name, "the view has auxiliary predicates (subqueries, set operators), which "
                                           "counting stores: key-based maintenance runs when `strategy: keyed` "
                                           "is set", cands)
    best = min((c for c in cands if c.cost is not None), key=lambda c: (c.cost, STRATEGIES.index(c.strategy)))
    detail = ", ".join(f"{c.strategy} {c.cost:,.0f}" for c in cands if c.cost is not None)
    return Choice(view, best.strategy, f"lowest estimated cost (rows + {JOB_ROWS:,} per Spark job, a change of "
                                       f"stored form counted as a recompute): {detail}", cands)
