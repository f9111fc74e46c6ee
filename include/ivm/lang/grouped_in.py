"""A front-end pass (#45, item 2; #71, item 4): an uncorrelated IN subquery that groups — TPC-H Q18's
``o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)`` —
becomes an IN over a subquery in FROM, which the compiler maintains as an aggregate subview:

    x IN (SELECT k FROM t GROUP BY k HAVING c)   ->   x IN (SELECT __in0.c0 FROM (SELECT k AS c0 FROM t
                                                                  GROUP BY k HAVING c) AS __in0)

The same rows, by SQL's definition of a derived table. A correlated one (its GROUP BY or HAVING reads a
column of the outer query) stays as it is and the compiler refuses it, as it refuses ORDER BY / LIMIT
there. [NOT] EXISTS over a subquery that groups is read the same way where its correlation allows
(`_exists`: equalities of outer columns with the subquery's columns, moved out of the grouping; a column
it does not group by joins its GROUP BY). It runs on the
qualified tree (every column names its table), where sqlglot's scopes tell an outer column from an inner
one; a pure function from tree to tree.

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
from sqlglot.optimizer.scope import Scope, build_scope

from ivm.lang.scalar_subqueries import conjuncts


def _groups(select: exp.Expression) -> bool:
    return isinstance(select, exp.Select) and (
        select.args.get("group") is not None or select.args.get("having") is not None
        or any(e.find(exp.AggFunc) for e in select.expressions))


def rewrite(tree: exp.Expression) -> exp.Expression:
    """The tree with each uncorrelated grouping IN subquery, and each grouping [NOT] EXISTS subquery
    (`_exists`), read through a subquery in FROM."""
    tree = _exists(tree.copy())
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

    (not for a query without GROUP BY: its one group exists over no rows too). Only where that holds:
    each condition naming an outer column is a conjunct of WHERE equating it with a column of the
    subquery's own, and no outer column is named anywhere else; an uncorrelated one moves whole. Any
    other (``t.c > o.x``: the groups then differ per outer row) stays as it is and the compiler refuses
    it in one line."""
    root = build_scope(tree)
    if root is None:
        return tree
    for n, (scope, node) in enumerate([(s, s.expression.parent) for s in root.traverse()
                                       if isinstance(s.expression.parent, exp.Exists)]):
        select = scope.expression
        if not _groups(select):
            continue
        moved = _correlation(scope, select)
        if moved is None:
            continue
        name = f"__ex{n}"
        inner = select.copy()
        kept = [c for c in conjuncts(inner.args.get("where") and inner.args["where"].this)
                if not any(c == m for m, _, _ in moved)]
        inner.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        grouped = inner.args["group"].expressions if inner.args.get("group") else []
        joined = [g for _, g, _ in moved if not any(g == x for x in grouped)]
        if joined:  # (a correlation by a column not grouped by: it joins the grouping)
            inner.set("group", exp.Group(expressions=[*grouped, *[g.copy() for g in joined]]))
        inner.set("expressions", [exp.alias_(g.copy(), f"c{i}") for i, (_, g, _) in enumerate(moved)] or
                  [exp.alias_(exp.Literal.number(1), "c0")])
        outer = exp.select("1").from_(inner.subquery(name))
        for i, (_, _, o) in enumerate(moved):
            outer = outer.where(exp.EQ(this=exp.column(f"c{i}", table=name), expression=o.copy()))
        node.set("this", outer)
    return tree


def _correlation(scope: Scope, select: exp.Select) -> list[tuple[exp.Expression, exp.Column, exp.Column]] | None:
    """The conjuncts of ``select``'s WHERE that correlate it (each with its inner column and the outer
    column), when they are the only place an outer column is named; None when it cannot move."""
    outer = {id(c) for c in scope.external_columns}
    if not outer:
        return []
    groups = select.args["group"].expressions if select.args.get("group") else []
    moved = []
    for c in conjuncts(select.args.get("where") and select.args["where"].this):
        cols = [x for x in c.find_all(exp.Column) if id(x) in outer]
        if not cols:
            continue
        if not isinstance(c, exp.EQ) or len(cols) != 1:
            return None
        o = cols[0]
        g = c.expression if c.this is o else c.this if c.expression is o else None
        if not isinstance(g, exp.Column) or not groups:
            return None
        moved.append((c, g, o))
    named = sum(1 for x in select.find_all(exp.Column) if id(x) in outer)
    return moved if named == len(moved) else None

