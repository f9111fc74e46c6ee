"""A front-end pass (#45, item 2): a scalar subquery — an aggregate standing where a value stands, in
WHERE, HAVING or the SELECT list, correlated or not (TPC-H Q2, Q11, Q15, Q17, Q20, Q22) — becomes a join
with a subquery in FROM, which the compiler maintains as an aggregate subview (000's groupby, kept by
counting); the subquery's place takes a column of it. This is the classic decorrelation of a nested
aggregate (Kim 1982, with Ganski and Wong's fix of the COUNT bug), by SQL's own definition of the rows:

* **uncorrelated** — ``(SELECT agg FROM ...)`` without GROUP BY returns exactly one row, even over no
  input, so a CROSS JOIN with it keeps every row once and gives each the value::

      ... WHERE x > (SELECT avg(y) FROM t)  ->  ... CROSS JOIN (SELECT avg(y) AS v FROM t) AS __sq0
                                                WHERE x > __sq0.v

* **correlated by equalities** — ``(SELECT agg FROM t WHERE t.k = o.c AND p)`` is the aggregate of the
  group ``t.k = o.c``: the subquery grouped by ``t.k`` has at most one row per outer row, so a join on
  ``__sq0.k0 = o.c`` keeps every row once. An outer row without a group gets what the aggregate gives
  over no rows (``count`` 0, the others NULL): a LEFT JOIN and ``CASE WHEN __sq0.k0 IS NULL THEN <the
  value over no rows> ELSE __sq0.v END`` — or, where that value is NULL and the subquery is an operand of
  a comparison that is a conjunct of WHERE (a NULL drops the row either way), an inner join::

      ... WHERE l.q < (SELECT 0.2 * avg(l2.q) FROM l AS l2 WHERE l2.p = o.p)
        ->  ... CROSS JOIN (SELECT l2.p AS k0, 0.2 * avg(l2.q) AS v FROM l AS l2 GROUP BY l2.p) AS __sq0
            WHERE __sq0.k0 = o.p AND l.q < __sq0.v

Where the subquery's value is read after the outer query aggregates (HAVING, or the SELECT list outside an
aggregate), its columns join the outer GROUP BY: they are one value per group (they follow from grouping
columns, or are constant), so the groups stay as they were.

Refused in one line, and not approximated: a scalar subquery that is not an aggregate without GROUP BY
(it may give no row or several), one correlated other than by equalities of its own columns with the
enclosing query's (``l2.s <> l1.s``, a correlation inside OR, a correlated value), one read after the
aggregation of a query without GROUP BY (it would need a value over no groups) or correlated there by a
column that is not grouped, and one outside WHERE, HAVING and the SELECT list. It runs on the qualified
tree (every column names its table; sqlglot's scopes tell an outer column from an inner one), innermost
subquery first, and is a pure function from tree to tree. (sqlglot's own ``unnest_subqueries`` rewrites
IN and EXISTS too, which ivm maintains as semi- and anti-joins (000's negation), and keeps non-equality
correlations as ARRAY_AGG / ARRAY_ANY, which no delta rule here maintains: hence this pass.)

>>> import sqlglot
>>> from sqlglot.optimizer.qualify import qualify
>>> schema = {"part": {"p_partkey": "int", "p_brand": "string"},
...           "lineitem": {"l_partkey": "int", "l_quantity": "int", "l_price": "int"}}
>>> q17 = ("SELECT sum(l_price) AS s FROM lineitem, part WHERE p_partkey = l_partkey AND "
...        "l_quantity < (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE l_partkey = p_partkey)")
>>> tree = qualify(sqlglot.parse_one(q17, read="spark"), schema=schema, dialect="spark", quote_identifiers=False)
>>> print(rewrite(tree, "q17").sql(dialect="spark"))  # doctest: +NORMALIZE_WHITESPACE
SELECT SUM(lineitem.l_price) AS s FROM lineitem AS lineitem CROSS JOIN part AS part CROSS JOIN
(SELECT lineitem.l_partkey AS k0, 0.2 * AVG(lineitem.l_quantity) AS v FROM lineitem AS lineitem
GROUP BY lineitem.l_partkey) AS __sq0 WHERE part.p_partkey = lineitem.l_partkey AND
lineitem.l_quantity < __sq0.v AND __sq0.k0 = part.p_partkey
>>> counts = "SELECT p_partkey, (SELECT count(*) FROM lineitem WHERE l_partkey = p_partkey) AS n FROM part"
>>> tree = qualify(sqlglot.parse_one(counts, read="spark"), schema=schema, dialect="spark", quote_identifiers=False)
>>> print(rewrite(tree, "counts").sql(dialect="spark"))  # doctest: +NORMALIZE_WHITESPACE
SELECT part.p_partkey AS p_partkey, CASE WHEN __sq0.k0 IS NULL THEN 0 ELSE __sq0.v END AS n
FROM part AS part LEFT JOIN (SELECT lineitem.l_partkey AS k0, COUNT(*) AS v FROM lineitem AS lineitem
GROUP BY lineitem.l_partkey) AS __sq0 ON __sq0.k0 = part.p_partkey
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.scope import build_scope

from ivm.lang.allowlist import Refused, scalar_subquery

#: operators whose value is NULL when an operand is: where the subquery's value over no rows is NULL and it
#: is an operand of one of these comparisons in a conjunct of WHERE, a missing group drops the row
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_STRICT = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Paren, exp.Cast)


def null_rejecting(column: exp.Expression, top: exp.Expression) -> bool:
    """Whether ``top`` (a conjunct) cannot hold where ``column`` in it is NULL: the column reaches it through
    comparisons and arithmetic only, each NULL when an operand is (under OR, COALESCE, IS NULL, a CASE or
    a function a NULL there may still make it hold, so it is not)."""
    node = column
    while node is not top and isinstance(node.parent, (*_COMPARISONS, *_STRICT)):
        node = node.parent
    return node is top


def over_no_rows(value: exp.Expression) -> exp.Expression:
    """The subquery's value where its group has no rows: each count 0, each other aggregate NULL."""
    def empty(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Count):
            return exp.Literal.number(0)
        if isinstance(node, exp.AggFunc):
            return exp.null()
        return node
    return value.copy().transform(empty)


