"""Nested data's compile-time passes (002): the extraction rewrite (§2.2, by value), collection
variables and owner indexes (§4.1-4.2, by reference). What they produce is maintained at run time by
ivm.maintain.nested, whose docstring describes both representations.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from ivm.config import ProjectConfig
from ivm.errors import ConfigError
from ivm.ir import (
    Assign,
    Atom,
    Condition,
    Expr,
    GroupBy,
    Literal,
    Predicate,
    Program,
    Rule,
    SetOf,
    Unnest,
    Var,
    Wildcard,
)
from ivm.stratify import recursive_predicates
from ivm.vocabulary import Kind

EXTRACTION = Kind.EXTRACTION
INDEX = "index"
#: in a Datalog rule, a variable in predicate position (HiLog): ``Y(Z, A)``
COLLECTION_VARIABLE = "$"


def extraction_functions(program: Program, config: ProjectConfig) -> Program:
    """The extraction rewrite of every nonrecursive rule (by value, 002 §2.2). Recursive rules keep
    their unnests (DRed maintains them as they are). Returns the new program."""
    program = program.copy()
    _extract_by_value(program, recursive_predicates(program))
    return program


def owner_indexes(program: Program, config: ProjectConfig) -> Program:
    """A literal over a nesting table T whose nested column is joined to its collection's id reads T
    through the view's owner index (by reference, 002 §4.2), in every nonrecursive rule. Returns the
    new program."""
    program = program.copy()
    _owner_indexes(program, config, recursive_predicates(program))
    return program


# -- by value: the extraction rewrite (002 §2.2, expression (1)) -------------------------------------------


def _item_variables(item) -> set[str]:
    if isinstance(item, Literal):
        return item.atom.variables()
    if isinstance(item, Assign):
        return {item.var.name} | item.expr.variables()
    if isinstance(item, Unnest):
        return item.variables() | item.array.variables()
    if isinstance(item, GroupBy | SetOf | Condition):
        return item.variables()
    return set()


def _head_variables(head: Atom) -> set[str]:
    out = set()
    for a in head.args:
        if isinstance(a, Var):
            out.add(a.name)
        elif isinstance(a, Expr):
            out |= a.variables()
    return out


def _variables_outside(rule: Rule, items: set[int]) -> set[str]:
    """The variables the rule's head and its body items other than ``items`` use."""
    return _head_variables(rule.head).union(*(_item_variables(x) for j, x in enumerate(rule.body) if j not in items))


def _rename(tree: exp.Expression, names: dict[str, str]) -> exp.Expression:
    return tree.copy().transform(
        lambda n: exp.column(names[n.name], quoted=True) if isinstance(n, exp.Column) and not n.table
        and n.name in names else n)


def _extract_by_value(program: Program, recursive: set[str]) -> None:
    defined: dict[tuple, str] = {}
    changed = True
    while changed:  # an unnest over an extraction's element (an array of arrays) is rewritten next round
        changed = False
        for n, rule in enumerate(program.rules):
            if rule.head.pred in recursive or program.predicates[rule.head.pred].kind == EXTRACTION:
                continue
            new = _extract_one(program, rule, defined)
            if new is not None:
                program.rules[n] = new
                changed = True


def _extract_one(program: Program, rule: Rule, defined: dict[tuple, str]) -> Rule | None:
    """Replace the first unnest whose array comes from one positive table (or extraction) literal by a
    literal over the extraction predicate e(kept parent columns, elements)."""
    for k, u in enumerate(rule.body):
        if not isinstance(u, Unnest):
            continue
        need = u.array.variables()
        for i, lit in enumerate(rule.body):
            if not (isinstance(lit, Literal) and not lit.negated and not lit.null_safe and need
                    and program.predicates[lit.atom.pred].kind in (Kind.BASE, Kind.EXTRACTION)
                    and need <= lit.atom.variables()
                    and all(isinstance(a, Var | Wildcard) for a in lit.atom.args)):
                continue
            names = [a.name for a in lit.atom.args if isinstance(a, Var)]
            if len(set(names)) != len(names):
                continue  # p(X, X) selects; keep the rule as it is
            elsewhere = _variables_outside(rule, {i, k})
            if {v.name for v in u.elements} & set(names):
                continue  # an element equal to a parent column: rare, keep the join
            parent = program.predicates[lit.atom.pred]
            kept = [p for p, a in enumerate(lit.atom.args) if isinstance(a, Var) and a.name in elsewhere]
            canonical = {a.name: f"C{p}" for p, a in enumerate(lit.atom.args) if isinstance(a, Var)}
            array = _rename(u.array.tree, canonical)
            key = (parent.name, tuple(kept), array.sql(dialect="spark"), u.kind, u.outer, len(u.elements))
            name = defined.get(key) or _define(program, parent, kept, array, u, key, defined)
            atom = Atom(name, tuple(lit.atom.args[p] for p in kept) + tuple(u.elements))
            body = [x for j, x in enumerate(rule.body) if j not in (i, k)]
            body.insert(min(i, k), Literal(atom))
            return Rule(rule.head, tuple(body))
    return None


