"""A front-end pass (#45, item 2): an uncorrelated IN subquery that groups — TPC-H Q18's
``o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)`` —
becomes an IN over a subquery in FROM, which the compiler maintains as an aggregate subview:

    x IN (SELECT k FROM t GROUP BY k HAVING c)   ->   x IN (SELECT __in0.c0 FROM (SELECT k AS c0 FROM t
                                                                  GROUP BY k HAVING c) AS __in0)

The same rows, by SQL's definition of a derived table. A correlated one (its GROUP BY or HAVING reads a
column of the outer query) stays as it is and the compiler refuses it, as it refuses ORDER BY / LIMIT
there. It runs on the qualified tree (every column names its table), where sqlglot's scopes tell an
outer column from an inner one; a pure function from tree to tree.

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
from sqlglot.optimizer.scope import build_scope


def _groups(select: exp.Expression) -> bool:
    return isinstance(select, exp.Select) and (
        select.args.get("group") is not None or select.args.get("having") is not None
        or any(e.find(exp.AggFunc) for e in select.expressions))


def rewrite(tree: exp.Expression) -> exp.Expression:
    """The tree with each uncorrelated grouping IN subquery read through a subquery in FROM."""
    tree = tree.copy()
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
