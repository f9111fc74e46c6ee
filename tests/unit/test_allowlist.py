"""Accept by allowlist (ivm.lang.allowlist): each family of SQL the front end cannot maintain is refused
at compile time (`ivm apply`) with one line naming the view and the construct, instead of being dropped
or evaluated wrongly; what the lists allow compiles. No Spark needed."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from ivm.errors import ConfigError
from ivm.lang import allowlist
from ivm.lang.sql import AGGREGATES
from tests.unit.test_lang import program

REFUSED = [
    # window functions outside ivm.lang.window_functions' reach (the others are maintained per partition)
    ("SELECT src, collect_list(dst) OVER (PARTITION BY src) AS ds FROM link",
     "window function COLLECT_LIST(dst) OVER (...) is not supported yet"),
    ("SELECT src FROM link WHERE row_number() OVER (ORDER BY dst) > 1",
     "the window function ROW_NUMBER() OVER (ORDER BY dst) in WHERE is refused"),
    ("SELECT src, sum(row_number() OVER (ORDER BY dst)) AS n FROM link GROUP BY src",
     "the window function ROW_NUMBER() OVER (ORDER BY dst) inside SUM() is refused"),
    ("SELECT src, sum(DISTINCT cost) OVER (PARTITION BY src) AS s FROM clink",
     "DISTINCT in the window function SUM(DISTINCT cost) OVER (PARTITION BY src) is refused"),
    ("SELECT src, rank() OVER (PARTITION BY src) AS r FROM link", "the window function RANK() needs ORDER BY"),
    ("SELECT src, rank() OVER w AS r FROM link WINDOW w AS (PARTITION BY src ORDER BY dst)",
     "a named window (RANK() OVER w) is not supported yet"),
    ("SELECT src FROM link TABLESAMPLE (10 PERCENT)", "TABLESAMPLE is refused"),
    # nondeterministic functions
    ("SELECT src, rand() AS r FROM link", "nondeterministic function RAND() is refused"),
    ("SELECT src, uuid() AS id FROM link", "nondeterministic function UUID() is refused"),
    ("SELECT src, current_timestamp() AS t FROM link", "nondeterministic function CURRENT_TIMESTAMP() is refused"),
    ("SELECT src, now() AS t FROM link", "nondeterministic function NOW() is refused"),
    ("SELECT src, monotonically_increasing_id() AS i FROM link",
     "nondeterministic function MONOTONICALLY_INCREASING_ID() is refused"),
    # aggregates the compiler does not map, and forms of them it would misread
    ("SELECT src, first(dst) AS d FROM link GROUP BY src", "the aggregate FIRST() is not supported yet"),
    ("SELECT src, collect_list(dst) AS ds FROM link GROUP BY src", "the aggregate ARRAY_AGG() is not supported yet"),
    ("SELECT src, max_by(dst, cost) AS d FROM clink GROUP BY src", "the aggregate ARG_MAX() is not supported yet"),
    # (count(*) FILTER, count_if, count([DISTINCT] a, b) are rewritten into counts: ivm.lang.aggregate_filters)
    ("SELECT src, percentile(cost, 0.5) FILTER (WHERE dst > 'a') AS p FROM clink GROUP BY src",
     "the aggregate filter PERCENTILE(cost, 0.5) FILTER(WHERE dst > 'a') (FILTER (WHERE ...)) is not supported yet"),
    ("SELECT src, count(src, dst) FILTER (WHERE dst > 'a') AS n FROM link GROUP BY src",
     "(FILTER (WHERE ...)) is not supported yet"),
    # scalar subqueries ivm.lang.scalar_subqueries cannot decorrelate into a join with an aggregate subview,
    # and what an IN / EXISTS subquery's compilation would drop
    ("SELECT src FROM link WHERE dst = (SELECT l.dst FROM link l WHERE l.src = 'a')",
     "is not an aggregate without GROUP BY (it may give no row or several)"),
    ("SELECT src FROM link WHERE dst = (SELECT max(l.dst) FROM link l GROUP BY l.src)",
     "is not an aggregate without GROUP BY"),
    ("SELECT l1.src FROM link l1 WHERE l1.dst = (SELECT max(l2.dst) FROM link l2 WHERE l2.src <> l1.src)",
     "is correlated other than by an equality of its columns with the enclosing query's (l1.src)"),
    ("SELECT l1.src FROM link l1 WHERE l1.dst = (SELECT max(l2.dst) FROM link l2 WHERE l2.src = l1.src "
     "OR l2.dst = 'a')", "is correlated other than by an equality"),
    ("SELECT l1.src, (SELECT max(l2.dst || l1.dst) FROM link l2 WHERE l2.src = l1.src) AS m FROM link l1",
     "is correlated other than by an equality"),
    ("SELECT count(*) + (SELECT count(*) FROM link) AS n FROM clink",
     "is read after the aggregation of a query without GROUP BY"),
    ("SELECT src, count(*) AS n FROM link l1 GROUP BY src HAVING count(*) > (SELECT count(*) FROM link l2 "
     "WHERE l2.dst = l1.dst)", "correlated by l1.dst, which is not a grouping column"),
    ("SELECT src FROM link GROUP BY src, (SELECT max(dst) FROM link)",
     "stands where ivm reads only WHERE, HAVING and SELECT"),
    # (an uncorrelated IN over GROUP BY / HAVING, and EXISTS, IN, NOT IN or ANY over one correlated by the
    # enclosing query's columns, are read through a subquery in FROM: ivm.lang.grouped_in); correlated by a
    # LATERAL VIEW's column or by a query two levels out (any subquery), a HAVING over no rows that reads the
    # outer row with a correlation other than by equalities, and a NOT IN under OR are refused, saying what
    # is read
    ("SELECT f.flight_id FROM flight f LATERAL VIEW explode(array(1, 2)) t AS e WHERE EXISTS "
     "(SELECT 1 FROM res r WHERE r.res_id > t.e GROUP BY r.seat HAVING count(*) > 1)",
     "GROUP BY inside this EXISTS / IN / ANY subquery is not supported yet (a grouping is read inside EXISTS, "
     "and inside IN, NOT IN and ANY conjuncts of WHERE, when correlated by columns of the FROM right around it "
     "(not a LATERAL VIEW's))"),
    ("SELECT f.flight_id FROM flight f WHERE EXISTS (SELECT 1 FROM res x WHERE x.flight_id = f.flight_id AND "
     "EXISTS (SELECT 1 FROM res r WHERE r.res_id = f.flight_id))",
     "a subquery correlated with the query two levels out (f.flight_id) is not supported yet"),
    ("SELECT f.flight_id FROM flight f WHERE EXISTS "
     "(SELECT 1 FROM res r WHERE r.flight_id < f.flight_id HAVING count(*) < f.miles)",
     "is correlated other than by an equality"),
    ("SELECT f.flight_id FROM flight f LATERAL VIEW explode(array(1, 2)) t AS e WHERE EXISTS "
     "(SELECT max(r.seat) FROM res r WHERE r.res_id > t.e)",
     "an aggregate inside this EXISTS / IN / ANY subquery is not supported yet"),
    ("SELECT f.flight_id FROM flight f WHERE f.miles > 3 OR f.flight_id NOT IN "
     "(SELECT r.flight_id FROM res r WHERE r.seat < f.flight_id GROUP BY r.flight_id HAVING count(*) > 1)",
     "is not supported yet"),
    ("SELECT flight_id FROM flight WHERE flight_id IN (SELECT flight_id FROM res ORDER BY seat LIMIT 3)",
     "ORDER BY / LIMIT in a view is not supported yet"),
    # anything else outside the lists
    ("SELECT src, reflect('java.util.UUID', 'randomUUID') AS s FROM link", "function REFLECT() is not supported yet"),
    ("SELECT src, shuffle(array(src, dst)) AS s FROM link", "nondeterministic function SHUFFLE() is refused"),
    ("SELECT src, my_udf(dst) AS s FROM link", "function MY_UDF() is not supported yet"),
    ("SELECT a, b FROM VALUES (1, 2) AS t(a, b)", "the construct VALUES"),
]


@pytest.mark.parametrize("sql, message", REFUSED, ids=[m.split(" (")[0][:40] for _, m in REFUSED])
def test_each_refused_family_is_named_in_one_line(sql, message):
    with pytest.raises(ConfigError) as e:
        program({"v": {"sql": sql}})
    assert str(e.value).startswith("views.v: ") and message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_what_the_lists_allow_compiles():
    """A view over a sample of each list: scalar expressions, modelled and named functions, generators,
    the mapped aggregates, IN / EXISTS / ANY subqueries with DISTINCT, scalar subqueries, set operators
    and CTEs."""
    views = {
        "scalars": {"sql": "SELECT upper(src) AS u, length(dst) + 1 AS n, coalesce(src, dst) AS c, "
                           "substring(src, 1, 2) AS s, CASE WHEN cost > 2 THEN 'hi' ELSE 'lo' END AS band, "
                           "cost BETWEEN 1 AND 3 AS mid, src LIKE 'a%' AS a, CAST(cost AS double) / 3 AS third, "
                           "round(cost * 1.5, 1) AS r, abs(cost) AS ab, pmod(cost, 7) AS p, nvl(src, 'x') AS nv, "
                           "year(to_date('2026-01-02')) AS y, date_add(to_date('2026-01-02'), cost) AS d, "
                           "concat(src, '-', dst) AS cat, src || dst AS pipe, greatest(cost, 2) AS g "
                           "FROM clink WHERE dst IS NOT NULL AND NOT (src = 'z')"},
        "aggregates": {"sql": "SELECT src, count(*) AS n, count(DISTINCT dst) AS d, sum(cost) AS s, avg(cost) AS a, "
                              "min(cost) AS lo, max(cost) AS hi, stddev_samp(cost) AS sd FROM clink GROUP BY src "
                              "HAVING count(*) > 0"},
        "filtered": {"sql": "SELECT src, count(*) FILTER (WHERE cost > 1) AS n, sum(cost) FILTER (WHERE dst = 'a') "
                            "AS s, count_if(cost > 2) AS c, count(dst, cost) AS both, "
                            "count(DISTINCT dst, cost) AS pairs FROM clink GROUP BY src"},
        "subqueries": {"sql": "SELECT f.flight_id FROM flight f WHERE f.flight_id IN (SELECT DISTINCT r.flight_id "
                              "FROM res r) AND NOT EXISTS (SELECT 1 FROM res r WHERE r.flight_id = f.flight_id "
                              "AND r.seat = 'x') AND f.miles > ANY (SELECT r.res_id FROM res r)"},
        # scalar subqueries, correlated by equalities or not, in WHERE, HAVING and SELECT (decorrelated)
        "scalar": {"sql": "SELECT c.src, (SELECT count(*) FROM link l WHERE l.src = c.src) AS n, "
                          "(SELECT max(l.dst) FROM link l) AS top FROM clink c WHERE c.cost > "
                          "(SELECT avg(x.cost) FROM clink x WHERE x.dst = c.dst AND x.src <> 'a')"},
        "scalar_having": {"sql": "SELECT src, sum(cost) AS s FROM clink GROUP BY src HAVING sum(cost) > "
                                 "(SELECT 0.1 * sum(cost) FROM clink) AND src <> (SELECT min(l.src) FROM link l "
                                 "WHERE l.dst = clink.src)"},
        "sets": {"sql": "WITH a AS (SELECT src FROM link) SELECT src FROM a UNION SELECT dst FROM link"},
        "hinted": {"sql": "SELECT /*+ BROADCAST(r) */ f.flight_id, r.seat FROM flight f JOIN res r "
                          "ON f.flight_id = r.flight_id"},
    }
    prog, _ = program(views)
    assert set(views) <= set(prog.predicates)


def _call(name: str) -> exp.Expression:
    """``name`` called with as many arguments as sqlglot's parser takes (1 to 3)."""
    for args in ("a", "a, b", "a, b, c"):
        try:
            return sqlglot.parse_one(f"SELECT {name}({args}) FROM t", read="spark").expressions[0]
        except sqlglot.errors.ParseError:
            continue
    raise AssertionError(f"{name}: no call of 1 to 3 arguments parses")