def _define(program: Program, parent: Predicate, kept: list[int], array: exp.Expression, u: Unnest,
            key: tuple, defined: dict[tuple, str]) -> str:
    columns = [parent.columns[p] for p in kept]
    elem = "elem"
    while any(c == elem or c.startswith(elem) for c in columns):
        elem = "_" + elem
    elements = [elem] if len(u.elements) == 1 else [f"{elem}{j + 1}" for j in range(len(u.elements))]
    label = array.name if isinstance(array, exp.Column) else (
        next((c.name for c in array.find_all(exp.Dot, exp.Column)), "") or "array")
    label = parent.columns[int(label[1:])] if label.startswith("C") and label[1:].isdigit() else label
    base = f"e_{parent.name.removeprefix('e_')}_{label}"
    name, n = base, 1
    while name in program.predicates:
        n += 1
        name = f"{base}_{n}"
    program.predicates[name] = Predicate(name, columns + elements, EXTRACTION, "bag", role=EXTRACTION)
    head = Atom(name, tuple(Var(f"C{p}") for p in kept) + tuple(Var(f"E{j + 1}") for j in range(len(u.elements))))
    body = (Literal(Atom(parent.name, tuple(Var(f"C{p}") for p in range(len(parent.columns))))),
            Unnest(Expr(array), tuple(Var(f"E{j + 1}") for j in range(len(u.elements))), u.kind, u.outer))
    program.rules.append(Rule(head, body))
    defined[key] = name
    return name


def source_relation(program: Program, pred: str) -> str:
    """The relation an extraction unnests (a table, or another extraction), or an owner index copies
    (its table): the first literal of the predicate's one rule."""
    [rule] = program.rules_for(pred)
    return rule.body[0].atom.pred


def extractions(program: Program, preds: Iterable[str]) -> list[str]:
    return sorted(p for p in preds if program.predicates[p].kind == EXTRACTION)


# -- by reference: collection variables and owner indexes (002 §4.1-4.2) --------------------------------------


def resolve_collections(rules: list[Rule], config: ProjectConfig, view: str) -> list[Rule]:
    """Datalog's HiLog literals ``Y(Z, A)`` as literals over the collection table Y refers to, its id
    column bound to Y (002 §2.2's e_S(Y, Z, A)); Y must be bound by a ``nested:`` column of a literal
    in the same rule (possibly another collection's, for deeper nesting)."""
    out = []
    for rule in rules:
        body = list(rule.body)
        for _ in range(len(body)):  # a collection's own nested column binds the next level
            done = True
            for n, item in enumerate(body):
                if not (isinstance(item, Literal) and item.atom.pred.startswith(COLLECTION_VARIABLE)):
                    continue
                var = item.atom.pred[len(COLLECTION_VARIABLE):]
                target = _referenced_collection(body, var, config)
                if target is None:
                    done = False
                    continue
                table, id_col = target
                columns = list(config.tables[table].columns)
                others = [c for c in columns if c != id_col]
                if len(item.atom.args) != len(others):
                    raise ConfigError(f"views.{view}: {var}({', '.join(map(str, item.atom.args))}) gives "
                                      f"{len(item.atom.args)} values but the collection {table} has "
                                      f"{len(others)} ({', '.join(others)}) besides its id {id_col}")
                given = iter(item.atom.args)
                args = tuple(Var(var) if c == id_col else next(given) for c in columns)
                body[n] = Literal(Atom(table, args), item.negated)
            if done:
                break
        for item in body:
            if isinstance(item, Literal) and item.atom.pred.startswith(COLLECTION_VARIABLE):
                var = item.atom.pred[len(COLLECTION_VARIABLE):]
                raise ConfigError(f"views.{view}: in `{rule.head} :- ...`, {var}(...) needs {var} bound to a "
                                  f"nested column (declare it under tables.<table>.nested)")
        out.append(Rule(rule.head, tuple(body)))
    return out


