"""The rule IR both front ends produce: predicates, rules, atoms, terms, aggregates (000 §3, §6).

A program is a set of rules over predicates. Base predicates (tables) are stratum 0; every view and
auxiliary predicate is defined by one or more rules, whose results are added (⊎: a bag view's
multiplicity is its number of derivations, 000 §3). Body literals are

  Literal     a positive or negated atom ``p(X, 'a', _)`` (variables join, constants select)
  Condition   a boolean expression over bound variables (comparisons, arithmetic)
  Assign      ``X = expr`` binding a new variable
  GroupBy     000 §6.2's ``GROUPBY(p(...), [Y...], M = agg(C))`` subgoal

Expressions are sqlglot trees whose column references name variables, so one expression language
serves SQL and Datalog and compiles to Spark SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal as Lit

from sqlglot import exp

from ivm.vocabulary import Kind

VALUES_PLACEHOLDER = "ivm_aggregate_values"


def _free_columns(tree: exp.Expression) -> set[str]:
    """Column references of an expression, less the parameters of its lambdas (``(a, x) -> a + x``)."""
    bound = {p.name for lam in tree.find_all(exp.Lambda) for p in lam.expressions}
    return {c.name for c in tree.find_all(exp.Column)} - bound


@dataclass(frozen=True)
class Var:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const:
    value: object

    def __str__(self) -> str:
        return "NULL" if self.value is None else repr(self.value) if isinstance(self.value, str) else str(self.value)


@dataclass(frozen=True)
class Wildcard:
    def __str__(self) -> str:
        return "_"


@dataclass(frozen=True)
class Expr:
    """A computed term (a head column like ``C1 + C2``); ``tree`` references variables as columns."""

    tree: exp.Expression

    def variables(self) -> set[str]:
        return _free_columns(self.tree)

    def __str__(self) -> str:
        return self.tree.sql(dialect="spark")


Term = Var | Const | Wildcard | Expr


@dataclass(frozen=True)
class Atom:
    pred: str
    args: tuple[Term, ...]

    def variables(self) -> set[str]:
        return {a.name for a in self.args if isinstance(a, Var)}

    def __str__(self) -> str:
        return f"{self.pred}({', '.join(map(str, self.args))})"


def column_names(atom: Atom) -> list[str]:
    """Column names for a predicate defined by rules with this head: its variables, lowercased (numbered
    where they repeat), ``cN`` for other terms."""
    names: list[str] = []
    for i, a in enumerate(atom.args):
        base = a.name.lower() if isinstance(a, Var) else f"c{i + 1}"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}_{n}"
        names.append(name)
    return names


@dataclass(frozen=True)
class Literal:
    atom: Atom
    negated: bool = False
    #: match with IS NOT DISTINCT FROM instead of = (set operators treat NULLs as equal)
    null_safe: bool = False

    def __str__(self) -> str:
        return ("not " if self.negated else "") + str(self.atom) + (" (null-safe)" if self.null_safe else "")


@dataclass(frozen=True)
class Condition:
    tree: exp.Expression

    def variables(self) -> set[str]:
        return _free_columns(self.tree)

    def __str__(self) -> str:
        return self.tree.sql(dialect="spark")


@dataclass(frozen=True)
class Assign:
    var: Var
    expr: Expr

    def __str__(self) -> str:
        return f"{self.var} = {self.expr}"


@dataclass(frozen=True)
class Inductive:
    """A user-defined aggregate defined inductively (001 §2: ``count({}, 0)``, ``count({X | Y}, C) :-
    count(Y, C1), C = C1 + 1``), as Spark SQL expressions over a state (any Spark type, usually a struct):

      initial   the state of the empty multiset                       (no variables)
      iterate   the state after one more value ``x``                 (``state``, ``x``)
      merge     the state of the union of two multisets               (``state``, ``other``)
      final     the aggregate's value                                  (``state``)
      retract   the state after removing one value ``x``, if any      (``state``, ``x``)

    Each is run by Spark's higher-order functions (``aggregate``, ``transform``): JVM expressions, no
    UDF. The aggregate must not depend on the order of the values (it is a function of a multiset);
    ivm folds them sorted, so a recomputation gets the same value as the first computation did.

    >>> sum_ = Inductive("0L", "state + x", "state + other", "state", "state - x")
    >>> sum_.fold("vals")
    'aggregate(vals, 0L, (state, x) -> state + x, state -> state)'
    >>> sum_.merged("o", "p")
    'aggregate(array(p), o, (state, other) -> state + other)'
    >>> sum_.retracted("deleted", "s")
    'aggregate(deleted, s, (state, x) -> state - x)'
    """

    initial: str
    iterate: str
    merge: str
    final: str
    retract: str | None = None

    def fold(self, values_sql: str, start: str | None = None, final: bool = True) -> str:
        """The state (``final``: the value) after iterating over an array of values from ``start``."""
        finish = f", state -> {self.final}" if final else ""
        return f"aggregate({values_sql}, {start or self.initial}, (state, x) -> {self.iterate}{finish})"

    def merged(self, state_sql: str, other_sql: str) -> str:
        """``merge`` of two states (folding a one-element array binds the lambda's names)."""
        return f"aggregate(array({other_sql}), {state_sql}, (state, other) -> {self.merge})"

    def retracted(self, values_sql: str, state_sql: str) -> str:
        """The state after retracting each value of an array."""
        return f"aggregate({values_sql}, {state_sql}, (state, x) -> {self.retract})"

    def value(self, state_sql: str) -> str:
        """``final`` of a state."""
        return f"element_at(transform(array({state_sql}), state -> {self.final}), 1)"


@dataclass(frozen=True)
class Aggregate:
    """``var = func([DISTINCT] arg)``; ``arg`` is None for COUNT(*)."""

    var: Var
    func: str
    arg: Expr | None
    distinct: bool = False
    #: further constant arguments, as Spark SQL text (the fraction of percentile)
    params: tuple[str, ...] = ()
    #: a user-defined SQL aggregate: its expression, with VALUES_PLACEHOLDER for the collected values
    template: str | None = None
    #: the rows of a window's partition (ivm.lang.window_functions): (variable, Spark SQL window function
    #: over the grouped atom's variables), computed over the group's rows before ``arg`` collects them
    windows: tuple[tuple[str, str], ...] = ()
    #: a user-defined aggregate defined inductively (001 §2), maintained from its state per group
    inductive: Inductive | None = None

    def call(self) -> str:
        """The aggregate as a Spark SQL call over its argument."""
        if self.windows:  # the partition's rows, in one order (a multiset has none)
            return f"array_sort(collect_list({self.arg}))"
        if self.inductive is not None:  # folded sorted: see Inductive
            return self.inductive.fold(f"array_sort({'collect_set' if self.distinct else 'collect_list'}({self.arg}))")
        if self.template is not None:
            # an aggregate over a (multi)set gets its values in one order, sorted: a Python function of a
            # list then returns the same value however the rows were read (001 §2: aggregates are
            # predicates over sets, which have no order)
            collect = f"array_sort({'collect_set' if self.distinct else 'collect_list'}({self.arg}))"
            return self.template.replace(VALUES_PLACEHOLDER, collect)
        inner = "*" if self.arg is None else ("DISTINCT " if self.distinct else "") + str(self.arg)
        # MODE with ties returns the least of the most frequent values (Spark's deterministic mode), so
        # a group recomputed incrementally gets the value a full recompute gets
        params = ("true",) if self.func == "mode" and not self.params else self.params
        text = f"{self.func}({', '.join([inner, *params])})"
        # a set has no order: collect_set's array is sorted so equal sets are equal values
        return f"array_sort({text})" if self.func == "collect_set" else text

    def __str__(self) -> str:
        over = "".join(f", {v} = {w}" for v, w in self.windows)
        return f"{self.var} = {self.call()}{over}"


@dataclass(frozen=True)
class GroupBy:
    """000 §6.2: the relation of ``atom`` grouped by ``by``, one tuple per group with the aggregates."""

    atom: Atom
    by: tuple[Var, ...]
    aggregates: tuple[Aggregate, ...]

    def variables(self) -> set[str]:
        return {v.name for v in self.by} | {a.var.name for a in self.aggregates}

    def __str__(self) -> str:
        return (f"groupby({self.atom}, [{', '.join(map(str, self.by))}], "
                f"{', '.join(map(str, self.aggregates))})")


@dataclass(frozen=True)
class SetOf:
    """001 Definition 1: ``setof(Y, p(X, Y, Z), S)`` binds S, for every binding of the atom's other
    variables, to the set of Y values (a tuple of variables gives a set of tuples)."""

    elements: tuple[Var, ...]
    atom: Atom
    result: Var

    def group(self) -> tuple[Var, ...]:
        names = {e.name for e in self.elements}
        seen: dict[str, Var] = {}
        for a in self.atom.args:
            if isinstance(a, Var) and a.name not in names:
                seen.setdefault(a.name, a)
        return tuple(seen.values())

    def variables(self) -> set[str]:
        return {v.name for v in self.group()} | {self.result.name}

    def __str__(self) -> str:
        elems = self.elements[0] if len(self.elements) == 1 else f"({', '.join(map(str, self.elements))})"
        return f"setof({elems}, {self.atom}, {self.result})"


@dataclass(frozen=True)
class Unnest:
    """The extraction function of 002 §2.2 for a nested collection held by value: one derivation per
    element of the array ``array`` (``explode``), or per element's fields (``inline``, arrays of structs).
    ``outer`` keeps a row whose array is empty or NULL, with NULL elements (LATERAL VIEW OUTER)."""

    array: Expr
    elements: tuple[Var, ...]
    kind: str = "explode"  # explode | inline
    outer: bool = False

    def variables(self) -> set[str]:
        return {v.name for v in self.elements}

    def __str__(self) -> str:
        names = ", ".join(map(str, self.elements))
        return f"{self.kind}{'_outer' if self.outer else ''}({self.array}) AS ({names})"


BodyItem = Literal | Condition | Assign | GroupBy | SetOf | Unnest
#: the body items 000 Definition 4.1 gives a delta rule each (an atom, negated or not, a GROUPBY or a setof
#: subgoal); conditions, assignments and unnests are kept as they are
Subgoal = Literal | GroupBy | SetOf


@dataclass(frozen=True)
class Rule:
    head: Atom
    body: tuple[BodyItem, ...]

    def predicates(self) -> list[tuple[str, bool]]:
        """(predicate, depends negatively or through aggregation) for each body predicate."""
        out = []
        for item in self.body:
            if isinstance(item, Literal):
                out.append((item.atom.pred, item.negated))
            elif isinstance(item, GroupBy | SetOf):
                out.append((item.atom.pred, True))
        return out

    def __str__(self) -> str:
        return f"{self.head} :- {', '.join(map(str, self.body))}." if self.body else f"{self.head}."


@dataclass
class Predicate:
    """A relation of the program: a base table, a view, an auxiliary predicate of a view, or an
    extraction function of a nested collection (002 §2.2; not stored, ivm.maintain.nested)."""

    name: str
    columns: list[str]
    kind: Kind
    #: bag: multiplicities count derivations; set: SELECT DISTINCT, set operators, Datalog
    semantics: Lit["bag", "set"] = "bag"
    #: the view an auxiliary predicate belongs to
    owner: str | None = None
    #: what an auxiliary predicate of a SQL view stands for: exists, in (subqueries), from (a subquery
    #: in FROM or a CTE), setop (a side of UNION/INTERSECT/EXCEPT), groupby (the rows before GROUP BY)
    role: str | None = None
    #: the primary key and the alternate (unique) keys of a base table, each a list of columns
    keys: list[list[str]] = field(default_factory=list)
    #: the columns its base layers are sorted by, when not the default (an owner index: the collection id)
    cluster: list[str] = field(default_factory=list)
    #: a base table's declared foreign keys: column -> (table, column) (ivm.maintain.references)
    references: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass
class Program:
    predicates: dict[str, Predicate] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)

    def rules_for(self, pred: str) -> list[Rule]:
        return [r for r in self.rules if r.head.pred == pred]

    def copy(self) -> Program:
        """A program a compile-time pass may change without changing this one (predicates and rules
        are values: the pass replaces them, never edits them)."""
        return Program(dict(self.predicates), list(self.rules))

    def owner(self, pred: str) -> str:
        """The view a predicate belongs to (a view owns itself)."""
        p = self.predicates[pred]
        return p.owner or p.name

    def origins(self, pred: str, column: str, seen: frozenset[str] = frozenset()) -> set[tuple[str, str]]:
        """The base tables' columns whose values ``column`` of ``pred`` holds as they are — each (table,
        column) that binds the variable a rule puts there, through the positive atoms and GROUP BY groups of
        its body and, in turn, theirs — in every rule of ``pred``; empty where a rule computes the column or
        binds it otherwise (an assignment, a setof, an unnested element) or the rules recurse. An equality
        is a shared variable, so Q3's ``l_orderkey`` is both ``lineitem.l_orderkey`` and ``orders.o_orderkey``."""
        p = self.predicates[pred]
        if p.kind is Kind.BASE:
            return {(pred, column)}
        if pred in seen:
            return set()
        found: set[tuple[str, str]] = set()
        for rule in self.rules_for(pred):
            arg = rule.head.args[p.columns.index(column)]
            if not isinstance(arg, Var):
                return set()
            here = set()
            for item in rule.body:
                atom = item.atom if isinstance(item, Literal) and not item.negated else \
                    item.atom if isinstance(item, GroupBy) and arg in item.by else None
                for i, a in enumerate(atom.args if atom is not None else ()):
                    if a == arg:
                        here |= self.origins(atom.pred, self.predicates[atom.pred].columns[i], seen | {pred})
            if not here:
                return set()
            found |= here
        return found


#: aggregates kept from per-group sums (000 §6.2), and those kept per (group, value) under DISTINCT
VARIANCES = {"var_samp", "var_pop", "variance", "stddev", "stddev_samp", "stddev_pop", "std"}
DISTINCT_OK = {"count", "sum", "avg"}


def aggregate_kind(a: Aggregate) -> str:
    """How an aggregate is maintained: star, count, sum, avg, variance, min, max, distinct, inductive
    (a user's inductive aggregate with ``retract``), inductive_insert (one without: incremental on
    insert only), recompute."""
    if a.template is not None or a.windows:
        return "recompute"
    if a.inductive is not None:  # under DISTINCT a value leaves the set only with its last copy: recomputed
        return "recompute" if a.distinct else "inductive" if a.inductive.retract else "inductive_insert"
    if a.func == "count" and a.arg is None:
        return "star"
    if a.distinct and a.func in DISTINCT_OK:
        return "distinct"
    if a.func in ("count", "sum", "avg", "min", "max"):
        return a.func
    if a.func in VARIANCES:
        return "variance"
    return "recompute"
