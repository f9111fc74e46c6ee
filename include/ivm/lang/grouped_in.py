"""A front-end pass (#45, item 2; #71, item 4): an uncorrelated IN subquery that groups — TPC-H Q18's
``o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)`` —
becomes an IN over a subquery in FROM, which the compiler maintains as an aggregate subview:

    x IN (SELECT k FROM t GROUP BY k HAVING c)   ->   x IN (SELECT __in0.c0 FROM (SELECT k AS c0 FROM t
                                                                  GROUP BY k HAVING c) AS __in0)

The same rows, by SQL's definition of a derived table. [NOT] EXISTS over a subquery that groups is read
the same way (`_exists`: equalities of outer columns with the subquery's columns moved out of the grouping;
any other correlation by the enclosing query's columns read once per value of them), a correlated IN, NOT
IN or ANY as such an EXISTS (`_as_exists`), and a correlated EXISTS over one group per outer row whose HAVING
over no rows reads the outer row as that HAVING's value (`exists_as_values`, run before the scalar
subqueries' pass). What none of them reads (correlated by a LATERAL VIEW's column or a query two levels
out; an IN, NOT IN or ANY that is not a conjunct of WHERE) stays as it is and the compiler refuses it in
one line, as it refuses ORDER BY / LIMIT there. It runs on
the qualified tree (every column names its table), where sqlglot's scopes tell an outer column from an
inner one; pure functions from tree to tree.

>>> import sqlglot
>>> from sqlglot.optimizer.qualify import qualify
>>> schema = {"orders": {"o_orderkey": "int"}, "lineitem": {"l_orderkey": "int", "l_quantity": "int"}}
>>> q18 = ("SELECT o_orderkey FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem "
...        "GROUP BY l_orderkey HAVING sum(l_quantity) > 300)")
>>> tree = qualify(sqlglot.parse_one(q18, read="spark"), schema=schema, dialect="spark", quote_identifiers=False)
>>> print(rewrite(tree).sql(dialect="spark"))  # doctest: +NORMALIZE_WHITESPACE
SELECT orders.o_orderkey AS o_orderkey FROM orders AS orders WHERE orders.o_orderkey IN (SELECT __in0.c0 AS c0
FROM (SELECT lineitem.l_orderkey AS c0 FROM lineitem AS lineitem GROUP BY lineitem.l_orderkey
HAVING SUM(lineitem.l_quantity) > 300) AS __in0)
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.executor import execute
from sqlglot.optimizer.scope import Scope, build_scope

from ivm.lang.scalar_subqueries import conjuncts, null_rejecting, over_no_rows


def _groups(select: exp.Expression) -> bool:
    return isinstance(select, exp.Select) and (
        select.args.get("group") is not None or select.args.get("having") is not None
        or any(e.find(exp.AggFunc) for e in select.expressions))


def rewrite(tree: exp.Expression) -> exp.Expression:
    """The tree with each uncorrelated grouping IN subquery, and each grouping [NOT] EXISTS subquery
    (`_exists`), read through a subquery in FROM."""
    tree = _exists(_as_exists(tree.copy()))
    root = build_scope(tree)
    if root is None:
        return tree
    correlated = {id(s.expression) for s in root.traverse() if s.external_columns}
    for n, node in enumerate(list(tree.find_all(exp.In))):
        query = node.args.get("query")
        select = query.this if isinstance(query, exp.Subquery) else query
        if not _groups(select) or id(select) in correlated:
            continue
        name = f"__in{n}"
        inner = select.copy()
        inner.set("expressions", [exp.alias_(e.unalias(), f"c{i}") for i, e in enumerate(select.expressions)])
        outer = exp.select(*[exp.alias_(exp.column(f"c{i}", table=name), f"c{i}")
                             for i in range(len(select.expressions))]).from_(inner.subquery(name))
        query.replace(exp.Subquery(this=outer) if isinstance(query, exp.Subquery) else outer)
    return tree


def _as_exists(tree: exp.Expression) -> exp.Expression:
    """IN, NOT IN and ANY over a query that groups, each a conjunct of WHERE, as the [NOT] EXISTS of a group
    whose value answers them (which `_exists` then reads):

        x IN (SELECT k FROM t WHERE w GROUP BY g HAVING c)  ->  EXISTS (SELECT 1 FROM t WHERE w GROUP BY g
                                                                        HAVING c AND k = x)
        x op ANY (SELECT k ...)                              ->  EXISTS (... HAVING c AND x op k)
        x NOT IN (SELECT k ...)                              ->  NOT EXISTS (... HAVING c AND
                                                                        (k = x OR k IS NULL OR x IS NULL))

    The same rows where a NULL drops the row as FALSE does; NOT IN is NULL, so drops the row, when x or a
    value is NULL over a non-empty set (hence its two IS NULLs: x there correlates NULL-safe,
    `_by_outer_values`). An uncorrelated IN or NOT IN keeps the cheaper route of `rewrite`."""
    root = build_scope(tree)
    if root is None:
        return tree
    for scope in list(root.traverse()):
        select = scope.expression
        query = select.parent.parent if isinstance(select.parent, exp.Subquery) else select.parent
        if not _groups(select) or len(select.expressions) != 1:
            continue
        k = select.expressions[0].unalias()
        if isinstance(query, exp.In) and scope.external_columns and not isinstance(query.this, exp.Tuple):
            condition, x = query, query.this
            match = exp.EQ(this=k.copy(), expression=x.copy())
            if isinstance(query.parent, exp.Not):
                condition = query.parent
                match = exp.or_(match, exp.Is(this=k.copy(), expression=exp.null()),
                                exp.Is(this=x.copy(), expression=exp.null()))
        elif isinstance(query, exp.Any) and isinstance(query.parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT,
                                                                      exp.LTE)):
            condition = query.parent
            match = type(condition)(this=condition.this.copy(), expression=k.copy())
        else:
            continue
        where = condition.find_ancestor(exp.Where, exp.Select)
        if not isinstance(where, exp.Where) or not any(condition is c for c in conjuncts(where.this)):
            continue
        inner = select.copy()
        having = inner.args.get("having")
        inner.set("having", exp.Having(this=exp.and_(having.this, match) if having else match))
        inner.set("expressions", [exp.Literal.number(1)])
        exists = exp.Exists(this=inner)
        condition.replace(exp.not_(exists) if isinstance(condition, exp.Not) else exists)
    return tree


def _exists(tree: exp.Expression) -> exp.Expression:
    """[NOT] EXISTS over a subquery that groups, decorrelated as IN's is read (#71, item 4): the grouping
    moves into a subquery in FROM, which selects the grouping columns the correlation compares, and the
    correlation compares the outer columns with them there —

        EXISTS (SELECT 1 FROM t WHERE t.k = o.x AND p GROUP BY t.k HAVING c)
          ->  EXISTS (SELECT 1 FROM (SELECT t.k AS c0 FROM t WHERE p GROUP BY t.k HAVING c) AS __ex0
                      WHERE __ex0.c0 = o.x)

    The same rows: a filter on a grouping column keeps or drops whole groups, so it commutes with the
    grouping and its HAVING (and NULL equals nothing on either side). A correlation by a column the query
    does not group by joins its GROUP BY first: the rows with ``t.c = o.x`` grouped by ``t.b`` are the
    groups of ``GROUP BY t.b, t.c`` whose ``c`` is ``o.x``, each the same rows (so the same HAVING) —

        EXISTS (SELECT 1 FROM t WHERE t.c = o.x GROUP BY t.b HAVING c)
          ->  EXISTS (SELECT 1 FROM (SELECT t.c AS c0 FROM t GROUP BY t.b, t.c HAVING c) AS __ex0
                      WHERE __ex0.c0 = o.x)

    Correlated otherwise (``t.c > o.x``, an outer column in HAVING: the rows grouped differ per outer
    row), the grouping runs once per outer value (`_by_outer_values`): the outer columns' distinct values
    join the subquery's FROM, the correlation compares the rows with them and the grouping adds them —

        EXISTS (SELECT 1 FROM t WHERE t.c > o.x GROUP BY t.b HAVING c)
          ->  EXISTS (SELECT 1 FROM (SELECT __exo0.x0 AS c0 FROM t, (SELECT DISTINCT o.x AS x0 FROM o)
                      AS __exo0 WHERE t.c > __exo0.x0 GROUP BY t.b, __exo0.x0 HAVING c) AS __ex0
                      WHERE __ex0.c0 = o.x)

    — the classic decorrelation by the outer query's values (the probe ivm.lang.sql reads other
    correlated subqueries through): the values of one table's columns from that table, of several tables'
    as the enclosing query's FROM pairs them; where each outer column is named in a comparison that is NULL
    where it is, an outer row with a NULL there finds no rows, as the equality with ``c0`` finds none.

    A correlated query without GROUP BY has one group per outer row, over no rows too: grouped by the
    correlation as above, an outer row without rows finds no group, which is right where HAVING over no
    rows (COUNT 0, the others NULL; `_holds_over_no_rows`) is not true; where it is true (``HAVING
    count(*) < 2``) the EXISTS holds unless a group fails it —

        EXISTS (SELECT 1 FROM t WHERE t.k = o.x HAVING c)   (c true over no rows)
          ->  NOT EXISTS (SELECT 1 FROM (SELECT t.k AS c0 FROM t GROUP BY t.k
                          HAVING NOT COALESCE(c, FALSE)) AS __ex0 WHERE __ex0.c0 = o.x)

    Where an outer column stands other than in a comparison or arithmetic that is a conjunct of WHERE or
    HAVING (under OR, COALESCE, IS NULL: a NULL there may find rows), the outer values correlate NULL-safe
    (``__ex0.c0 <=> o.x``: the NULL value's group is that row's). A HAVING over no rows that reads the
    outer row is `exists_as_values`'s, before this; a LATERAL VIEW's column, or a column of a query further
    out, stays as it is and the compiler refuses it in one line. An uncorrelated query moves whole."""
    root = build_scope(tree)
    if root is None:
        return tree
    for n, (scope, node) in enumerate([(s, s.expression.parent) for s in root.traverse()
                                       if isinstance(s.expression.parent, exp.Exists)]):
        select = scope.expression
        if not _groups(select):
            continue
        moved = _correlation(scope, select)
        read = _by_equalities(select, moved) if moved is not None else _by_outer_values(scope, select, n)
        if read is None:
            continue
        inner, keys = read
        complement = False
        if keys and inner.args.get("group") is None:  # (one group per outer row, over no rows too)
            complement = _holds_over_no_rows(inner.args.get("having"))
            if complement is None:
                continue
        grouped = inner.args["group"].expressions if inner.args.get("group") else []
        joined = [k for k, _, _ in keys if not any(k == x for x in grouped)]
        if joined:  # (a correlation by a column not grouped by: it joins the grouping)
            inner.set("group", exp.Group(expressions=[*grouped, *[k.copy() for k in joined]]))
        if complement:
            having = inner.args["having"].this if inner.args.get("having") else exp.true()
            inner.set("having", exp.Having(this=exp.not_(exp.func("COALESCE", having, exp.false()))))
        name = f"__ex{n}"
        inner.set("expressions", [exp.alias_(k.copy(), f"c{i}") for i, (k, _, _) in enumerate(keys)] or
                  [exp.alias_(exp.Literal.number(1), "c0")])
        outer = exp.select("1").from_(inner.subquery(name))
        for i, (_, o, equal) in enumerate(keys):
            outer = outer.where(equal(this=exp.column(f"c{i}", table=name), expression=o.copy()))
        if not complement:
            node.set("this", outer)
        elif isinstance(node.parent, exp.Not):
            node.parent.replace(exp.Exists(this=outer))
        else:
            node.replace(exp.not_(exp.Exists(this=outer)))
    return tree


def exists_as_values(tree: exp.Expression) -> exp.Expression:
    """A correlated [NOT] EXISTS over a query without GROUP BY whose HAVING over no rows reads the outer
    row (``HAVING count(*) < o.x``) or an aggregate whose value there is not known, as the value of its
    HAVING — the query has one group per outer row, there whenever HAVING holds, so

        EXISTS (SELECT 1 FROM t WHERE w HAVING c(agg, o.x))
          ->  COALESCE(c((SELECT agg FROM t WHERE w), o.x), FALSE)

    (NOT EXISTS: its negation), each aggregate a scalar subquery, which ivm.lang.scalar_subqueries then
    decorrelates (it runs after this pass; its refusals hold for these too). The other forms are
    `_exists`'s, after it."""
    tree = tree.copy()
    root = build_scope(tree)
    if root is None:
        return tree
    for scope in list(root.traverse()):
        select, node = scope.expression, scope.expression.parent
        if (not isinstance(node, exp.Exists) or not _groups(select) or select.args.get("group") is not None
                or not scope.external_columns or _holds_over_no_rows(select.args.get("having")) is not None):
            continue
        having = select.args["having"].this.copy() if select.args.get("having") else exp.true()

        def scalar(agg: exp.Expression, select: exp.Select = select) -> exp.Expression:
            if not isinstance(agg, exp.AggFunc):
                return agg
            sub = select.copy()
            sub.set("expressions", [agg.copy()])
            sub.set("having", None)
            return exp.Subquery(this=sub)

        value = exp.func("COALESCE", having.transform(scalar), exp.false())
        if isinstance(node.parent, exp.Not):
            node.parent.replace(exp.not_(value))
        else:
            node.replace(value)
    return tree