def test_the_lists_name_what_they_mean():
    """Every listed class is a sqlglot expression; nothing is both allowed and nondeterministic; each name
    in NAMED_FUNCTIONS parses to a call by that name (unmodelled, or a scalar class of that SQL name)
    and passes; every aggregate the compiler maps passes."""
    allowed = allowlist.QUERY + allowlist.SCALARS + allowlist.FUNCTIONS + allowlist.GENERATORS
    assert all(issubclass(c, exp.Expression) for c in allowed + allowlist.NONDETERMINISTIC)
    assert not set(allowed) & set(allowlist.NONDETERMINISTIC)
    assert not allowlist.NAMED_FUNCTIONS & allowlist.NONDETERMINISTIC_NAMES
    unknown = []
    for name in sorted(allowlist.NAMED_FUNCTIONS):
        node = _call(name)
        names = {n.lower() for n in type(node).sql_names()} if isinstance(node, exp.Func) else set()
        known = isinstance(node, (exp.Anonymous,) + allowlist.SCALARS + allowlist.FUNCTIONS) or name in names
        if not known or isinstance(node, exp.AggFunc) or allowlist.refusal(node, AGGREGATES, set()) is not None:
            unknown.append(f"{name}: {type(node).__name__}")
    assert unknown == []
    for cls, name in AGGREGATES.items():
        tree = sqlglot.parse_one(f"SELECT {name}(a) FROM t", read="spark")
        assert type(tree.expressions[0]) is cls or allowlist.refusal(tree, AGGREGATES, set()) is None, name
