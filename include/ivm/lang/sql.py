"""The SQL front end: a view in Spark SQL, parsed and qualified by sqlglot, turned into rules.

Each SELECT block becomes one rule over atoms for its FROM items; equalities between columns unify
variables (a join), other predicates become conditions. GROUP BY becomes 000 §6.2's GROUPBY subgoal
over an auxiliary predicate holding the pre-aggregation rows. Subqueries in FROM, CTEs and the sides
of set operators become auxiliary predicates. [NOT] EXISTS and IN subqueries become (negated) atoms
over a set-semantics auxiliary predicate that exposes the correlated columns (correlation by equality).
UNION ALL adds derivations (bag); UNION, INTERSECT, EXCEPT and DISTINCT have set semantics, and set
operators compare NULLs as equal.

Outer joins are the union of a matched rule and a NULL-padded rule whose negated atom finds no partner;
NOT IN keeps SQL's NULL semantics with three negated atoms; WITH RECURSIVE gives a recursive predicate.
LATERAL VIEW explode/inline is 002's extraction of a nested collection (an Unnest subgoal). Window
functions are a GROUP BY on PARTITION BY whose aggregate is the partition's rows with their window values,
unnested again (ivm.lang.window_functions); QUALIFY a WHERE over them. Constructs not
handled yet are refused at `ivm apply` with the construct named: generators inside expressions, ORDER BY /
LIMIT, ALL subqueries. Correlated subqueries may compare outer and inner
columns in any way; `op ANY (subquery)` is EXISTS with the comparison (003 §6.3).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.qualify import qualify
from sqlglot.transforms import eliminate_qualify

from ivm.aggregates import aggregate as user_aggregate
from ivm.errors import ConfigError
from ivm.ir import (
    Aggregate,
    Assign,
    Atom,
    Condition,
    Const,
    Expr,
    GroupBy,
    Literal,
    Predicate,
    Program,
    Rule,
    Unnest,
    Var,
)
from ivm.lang import aggregate_filters, allowlist, bag_set_operations, grouped_in, scalar_subqueries, window_functions
from ivm.lang.scalar_subqueries import conjuncts
from ivm.vocabulary import Kind

#: sqlglot aggregate classes and the Spark SQL function each stands for
AGGREGATES: dict[type, str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
    exp.Variance: "var_samp", exp.VariancePop: "var_pop", exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop", exp.Median: "median",
    exp.Quantile: "percentile", exp.ApproxQuantile: "percentile_approx", exp.Mode: "mode",
    exp.ArrayUniqueAgg: "collect_set",
}


class Unsupported(ConfigError):
    pass


@dataclass
class _Block:
    """One SELECT being compiled: its sources' variables and the equalities that unify them."""

    scope: dict[str, dict[str, str]] = field(default_factory=dict)  # alias -> column -> variable
    parent: dict[str, str] = field(default_factory=dict)           # union-find over variables
    body: list = field(default_factory=list)
    #: correlated equalities (outer variable, inner variable) found in a subquery
    correlations: list[tuple[str, str]] = field(default_factory=list)
    #: variables that are NULL in this block: the padded side of an outer join
    nulls: set[str] = field(default_factory=set)
    #: the inner variables of correlations read through a probe of the outer bindings (`_probe`) where an
    #: outer column's NULL may make a condition hold: the semijoin meets them NULL-safe (`_semijoin`)
    probed: set[str] = field(default_factory=set)

    def copy(self) -> _Block:
        return _Block({a: dict(c) for a, c in self.scope.items()}, dict(self.parent), list(self.body),
                      list(self.correlations), set(self.nulls), set(self.probed))

    def find(self, v: str) -> str:
        while self.parent.get(v, v) != v:
            v = self.parent[v]
        return v

    def is_null(self, v: str) -> bool:
        """Whether the variable is NULL here (unified with a padded one)."""
        return self.find(v) in {self.find(n) for n in self.nulls}

    def unify(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


class SqlCompiler:
    """Compiles the SQL views of a project into one program, view by view (views may read views)."""

    def __init__(self, program: Program, aggregates: dict | None = None):
        self.program = program
        self.udas = {k.lower(): (k, v) for k, v in (aggregates or {}).items()}
        self.view = ""
        self._ctes: dict[str, str] = {}
        self._counts: dict[str, int] = {}
        self._names: set[str] = set()

    # -- names -------------------------------------------------------------------------------------
    # A view's auxiliary predicates and variables name its stored relations and their columns, so they
    # are counted per hint (per table column, per kind): a column added to a table it reads
    # (ivm.evolution) names a new variable and shifts none of the others, and the stored state keeps
    # reading as it was written.

    def _next(self, base: str, sep: str = "_") -> str:
        while True:
            self._counts[base] = self._counts.get(base, 0) + 1
            name = f"{base}{sep}{self._counts[base]}"
            if name not in self._names:
                self._names.add(name)
                return name

    def _aux(self, columns: list[str], semantics: str = "bag", role: str = "from") -> Predicate:
        pred = Predicate(self._next(self.view, "__"), columns, Kind.AUX, semantics, owner=self.view, role=role)
        self.program.predicates[pred.name] = pred
        return pred

    def _fresh(self, hint: str) -> str:
        return self._next(re.sub(r"[^A-Za-z0-9_]", "_", hint))

    def _fail(self, what: str) -> Unsupported:
        return Unsupported(f"views.{self.view}: {what} is not supported yet")

    # -- entry -------------------------------------------------------------------------------------

    def compile_view(self, name: str, sql: str) -> Predicate:
        self.view, self._ctes, self._counts, self._names = name, {}, {}, set()
        try:
            tree = sqlglot.parse_one(sql, read="spark")
        except ParseError as e:
            raise ConfigError(f"views.{name}: SQL syntax error: {str(e).splitlines()[0]}") from e
        if not isinstance(tree, exp.Query):
            raise ConfigError(f"views.{name}: a view is a query (SELECT ...), not {tree.key.upper()}")
        # (an aggregate's FILTER, count_if, count(a, b): as the aggregates below, by SQL's definition)
        tree = aggregate_filters.rewrite(tree)
        allowlist.check(tree, name, AGGREGATES, set(self.udas))
        tree = tree.transform(eliminate_qualify)  # (QUALIFY: a WHERE over the windowed rows, as a subquery)
        schema = {p.name: {c: "string" for c in p.columns}
                  for p in self.program.predicates.values() if p.kind in (Kind.BASE, Kind.VIEW)}
        tree = self._qualify(tree, schema)
        counted = bag_set_operations.rewrite(tree, name)  # (INTERSECT / EXCEPT ALL: counted groups repeated)
        if counted is not tree:
            tree = self._qualify(counted, schema)
        tree = grouped_in.exists_as_values(tree)  # (EXISTS over one group per outer row: its HAVING's value)
        tree = scalar_subqueries.rewrite(tree, name)  # (decorrelated into joins with aggregate subqueries)
        tree = grouped_in.rewrite(tree)  # (EXISTS, IN, NOT IN and ANY over GROUP BY: via FROM)
        self._query(tree, name, Kind.VIEW)
        self._view_is_its_recursion(name)
        return self.program.predicates[name]

    def _qualify(self, tree: exp.Expression, schema: dict) -> exp.Expression:
        try:
            return qualify(tree, schema=schema, dialect="spark", quote_identifiers=False,
                           validate_qualify_columns=True)
        except OptimizeError as e:
            raise ConfigError(f"views.{self.view}: {str(e).splitlines()[0]}") from e

    # -- queries -----------------------------------------------------------------------------------

    def _query(self, node: exp.Expression, name: str | None, kind: Kind = Kind.AUX, role: str = "from") -> Predicate:
        """Compile a query into predicate ``name`` (a new auxiliary predicate with ``role`` if None)."""
        if node.args.get("order") or node.args.get("limit") or node.args.get("offset"):
            raise self._fail("ORDER BY / LIMIT in a view")
        with_ = _arg(node, "with")
        if with_ is not None:
            for cte in with_.expressions:
                if with_.args.get("recursive") and isinstance(cte.this, exp.Union):
                    self._recursive_cte(cte)
                else:
                    self._ctes[cte.alias_or_name] = self._query(cte.this, None).name
        if isinstance(node, exp.Subquery):
            return self._query(node.this, name, kind, role)
        if isinstance(node, exp.SetOperation):
            return self._set_operation(node, name, kind, role)
        if isinstance(node, exp.Select):
            return self._select(node, name, kind, role)
        raise self._fail(f"the query form {node.key.upper()}")

    def _recursive_cte(self, cte: exp.CTE) -> None:
        """WITH RECURSIVE r AS (base UNION [ALL] step): the predicate exists before its rules, so the
        step's reference to r is a recursive subgoal (evaluated by DRed's fixpoint, 000 §7)."""
        columns = [c.name for c in cte.args["alias"].columns] or [
            p.alias_or_name for p in cte.this.left.find(exp.Select).expressions]
        pred = self._aux(columns, "set" if cte.this.args.get("distinct") else "bag", "from")
        self._ctes[cte.alias_or_name] = pred.name
        self._set_operation(cte.this, pred.name, Kind.AUX, "from")
        pred_now = self.program.predicates[pred.name]
        pred_now.owner, pred_now.role = self.view, "from"
        self._inline_sides(pred.name)

    def _inline_sides(self, pred: str) -> None:
        """``r :- side(C0, ...)`` for each side of the recursive UNION: the side's own rules become r's
        (a pass-through predicate in the recursive component would cost the fixpoint a round per step)."""
        program = self.program
        for rule in program.rules_for(pred):
            side = rule.body[0].atom.pred
            if sum(1 for r in program.rules for q, _ in r.predicates() if q == side) != 1:
                continue
            inlined = [Rule(Atom(pred, r.head.args), r.body) for r in program.rules_for(side)]
            at = program.rules.index(rule)
            program.rules[at:at + 1] = inlined
            program.rules = [r for r in program.rules if r.head.pred != side]
            del program.predicates[side]

    def _view_is_its_recursion(self, view: str) -> None:
        """A view that selects a recursive CTE's columns as they are (``WITH RECURSIVE r(src, dst) AS
        (...) SELECT src, dst FROM r``) becomes the CTE's predicate: the CTE's rules define the view
        (under its column names), so the closure is stored and maintained once, not once as the CTE
        and again as the view's copy of it."""
        program = self.program
        rules = program.rules_for(view)
        if len(rules) != 1 or len(rules[0].body) != 1:
            return
        copy, item = rules[0], rules[0].body[0]
        cte = program.predicates.get(item.atom.pred) if isinstance(item, Literal) and not item.negated else None
        args = copy.head.args
        if (cte is None or cte.owner != view or cte.semantics != "set" or item.atom.args != args
                or not all(isinstance(a, Var) for a in args) or len({a.name for a in args}) != len(args)):
            return
        readers = {r.head.pred for r in program.rules if any(q == cte.name for q, _ in r.predicates())}
        if readers != {view, cte.name}:  # read by another predicate of the view, or not recursive
            return
        if any(isinstance(i, GroupBy) and i.atom.pred == cte.name for r in program.rules_for(cte.name) for i in r.body):
            return  # (recursion through an aggregate: refused by stratification, with the CTE's name)

        def renamed(atom: Atom) -> Atom:
            return Atom(view, atom.args) if atom.pred == cte.name else atom

        program.rules = [Rule(renamed(r.head), tuple(Literal(renamed(i.atom), i.negated, i.null_safe)
                                                     if isinstance(i, Literal) else i for i in r.body))
                         if r.head.pred == cte.name else r for r in program.rules if r is not copy]
        del program.predicates[cte.name]
        program.predicates[view].semantics = "set"

    def _target(self, name: str | None, kind: Kind, columns: list[str], semantics: str, role: str) -> Predicate:
        if name is None:
            return self._aux(columns, semantics, role)
        pred = Predicate(name, columns, kind, semantics)
        self.program.predicates[name] = pred
        return pred

    def _set_operation(self, node: exp.SetOperation, name: str | None, kind: Kind, role: str) -> Predicate:
        distinct = bool(node.args.get("distinct"))
        op = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}[type(node)]
        if op != "UNION" and not distinct:  # (rewritten before: ivm.lang.bag_set_operations)
            raise self._fail(f"{op} ALL")
        left, right = self._query(node.left, None, role="setop"), self._query(node.right, None, role="setop")
        if len(left.columns) != len(right.columns):
            raise ConfigError(f"views.{self.view}: the sides of {op} have {len(left.columns)} and "
                              f"{len(right.columns)} columns")
        target = self._target(name, kind, list(left.columns), "set" if distinct else "bag", role)
        xs = tuple(Var(f"C{i}") for i in range(len(left.columns)))
        if op == "UNION":
            self.program.rules += [Rule(Atom(target.name, xs), (Literal(Atom(left.name, xs)),)),
                                   Rule(Atom(target.name, xs), (Literal(Atom(right.name, xs)),))]
        else:  # set operators compare rows with IS NOT DISTINCT FROM
            other = Literal(Atom(right.name, xs), negated=op == "EXCEPT", null_safe=True)
            self.program.rules.append(Rule(Atom(target.name, xs), (Literal(Atom(left.name, xs)), other)))
        return target

    def _select(self, sel: exp.Select, name: str | None, kind: Kind, role: str) -> Predicate:
        from_ = _arg(sel, "from")
        if from_ is None:
            raise self._fail("SELECT without FROM")
        if window_functions.has_windows(sel):
            return self._windowed(sel, name, kind, role)
        # one block per combination of matched / padded outer joins: each becomes one rule
        blocks = [_Block()]
        self._bind(from_.this.alias_or_name, self._source_predicate(from_.this), blocks[0])
        where: list[exp.Expression] = []
        for join in sel.args.get("joins") or []:
            if join.kind in ("SEMI", "ANTI") or join.args.get("using"):
                raise self._fail("SEMI/ANTI JOIN" if join.kind in ("SEMI", "ANTI") else "JOIN ... USING")
            on = conjuncts(join.args["on"]) if join.args.get("on") is not None else []
            side = (join.side or "").upper()
            if not side:  # an inner join's ON is part of the rule's predicate, as WHERE is
                pred = self._source_predicate(join.this)
                for b in blocks:
                    self._bind(join.this.alias_or_name, pred, b)
                where += on
            else:
                if side in ("RIGHT", "FULL") and where:
                    # the inner joins' ON so far, before a RIGHT / FULL JOIN: its padding asks which rows of
                    # the left side (those joins' result) match, so their conditions apply to it first
                    for b in blocks:
                        for c in _subqueries_last(where):
                            self._conjunct(c, b, None)
                    where = []
                blocks = self._outer_join(side, join.this, on, blocks)
        for lateral in sel.args.get("laterals") or []:
            for b in blocks:
                self._lateral(lateral, b)
        sel = self._generators_as_laterals(sel, blocks)
        if sel.args.get("where") is not None:
            where += conjuncts(sel.args["where"].this)
        for b in blocks:
            for c in _subqueries_last(where):
                self._conjunct(c, b, None)
        columns = [p.alias_or_name for p in sel.expressions]
        if len(set(c.lower() for c in columns)) != len(columns):
            raise ConfigError(f"views.{self.view}: duplicate output column names {columns}")
        semantics = "set" if sel.args.get("distinct") else "bag"
        aggregated = sel.args.get("group") is not None or sel.args.get("having") is not None or any(
            list(self._aggregate_calls(p)) for p in sel.expressions)
        target = self._target(name, kind, columns, semantics, role)
        if aggregated:
            self._aggregate(sel, blocks, target)
            return target
        for b in blocks:
            head = [self._term(p.unalias(), b) for p in sel.expressions]
            self._add_rule(Rule(Atom(target.name, tuple(head)), tuple(b.body)), b)
        return target

    def _windowed(self, sel: exp.Select, name: str | None, kind: Kind, role: str) -> Predicate:
        """A SELECT with window functions (ivm.lang.window_functions): its rows before the windows as an
        auxiliary predicate; per PARTITION BY, 000 §6.2's GROUPBY subgoal on the partition columns whose
        one aggregate collects the partition's rows with their window values, unnested by the rule that
        reads it (002's extraction, ``inline``)."""
        split = window_functions.split(sel)
        source = self._query(split.inner, None)
        bound = {c: Var(self._fresh("c")) for c in source.columns}  # leaf or window column -> variable
        atom = Atom(source.name, tuple(bound.values()))
        columns = [p.alias_or_name for p in sel.expressions]
        target = self._target(name, kind, columns, "set" if split.distinct else "bag", role)
        for i, layer in enumerate(split.layers):
            windows = {c: Var(self._fresh("w")) for c in layer.windows}
            carried = [c for c in bound if c not in layer.partition]
            fields = [*carried, *windows]
            values = {**{c: bound[c] for c in carried}, **windows}
            struct = exp.func("named_struct", *[x for c in fields for x in (exp.Literal.string(c),
                                                                            exp.column(values[c].name, quoted=True))])
            rows = Var(self._fresh("rows"))
            aggregate = Aggregate(rows, "window", Expr(struct), windows=tuple(
                (windows[c].name, _renamed(w, bound).sql(dialect="spark")) for c, w in layer.windows.items()))
            group = GroupBy(atom, tuple(bound[c] for c in layer.partition), (aggregate,))
            bound = {**{c: bound[c] for c in layer.partition}, **{c: Var(self._fresh("c")) for c in fields}}
            body = (group, Unnest(Expr(exp.column(rows.name, quoted=True)), tuple(bound[c] for c in fields), "inline"))
            if i == len(split.layers) - 1:
                head = [_renamed(p.unalias(), bound) for p in split.outer]
                self.program.rules.append(Rule(Atom(target.name, tuple(
                    Var(h.name) if isinstance(h, exp.Column) else Expr(h) for h in head)), body))
            else:  # the rows with this layer's windows, for the next PARTITION BY's
                layered = self._aux(list(bound), role="from")
                self.program.rules.append(Rule(Atom(layered.name, tuple(bound.values())), body))
                atom = Atom(layered.name, tuple(bound.values()))
        return target

    def _generators_as_laterals(self, sel: exp.Select, blocks: list[_Block]) -> exp.Select:
        """``SELECT explode(xs) AS x`` is ``LATERAL VIEW explode(xs) g AS x`` with ``g.x`` selected."""
        projections = []
        for p in sel.expressions:
            gen = p.unalias()
            if isinstance(gen, exp.Explode | exp.ExplodeOuter):
                name, table = p.alias_or_name, self._fresh("gen")
                lateral = exp.Lateral(this=exp.Explode(this=gen.this.copy()), view=True,
                                      outer=isinstance(gen, exp.ExplodeOuter),
                                      alias=exp.TableAlias(this=exp.to_identifier(table),
                                                           columns=[exp.to_identifier(name)]))
                for b in blocks:
                    self._lateral(lateral, b)
                p = exp.alias_(exp.column(name, table=table), name)
            elif p.find(exp.Explode, exp.Inline, exp.Posexplode):
                raise self._fail(f"the generator {p.sql(dialect='spark')!r} inside an expression")
            projections.append(p)
        if projections == list(sel.expressions):
            return sel
        sel = sel.copy()
        sel.set("expressions", projections)
        return sel

    def _lateral(self, lateral: exp.Lateral, block: _Block) -> None:
        """LATERAL VIEW [OUTER] explode(array) t AS x / inline(array of structs) t AS a, b: 002 §2.2's
        extraction of a nested collection, one derivation per element."""
        gen = lateral.this
        kind = {exp.Explode: "explode", exp.Inline: "inline"}.get(type(gen))
        if kind is None or not lateral.args.get("view"):
            raise self._fail(f"the lateral {lateral.sql(dialect='spark')!r} (use LATERAL VIEW explode or inline)")
        alias = lateral.args.get("alias")
        names = [c.name for c in alias.columns] if alias is not None else []
        if not names or (kind == "explode" and len(names) != 1):
            raise ConfigError(f"views.{self.view}: LATERAL VIEW {kind} needs column aliases (... t AS x)")
        variables = {n: self._fresh(f"{alias.name}_{n}") for n in names}
        array = Expr(self._expression(gen.this, block))
        block.scope[alias.name] = variables
        block.body.append(Unnest(array, tuple(Var(variables[n]) for n in names), kind, bool(lateral.args.get("outer"))))

    def _aggregate_calls(self, node: exp.Expression):
        """Built-in aggregate calls and calls of registered aggregates in an expression."""
        yield from node.find_all(*AGGREGATES)
        yield from _uda_calls(node, self.udas)

    def _add_rule(self, rule: Rule, block: _Block) -> None:
        resolved = _resolved(rule, block)
        if resolved is not None:  # None: a padded NULL must equal something, so the rule derives nothing
            self.program.rules.append(resolved)

    def _outer_join(self, side: str, source: exp.Expression, on: list[exp.Expression],
                    blocks: list[_Block]) -> list[_Block]:
        """R LEFT JOIN S ON c = (R ⋈c S) ⊎ (R ▷c S padded with NULLs); RIGHT and FULL likewise. The
        anti-join is a negated atom over an auxiliary predicate holding the join partners' keys."""
        pred = self._source_predicate(source)
        alias = source.alias_or_name
        out: list[_Block] = []
        for b in blocks:
            matched = b.copy()
            self._bind(alias, pred, matched)
            for c in on:
                self._conjunct(c, matched, None)
            out.append(matched)
            if side in ("LEFT", "FULL"):  # left rows without a partner
                padded = b.copy()
                self._bind(alias, pred, padded, padded=True)
                keyed = self._partners(source, pred, on, b)
                if keyed is not None:
                    partners, outer_vars = keyed
                    padded.body.append(Literal(Atom(partners, tuple(Var(v) for v in outer_vars)), negated=True))
                else:  # any other ON: NOT EXISTS (SELECT 1 FROM source WHERE on), a theta anti-join
                    self._exists(exp.select("1").from_(source.copy()).where(exp.and_(*[c.copy() for c in on])),
                                 padded, True)
                out.append(padded)
        if side in ("RIGHT", "FULL"):  # right rows without a partner: the left side padded
            # (the left side is every block so far: after another outer join, its matched and padded rows
            # alike — a rule of the partners predicate each, their union the left side's rows)
            padded = _Block()
            self._bind(alias, pred, padded)
            for a, cols in blocks[0].scope.items():
                padded.scope[a] = dict(cols)
                padded.nulls |= set(cols.values())
            pairs = [[self._cross_equality(c, b, padded) for c in on] for b in blocks]
            if all(all(p) for p in pairs):
                partners = self._aux([f"k{i}" for i in range(len(on))], "set", "exists")
                for b, ps in zip(blocks, pairs, strict=True):
                    if not any(b.is_null(lv) for lv, _ in ps):  # (a NULL of the left side matches no right row)
                        self._add_rule(Rule(Atom(partners.name, tuple(Var(lv) for lv, _ in ps)), tuple(b.body)), b)
                padded.body.append(Literal(Atom(partners.name, tuple(Var(rv) for _, rv in pairs[0])), negated=True))
            else:  # any other ON: the left side's rows that satisfy it with the right row, as NOT EXISTS's are
                inners = []
                for b in blocks:
                    inner = b.copy()
                    inner.correlations = []
                    self._correlate(list(on), inner, padded)
                    inners.append(inner)
                partners, outer_vars, null_safe = self._semijoin(*inners)
                padded.body.append(Literal(Atom(partners, tuple(Var(o) for o in outer_vars)), negated=True,
                                           null_safe=null_safe))
            out.append(padded)
        return out

    def _partners(self, source: exp.Expression, pred: Predicate, on: list[exp.Expression],
                  left: _Block) -> tuple[str, list[str]] | None:
        """An auxiliary predicate of the right side's rows that satisfy ON, keyed by the left columns ON
        equates them to; and those left variables. None when ON holds a condition other than those
        equalities and conditions on the joined table alone (the caller anti-joins through NOT EXISTS)."""
        inner = _Block()
        self._bind(source.alias_or_name, pred, inner)
        own = [all(self._var(col, inner) for col in c.find_all(exp.Column)) for c in on]
        pairs = [self._cross_equality(c, left, inner) for c, mine in zip(on, own, strict=True) if not mine]
        if None in pairs:
            return None
        for c, mine in zip(on, own, strict=True):
            if mine:
                self._conjunct(c, inner, None)  # a condition on the joined table alone
        inner.correlations += pairs
        partners, outer_vars, _ = self._semijoin(inner)  # (equalities only: no probe)
        return partners, outer_vars

    def _semijoin(self, *inners: _Block) -> tuple[str, list[str], bool]:
        """A set predicate of the inner blocks' correlated columns (a rule each: their union), the outer
        variables they pair with — what EXISTS and an outer join's partner test join with — and whether
        that join is NULL-safe. It is where a condition read through a probe of the outer bindings may hold
        for an outer NULL (``s.c > coalesce(r.a, 1)``; `_probe` marks it): the probe holds that NULL as it
        is, the predicate a row with it, which only a NULL-safe join meets; the plain equalities' inner
        columns are then kept from NULL, so that they still meet no NULL."""
        outer = [o for o, _ in inners[0].correlations]
        if any([o for o, _ in b.correlations] != outer for b in inners):  # (one ON read alike in each block)
            raise RuntimeError(f"views.{self.view}: the blocks of an outer join correlate differently")
        aux = self._aux([f"k{i}" for i in range(len(outer))], "set", "exists")
        null_safe = any(inner.probed for inner in inners)
        for inner in inners:
            kept = [_not_null(exp.column(i, quoted=True)) for _, i in inner.correlations
                    if null_safe and i not in inner.probed]
            self._add_rule(Rule(Atom(aux.name, tuple(Var(i) for _, i in inner.correlations)),
                                (*inner.body, *kept)), inner)
        return aux.name, outer, null_safe

    def _cross_equality(self, c: exp.Expression, left: _Block, right: _Block) -> tuple[str, str] | None:
        """(left variable, right variable) if ``c`` is ``column = column`` across the two blocks."""
        if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
            return None
        for a, b in ((c.this, c.expression), (c.expression, c.this)):
            lv, rv = self._var(a, left), self._var(b, right)
            if lv and rv:
                return lv, rv
        return None

    # -- FROM items and conditions -------------------------------------------------------------

    def _source_predicate(self, source: exp.Expression) -> Predicate:
        if isinstance(source, exp.Table):
            pred = self.program.predicates.get(self._ctes.get(source.name, source.name))
            if pred is None:
                raise ConfigError(f"views.{self.view}: unknown table or view {source.name!r}")
            return pred
        if isinstance(source, exp.Subquery):
            return self._query(source.this, None)
        raise self._fail(f"the FROM item {source.sql(dialect='spark')!r}")

    def _bind(self, alias: str, pred: Predicate, block: _Block, padded: bool = False) -> None:
        """Give the source's columns fresh variables in ``block``: an atom, or NULLs if padded."""
        variables = {c: self._fresh(f"{alias}_{c}") for c in pred.columns}
        block.scope[alias] = variables
        if padded:
            block.nulls |= set(variables.values())
        else:
            block.body.append(Literal(Atom(pred.name, tuple(Var(variables[c]) for c in pred.columns))))

    def _source(self, source: exp.Expression, block: _Block) -> None:
        self._bind(source.alias_or_name, self._source_predicate(source), block)

    def _var(self, col: exp.Column, block: _Block) -> str | None:
        cols = block.scope.get(col.table)
        return cols.get(col.name) if cols is not None else None

    def _conjunct(self, c: exp.Expression, block: _Block, outer: _Block | None) -> None:
        if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column):
            left, right = self._var(c.this, block), self._var(c.expression, block)
            if left and right:
                block.unify(left, right)
                return
            if outer is not None and (left or right):
                outer_col = c.expression if left else c.this
                outer_var = self._var(outer_col, outer)
                if outer_var:
                    block.correlations.append((outer_var, left or right))  # type: ignore[arg-type]
                    return
        negated = isinstance(c, exp.Not)
        inner = c.this if negated else c
        if isinstance(inner, exp.Exists):
            self._exists(inner.this, block, negated)
            return
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            (self._not_in if negated else self._in)(inner, block)
            return
        if isinstance(c, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)) and isinstance(c.expression, exp.Any):
            self._any(c, block)
            return
        if c.find(exp.Exists, exp.Subquery, exp.Select):
            raise self._fail(f"the subquery condition {c.sql(dialect='spark')!r}")
        block.body.append(Condition(self._expression(c, block)))

    def _correlated(self, query: exp.Expression, block: _Block,
                    extra: exp.Expression | None = None) -> tuple[exp.Select, _Block]:
        """The subquery's sources and conditions in a block of its own. Correlation by ``outer = inner``
        becomes a correlated column pair; any other condition on outer columns (``o.x > i.y``) is
        evaluated against a probe predicate of the outer rule's bindings of those columns, whose columns
        then correlate by equality — so every correlated subquery becomes a semi- or anti-join."""
        sel = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(sel, exp.Select):
            raise self._fail("a set operation inside EXISTS/IN")
        # what reads only the subquery's joins and WHERE would drop (TPC-H Q18's IN over a GROUP BY ...
        # HAVING must not become "orders that have a line item"): the groupings inside EXISTS, IN, NOT IN
        # and ANY that ivm.lang.grouped_in reads were read through a subquery in FROM before; what reaches
        # here is refused, saying what is read
        # (its DISTINCT changes nothing: EXISTS and IN ask whether a row is there)
        grouped = ("a grouping is read inside EXISTS, and inside IN, NOT IN and ANY conjuncts of WHERE, when "
                   "correlated by columns of the FROM right around it (not a LATERAL VIEW's)")
        for part, what in (("group", "GROUP BY"), ("having", "HAVING"), ("with", "WITH"), ("order", "ORDER BY"),
                           ("limit", "LIMIT"), ("offset", "OFFSET")):
            if sel.args.get(part) is not None:
                why = f" ({grouped})" if part in ("group", "having") else ""
                raise Unsupported(f"{self._fail(f'{what} inside this EXISTS / IN / ANY subquery')}{why}")
        if any(e.find(exp.AggFunc) for e in sel.expressions):
            raise Unsupported(f"{self._fail('an aggregate inside this EXISTS / IN / ANY subquery')} ({grouped})")
        inner = _Block()
        for j in sel.args.get("joins") or []:
            if j.side:
                raise self._fail(f"{j.side.upper()} JOIN inside a subquery")
        for source in [_arg(sel, "from").this] + [j.this for j in sel.args.get("joins") or []]:
            self._source(source, inner)
        conds = [x for j in sel.args.get("joins") or [] if j.args.get("on") is not None
                 for x in conjuncts(j.args["on"])]
        if sel.args.get("where") is not None:
            conds += conjuncts(sel.args["where"].this)
        if extra is not None:
            conds.append(extra)
        self._correlate(conds, inner, block)
        return sel, inner

    def _correlate(self, conds: list[exp.Expression], inner: _Block, block: _Block) -> None:
        """A subquery's conditions: its own and ``outer = inner`` equalities in ``inner``, any other
        naming an outer column against a probe of the outer block's bindings (`_probe`)."""
        residual = []
        for c in _subqueries_last(conds):
            outer_refs = [col for col in c.find_all(exp.Column)
                          if self._var(col, inner) is None and self._var(col, block) is not None]
            far = [col for col in outer_refs if col.find_ancestor(exp.Select) is not c.find_ancestor(exp.Select)]
            if far:
                raise self._fail(f"a subquery correlated with the query two levels out ({far[0].sql(dialect='spark')})")
            simple = isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
            if outer_refs and not simple:
                residual.append(c)
            else:
                self._conjunct(c, inner, block)
        if residual:
            self._probe(residual, inner, block)

    def _probe(self, residual: list[exp.Expression], inner: _Block, block: _Block) -> None:
        outer_cols = [(c, col) for c in residual for col in c.find_all(exp.Column)
                      if self._var(col, inner) is None and self._var(col, block) is not None]
        outer_vars = list(dict.fromkeys(self._var(col, block) for _, col in outer_cols))
        # the probe holds the outer columns the equalities correlate too, each joined with its inner column:
        # the outer rows' pairs of them, so that the inner rows are compared only with the values of their
        # own outer rows (TPC-H Q21's `l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey`: the
        # line items of each order against that order's suppliers, not every line item against every
        # supplier — at SF 1 that was billions of pairs, the spill filling the disk). The same rows: an
        # inner row meets an outer one only with the outer row's values, which its probe row holds
        equal = [(o, i) for o, i in inner.correlations if o not in outer_vars]
        probe = self._aux([f"k{i}" for i in range(len(outer_vars) + len(equal))], "set", "exists")
        self._add_rule(Rule(Atom(probe.name, tuple(Var(v) for v in [*outer_vars, *(o for o, _ in equal)])),
                            tuple(block.body)), block)
        mine = {v: self._fresh("probe") for v in outer_vars}
        inner.body.append(Literal(Atom(probe.name, (*(Var(mine[v]) for v in outer_vars),
                                                    *(Var(i) for _, i in equal)))))

        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column):
                v = self._var(n, inner)
                return exp.column(v if v is not None else mine[self._var(n, block)], quoted=True)
            return n

        for c in residual:
            inner.body.append(Condition(c.copy().transform(swap)))
        inner.correlations += [(v, mine[v]) for v in outer_vars]
        # (where each outer column's NULL makes its condition fail, the probe's NULLs find no rows and the
        # join by equality is the same as the NULL-safe one; only the others are read NULL-safe)
        if not all(scalar_subqueries.null_rejecting(col, c) for c, col in outer_cols):
            inner.probed |= set(mine.values())

    def _any(self, c: exp.Expression, block: _Block) -> None:
        """``x op ANY (SELECT y ...)`` is ``EXISTS (SELECT ... WHERE x op y)`` (003 §6.3)."""
        query = c.expression.this
        sel = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(sel, exp.Select) or len(sel.expressions) != 1:
            raise ConfigError(f"views.{self.view}: an ANY subquery must select one column")
        extra = type(c)(this=c.this.copy(), expression=sel.expressions[0].unalias().copy())
        self._exists(query, block, False, extra)

    def _exists(self, query: exp.Expression, block: _Block, negated: bool,
                extra: exp.Expression | None = None) -> None:
        _, inner = self._correlated(query, block, extra)
        pred, outer_vars, null_safe = self._semijoin(inner)
        block.body.append(Literal(Atom(pred, tuple(Var(o) for o in outer_vars)), negated=negated, null_safe=null_safe))

    def _in(self, node: exp.In, block: _Block) -> None:
        sel, inner = self._correlated(node.args["query"], block)
        if len(sel.expressions) != 1:
            raise ConfigError(f"views.{self.view}: an IN subquery must select one column")
        value = self._term(sel.expressions[0].unalias(), inner)
        pred = self._aux(["v"] + [f"k{i}" for i in range(len(inner.correlations))], "set", "in")
        head = Atom(pred.name, (value, *(Var(i) for _, i in inner.correlations)))
        # (a condition read through a probe meets the outer NULL NULL-safe, as `_semijoin` says; the value
        # and the plain equalities then meet no NULL: a NULL value is in no set)
        null_safe = bool(inner.probed)
        kept = [_not_null(value.tree if isinstance(value, Expr) else exp.column(value.name, quoted=True)),
                *(_not_null(exp.column(i, quoted=True)) for _, i in inner.correlations if i not in inner.probed)]
        self._add_rule(Rule(head, (*inner.body, *(kept if null_safe else ()))), inner)
        probe = self._term(node.this, block)
        if not isinstance(probe, Var):
            v = Var(self._fresh("in"))
            block.body.append(Assign(v, probe))
            probe = v
        block.body.append(Literal(Atom(pred.name, (probe, *(Var(o) for o, _ in inner.correlations))),
                                  null_safe=null_safe))

    def _not_in(self, node: exp.In, block: _Block) -> None:
        """``x NOT IN (SELECT c ...)`` with SQL's NULL semantics: true when the subquery is empty;
        otherwise false when x is NULL, when some c = x, or when some c is NULL. As negated atoms over
        three auxiliary predicates: the values, a NULL value, and "the subquery is not empty" probed
        with the flag ``x IS NULL``."""
        sel, inner = self._correlated(node.args["query"], block)
        if len(sel.expressions) != 1:
            raise ConfigError(f"views.{self.view}: a NOT IN subquery must select one column")
        value = self._term(sel.expressions[0].unalias(), inner)
        keys = [f"k{i}" for i in range(len(inner.correlations))]
        inner_corr = tuple(Var(i) for _, i in inner.correlations)
        outer_corr = tuple(Var(o) for o, _ in inner.correlations)
        # (a condition read through a probe meets the outer NULL NULL-safe, as `_semijoin` says; the plain
        # equalities then meet no NULL)
        null_safe = bool(inner.probed)
        body = (*inner.body, *(_not_null(exp.column(i, quoted=True)) for _, i in inner.correlations
                               if null_safe and i not in inner.probed))
        values = self._aux(["v", *keys], "set", "in")
        value_tree = value.tree if isinstance(value, Expr) else exp.column(value.name, quoted=True)
        self._add_rule(Rule(Atom(values.name, (value, *inner_corr)),
                            (*body, *((_not_null(value_tree),) if null_safe else ()))), inner)
        nulls = self._aux(keys, "set", "in")
        self._add_rule(Rule(Atom(nulls.name, inner_corr),
                            (*body, Condition(exp.Is(this=value_tree.copy(), expression=exp.Null())))), inner)
        nonempty = self._aux(["f", *keys], "set", "in")
        self._add_rule(Rule(Atom(nonempty.name, (Const(True), *inner_corr)), body), inner)
        probe = self._term(node.this, block)
        if not isinstance(probe, Var):
            v = Var(self._fresh("in"))
            block.body.append(Assign(v, probe))
            probe = v
        flag = Var(self._fresh("is_null"))
        block.body += [
            Literal(Atom(values.name, (probe, *outer_corr)), negated=True, null_safe=null_safe),
            Literal(Atom(nulls.name, outer_corr), negated=True, null_safe=null_safe),
            Assign(flag, Expr(exp.Is(this=exp.column(probe.name, quoted=True), expression=exp.Null()))),
            Literal(Atom(nonempty.name, (flag, *outer_corr)), negated=True, null_safe=null_safe),
        ]

    # -- expressions ---------------------------------------------------------------------------------

    def _expression(self, node: exp.Expression, block: _Block) -> exp.Expression:
        """A copy of ``node`` whose column references name this block's variables."""
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and n.args.get("db") is not None:  # alias.element.field
                base = block.scope.get(n.args["db"].name, {}).get(n.table)
                if base is not None:
                    return exp.Dot(this=exp.column(base, quoted=True), expression=exp.to_identifier(n.name))
            if isinstance(n, exp.Column):
                v = self._var(n, block)
                if v is None:
                    raise ConfigError(f"views.{self.view}: column {n.sql(dialect='spark')} is not available here")
                return exp.column(v, quoted=True)
            return n
        return node.copy().transform(swap)

    def _term(self, node: exp.Expression, block: _Block) -> Var | Expr:
        if isinstance(node, exp.Column) and node.args.get("db") is None:
            v = self._var(node, block)
            if v is None:
                raise ConfigError(f"views.{self.view}: column {node.sql(dialect='spark')} is not available here")
            return Var(v)
        return Expr(self._expression(node, block))

    def _aggregate(self, sel: exp.Select, blocks: list[_Block], target: Predicate) -> None:
        """GROUP BY as 000 §6.2's GROUPBY subgoal over an auxiliary predicate of the input rows (one rule
        per block: the matched and padded combinations of outer joins)."""
        group_nodes = list(sel.args["group"].expressions) if sel.args.get("group") else []
        nodes = [p.unalias() for p in sel.expressions]
        having = sel.args.get("having")
        calls: dict[str, exp.Expression] = {}
        for node in nodes + ([having.this] if having is not None else []):
            for agg in self._aggregate_calls(node):
                calls.setdefault(agg.sql(dialect="spark"), agg)
        replace: dict[str, str] = {}  # SQL text of a group expression or aggregate call -> variable
        by = [Var(self._fresh("g")) for _ in group_nodes]
        for g, v in zip(group_nodes, by, strict=True):
            replace[g.sql(dialect="spark")] = v.name
        args: list[exp.Expression] = []  # the aggregates' arguments, each a column of the input predicate
        aggregates: list[Aggregate] = []
        arg_vars: list[Var] = []
        for text, agg in calls.items():
            uda = self.udas.get(agg.name.lower()) if isinstance(agg, exp.Anonymous) else None
            first = (agg.expressions[0] if agg.expressions else None) if uda else agg.this
            distinct = isinstance(first, exp.Distinct)
            arg = first.expressions[0] if distinct else first
            arg_var = None
            if arg is not None and not isinstance(arg, exp.Star):
                arg_var = Var(self._fresh("a"))
                args.append(arg)
                arg_vars.append(arg_var)
            if uda:
                out = Var(self._fresh(uda[0]))
                if arg_var is None:
                    raise ConfigError(f"views.{self.view}: {text} needs a column to aggregate")
                aggregates.append(user_aggregate(uda[0], uda[1], out, Expr(exp.column(arg_var.name, quoted=True)),
                                                 distinct))
                replace[text] = out.name
                continue
            out = Var(self._fresh(AGGREGATES[type(agg)]))
            params = tuple(agg.args[k].sql(dialect="spark") for k in ("quantile", "accuracy") if agg.args.get(k))
            aggregates.append(Aggregate(out, AGGREGATES[type(agg)],
                                        Expr(exp.column(arg_var.name, quoted=True)) if arg_var else None, distinct,
                                        params))
            replace[text] = out.name
        inputs = self._aux([v.name for v in [*by, *arg_vars]], role="groupby")
        for b in blocks:
            head = [self._term(n, b) for n in [*group_nodes, *args]]
            self._add_rule(Rule(Atom(inputs.name, tuple(head)), tuple(b.body)), b)

        def rewrite(node: exp.Expression) -> Var | Expr:
            text = node.sql(dialect="spark")
            if text in replace:
                return Var(replace[text])
            tree = node.copy().transform(
                lambda n: exp.column(replace[n.sql(dialect="spark")], quoted=True)
                if isinstance(n, (exp.Column, exp.Anonymous, *AGGREGATES)) and n.sql(dialect="spark") in replace
                else n)
            stray = [c for c in tree.find_all(exp.Column) if c.name not in set(replace.values())]
            if stray:
                raise ConfigError(f"views.{self.view}: {stray[0].sql(dialect='spark')} must appear in GROUP BY "
                                  "or in an aggregate")
            return Expr(tree)

        body: list = [GroupBy(Atom(inputs.name, tuple([*by, *arg_vars])), tuple(by), tuple(aggregates))]
        if having is not None:
            cond = rewrite(having.this)
            body.append(Condition(cond.tree if isinstance(cond, Expr) else exp.column(cond.name, quoted=True)))
        self.program.rules.append(Rule(Atom(target.name, tuple(rewrite(n) for n in nodes)), tuple(body)))


