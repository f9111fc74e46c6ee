"""The delta rule of each subgoal kind, one entry per kind in `RULES`, looked up by `kind` (as Feldera's
compiler keeps one incremental rule per operator). A delta rule of 000 Definition 4.1 reads one subgoal at
its Δ and the others at their old or new states; how it reads each depends on the subgoal's kind alone:

============  ===================================================  ==============================================
kind          Δ position                                           old / new position
============  ===================================================  ==============================================
atom          the predicate's Δ as the rules above it use it       its stored layers (a set predicate's
              (000 Algorithm 4.1 statement (2)), broadcast when    consolidated, count 1)
              small
negation      000 Definition 6.1's Δ(¬q)                           an anti-join after the joins, against Qᵛ
                                                                   before the Δ subgoal and Q after it (Lemma 6.1)
groupby       000 Algorithm 6.1's Δ(T) from the stored state       T or Tᵛ, aggregated from the grouped relation
setof         001's v_a⁺/v_a⁻ (CReaM's Δ1–Δ6, Figure 1)            the sets of the grouped relation
extraction    002 §2.2's Δe_S: the parent's Δ, extracted           the parent's state, extracted (e_S is not
                                                                   stored)
owner index   its Δ, kept from the nesting table's net delta       probed with the collection ids the Δ subgoal
              (002 §4.2)                                           binds (002 §4.3 step 2-1, ivm.maintain.nested)
============  ===================================================  ==============================================

The counting algorithm reads a subgoal through its entry (`Counting.subgoal`), and asks it whether the
subgoal may share its joins with the other terms of a rule (`SubgoalRule.joins`: `Counting.factored`) and
whether its Δ is known empty before a term over it is planned (`SubgoalRule.empty`); `ivm explain` says
what each entry says of a view's subgoals (`explain`); the cost model's shape of a view, one join of tables
(004 §2, `ivm.maintain.reduce.shape`), admits the subgoals whose entry ``joins``.

(A positive subgoal a delta rule takes from the run's deltas instead of its stored layers, a keyed table's
lookup or a foreign key's reference, is a choice of the delta rule, not of the subgoal: it depends on which
subgoal is the Δ one; ivm.maintain.references makes it before the subgoals are read.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ivm.ir import BodyItem, GroupBy, Literal, Program, Rule, SetOf
from ivm.lang.auxiliary_views import ROLE, case1, set_changes_known
from ivm.lang.nested import INDEX
from ivm.maintain.delta_rules import DELTA
from ivm.maintain.groupby import describe, state_name
from ivm.vocabulary import Kind, SubgoalKind

if TYPE_CHECKING:
    from ivm.maintain.states import DeltaContext


def kind(program: Program, item: BodyItem) -> SubgoalKind | None:
    """The subgoal kind of a rule's body item; None for a condition, an assignment or an unnest (000
    Definition 4.1 gives them no delta rule: they are kept as they are)."""
    if isinstance(item, GroupBy):
        return SubgoalKind.GROUPBY
    if isinstance(item, SetOf):
        return SubgoalKind.SETOF
    if not isinstance(item, Literal):
        return None
    if item.negated:
        return SubgoalKind.NEGATION
    p = program.predicates[item.atom.pred]
    if p.kind == Kind.EXTRACTION:
        return SubgoalKind.EXTRACTION
    return SubgoalKind.OWNER_INDEX if p.role == INDEX else SubgoalKind.ATOM


@dataclass(frozen=True)
class SubgoalRule:
    """How a delta rule reads one kind of subgoal. ``delta(c, pred, r, j, item, broadcast)`` is the
    subgoal's Δ (body item ``j`` of rule ``r`` of ``pred``; a small Δ broadcast into the joins when
    ``broadcast``), ``state(c, pred, r, j, item, state)`` the subgoal at the old or new state (None: it is
    applied after the joins, `Counting.absent`)."""

    kind: SubgoalKind
    delta: Callable[[DeltaContext, str, int, int, BodyItem, bool], DataFrame]
    state: Callable[[DeltaContext, str, int, int, BodyItem, str], DataFrame | None]
    #: a positive join of stored rows: joins distribute over ⊎, so the terms of one rule may join it once
    #: (`Counting.factored`), and 004's one-join shape admits it
    joins: bool = False
    #: whether the subgoal's Δ is known to be empty before a term over it is planned (that term is dropped)
    empty: Callable[[DeltaContext, str, int, int, BodyItem], bool] = lambda c, pred, r, j, item: False
    #: what `ivm explain` says of the subgoal in rule ``r`` (an index into ``pred``'s rules), in words
    explain: Callable[[Program, str, int, int, BodyItem], list[str]] = lambda program, pred, r, j, item: []


# -- atoms: positive literals over tables, views and auxiliary predicates (000 §4) --------------------------


def _atom_delta(c: DeltaContext, pred: str, r: int, j: int, item: Literal, broadcast: bool) -> DataFrame:
    rows = c.ev.atom(item.atom, c.joined(item.atom.pred, DELTA))
    return F.broadcast(rows) if broadcast and c.states.broadcastable(item.atom.pred) else rows


def _atom_state(c: DeltaContext, pred: str, r: int, j: int, item: Literal, state: str) -> DataFrame:
    return c.ev.atom(item.atom, c.joined(item.atom.pred, state))


# -- negated atoms (000 §6.1) ---------------------------------------------------------------------------


def _negation_delta(c: DeltaContext, pred: str, r: int, j: int, item: Literal, broadcast: bool) -> DataFrame:
    return c.negation_delta(item.atom)  # Definition 6.1


def _negation_state(c: DeltaContext, pred: str, r: int, j: int, item: Literal, state: str) -> None:
    return None  # an anti-join after the joins (Lemma 6.1: `Counting.absent`)


def _negation_explain(program: Program, pred: str, r: int, j: int, item: Literal) -> list[str]:
    return ["negation (NOT EXISTS, NOT IN, EXCEPT, outer-join padding): Δ(¬q) by 000 Definition 6.1, anti-joins "
            "against Qᵛ before the Δ subgoal and Q after it (Lemma 6.1)"]


# -- GROUPBY subgoals (000 §6.2, Algorithm 6.1) -----------------------------------------------------------


def _groupby_delta(c: DeltaContext, pred: str, r: int, j: int, item: GroupBy, broadcast: bool) -> DataFrame:
    return c.groupby_delta(state_name(pred, r, j), item)


def _groupby_state(c: DeltaContext, pred: str, r: int, j: int, item: GroupBy, state: str) -> DataFrame:
    return c.ev.groupby(item, c.source(item.atom, state))


def _groupby_empty(c: DeltaContext, pred: str, r: int, j: int, item: GroupBy) -> bool:
    """Δ(T) is computed and written before any term over it is planned, so its emptiness is known then:
    the term that starts from it joins nothing (an aggregate view whose groups did not change writes no
    view delta: a Spark job less)."""
    return c.groupby_unchanged(state_name(pred, r, j), item)


def _groupby_explain(program: Program, pred: str, r: int, j: int, item: GroupBy) -> list[str]:
    return [f"aggregation ({item}): 000 Algorithm 6.1 with the stored state {state_name(pred, r, j)}:",
            *(f"  {describe(a)}" for a in item.aggregates)]


# -- setof subgoals (001) ---------------------------------------------------------------------------------


def _setof_delta(c: DeltaContext, pred: str, r: int, j: int, item: SetOf, broadcast: bool) -> DataFrame:
    return c.setof_delta(pred, r, j, item)


def _setof_state(c: DeltaContext, pred: str, r: int, j: int, item: SetOf, state: str) -> DataFrame:
    return c.ev.setof(item, c.source(item.atom, state))


def _setof_explain(program: Program, pred: str, r: int, j: int, item: SetOf) -> list[str]:
    rule: Rule = program.rules_for(pred)[r]
    if program.predicates[item.atom.pred].role == ROLE:
        return [f"{item}: CReaM (001 Figure 1): the auxiliary view {item.atom.pred} keeps every variable of φ, "
                "Δ1–Δ6 maintain it from φ⁺/φ⁻ alone, and the view counts its derivations from v_a⁺/v_a⁻"]
    if case1(program, rule, item):
        return [f"{item}: 001 §3 Case 1: the view holds every outer variable, so it is its own v_a; Δ1–Δ6 over "
                "its stored sets and φ's set changes"]
    if set_changes_known(program, item):
        return [f"{item}: Δ1–Δ6 (001 §3) over {item.atom.pred}, which serves as v_a"]
    return [f"{item}: no auxiliary view (auxiliary_views: false): each touched group's set is re-read from φ "
            "before and after the change (001 §3, Γ1–Γ6)"]


#: the delta rule of every subgoal kind. An extraction function (002 §2.2) and an owner index (002 §4.2)
#: are read as atoms are (`Counting.used` extracts e_S from its parent's state and Δ, `nested.probe_indexes`
#: restricts an index before the joins), but neither shares its joins with other terms: e_S is computed
#: from its parent per term, and an index is probed per term with that term's collection ids
RULES: dict[SubgoalKind, SubgoalRule] = {r.kind: r for r in (
    SubgoalRule(SubgoalKind.ATOM, _atom_delta, _atom_state, joins=True),
    SubgoalRule(SubgoalKind.NEGATION, _negation_delta, _negation_state, explain=_negation_explain),
    SubgoalRule(SubgoalKind.GROUPBY, _groupby_delta, _groupby_state, empty=_groupby_empty, explain=_groupby_explain),
    SubgoalRule(SubgoalKind.SETOF, _setof_delta, _setof_state, explain=_setof_explain),
    SubgoalRule(SubgoalKind.EXTRACTION, _atom_delta, _atom_state),
    SubgoalRule(SubgoalKind.OWNER_INDEX, _atom_delta, _atom_state),
)}


def rule_for(program: Program, item: BodyItem) -> SubgoalRule | None:
    """The entry of ``item``'s kind; None for a body item that is not a subgoal."""
    k = kind(program, item)
    return None if k is None else RULES[k]


def explain_lines(program: Program, preds: list[str]) -> list[str]:
    """What `ivm explain` says of the subgoals of ``preds``' rules, each line once, in rule order."""
    lines: dict[str, None] = {}
    for pred in preds:
        for r, rule in enumerate(program.rules_for(pred)):
            for j, item in enumerate(rule.body):
                entry = rule_for(program, item)
                if entry is not None:
                    lines.update(dict.fromkeys(entry.explain(program, pred, r, j, item)))
    return list(lines)
