"""Window functions (#45): a SELECT with ``f(...) OVER (PARTITION BY p ORDER BY o ...)`` split into the
query's rows before its windows and the windows over them, so that ivm maintains it by recomputing only
the partitions a change touches.

A window function's value for a row depends on the other rows of its partition and on nothing else
(SQL's window semantics: the partition is the set of rows that agree on PARTITION BY). So a windowed
query is a GROUP BY of its rows on the partition columns whose one "aggregate" is the partition's rows,
each with its window values — computed by Spark's own window functions over the group's rows — and
its result those rows again (``LATERAL VIEW inline``). ivm maintains that aggregate as it maintains
any aggregate that is not incrementally computable (000 §6.2, ivm.maintain.groupby): the groups Δ
touches are recomputed from their stored rows, the others kept; so a change costs the partitions it
touches, and the result is the one Spark's window functions give.

`split` does the splitting on the qualified tree (QUALIFY was already turned into a WHERE over a
subquery by sqlglot's ``eliminate_qualify``, before qualification): every data-dependent expression of
the SELECT list that holds no window function, and every argument, PARTITION BY and ORDER BY expression
of a window, becomes a *leaf*, a column ``__cN`` of the inner query (the original FROM, WHERE, GROUP BY
and HAVING); each window function becomes a column ``__wN`` computed over the leaves; the SELECT list is
rewritten over both. Windows with different PARTITION BY are evaluated in layers, one GROUP BY each.

Ties: ROW_NUMBER, NTILE, LAG / LEAD, FIRST_VALUE / LAST_VALUE / NTH_VALUE and aggregates over a ROWS
frame depend on the order of rows that ORDER BY leaves tied, which Spark (and any SQL engine) picks as
it reads them. A partition recomputed alone must get the values a recomputation of the whole gets, so
ivm breaks those ties by the row's other values (its leaves, ascending, appended to ORDER BY); RANK,
DENSE_RANK, PERCENT_RANK, CUME_DIST and aggregates over a RANGE frame (the default) are the same
whatever the order of peers, so their ORDER BY is kept as written.

>>> import sqlglot
>>> from sqlglot.optimizer.qualify import qualify
>>> sql = ("SELECT a, row_number() OVER (PARTITION BY p ORDER BY o DESC) AS rn, "
...        "x / sum(x) OVER (PARTITION BY p) AS s FROM t")
>>> schema = {"t": {"a": "int", "p": "int", "o": "int", "x": "int"}}
>>> w = split(qualify(sqlglot.parse_one(sql, read="spark"), schema=schema, quote_identifiers=False))
>>> w.inner.sql(dialect="spark")
'SELECT t.a AS __c0, t.p AS __c1, t.o AS __c2, t.x AS __c3 FROM t AS t'
>>> for layer in w.layers:
...     print(layer.partition, {c: f.sql(dialect="spark") for c, f in layer.windows.items()})
['__c1'] {'__w0': 'ROW_NUMBER() OVER (PARTITION BY __c1 ORDER BY __c2 DESC, __c0, __c3)', \
'__w1': 'SUM(__c3) OVER (PARTITION BY __c1)'}
>>> [p.sql(dialect="spark") for p in w.outer]
['__c0 AS a', '__w0 AS rn', '__c3 / __w1 AS s']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

#: window functions by their position in the order of the partition, and over a frame of the ordered
#: partition (both need ORDER BY); with the aggregates the compiler maps, the window functions ivm
#: maintains (ivm.lang.allowlist refuses the others)
RANKING = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.Ntile, exp.Lag, exp.Lead)
VALUES = (exp.FirstValue, exp.LastValue, exp.NthValue, exp.First, exp.Last)
WINDOW_FUNCTIONS = RANKING + VALUES
#: window functions whose value depends on the order ORDER BY leaves among tied rows (see the module
#: docstring)
_TIE_SENSITIVE = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead, *VALUES)


@dataclass
class Layer:
    """The window functions that share one PARTITION BY: one GROUP BY of the rows on ``partition``."""

    partition: list[str]
    #: the window's column -> the window function over leaf columns
    windows: dict[str, exp.Window] = field(default_factory=dict)


@dataclass
class Windowed:
    """A SELECT with window functions, split (see the module docstring)."""

    #: the rows before the windows: one column per leaf
    inner: exp.Select
    layers: list[Layer]
    #: the SELECT list over the leaves' and the windows' columns, aliased as the query's own
    outer: list[exp.Expression]
    distinct: bool


def function(window: exp.Window) -> exp.Expression:
    """The function a window applies (under IGNORE / RESPECT NULLS)."""
    fn = window.this
    return fn.this if isinstance(fn, exp.IgnoreNulls | exp.RespectNulls) else fn


def has_windows(select: exp.Select) -> bool:
    return any(p.find(exp.Window) for p in select.expressions)


def _data(node: exp.Expression) -> bool:
    """Whether an expression depends on the row (a column or an aggregate), not only on constants."""
    return any(isinstance(n, exp.Column | exp.AggFunc) for n in node.walk())


def split(select: exp.Select) -> Windowed:
    """`Windowed` for a qualified SELECT whose list holds window functions (ivm.lang.allowlist refused
    before what Spark would not run: a named window, DISTINCT inside one, a ranking without ORDER BY)."""
    leaves: dict[str, exp.Expression] = {}  # SQL text -> expression of the inner query
    columns: dict[str, str] = {}  # SQL text -> its leaf column

    def leaf(node: exp.Expression) -> exp.Column:
        text = node.sql(dialect="spark")
        if text not in columns:
            columns[text] = f"__c{len(columns)}"
            leaves[text] = node.copy()
        return exp.column(columns[text])

    windows: list[tuple[exp.Window, list[str]]] = []  # (window over leaves, its partition columns)

    def over_leaves(node: exp.Expression) -> exp.Expression:
        """``node`` with each largest data-dependent subtree free of windows replaced by its leaf, and
        each window by its column (pre-order: a replaced subtree is not visited again)."""
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Window):
                return _window(n)
            if not n.find(exp.Window) and _data(n) and not isinstance(n, exp.Star):
                return leaf(n)
            return n
        return node.copy().transform(swap)

    def _window(w: exp.Window) -> exp.Column:
        order = w.args.get("order")
        new = w.copy()
        call = function(new)
        for arg in list(call.iter_expressions()):  # (an argument may be an aggregate: SUM(SUM(x)) OVER ...)
            if not isinstance(arg, exp.Star) and _data(arg):
                arg.replace(leaf(arg))
        partition = [leaf(p) for p in w.args.get("partition_by") or []]
        new.set("partition_by", partition or None)
        if order is not None:
            new.set("order", exp.Order(expressions=[exp.Ordered(this=leaf(o.this), desc=o.args.get("desc"),
                                                                nulls_first=o.args.get("nulls_first"))
                                                    for o in order.expressions]))
        windows.append((new, list(dict.fromkeys(p.name for p in partition))))
        return exp.column(f"__w{len(windows) - 1}")

    outer = [exp.alias_(over_leaves(p.unalias()), p.alias_or_name) for p in select.expressions]
    if not leaves:  # (a query of window values alone, over no column: one constant leaf)
        leaf(exp.Literal.number(1))
    layers: dict[frozenset[str], Layer] = {}
    for i, (w, partition) in enumerate(windows):
        if isinstance(function(w), _TIE_SENSITIVE) or (w.args.get("spec") is not None
                                                       and w.args["spec"].args.get("kind") == "ROWS"):
            _break_ties(w, partition, list(columns.values()))
        layers.setdefault(frozenset(partition), Layer(partition)).windows[f"__w{i}"] = w
    inner = select.copy()
    for arg in ("with", "distinct", "qualify"):
        inner.set(arg, None)
    inner.set("expressions", [exp.alias_(e, columns[t]) for t, e in leaves.items()])
    return Windowed(inner, list(layers.values()), outer, bool(select.args.get("distinct")))


def _break_ties(window: exp.Window, partition: list[str], leaves: list[str]) -> None:
    """Append to ORDER BY the leaves it and PARTITION BY do not hold (see the module docstring)."""
    order = window.args.get("order") or exp.Order(expressions=[])
    held = set(partition) | {o.this.name for o in order.expressions}
    order.set("expressions", [*order.expressions, *[exp.Ordered(this=exp.column(c), nulls_first=True)
                                                    for c in leaves if c not in held]])
    window.set("order", order)
