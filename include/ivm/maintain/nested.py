"""Views over nested data (002): the extraction rewrite, element-level deltas, owner indexes.

002 maintains a view over nested relations with the counting algorithm once every nested relation a
rule reaches through a variable is replaced by the *extraction function* e_S(X, A1..Ak) = u_S(X) ⋈
X(A1..Ak) (§2.2, expression (1)); its delta Δe_S holds only the elements that changed, so "the
incremental work ... is proportional to the changes in the contents of the nested relations, and not
proportional to the size of the nested relations themselves" (§2.2, after Example 2.2). Two
representations:

* **By value** (an ``array<...>`` column, ``LATERAL VIEW explode/inline``): a rule's parent literal
  and its unnest are replaced by one literal over an extraction predicate (kind ``extraction``), defined
  by ``e(kept parent columns, elements) :- parent(...), explode(array) AS (elements)``. Like 002's
  e_S it is not stored, "only the log of the view, not the view's extension" (§2.2): its old and new
  states are the parent's, extracted; Δe is the parent's net delta, extracted, projected onto e's
  columns and consolidated, which is the multiset difference of each updated row's before- and
  after-array: an element that stayed cancels before anything joins it. Parent columns the rule uses
  only inside the array expression are dropped, so an update elsewhere in the row cancels too. Arrays
  of arrays nest the rewrite (e over e, §2.2: "we can recursively express Δe_S in terms of S and e_T").
* **By reference** (``tables.T.nested: {col: {collection: S, id: c}}``): S is the one table of all
  collections of that type, its rows tagged with their collection's id; S's change log is the nested
  descriptor's log (§4.1), one per collection type, and S itself (u_S ⋈ X) is e_S. In Datalog a
  variable in predicate position, HiLog style as in Example 2.1 (``emp(X, Y), Y(Z, A)``), stands for
  the collection Y refers to; in SQL the join ``S.c = T.col`` is the same thing. A rule that joins a
  nesting table T to its collection S reads T through the view's **owner index** (§4.2): a copy of
  T's rows stored clustered by the collection id, a relation of the view that every refresh maintains
  from T's net delta (inserted owners add entries, deleted ones remove them, an update is both), and
  that the first materialization builds from all of T (footnote 5: every nesting tuple, whether or not
  it contributes). A delta rule whose Δ subgoal is a collection's change probes the index with the
  changed collection ids (§4.3 step 2-1) and, level by level, probes the next index with the owners it
  found, so a change deep inside a collection reaches the owning rows without scanning the nesting
  tables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from sqlglot import exp

from ivm.config import ProjectConfig
from ivm.errors import ConfigError
from ivm.ir import (
    Assign,
    Atom,
    BodyItem,
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
from ivm.maintain.delta_rules import DELTA, DeltaRule
from ivm.stratify import recursive_predicates
from ivm.zset import consolidate, one_partition

if TYPE_CHECKING:
    from ivm.maintain.counting import Counting

log = logging.getLogger(__name__)
EXTRACTION = "extraction"
#: at most this many collection ids probe an owner index as a filter (002 §4.3)
PROBE_LIMIT = 10_000
INDEX = "index"
#: in a Datalog rule, a variable in predicate position (HiLog): ``Y(Z, A)``
COLLECTION_VARIABLE = "$"


def rewrite(program: Program, config: ProjectConfig) -> None:
    """The extraction rewrite of every nonrecursive rule (by value), then the owner indexes (by
    reference). Recursive rules keep their unnests (DRed maintains them as they are)."""
    recursive = recursive_predicates(program)
    _extract_by_value(program, recursive)
    _owner_indexes(program, config, recursive)


def _q(name: str) -> str:
    return f"`{name}`"


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
                    and program.predicates[lit.atom.pred].kind in ("base", EXTRACTION)
                    and need <= lit.atom.variables()
                    and all(isinstance(a, Var | Wildcard) for a in lit.atom.args)):
                continue
            names = [a.name for a in lit.atom.args if isinstance(a, Var)]
            if len(set(names)) != len(names):
                continue  # p(X, X) selects; keep the rule as it is
            elsewhere = _head_variables(rule.head).union(
                *(_item_variables(x) for j, x in enumerate(rule.body) if j not in (i, k)))
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
    through the view's owner index (002 §4.2)."""
    for n, rule in enumerate(program.rules):
        if rule.head.pred in recursive:
            continue
        body = list(rule.body)
        for i, lit in enumerate(body):
            if not (isinstance(lit, Literal) and not lit.negated and lit.atom.pred in config.tables):
                continue
            table = config.tables[lit.atom.pred]
            for col, ref in table.nested.items():
                arg = lit.atom.args[list(table.columns).index(col)]
                id_pos = list(config.tables[ref.collection].columns).index(ref.id)
                if isinstance(arg, Var) and any(
                        isinstance(x, Literal) and not x.negated and x.atom.pred == ref.collection
                        and x.atom.args[id_pos] == arg for x in body):
                    name = _index(program, program.owner(rule.head.pred), lit.atom.pred, col)
                    body[i] = Literal(Atom(name, lit.atom.args), null_safe=lit.null_safe)
                    break
        program.rules[n] = Rule(rule.head, tuple(body))


def _index(program: Program, owner: str, table: str, column: str) -> str:
    name = index_name(owner, table, column)
    if name not in program.predicates:
        t = program.predicates[table]
        program.predicates[name] = Predicate(name, list(t.columns), "aux", "bag", owner=owner, role=INDEX,
                                             cluster=[column, *(c for c in t.columns if c != column)])
        args = tuple(Var(f"C{p}") for p in range(len(t.columns)))
        program.rules.append(Rule(Atom(name, args), (Literal(Atom(table, args)),)))
    return name


