"""The dependency graph and strata of a program (000 Definition 3.1), and the checks that make a
program evaluable: safety of every variable, negation and aggregation stratified.

Strongly connected components of the dependency graph are collapsed into one node each; base
predicates are stratum 0 and every other component gets one more than the highest component it
depends on, so the predicates of a stratum depend only on lower strata and can be maintained
independently of each other (docs/design.md §6).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ivm.errors import ConfigError
from ivm.ir import Assign, Condition, Expr, GroupBy, Literal, Program, Rule, SetOf, Unnest, Var
from ivm.vocabulary import Kind


@dataclass(frozen=True)
class Component:
    predicates: tuple[str, ...]
    stratum: int
    recursive: bool


@dataclass
class Strata:
    components: list[Component]
    stratum_of: dict[str, int]
    depends_on: dict[str, set[str]]

    def upstream(self, pred: str) -> set[str]:
        """Every predicate ``pred`` depends on, directly or not."""
        seen: set[str] = set()
        todo = [pred]
        while todo:
            for d in self.depends_on.get(todo.pop(), ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    def recursive_among(self, preds: Iterable[str]) -> list[Component]:
        """The recursive components that hold any of ``preds`` (DRed maintains them, 000 §7)."""
        wanted = set(preds)
        return [c for c in self.components if c.recursive and wanted & set(c.predicates)]


def check_safety(program: Program, rule: Rule) -> None:
    """Every variable of the head, of a negated atom and of a condition is bound by a positive atom,
    a GROUPBY subgoal or an assignment (000 §6: safe negation)."""
    bound: set[str] = set()
    for item in rule.body:
        if isinstance(item, Literal) and not item.negated:
            bound |= item.atom.variables()
        elif isinstance(item, GroupBy | SetOf):
            bound |= item.variables()
    changed = True
    binders = [i for i in rule.body if isinstance(i, Assign | Unnest)]
    while changed:  # an assignment or unnest binds its variables once its expression's are bound
        changed = False
        for a in binders:
            expr, new = (a.expr, {a.var.name}) if isinstance(a, Assign) else (a.array, a.variables())
            if not new <= bound and expr.variables() <= bound:
                bound |= new
                changed = True
    view = program.owner(rule.head.pred)

    def need(vars_: set[str], where: str) -> None:
        loose = sorted(vars_ - bound)
        if loose:
            raise ConfigError(f"views.{view}: unsafe variable {loose[0]} in {where} of rule `{rule}` "
                              "(bind it in a positive subgoal)")

    for a in rule.head.args:
        need({a.name} if isinstance(a, Var) else a.variables() if isinstance(a, Expr) else set(), "the head")
    for item in rule.body:
        if isinstance(item, Literal) and item.negated:
            need(item.atom.variables(), f"`{item}`")
        elif isinstance(item, Condition):
            need(item.variables(), f"`{item}`")
        elif isinstance(item, Assign):
            need(item.expr.variables(), f"`{item}`")
        elif isinstance(item, Unnest):
            need(item.array.variables(), f"`{item}`")


def stratify(program: Program) -> Strata:
    """Strata of the program; raises ConfigError for negation or aggregation through recursion."""
    deps: dict[str, set[str]] = {p: set() for p in program.predicates}
    nonmonotone: set[tuple[str, str]] = set()
    for rule in program.rules:
        check_safety(program, rule)
        for pred, negative in rule.predicates():
            deps[rule.head.pred].add(pred)
            if negative:
                nonmonotone.add((rule.head.pred, pred))
    components = _tarjan(deps)
    comp_of = {p: i for i, comp in enumerate(components) for p in comp}
    stratum: dict[int, int] = {}
    result: list[Component] = []
    for i, comp in enumerate(components):  # Tarjan yields components after everything they depend on
        below = [stratum[comp_of[d]] for p in comp for d in deps[p] if comp_of[d] != i]
        base = all(program.predicates[p].kind == Kind.BASE for p in comp)
        stratum[i] = 0 if base else 1 + max(below, default=0)
        recursive = len(comp) > 1 or any(p in deps[p] for p in comp)
        for head, body in nonmonotone:
            if recursive and head in comp and body in comp:
                raise ConfigError(f"views.{program.owner(head)}: {head} depends on {body} through negation or "
                                  "aggregation inside a recursive cycle; the program is not stratified")
        if recursive:
            _recursive_sets(program, comp)
        result.append(Component(tuple(sorted(comp)), stratum[i], recursive))
    return Strata(result, {p: stratum[comp_of[p]] for p in program.predicates}, deps)


def recursive_predicates(program: Program) -> set[str]:
    """The predicates in a recursive component (a cycle of the dependency graph, or a self-loop), before
    any check: what a rewrite must leave alone."""
    deps: dict[str, set[str]] = {p: set() for p in program.predicates}
    for rule in program.rules:
        deps[rule.head.pred].update(p for p, _ in rule.predicates())
    return {p for comp in _tarjan(deps) if len(comp) > 1 or comp[0] in deps[comp[0]] for p in comp}


def _recursive_sets(program: Program, comp: list[str]) -> None:
    """The predicates of a recursive component have set semantics (000 §7: DRed maintains sets; a bag
    would count infinitely many derivations around a cycle). A bag member whose multiplicities are seen
    outside the component (WITH RECURSIVE ... UNION ALL) is refused; an inner one (the step query of
    a WITH RECURSIVE ... UNION) only feeds the set and becomes one."""
    for p in comp:
        pred = program.predicates[p]
        if pred.semantics == "set":
            continue
        readers = sorted({r.head.pred for r in program.rules if r.head.pred not in comp
                          and any(q == p for q, _ in r.predicates())})
        if pred.kind == Kind.VIEW or readers:
            raise ConfigError(f"views.{program.owner(p)}: {p} is recursive with bag semantics (WITH RECURSIVE "
                              "... UNION ALL); use UNION: recursive views are maintained as sets (DRed, 000 §7)")
        pred.semantics = "set"


def _tarjan(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, each after the components it reaches (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(comp)
    return out
