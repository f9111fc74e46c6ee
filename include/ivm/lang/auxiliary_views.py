"""CReaM's Step 1 (001 §4, Figure 1), a compile-time pass: rewrite a view over an auxiliary view that
keeps every non-aggregated variable of a setof subgoal, ``v_a(X̄, Z̄, W) :- setof(Ȳ, φ(X̄, Ȳ, Z̄), W)``
and ``v(X̄, A) :- v_a(X̄, Z̄, W), agg(W, A)`` (one auxiliary view per setof subgoal, 001 §4's k-subgoal
case), and likewise a GROUPBY subgoal with a non-distributive aggregate over a table. Steps 2-4 (store
v_a, count v's derivations, maintain v_a by Δ1–Δ6) are run time: ivm.maintain.cream.
"""

from __future__ import annotations

from ivm.config import ProjectConfig
from ivm.ir import (
    Atom,
    BodyItem,
    GroupBy,
    Literal,
    Predicate,
    Program,
    Rule,
    SetOf,
    Var,
    aggregate_kind,
    column_names,
)
from ivm.vocabulary import Kind

ROLE = "cream"
#: the kinds of aggregates (ivm.maintain.groupby.kind) whose touched groups are recomputed from the input
RECOMPUTED = {"recompute", "min", "max", "inductive_insert"}


def pure(atom: Atom) -> bool:
    """The atom reads its predicate without selection or projection: distinct variables only."""
    names = [a.name for a in atom.args if isinstance(a, Var)]
    return len(names) == len(atom.args) == len(set(names))


def set_changes_known(program: Program, s: SetOf) -> bool:
    """φ⁺ and φ⁻ are φ's own set changes: the setof reads a set predicate whole (v_a, a keyed table, a
    view's own set predicate), so Δ1–Δ6 apply without re-reading φ."""
    return pure(s.atom) and program.predicates[s.atom.pred].semantics == "set"


def case1(program: Program, rule: Rule, s: SetOf) -> bool:
    """001 §3 Case 1 with the view as its own v_a: the rule is ``v(X̄, W) :- setof(Ȳ, φ(X̄, Ȳ), W)``
    (the head is exactly the setof's outer variables and W), it is the predicate's only rule, and φ is
    a set read without projection, so its set changes are φ⁺ and φ⁻."""
    head = [a.name for a in rule.head.args if isinstance(a, Var)]
    return (rule.body == (s,) and len(head) == len(rule.head.args) == len(set(head))
            and set(head) == {v.name for v in s.group()} | {s.result.name}
            and len(program.rules_for(rule.head.pred)) == 1 and set_changes_known(program, s))


def serves_as_auxiliary(program: Program, view: str, atom: Atom, semantics: str) -> bool:
    """The subgoal reads a predicate the view stores itself, whole: that predicate already is the
    auxiliary view (the GROUP BY input of a SQL view, a Datalog view's own set predicate)."""
    p = program.predicates[atom.pred]
    return (p.kind == Kind.AUX and p.owner == view and pure(atom)
            and (semantics == "bag" or p.semantics == "set"))


def needs_auxiliary(program: Program, rule: Rule, item: BodyItem) -> str | None:
    """The semantics of the auxiliary view Step 1 gives this subgoal (set for a setof, bag for a GROUPBY's
    multisets), or None when it needs none."""
    view = program.owner(rule.head.pred)
    if isinstance(item, SetOf):
        if case1(program, rule, item) or serves_as_auxiliary(program, view, item.atom, "set"):
            return None
        return "set"
    if isinstance(item, GroupBy) and any(aggregate_kind(a) in RECOMPUTED for a in item.aggregates):
        return None if serves_as_auxiliary(program, view, item.atom, "bag") else "bag"
    return None


def auxiliary_views(program: Program, config: ProjectConfig) -> Program:
    """Step 1 for every view with ``auxiliary_views: true``: each setof subgoal (and each GROUPBY subgoal
    with a non-distributive aggregate) that needs one reads an auxiliary view ``<view>__va<n>`` defined
    by ``v_a(X̄, Z̄, Ȳ) :- φ(...)``, the subgoal's atom over its variables. Returns the new program."""
    program = program.copy()
    counters: dict[str, int] = {}
    rules: list[Rule] = []
    for rule in program.rules:
        view = program.owner(rule.head.pred)
        body = list(rule.body)
        for j, item in enumerate(body):
            semantics = needs_auxiliary(program, rule, item) if config.views[view].auxiliary_views else None
            if semantics is None:
                continue
            assert isinstance(item, SetOf | GroupBy)
            if isinstance(item, SetOf):
                keep = [*item.group(), *item.elements]  # X̄, Z̄ then Ȳ: every variable of φ
            else:
                used = {item.atom.args.index(v) for v in item.by} | {
                    i for a in item.aggregates if a.arg is not None for v in a.arg.variables()
                    for i, t in enumerate(item.atom.args) if isinstance(t, Var) and t.name == v}
                keep = list(dict.fromkeys(item.atom.args[i] for i in sorted(used)))
            n = counters.get(view, 0) + 1
            while f"{view}__va{n}" in program.predicates:
                n += 1
            counters[view] = n
            head = Atom(f"{view}__va{n}", tuple(keep))
            program.predicates[head.pred] = Predicate(head.pred, column_names(head), Kind.AUX, semantics,  # type: ignore[arg-type]
                                                      owner=view, role=ROLE)
            rules.append(Rule(head, (Literal(item.atom),)))
            body[j] = (SetOf(item.elements, head, item.result) if isinstance(item, SetOf)
                       else GroupBy(head, item.by, item.aggregates))
        rules.append(Rule(rule.head, tuple(body)))
    program.rules[:] = rules
    return program
