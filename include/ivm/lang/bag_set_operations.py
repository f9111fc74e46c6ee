"""A front-end pass (#45, item 2): INTERSECT ALL and EXCEPT ALL, by SQL's definition of their multiplicities
— a row that appears m times on the left and n times on the right appears min(m, n) times in INTERSECT ALL
and max(m - n, 0) times in EXCEPT ALL — written with what the compiler maintains: the two sides tagged and
united (UNION ALL), a GROUP BY per row that counts each side (000 §6.2's state, a SUM per side, NULLs
grouped as set operators compare them, IS NOT DISTINCT FROM), and each kept row repeated by a
generator over ``sequence(1, n)`` (002's extraction of a collection)::

    A INTERSECT ALL B  ->  SELECT __b.c0 AS x, ... FROM (SELECT c0, ..., least(sum(left), sum(right)) AS n
                                                      FROM (A tagged 1/0 UNION ALL B tagged 0/1)
                                                      GROUP BY c0, ... HAVING n > 0) AS __b
                           LATERAL VIEW explode(sequence(1, __b.n)) ...

A change of a row's count on either side changes its group's count, and the repetition follows by
counting: from 3 copies to 2 is three derivations out and two in. It runs on the qualified tree (every
projection is named), innermost operation first, and returns a tree to qualify again; a pure function.

>>> import sqlglot
>>> from sqlglot.optimizer.qualify import qualify
>>> schema = {"r": {"a": "int", "b": "string"}, "s": {"b": "string", "c": "int"}}
>>> tree = qualify(sqlglot.parse_one("SELECT b FROM r EXCEPT ALL SELECT b FROM s", read="spark"), schema=schema,
...                dialect="spark", quote_identifiers=False)
>>> print(rewrite(tree, "v").sql(dialect="spark"))  # doctest: +NORMALIZE_WHITESPACE
SELECT __bag0.c0 AS b FROM (SELECT __sides.c0, SUM(__sides.l) - SUM(__sides.r) AS n
FROM (SELECT __side.b AS c0, 1 AS l, 0 AS r FROM (SELECT r.b AS b FROM r AS r) AS __side
UNION ALL SELECT __side.b AS c0, 0 AS l, 1 AS r FROM (SELECT s.b AS b FROM s AS s) AS __side) AS __sides
GROUP BY __sides.c0 HAVING SUM(__sides.l) - SUM(__sides.r) > 0) AS __bag0
LATERAL VIEW EXPLODE(SEQUENCE(CAST(1 AS BIGINT), __bag0.n)) __copies0 AS __copy
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from ivm.errors import ConfigError


def _side(query: exp.Expression, left: int, right: int) -> str:
    names = [s.alias_or_name for s in query.selects]
    cols = ", ".join(f"__side.{n} AS c{i}" for i, n in enumerate(names))
    return f"SELECT {cols}, {left} AS l, {right} AS r FROM ({query.sql(dialect='spark')}) AS __side"


def _rewritten(node: exp.Intersect | exp.Except, n: int) -> exp.Expression:
    names = [s.alias_or_name for s in node.left.selects]
    keys = ", ".join(f"__sides.c{i}" for i in range(len(names)))
    count = ("least(sum(__sides.l), sum(__sides.r))" if isinstance(node, exp.Intersect)
             else "sum(__sides.l) - sum(__sides.r)")
    bag = f"__bag{n}"
    sql = (f"SELECT {', '.join(f'{bag}.c{i} AS {name}' for i, name in enumerate(names))} "
           f"FROM (SELECT {keys}, {count} AS n FROM ({_side(node.left, 1, 0)} UNION ALL {_side(node.right, 0, 1)}) "
           f"AS __sides GROUP BY {keys} HAVING {count} > 0) AS {bag} "
           f"LATERAL VIEW explode(sequence(CAST(1 AS BIGINT), {bag}.n)) __copies{n} AS __copy")
    return sqlglot.parse_one(sql, read="spark")


def rewrite(tree: exp.Expression, view: str) -> exp.Expression:
    """The tree with each INTERSECT ALL / EXCEPT ALL written as counted groups repeated (innermost first);
    ``tree`` itself when it has none; a ConfigError naming ``view`` when the sides differ in their number of
    columns."""
    if not any(not s.args.get("distinct") for s in tree.find_all(exp.Intersect, exp.Except)):
        return tree
    tree = tree.copy()
    found = [s for s in tree.find_all(exp.Intersect, exp.Except, bfs=False) if not s.args.get("distinct")]
    for n, node in enumerate(reversed(found)):
        if len(node.left.selects) != len(node.right.selects):
            raise ConfigError(f"views.{view}: the sides of {node.key.upper()} ALL have {len(node.left.selects)} "
                              f"and {len(node.right.selects)} columns")
        replacement = _rewritten(node, n)
        if node is tree:
            return replacement
        node.replace(replacement)  # (a SELECT stands wherever the set operation stood)
    return tree
