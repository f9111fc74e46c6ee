"""The delta rules of 000 Definition 4.1, as the counting algorithm evaluates them (ivm.maintain.counting) and
`ivm explain` prints them.

For a rule ``p :- s1, ..., sn`` the i-th delta rule is

    Δ(p) :- s1ᵛ, ..., s(i-1)ᵛ, Δ(si), s(i+1), ..., sn.

new states (ᵛ) before the Δ subgoal, old states after it, so each derivation that changes is counted
exactly once (000 §4). A negated subgoal contributes Δ(¬q), the tuples whose absence from q changed
(000 Definition 6.1); a GROUPBY subgoal contributes the changed groups of its aggregate (000 Algorithm
6.1). Conditions and assignments are kept as they are. Each rule is also rendered as SQL a person can
read: relations are named ``<pred>__old``, ``<pred>__new`` and ``<pred>__delta``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ivm.ir import (
    Assign,
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

OLD, NEW, DELTA = "old", "new", "delta"


@dataclass(frozen=True)
class DeltaRule:
    """One term of Definition 4.1: the source rule with a state chosen for each subgoal."""

    rule: Rule
    states: tuple[str | None, ...]  # per body item: old | new | delta, None for conditions/assignments
    term: int
    terms: int

    def __str__(self) -> str:
        items = [render_item(item, state) for item, state in zip(self.rule.body, self.states, strict=True)]
        return f"Δ{self.rule.head} :- {', '.join(items)}."

    def sql(self, program: Program) -> str:
        return rule_sql(program, self.rule, self.states)


def render_item(item, state: str | None, delta: str = "Δ") -> str:
    """A body item in a delta rule: ``Δ(item)`` at the Δ position, ``pᵛ(...)`` in the new state."""
    text = str(item)
    if state == DELTA:
        return f"{delta}({text})"
    if state == NEW:
        return text.replace(f"{item.atom.pred}(", f"{item.atom.pred}ᵛ(", 1)
    return text


def delta_rules(rule: Rule) -> list[DeltaRule]:
    """000 Definition 4.1: one delta rule per subgoal (atom, negated atom or GROUPBY)."""
    subgoals = [i for i, item in enumerate(rule.body) if isinstance(item, Subgoal)]
    out = []
    for n, k in enumerate(subgoals):
        states = tuple(None if i not in subgoals else NEW if i < k else DELTA if i == k else OLD
                       for i in range(len(rule.body)))
        out.append(DeltaRule(rule, states, n + 1, len(subgoals)))
    return out


def render_call(a, names: dict[str, str]) -> str:
    """An aggregate call with its argument's variables named by the input relation's columns (a window's
    values keep their variables' names, as the window functions `rule_sql` renders are named)."""
    return a.call() if a.arg is None else _named(a.call(), names)


def _named(text: str, names: dict[str, str]) -> str:
    for v, column in names.items():
        text = text.replace(f"`{v}`", column)
    return text


def rule_sql(program: Program, rule: Rule, states: tuple[str | None, ...] | None = None,
             counts: bool = True) -> str:
    """A rule as a SELECT over its subgoals' relations, counts multiplied (000 §3); without the count
    column for set-semantics rules (003)."""
    states = states or tuple(None for _ in rule.body)
    binding: dict[str, exp.Expression] = {}
    froms: list[str] = []
    where: list[str] = []
    count_terms: list[str] = []

    def rel(pred: str, state: str | None) -> str:
        return pred if state is None else f"{pred}__{state}"

    def col(alias: str, name: str) -> exp.Expression:
        return exp.column(name, table=alias)

    def render(tree: exp.Expression) -> str:
        return tree.copy().transform(
            lambda n: binding[n.name].copy() if isinstance(n, exp.Column) and n.name in binding else n
        ).sql(dialect="spark")

    def bind_atom(alias: str, columns: list[str], args, eq: str = "=") -> None:
        for c, a in zip(columns, args, strict=True):
            if isinstance(a, Var):
                if a.name in binding:
                    where.append(f"{alias}.{c} {eq} {binding[a.name].sql(dialect='spark')}")
                else:
                    binding[a.name] = col(alias, c)
            elif isinstance(a, Const):
                where.append(f"{alias}.{c} IS NULL" if a.value is None else
                             f"{alias}.{c} = {exp.convert(a.value).sql(dialect='spark')}")
            elif isinstance(a, Expr):
                where.append(f"{alias}.{c} = {render(a.tree)}")

    n = 0
    for item, state in zip(rule.body, states, strict=True):
        if isinstance(item, Literal) and (not item.negated or state == DELTA):
            n += 1
            alias = f"t{n}"
            if item.negated:  # 000 Definition 6.1: Δ(Q̄) is a relation, joined like a positive subgoal
                froms.append(f"not_{item.atom.pred}__delta AS {alias} /* Δ(¬{item.atom.pred}): +1 for tuples of "
                             f"Δ{item.atom.pred} no longer in {item.atom.pred}, -1 for those newly in it */")
            else:
                froms.append(f"{rel(item.atom.pred, state)} AS {alias}")
            bind_atom(alias, program.predicates[item.atom.pred].columns, item.atom.args,
                      "<=>" if item.null_safe else "=")
            count_terms.append(f"{alias}.__count")
        elif isinstance(item, GroupBy):
            n += 1
            alias = f"g{n}"
            inner_cols = program.predicates[item.atom.pred].columns
            names = dict(zip((a.name for a in item.atom.args if isinstance(a, Var)), inner_cols, strict=False))
            aggs = ", ".join(f"{render_call(a, names)} AS {a.var.name}" for a in item.aggregates)
            by = ", ".join(names[v.name] for v in item.by)
            windows = [f"{_named(w, names)} AS {v}" for a in item.aggregates for v, w in a.windows]
            source = rel(item.atom.pred, state)
            if windows:  # (the group's rows with their window values, ivm.lang.window_functions)
                source = f"(SELECT *, {', '.join(windows)} FROM {source})"
            froms.append(f"(SELECT {by + ', ' if by else ''}{aggs} FROM {source}"
                         f"{' GROUP BY ' + by if by else ''}) AS {alias}")
            for v in item.by:
                binding[v.name] = col(alias, names[v.name])
            for a in item.aggregates:
                binding[a.var.name] = col(alias, a.var.name)
        elif isinstance(item, SetOf):
            n += 1
            alias = f"s{n}"
            inner_cols = program.predicates[item.atom.pred].columns
            names = dict(zip((a.name for a in item.atom.args if isinstance(a, Var)), inner_cols, strict=False))
            group = ", ".join(names[v.name] for v in item.group())
            elems = [names[e.name] for e in item.elements]
            element = elems[0] if len(elems) == 1 else f"struct({', '.join(elems)})"
            froms.append(f"(SELECT {group + ', ' if group else ''}array_sort(collect_set({element})) AS "
                         f"{item.result.name} FROM {rel(item.atom.pred, state)}"
                         f"{' GROUP BY ' + group if group else ''}) AS {alias}")
            for v in item.group():
                binding[v.name] = col(alias, names[v.name])
            binding[item.result.name] = col(alias, item.result.name)
    laterals = []
    for item in rule.body:
        if isinstance(item, Assign):
            binding[item.var.name] = exp.Paren(this=exp.maybe_parse(render(item.expr.tree), dialect="spark"))
        elif isinstance(item, Unnest):
            alias = f"u{len(laterals) + 1}"
            names = [f"e{i + 1}" for i in range(len(item.elements))]
            laterals.append(f"LATERAL VIEW {'OUTER ' if item.outer else ''}{item.kind}({render(item.array.tree)}) "
                            f"{alias} AS {', '.join(names)}")
            for v, nm in zip(item.elements, names, strict=True):
                binding[v.name] = col(alias, nm)
    for item, state in zip(rule.body, states, strict=True):
        if isinstance(item, Condition):
            where.append(render(item.tree))
        elif isinstance(item, Literal) and item.negated and state != DELTA:
            # 000 §6.1 cases 1 and 2: Q̄ from the old Q, Q̄ᵛ from the new one (Lemma 6.1)
            columns = program.predicates[item.atom.pred].columns
            eq = "<=>" if item.null_safe else "="
            conds = [f"n.{c} {eq} {binding[a.name].sql(dialect='spark')}" for c, a in zip(columns, item.atom.args,
                                                                                          strict=True)
                     if isinstance(a, Var) and a.name in binding]
            conds += [f"n.{c} IS NULL" if a.value is None else f"n.{c} = {exp.convert(a.value).sql(dialect='spark')}"
                      for c, a in zip(columns, item.atom.args, strict=True) if isinstance(a, Const)]
            where.append(f"NOT EXISTS (SELECT 1 FROM {rel(item.atom.pred, state)} AS n"
                         f"{' WHERE ' + ' AND '.join(conds) if conds else ''})")
    head_cols = program.predicates[rule.head.pred].columns
    select = []
    for c, a in zip(head_cols, rule.head.args, strict=True):
        if isinstance(a, Var):
            select.append(f"{binding[a.name].sql(dialect='spark')} AS {c}")
        elif isinstance(a, Const):
            select.append(f"{exp.convert(a.value).sql(dialect='spark')} AS {c}")
        elif isinstance(a, Expr):
            select.append(f"{render(a.tree)} AS {c}")
        elif isinstance(a, Wildcard):
            select.append(f"NULL AS {c}")
    if counts:
        select.append(f"{' * '.join(count_terms) or '1'} AS __count")
    text = f"SELECT {', '.join(select)}\nFROM {', '.join(froms) or '(SELECT 1)'}"
    for lateral in laterals:
        text += f"\n  {lateral}"
    if where:
        text += "\nWHERE " + "\n  AND ".join(where)
    return text