def _referenced_collection(body, var: str, config: ProjectConfig) -> tuple[str, str] | None:
    for item in body:
        if not (isinstance(item, Literal) and not item.negated and item.atom.pred in config.tables):
            continue
        table = config.tables[item.atom.pred]
        for col, arg in zip(table.columns, item.atom.args, strict=False):
            if isinstance(arg, Var) and arg.name == var and col in table.nested:
                return table.nested[col].collection, table.nested[col].id
    return None


def index_name(owner: str, table: str, column: str) -> str:
    return f"{owner}__{table}_by_{column}"


def _owner_indexes(program: Program, config: ProjectConfig, recursive: set[str]) -> None:
    """A literal over a nesting table T whose nested column is joined to its collection's id reads T
    through the view's owner index (002 §4.2): collection id -> the owner's columns the view's rules
    read (its other columns are not kept; counts sum over the owners that agree on the kept ones)."""
    uses: dict[tuple[int, int], tuple[str, str, str]] = {}  # (rule, literal) -> (view, table, column)
    kept: dict[tuple[str, str, str], set[int]] = {}  # the columns each index keeps
    for n, rule in enumerate(program.rules):
        if rule.head.pred in recursive:
            continue
        for i, lit in enumerate(rule.body):
            if not (isinstance(lit, Literal) and not lit.negated and lit.atom.pred in config.tables):
                continue
            table = config.tables[lit.atom.pred]
            for col, ref in table.nested.items():
                arg = lit.atom.args[list(table.columns).index(col)]
                id_pos = list(config.tables[ref.collection].columns).index(ref.id)
                if isinstance(arg, Var) and any(
                        isinstance(x, Literal) and not x.negated and x.atom.pred == ref.collection
                        and x.atom.args[id_pos] == arg for x in rule.body):
                    key = (program.owner(rule.head.pred), lit.atom.pred, col)
                    uses[(n, i)] = key
                    kept.setdefault(key, {list(table.columns).index(col)}).update(_read_positions(rule, i))
                    break
    for (n, i), (owner, table, col) in uses.items():
        rule = program.rules[n]
        positions = sorted(kept[(owner, table, col)])
        name = _index(program, owner, table, col, positions)
        lit = rule.body[i]
        body = list(rule.body)
        body[i] = Literal(Atom(name, tuple(lit.atom.args[p] for p in positions)), null_safe=lit.null_safe)
        program.rules[n] = Rule(rule.head, tuple(body))


def _read_positions(rule: Rule, i: int) -> set[int]:
    """The positions of body literal ``i`` the rule reads: a constant (it selects), a variable the head
    or another body item uses or the literal repeats; not ``_`` nor a variable seen nowhere else."""
    lit = rule.body[i]
    elsewhere = _variables_outside(rule, {i})
    names = [a.name for a in lit.atom.args if isinstance(a, Var)]
    return {p for p, a in enumerate(lit.atom.args) if not isinstance(a, Var | Wildcard)
            or isinstance(a, Var) and (a.name in elsewhere or names.count(a.name) > 1)}


def _index(program: Program, owner: str, table: str, column: str, positions: list[int]) -> str:
    name = index_name(owner, table, column)
    if name not in program.predicates:
        t = program.predicates[table]
        columns = [t.columns[p] for p in positions]
        program.predicates[name] = Predicate(name, columns, Kind.AUX, "bag", owner=owner, role=INDEX,
                                             cluster=[column, *(c for c in columns if c != column)])
        args = tuple(Var(f"C{p}") for p in range(len(t.columns)))
        program.rules.append(Rule(Atom(name, tuple(args[p] for p in positions)), (Literal(Atom(table, args)),)))
    return name


def nested_column(program: Program, index: str) -> str:
    """The collection-id column an owner index is clustered by."""
    return program.predicates[index].cluster[0]