@functools.lru_cache(maxsize=1024)
def union_in_recursion(sql: str) -> str | None:
    """The name of a recursive CTE of ``sql`` whose definition refers to itself and combines with UNION
    (a set) rather than UNION ALL: ivm maintains it (DRed, 000 §7), Spark SQL's analysis refuses it
    (UNION_NOT_SUPPORTED_IN_RECURSIVE_CTE, logged whole by Spark before the caller could catch it), so
    a caller that would run the text in Spark SQL asks first. None when there is none (or the text
    does not parse: the caller's Spark SQL says why). Kept per text: the validation asks it of every
    view a checked view reads, in every run."""
    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except ParseError:
        return None
    for with_ in tree.find_all(exp.With):
        if not with_.args.get("recursive"):
            continue
        for cte in with_.expressions:
            name = cte.alias_or_name
            if any(t.name == name for t in cte.this.find_all(exp.Table)) and \
                    any(u.args.get("distinct") for u in cte.this.find_all(exp.Union)):
                return name
    return None


def _renamed(tree: exp.Expression, variables: dict[str, Var]) -> exp.Expression:
    """``tree`` with its columns named as the variables they are bound to."""
    return tree.copy().transform(lambda n: exp.column(variables[n.name].name, quoted=True)
                                 if isinstance(n, exp.Column) and n.name in variables else n)