def nested_column(program: Program, index: str) -> str:
    """The collection-id column an owner index is clustered by."""
    return program.predicates[index].cluster[0]


# -- maintenance: Δe (002 §2.2) and the owner-index probe (§4.3), for the counting algorithm ----------------


def extraction_delta(c: Counting, pred: str) -> None:
    """002 §2.2's Δe_S: the parent's net delta, extracted and consolidated on e's columns, so each
    updated row contributes the multiset difference of its before- and after-arrays (an element that
    stayed cancels here, before any join). Kept in the run's scratch space, like e itself never
    stored (only "the log of the view" is)."""
    [rule] = c.program.rules_for(pred)
    parent = rule.body[0].atom.pred
    if not c.changed(parent):
        return
    rows = c.ev.rule(rule, lambda j, item: c.ev.atom(item.atom, c.used(parent, DELTA)))
    delta = consolidate(rows, c.program.predicates[pred].columns)
    path, n, size = c.states.scratch.put(f"{pred}__delta", delta)
    log.info("%s: Δ from %s's delta: %d changed elements", pred, parent, n)
    c.extraction_rows[pred] = n
    if n:
        c.states.delta_bytes[pred], c.states.delta_rows[pred] = size, n
        rows = c.states.scratch.read([path], delta.schema)
        c.used_delta[pred] = one_partition(rows) if c.states.small else rows


def probe_indexes(c: Counting, d: DeltaRule, i: int,
                  subgoal: Callable[[int, BodyItem, str], DataFrame | None]) -> dict[int, DataFrame]:
    """002 §4.3 step 2-1: the owner indexes a delta rule reaches from its Δ
    subgoal, each restricted to the collection ids bound so far: first the ids of the changed
    collections, then, a level up, the ids of the owners found. An index's base layer is sorted by
    the id, so the Parquet reader skips the row groups no probed id falls in. The ids of one level
    are collected on the driver (one small job; at most PROBE_LIMIT of them, beyond that the index
    is joined whole)."""
    body = d.rule.body
    todo = {j: x for j, x in enumerate(body) if j != i and isinstance(x, Literal) and not x.negated
            and c.program.predicates[x.atom.pred].role == INDEX}
    if not todo or not isinstance(body[i], Literal) or body[i].negated:
        return {}
    start = subgoal(i, body[i], DELTA)
    bound = {v: start for v in body[i].atom.variables()}
    probed: dict[int, DataFrame] = {}
    while todo:
        ready = {}
        for j, lit in todo.items():
            column = nested_column(c.program, lit.atom.pred)
            arg = lit.atom.args[c.program.predicates[lit.atom.pred].columns.index(column)]
            if isinstance(arg, Var) and arg.name in bound:
                ready[j] = (lit, arg.name)
        if not ready:
            break
        for j, (lit, var) in ready.items():
            del todo[j]
            ids = [row[0] for row in bound[var].select(F.col(_q(var))).where(F.col(_q(var)).isNotNull())
                   .distinct().limit(PROBE_LIMIT + 1).collect()]
            rows = c.ev.atom(lit.atom, c.joined(lit.atom.pred, d.states[j]))
            if len(ids) <= PROBE_LIMIT:
                rows = rows.where(F.col(_q(var)).isin(ids))
            c.probes[lit.atom.pred] = c.probes.get(lit.atom.pred, 0) + len(ids)
            log.info("%s: probed %s with %d collection ids", d.rule.head.pred, lit.atom.pred, len(ids))
            probed[j] = rows
            bound |= {v: rows for v in lit.atom.variables() if v not in bound}
    return probed


def describe(program: Program, config: ProjectConfig, view: str, upstream: set[str]) -> list[str]:
    """`ivm explain`'s lines on nested data: each extraction function with its definition and the log
    its delta comes from, each owner index, each collection log."""
    lines = []
    for e in extractions(program, upstream):
        [rule] = program.rules_for(e)
        source = source_relation(program, e)
        table = source
        while program.predicates[table].kind == EXTRACTION:
            table = source_relation(program, table)
        lines.append(f"extraction {e}({', '.join(program.predicates[e].columns)}) := "
                     f"{rule.body[0]}, {rule.body[1]}  (002 §2.2 e_S; not stored)")
        lines.append(f"  Δ{e}: the net delta of {source}"
                     f"{'' if source == table else f' (from the log of {table})'}, extracted, projected onto "
                     f"its columns and consolidated: only elements that changed (element-level multiset "
                     f"difference of each updated row's arrays)")
    for t in sorted(u for u in upstream if u in config.tables):
        for col, ref in config.tables[t].nested.items():
            if ref.collection in upstream:
                lines.append(f"collection {t}.{col} -> {ref.collection} (by reference, id {ref.id}): the log of "
                             f"{ref.collection} is the nested descriptor's log of every {ref.collection} "
                             f"collection (002 §4.1)")
    owned = sorted(p for p, d in program.predicates.items() if d.role == INDEX and d.owner == view)
    for idx in owned:
        lines.append(f"owner index {idx}: the rows of {source_relation(program, idx)} clustered by "
                     f"{nested_column(program, idx)}; maintained from {source_relation(program, idx)}'s log in "
                     f"every refresh, probed with the changed collection ids (002 §4.2, §4.3 step 2-1)")
    return lines
