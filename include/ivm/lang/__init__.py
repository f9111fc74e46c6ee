"""Front ends: SQL (sqlglot) and Datalog (lark). `compile_project` turns every view of a project into
one rule program (ivm.ir), views in dependency order so that views can read views."""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from ivm.config import ProjectConfig
from ivm.errors import ConfigError
from ivm.ir import Atom, GroupBy, Predicate, Program, Rule, SetOf, Subgoal, column_names
from ivm.lang.auxiliary_views import auxiliary_views
from ivm.lang.datalog import parse_program
from ivm.lang.nested import extraction_functions, owner_indexes, resolve_collections
from ivm.lang.sql import SqlCompiler
from ivm.vocabulary import Kind

#: the compile-time passes over the front ends' program, in order (sqlglot's optimizer's RULES): each a
#: function from (program, project) to a new program
PASSES = (
    auxiliary_views,  # 001 Figure 1, Step 1: setof and non-distributive GROUPBY over auxiliary views
    extraction_functions,  # 002 §2.2: unnests as extraction functions, element-level deltas
    owner_indexes,  # 002 §4.2: nesting tables read through the views' owner indexes
)


def _sql_references(name: str, sql: str) -> set[str]:
    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except ParseError as e:
        raise ConfigError(f"views.{name}: SQL syntax error: {str(e).splitlines()[0]}") from e
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    return {t.name for t in tree.find_all(exp.Table)} - ctes


def _datalog_references(rules: list[Rule]) -> set[str]:
    defined = {r.head.pred for r in rules}
    return {p for r in rules for p, _ in r.predicates()} - defined


def add_datalog_view(program: Program, view: str, rules: list[Rule]) -> None:
    """Add a view's Datalog program: the predicate named like the view is the view, the other
    predicates it defines are its auxiliaries; base predicates read tables by column position."""
    heads: dict[str, Atom] = {}
    for r in rules:
        if r.head.pred in program.predicates:
            other = program.predicates[r.head.pred]
            raise ConfigError(f"views.{view}: predicate {r.head.pred} is already defined "
                              f"({'a table' if other.kind == Kind.BASE else 'by view ' + (other.owner or other.name)})")
        first = heads.setdefault(r.head.pred, r.head)
        if len(first.args) != len(r.head.args):
            raise ConfigError(f"views.{view}: predicate {r.head.pred} has rules with {len(first.args)} and "
                              f"{len(r.head.args)} arguments")
    if view not in heads:
        raise ConfigError(f"views.{view}: the Datalog program does not define the predicate {view}")
    for pred, head in heads.items():
        program.predicates[pred] = Predicate(pred, column_names(head), Kind.VIEW if pred == view else Kind.AUX,
                                             "set", owner=view)
    for r in rules:
        for item in r.body:
            atom = item.atom if isinstance(item, Subgoal) else None
            if atom is None:
                continue
            target = program.predicates.get(atom.pred)
            if target is None:
                raise ConfigError(f"views.{view}: unknown predicate {atom.pred} in rule `{r}`")
            if len(atom.args) != len(target.columns):
                raise ConfigError(f"views.{view}: {atom.pred} has {len(target.columns)} columns "
                                  f"({', '.join(target.columns)}) but `{atom}` gives {len(atom.args)}")
            if isinstance(item, SetOf) and not {e.name for e in item.elements} <= atom.variables():
                raise ConfigError(f"views.{view}: {item}: the set's elements must be variables of {atom}")
            if isinstance(item, GroupBy):
                for a in item.aggregates:
                    if a.arg is not None and not (a.arg.variables() <= atom.variables()):
                        raise ConfigError(f"views.{view}: the aggregate {a} uses a variable not in {atom}")
        program.rules.append(r)


def compile_project(config: ProjectConfig) -> Program:
    """The program of all the project's views. Errors name the view and the construct."""
    program = Program({name: Predicate(name, list(t.columns), Kind.BASE, "set" if t.key else "bag",
                                       keys=([list(t.key)] if t.key else []) + [list(u) for u in t.unique],
                                       references={c: tuple(r.split(".")) for c, r in t.references.items()})
                       for name, t in config.tables.items()})
    parsed: dict[str, list[Rule]] = {}
    refs: dict[str, set[str]] = {}
    for name, view in config.views.items():
        if view.language == "sql":
            refs[name] = _sql_references(name, view.definition)
        else:
            parsed[name] = resolve_collections(parse_program(view.definition, name, config.aggregates), config, name)
            refs[name] = _datalog_references(parsed[name])
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(v: str, path: list[str]) -> None:
        if state.get(v) == 2:
            return
        if state.get(v) == 1:
            raise ConfigError(f"views.{v}: views read each other in a cycle: {' -> '.join(path + [v])}")
        state[v] = 1
        for r in sorted(refs[v]):
            if r in config.views:
                visit(r, path + [v])
        state[v] = 2
        order.append(v)

    for v in config.views:
        visit(v, [])
    sql = SqlCompiler(program, config.aggregates)
    for v in order:
        if v in parsed:
            add_datalog_view(program, v, parsed[v])
        else:
            sql.compile_view(v, config.views[v].definition)
    for rewrite in PASSES:
        program = rewrite(program, config)
    return program
