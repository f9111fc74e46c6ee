"""A front-end pass (#45, item 2): an aggregate's filter, ``count_if`` and ``count`` over several columns,
rewritten into the aggregates the compiler maintains, as SQL defines them.

* ``agg(x) FILTER (WHERE c)`` is ``agg(CASE WHEN c THEN x END)`` for an aggregate that skips NULL —
  ``count``, ``sum``, ``avg``, ``min``, ``max`` (DISTINCT or not): the rows the filter drops become NULL,
  which the aggregate skips, so an empty filtered group gives what the filter gives (count 0, the others
  NULL); ``count(*) FILTER (WHERE c)`` counts ``CASE WHEN c THEN 1 END``;
* ``count_if(c)`` is ``count(CASE WHEN c THEN 1 END)`` (a NULL condition is not true: not counted);
* ``count(a, b)`` counts the rows where no argument is NULL: ``count(CASE WHEN a IS NOT NULL AND b IS NOT
  NULL THEN 1 END)``; ``count(DISTINCT a, b)`` the distinct tuples among them: ``count(DISTINCT CASE WHEN
  ... THEN named_struct('c0', a, 'c1', b) END)``.

Another aggregate's FILTER stays as it is: the allowlist (ivm.lang.allowlist) refuses it with its own
message. `rewrite` is a pure function from tree to
tree, as sqlglot's optimizer rules are.

>>> import sqlglot
>>> def show(sql):
...     return rewrite(sqlglot.parse_one(sql, read="spark")).sql(dialect="spark")
>>> show("SELECT b, count(*) FILTER (WHERE a > 1) AS n, sum(a) FILTER (WHERE a > 1) AS s FROM r GROUP BY b")
'SELECT b, COUNT(CASE WHEN a > 1 THEN 1 END) AS n, SUM(CASE WHEN a > 1 THEN a END) AS s FROM r GROUP BY b'
>>> show("SELECT count(DISTINCT a) FILTER (WHERE b = 'x') FROM r")
"SELECT COUNT(DISTINCT CASE WHEN b = 'x' THEN a END) FROM r"
>>> show("SELECT count_if(a > 2), count(a, b) FROM r")
'SELECT COUNT(CASE WHEN a > 2 THEN 1 END), COUNT(CASE WHEN NOT a IS NULL AND NOT b IS NULL THEN 1 END) FROM r'
>>> show("SELECT count(DISTINCT a, b) FROM r")
"SELECT COUNT(DISTINCT CASE WHEN NOT a IS NULL AND NOT b IS NULL THEN NAMED_STRUCT('c0', a, 'c1', b) END) FROM r"
>>> show("SELECT percentile(a, 0.5) FILTER (WHERE a > 1) FROM r")  # (refused later, by the allowlist)
'SELECT PERCENTILE(a, 0.5) FILTER(WHERE a > 1) FROM r'
"""

from __future__ import annotations

from sqlglot import exp

#: the aggregates that skip NULL, whose FILTER is a CASE inside them
NULL_SKIPPING = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def _when(condition: exp.Expression, value: exp.Expression) -> exp.Case:
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])


def _filtered(node: exp.Filter) -> exp.Expression:
    agg, condition = node.this, node.expression.this
    if not isinstance(agg, NULL_SKIPPING) or (isinstance(agg, exp.Count) and agg.expressions):
        return node
    arg = agg.this
    if isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            return node
        return agg.__class__(this=exp.Distinct(expressions=[_when(condition, arg.expressions[0])]))
    return agg.__class__(this=_when(condition, exp.Literal.number(1) if isinstance(arg, exp.Star) else arg))


def _node(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Filter):
        return _filtered(node)
    if isinstance(node, exp.CountIf):
        return exp.Count(this=_when(node.this, exp.Literal.number(1)))
    if isinstance(node, exp.Count) and node.expressions and not isinstance(node.this, exp.Distinct):
        return exp.Count(this=_when(_present([node.this, *node.expressions]), exp.Literal.number(1)))
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct) and len(node.this.expressions) > 1:
        args = node.this.expressions
        pairs = [x for i, a in enumerate(args) for x in (exp.Literal.string(f"c{i}"), a.copy())]
        value = exp.Anonymous(this="named_struct", expressions=pairs)
        return exp.Count(this=exp.Distinct(expressions=[_when(_present(args), value)]))
    return node


def _present(args: list[exp.Expression]) -> exp.Expression:
    """None of ``args`` is NULL."""
    return exp.and_(*[exp.Not(this=exp.Is(this=a.copy(), expression=exp.Null())) for a in args])


def rewrite(tree: exp.Expression) -> exp.Expression:
    """The view's tree with its aggregate filters, ``count_if`` and multi-column counts rewritten."""
    return tree.copy().transform(_node)