#: each grouping column the correlation compares, the outer column it compares with, and how: ``=``, or
#: ``<=>`` where that column's NULL may find rows (`_by_outer_values`)
Keys = list[tuple[exp.Expression, exp.Column, type[exp.EQ] | type[exp.NullSafeEQ]]]


def _by_equalities(select: exp.Select, moved: list) -> tuple[exp.Select, Keys]:
    """The subquery without its correlating equalities, and each one's inner and outer column."""
    inner = select.copy()
    kept = [c for c in conjuncts(inner.args.get("where") and inner.args["where"].this)
            if not any(c == m for m, _, _ in moved)]
    inner.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    return inner, [(g, o, exp.EQ) for _, g, o in moved]


def _by_outer_values(scope: Scope, select: exp.Select, n: int) -> tuple[exp.Select, Keys] | None:
    """The subquery joined with the distinct values of the outer columns it names, which it reads there;
    None unless they are columns of the enclosing query's sources, each in a conjunct of WHERE or HAVING.
    An outer column under comparisons and arithmetic only finds no rows where it is NULL, and its value
    correlates by ``=``; elsewhere (under OR, COALESCE, IS NULL) its NULL may find rows, the NULL value's
    group is that outer row's, and it correlates by ``<=>`` (which the compiler meets NULL-safe).

    The values are read from the one table that holds them, or, for columns of several, from a copy of
    the enclosing query's FROM and its joins (before its WHERE: every row the EXISTS is asked about, and
    more, which find no outer row to answer)."""
    external, parent = scope.external_columns, scope.parent
    if parent is None or any(c.table not in parent.sources for c in external):
        return None
    tops = {id(x) for k in ("where", "having") if select.args.get(k) is not None
            for x in conjuncts(select.args[k].this)}
    lenient = set()
    for c in external:
        top = c
        while top.parent is not None and id(top) not in tops:
            top = top.parent
        if id(top) not in tops:
            return None
        if not null_rejecting(c, top):
            lenient.add((c.table, c.name))
    keys = list(dict.fromkeys((c.table, c.name) for c in external))
    probe_name = f"__exo{n}"
    tables = {t for t, _ in keys}
    if len(tables) == 1 and isinstance(parent.sources[next(iter(tables))], exp.Table):
        source = parent.sources[next(iter(tables))].copy()
        source.set("alias", exp.TableAlias(this=exp.to_identifier(f"{probe_name}_{source.alias_or_name}")))
        sources, joins = source, []
    else:
        outer = parent.expression
        if not isinstance(outer, exp.Select) or outer.args.get("laterals"):
            return None
        sources = (outer.args.get("from_") or outer.args.get("from")).this.copy()  # (from_: newer sqlglot)
        joins = [j.copy() for j in outer.args.get("joins") or []]
        renamed = {}
        for s in [sources, *(j.this for j in joins)]:
            if not s.alias:
                return None
            renamed[s.alias] = f"{probe_name}_{s.alias}"
            s.set("alias", exp.TableAlias(this=exp.to_identifier(renamed[s.alias])))
        for j in joins:
            if j.args.get("on") is not None:
                j.set("on", j.args["on"].transform(
                    lambda c: exp.column(c.name, table=renamed[c.table])
                    if isinstance(c, exp.Column) and c.table in renamed else c))
    probe = exp.select(*[exp.alias_(exp.column(c, table=f"{probe_name}_{t}"), f"x{i}")
                         for i, (t, c) in enumerate(keys)]).from_(sources).distinct()
    if joins:
        probe.set("joins", joins)
    inner = select.copy()
    copies = dict(zip([id(x) for x in select.walk()], inner.walk(), strict=True))
    for c in external:
        copies[id(c)].replace(exp.column(f"x{keys.index((c.table, c.name))}", table=probe_name))
    inner.set("joins", [exp.Join(this=probe.subquery(probe_name)), *(inner.args.get("joins") or [])])
    first = {}
    for c in external:
        first.setdefault((c.table, c.name), c)
    return inner, [(exp.column(f"x{i}", table=probe_name), first[k], exp.NullSafeEQ if k in lenient else exp.EQ)
                   for i, k in enumerate(keys)]