def _null(node: exp.Expression) -> bool:
    """Whether ``node`` is NULL for sure (NULL, or arithmetic over a NULL)."""
    if isinstance(node, exp.Null):
        return True
    return isinstance(node, _STRICT) and any(_null(child) for child in node.iter_expressions()
                                              if not isinstance(child, exp.DataType))


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The conjuncts of ``node``, through AND and parentheses."""
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    return [] if node is None else [node]


def _in_conjuncts(node: exp.Expression, clause: exp.Expression | None) -> bool:
    return clause is not None and any(node is c for c in conjuncts(clause.this))


def _correlation(inner: exp.Select, external: list[exp.Column], outer_sources: set[str],
                 why: str) -> list[tuple[exp.Expression, exp.Column]]:
    """The (inner expression, outer column) pairs of the equalities correlating ``inner``, whose conjuncts
    leave its WHERE. Anything else that reads the enclosing query is refused."""
    where, external_ids, pairs, used = inner.args.get("where"), {id(c) for c in external}, [], []
    for column in external:
        side = column
        while isinstance(side.parent, exp.Paren):
            side = side.parent
        eq = side.parent
        if not (isinstance(eq, exp.EQ) and _in_conjuncts(eq, where) and column.table in outer_sources):
            raise Refused(f"{why} is correlated other than by an equality of its columns with the enclosing "
                          f"query's ({column.sql(dialect='spark')}), which is not supported yet")
        other = eq.expression if eq.this is side else eq.this
        if any(id(c) in external_ids for c in other.find_all(exp.Column)):
            raise Refused(f"{why} is correlated by {eq.sql(dialect='spark')}, which compares the enclosing "
                          f"query's columns with each other: not supported yet")
        pairs.append((other, column))
        used.append(eq)
    if used:
        rest = [c for c in conjuncts(where.this) if not any(c is u for u in used)]
        inner.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    return pairs


def _decorrelate(sq: exp.Subquery, name: str, view: str) -> None:
    inner, outer = sq.this, sq.parent_select
    why = f"views.{view}: the scalar subquery ({sq.sql(dialect='spark')[:80]})"
    if not isinstance(inner, exp.Select) or len(inner.expressions) != 1 or inner.args.get("group") \
            or inner.args.get("having") or not inner.expressions[0].find(exp.AggFunc):
        raise Refused(f"{why} is not an aggregate without GROUP BY (it may give no row or several): "
                      f"not supported yet")
    clause = sq.find_ancestor(exp.Where, exp.Having, exp.Select, exp.Join, exp.Group, exp.Order)
    if not isinstance(clause, (exp.Where, exp.Having)) and not (
            clause is outer and any(sq is n for p in outer.expressions for n in p.walk())):
        raise Refused(f"{why} stands where ivm reads only WHERE, HAVING and SELECT: not supported yet")
    scopes = {id(s.expression): s for s in build_scope(outer.root()).traverse()}
    scope, outer_scope = scopes[id(inner)], scopes[id(outer)]
    pairs = _correlation(inner, scope.external_columns, set(outer_scope.selected_sources), why)
    value = inner.expressions[0].unalias()
    empty = over_no_rows(value)
    inner.set("expressions", [exp.alias_(e.copy(), f"k{i}") for i, (e, _) in enumerate(pairs)]
              + [exp.alias_(value.copy(), "v")])
    if pairs:
        inner.set("group", exp.Group(expressions=[e.copy() for e, _ in pairs]))
    on = [exp.column(f"k{i}", table=name).eq(c.copy()) for i, (_, c) in enumerate(pairs)]
    strict = _null(empty) and isinstance(sq.parent, _COMPARISONS) and _in_conjuncts(sq.parent, outer.args.get("where"))
    in_aggregate = isinstance(sq.find_ancestor(exp.AggFunc, exp.Select), exp.AggFunc)
    column = exp.column("v", table=name)
    if not pairs or strict:  # exactly one row (uncorrelated), or a missing group drops the row anyway
        sq.replace(column)
        outer.join(inner.subquery(name, copy=False), join_type="CROSS", copy=False)
        if on:
            outer.set("where", exp.Where(this=exp.and_(*conjuncts(outer.args["where"].this), *on, copy=False)))
    else:
        sq.replace(column if _null(empty) else exp.case().when(
            exp.column("k0", table=name).is_(exp.null()), empty).else_(column))
        outer.join(inner.subquery(name, copy=False), on=exp.and_(*on), join_type="LEFT", copy=False)
    aggregated = outer.args.get("group") is not None or any(
        a.find_ancestor(exp.Select) is outer for p in outer.expressions for a in p.find_all(exp.AggFunc))
    if aggregated and not isinstance(clause, exp.Where) and not in_aggregate:
        # read after the aggregation: one value per group, so grouping by it keeps the groups
        if outer.args.get("group") is None:
            raise Refused(f"{why} is read after the aggregation of a query without GROUP BY: not supported yet")
        grouping = {e.sql() for e in outer.args["group"].expressions}
        loose = [c.sql(dialect="spark") for _, c in pairs if c.sql() not in grouping]
        if loose:
            raise Refused(f"{why} is read after the aggregation but correlated by {loose[0]}, which is not a "
                          f"grouping column")
        outer.set("group", exp.Group(expressions=[*outer.args["group"].expressions, column.copy(),
                                                  *[exp.column(f"k{i}", table=name) for i in range(len(on))]]))


def rewrite(tree: exp.Expression, view: str) -> exp.Expression:
    """The tree with each scalar subquery read through a join with a subquery in FROM (innermost first);
    `Refused` naming ``view`` for one this cannot rewrite."""
    tree = tree.copy()
    subqueries = [s for s in tree.find_all(exp.Subquery, bfs=False) if scalar_subquery(s)]
    for n, sq in enumerate(reversed(subqueries)):
        _decorrelate(sq, f"__sq{n}", view)
    return tree