def _uda_calls(node: exp.Expression, udas: dict):
    for call in node.find_all(exp.Anonymous):
        if call.name.lower() in udas:
            yield call


def _arg(node: exp.Expression, name: str):
    """``from``/``with`` are ``from_``/``with_`` in newer sqlglot releases."""
    value = node.args.get(f"{name}_")
    return value if value is not None else node.args.get(name)


def _not_null(tree: exp.Expression) -> Condition:
    return Condition(tree.copy().is_(exp.null()).not_())


def _subqueries_last(conjuncts: list[exp.Expression]) -> list[exp.Expression]:
    """A conjunction's conditions with those holding a subquery last (its order changes nothing else): a
    probe of the outer bindings (`_probe`) then holds every equality and filter of its rule, not only those
    written before it (TPC-H Q21's probe joined `nation` unrelated, 25 times over, when
    `s_nationkey = n_nationkey` followed its EXISTS)."""
    return sorted(conjuncts, key=lambda c: c.find(exp.Subquery, exp.Exists, exp.Select) is not None)


def _resolved(rule: Rule, block: _Block) -> Rule | None:
    """Apply the block's unifications to every variable of the rule, and its NULLs (the padded side of
    an outer join). None if the rule can derive nothing: a NULL would have to equal something."""
    nulls = {block.find(v) for v in block.nulls}

    def is_null(name: str) -> bool:
        return block.find(name) in nulls

    def tree(node: exp.Expression) -> exp.Expression:
        return node.copy().transform(lambda n: (exp.Null() if is_null(n.name) else
                                                exp.column(block.find(n.name), quoted=True))
                                     if isinstance(n, exp.Column) else n)

    def term(t):
        if isinstance(t, Var):
            return Const(None) if is_null(t.name) else Var(block.find(t.name))
        if isinstance(t, Expr):
            return Expr(tree(t.tree))
        return t

    body = []
    for i in rule.body:
        if isinstance(i, Literal):
            padded = not i.null_safe and any(isinstance(a, Var) and is_null(a.name) for a in i.atom.args)
            if padded and not i.negated:
                return None  # a join on a padded NULL finds nothing
            if padded:
                continue  # NOT EXISTS on a NULL correlation holds: NULL equals nothing
            # (a NULL-safe one meets the padded NULL: its argument is the constant NULL, read IS NULL)
            body.append(Literal(Atom(i.atom.pred, tuple(term(a) for a in i.atom.args)), i.negated, i.null_safe))
        elif isinstance(i, Condition):
            body.append(Condition(tree(i.tree)))
        elif isinstance(i, Assign):
            body.append(Assign(Var(block.find(i.var.name)), term(i.expr)))
        elif isinstance(i, Unnest):
            body.append(Unnest(Expr(tree(i.array.tree)), tuple(Var(block.find(v.name)) for v in i.elements),
                               i.kind, i.outer))
        else:
            body.append(i)
    return Rule(Atom(rule.head.pred, tuple(term(a) for a in rule.head.args)), tuple(body))