#: the aggregates whose value over no rows `scalar_subqueries.over_no_rows` gives (COUNT 0, these NULL);
#: any other: not known, refused (count_if is a COUNT by then: ivm.lang.aggregate_filters)
_KNOWN_OVER_NO_ROWS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Stddev, exp.StddevSamp, exp.StddevPop,
                       exp.Variance, exp.VariancePop)


def _holds_over_no_rows(having: exp.Having | None) -> bool | None:
    """Whether HAVING holds for the one group of a query without GROUP BY over no rows (its aggregates'
    values there: `scalar_subqueries.over_no_rows`), evaluated by sqlglot's executor (three-valued, as
    SQL); None when it names a column outside an aggregate (the outer row's) or another aggregate."""
    if having is None:
        return True
    aggregates = list(having.this.find_all(exp.AggFunc))
    outside = [c for c in having.this.find_all(exp.Column) if c.find_ancestor(exp.AggFunc) is None]
    if outside or not all(isinstance(a, _KNOWN_OVER_NO_ROWS) for a in aggregates):
        return None
    try:
        rows = execute(exp.select(exp.alias_(over_no_rows(having.this), "v")), tables={}).rows
    except Exception:  # noqa: BLE001 (sqlglot's executor lacks the function: not known, refused)
        return None
    return rows[0][0] is True


def _correlation(scope: Scope, select: exp.Select) -> list[tuple[exp.Expression, exp.Column, exp.Column]] | None:
    """The conjuncts of ``select``'s WHERE that correlate it (each with its inner column and the outer
    column), when they are the only place an outer column is named; None when it cannot move."""
    outer = {id(c) for c in scope.external_columns}
    if not outer:
        return []
    moved = []
    for c in conjuncts(select.args.get("where") and select.args["where"].this):
        cols = [x for x in c.find_all(exp.Column) if id(x) in outer]
        if not cols:
            continue
        if not isinstance(c, exp.EQ) or len(cols) != 1:
            return None
        o = cols[0]
        g = c.expression if c.this is o else c.this if c.expression is o else None
        if not isinstance(g, exp.Column):
            return None
        moved.append((c, g, o))
    named = sum(1 for x in select.find_all(exp.Column) if id(x) in outer)
    return moved if named == len(moved) else None

