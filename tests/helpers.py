"""Helpers the tests share: change files and Z-sets as Python values, the randomized change streams and
the view library the differential tests draw from, and small utilities (a free port, running the CLI).
Tests import them from here, never from one another."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import socket
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from ivm import Project
from ivm.catalog.store import PublishChange
from ivm.cli import main
from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain.recompute import Evaluator
from ivm.refresh import begin, load_plan, maintain_stage, plan, trim_stage
from ivm.storage import Scratch

small = st.one_of(st.none(), st.integers(0, 4))
names = st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))
nodes = st.sampled_from(["a", "b", "c", "d"])


ROWS = {
    "r": st.tuples(small, names),
    "s": st.tuples(names, small),
    "link": st.tuples(nodes, nodes),
    "clink": st.tuples(nodes, nodes, st.integers(1, 5)),
    "tournament": st.tuples(st.sampled_from(["yoda", "vader"]), st.sampled_from(["yoda", "vader", "palpatine"]),
                            st.sampled_from(["dagobah", "tatooine"])),
}


#: the column whose MIN/MAX the library aggregates, per table (deleting the extreme is drawn on purpose)
EXTREME = {"r": 0, "clink": 2}


def write_jsonl(path: Path, columns: list[str], rows: list[tuple], kinds: list[str] | None = None) -> str:
    """Rows as JSON lines, with ``_change_type`` when ``kinds`` is given (a change file)."""
    path.write_text("".join(json.dumps({**dict(zip(columns, r, strict=True)),
                                        **({"_change_type": kinds[i]} if kinds else {})}) + "\n"
                            for i, r in enumerate(rows)))
    return str(path)


@st.composite
def batch(draw, state: dict[str, list[tuple]]) -> dict[str, list[tuple[str, tuple]]]:
    """One commit per table: deletes of present rows (a duplicate loses one copy), updates (preimage and
    postimage), inserts (NULLs and duplicates included), and on purpose the deletion of the row holding
    the current MIN or MAX, or of a whole group."""
    out = {}
    for table, rows in state.items():
        present = list(rows)
        changes: list[tuple[str, tuple]] = []
        how = draw(st.sampled_from(["mixed", "extreme", "empty_group", "none"]))
        if how == "none":
            continue
        if how == "extreme" and table in EXTREME and any(r[EXTREME[table]] is not None for r in present):
            col = EXTREME[table]
            pick = (max if draw(st.booleans()) else min)(
                (r for r in present if r[col] is not None), key=lambda r: r[col])
            present.remove(pick)
            changes.append(("delete", pick))
        elif how == "empty_group" and present:
            key = draw(st.sampled_from(present))[-1]
            for r in [r for r in present if r[-1] == key]:
                present.remove(r)
                changes.append(("delete", r))
        for _ in range(draw(st.integers(0, 2))):
            if present:
                r = present.pop(draw(st.integers(0, len(present) - 1)))
                changes.append(("delete", r))
        for _ in range(draw(st.integers(0, 2))):
            if present:
                old = present.pop(draw(st.integers(0, len(present) - 1)))
                new = draw(ROWS[table])
                changes += [("update_preimage", old), ("update_postimage", new)]
        for _ in range(draw(st.integers(0, 3))):
            changes.append(("insert", draw(st.sampled_from(rows)) if rows and draw(st.booleans())
                            else draw(ROWS[table])))
        if changes:
            out[table] = changes
    return out


def apply_batch(state: dict[str, list[tuple]], changes: dict[str, list[tuple[str, tuple]]]) -> None:
    for table, items in changes.items():
        for kind, row in items:
            if kind in ("delete", "update_preimage"):
                state[table].remove(row)
            else:
                state[table].append(row)


def as_zset(rows) -> dict:
    out: Counter = Counter()
    for r in rows:
        out[tuple(norm(x) for x in r[:-1])] += r[-1]
    return dict(out)


def assert_close(got: dict, expected: dict, view: str) -> None:
    """Equal Z-sets, doubles compared to 1e-6 (incremental sums and sums of squares round differently)."""
    if got == expected:
        return

    def key(item):
        return tuple((0, round(x, 3)) if isinstance(x, float) else (1, str(x)) for x in item[0]) + (item[1],)

    a, b = sorted(got.items(), key=key), sorted(expected.items(), key=key)
    assert len(a) == len(b), f"{view}: {len(a)} rows, expected {len(b)}:\n{a}\n{b}"
    for (ra, ca), (rb, cb) in zip(a, b, strict=True):
        same = ca == cb and len(ra) == len(rb) and all(
            math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-6) if isinstance(x, float) and isinstance(y, float)
            else x == y for x, y in zip(ra, rb, strict=True))
        assert same, f"{view}: {ra} x{ca}, expected {rb} x{cb}"


#: change streams: every step runs Spark jobs, so one drawn example per run (`drawn_stream`; every CI
#: run draws a new one) and no shrinking (a failing example is printed as drawn)
STREAMS = settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck),
                   phases=(Phase.explicit, Phase.reuse, Phase.generate))


KEYED = {"emp": {"columns": {"id": "int", "dept": "string", "sal": "int"}, "key": ["id"]},
         "dept": {"columns": {"name": "string", "region": "string"}, "key": ["name"]}}


TABLES = {
    "r": {"columns": {"a": "int", "b": "string"}},
    "s": {"columns": {"b": "string", "c": "int"}},
    "link": {"columns": {"src": "string", "dst": "string"}},
    "clink": {"columns": {"src": "string", "dst": "string", "cost": "int"}},
    "tournament": {"columns": {"victor": "string", "defeated": "string", "location": "string"}},
}


#: view -> SQL run verbatim by both engines (views may read earlier views)
SQL_VIEWS = {
    "v_join": "SELECT r.a, s.c FROM r JOIN s ON r.b = s.b",
    "v_where": "SELECT a, b FROM r WHERE a > 1 OR b = 'x'",
    "v_distinct": "SELECT DISTINCT b FROM r",
    "v_agg": "SELECT b, count(*) AS n, count(a) AS na, sum(a) AS sa, min(a) AS mi, max(a) AS ma, avg(a) AS av "
             "FROM r GROUP BY b",
    "v_agg2": "SELECT b, count(DISTINCT a) AS d, var_samp(a) AS v, stddev_samp(a) AS sd FROM r GROUP BY b "
              "HAVING count(*) > 1",
    "v_global": "SELECT count(*) AS n, sum(a) AS total, max(a) AS m FROM r",
    "v_global_filtered": "SELECT count(*) AS n, sum(c) AS total FROM s WHERE c > 100",
    "v_union_all": "SELECT a FROM r UNION ALL SELECT c FROM s",
    "v_union": "SELECT a FROM r UNION SELECT c FROM s",
    "v_intersect": "SELECT b FROM r INTERSECT SELECT b FROM s",
    "v_except": "SELECT b FROM r EXCEPT SELECT b FROM s",
    # the ALL forms (ivm.lang.bag_set_operations), one inside the other: max(m - min(n, m), 0) copies, NULLs
    # compared equal
    "v_bag_setops": "SELECT a, b FROM r EXCEPT ALL (SELECT c, b FROM s INTERSECT ALL SELECT a, b FROM r)",
    "v_exists": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b)",
    "v_not_exists": "SELECT a, b FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.b = r.b AND s.c > 1)",
    "v_in": "SELECT a FROM r WHERE b IN (SELECT b FROM s)",
    # TPC-H Q18's shape: IN over GROUP BY / HAVING (ivm.lang.grouped_in), and NOT IN over an aggregate
    # that can be NULL (SQL's NOT IN then holds for no row)
    "v_in_grouped": "SELECT a, b FROM r WHERE b IN (SELECT b FROM s GROUP BY b HAVING sum(c) > 2)",
    "v_not_in_grouped": "SELECT a FROM r WHERE a NOT IN (SELECT max(c) FROM s GROUP BY b)",
    # [NOT] EXISTS over GROUP BY / HAVING (ivm.lang.grouped_in, #71): correlated on the grouping column, with
    # a filter before the grouping; and uncorrelated (true while any group passes)
    "v_exists_grouped": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b AND s.c > 0 "
                        "GROUP BY s.b HAVING count(*) > 1)",
    "v_not_exists_grouped": "SELECT a FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE r.b = s.b GROUP BY s.b "
                            "HAVING sum(c) > 2)",
    "v_exists_any_group": "SELECT a FROM r WHERE EXISTS (SELECT 1 FROM s GROUP BY b HAVING sum(c) > 3)",
    # correlated by a column it does not group by (the column joins the grouping)
    "v_exists_grouped_off": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.c = r.a GROUP BY s.b "
                            "HAVING count(*) > 1)",
    # correlated otherwise: by a comparison, and by HAVING (the grouping runs per outer value: the outer
    # table's distinct values join the subquery); and without GROUP BY, one group per outer row over no rows
    # too — a HAVING false there, and one true there (count(*) < 2: the outer rows without rows pass)
    "v_exists_grouped_theta": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.c > r.a GROUP BY s.b "
                              "HAVING count(*) > 1)",
    "v_not_exists_having_outer": "SELECT a, b FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.b = r.b "
                                 "GROUP BY s.c HAVING sum(s.c) > r.a)",
    "v_exists_having_only": "SELECT a FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b HAVING sum(s.c) > 2)",
    "v_exists_having_none": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b AND s.c > 0 "
                            "HAVING count(*) < 2)",
    "v_not_exists_having_none": "SELECT a FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.c = r.a "
                                "HAVING count(*) < 2)",
    # an outer column where a NULL finds rows (its values then correlate NULL-safe), and a HAVING whose value
    # over no rows reads the outer row (the EXISTS is that value, its aggregates scalar subqueries)
    "v_not_exists_grouped_coalesce": "SELECT a FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.c > coalesce(r.a, 1) "
                                     "GROUP BY s.b HAVING count(*) > 1)",
    "v_exists_having_outer": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b "
                             "HAVING count(*) < r.a)",
    # correlated by columns of two enclosing tables: their values as the enclosing query's FROM pairs them
    "v_exists_grouped_two": "SELECT r.a, s2.c FROM r JOIN s s2 ON r.b = s2.b WHERE EXISTS (SELECT 1 FROM s "
                            "WHERE s.c > r.a AND s.c < s2.c + 3 GROUP BY s.b HAVING count(*) > 1)",
    # a correlated IN, NOT IN and an ANY over GROUP BY: the [NOT] EXISTS of a group whose value answers them
    # (NOT IN: none equal, none NULL, or no group at all)
    "v_in_grouped_correlated": "SELECT a, b FROM r WHERE a IN (SELECT max(s.c) FROM s WHERE s.b <> r.b "
                               "GROUP BY s.b HAVING count(*) > 1)",
    "v_not_in_grouped_correlated": "SELECT a, b FROM r WHERE a NOT IN (SELECT max(s.c) FROM s WHERE s.b = r.b "
                                   "GROUP BY s.c)",
    "v_any_grouped": "SELECT a FROM r WHERE a > ANY (SELECT min(s.c) FROM s GROUP BY s.b HAVING count(*) > 1)",
    # scalar subqueries (ivm.lang.scalar_subqueries): correlated by equality or not, a count over no rows (0,
    # not NULL: the COUNT bug), a MAX in the SELECT list, an uncorrelated AVG; and in a GROUP BY query: inside
    # an aggregate's argument, read after the aggregation in SELECT and in HAVING
    "v_scalar": "SELECT a, b, (SELECT max(c) FROM s WHERE s.b = r.b) AS top FROM r "
                "WHERE a >= (SELECT count(*) FROM s WHERE s.b = r.b) AND a > (SELECT avg(c) FROM s) - 3",
    "v_scalar_agg": "SELECT b, sum(a + (SELECT count(*) FROM s WHERE s.b = r.b)) AS sa, "
                    "(SELECT min(c) FROM s WHERE s.b = r.b) AS lo FROM r GROUP BY b "
                    "HAVING sum(a) > (SELECT min(c) FROM s WHERE s.b = r.b)",
    "v_from_sub": "SELECT x.b, x.total FROM (SELECT b, sum(a) AS total FROM r GROUP BY b) x WHERE x.total > 2",
    "v_cte": "WITH big AS (SELECT * FROM s WHERE c >= 1) SELECT r.a, big.c FROM r JOIN big ON r.b = big.b",
    "v_over_view": "SELECT a, count(*) AS n FROM v_join GROUP BY a",
    "v_expr": "SELECT a + 1 AS a1, upper(b) AS ub, a * 2 - 1 AS odd FROM r",
    "v_selfjoin": "SELECT r1.a, r2.a AS a2 FROM r r1 JOIN r r2 ON r1.b = r2.b AND r1.a < r2.a",
    "v_group_expr": "SELECT a % 2 AS parity, sum(a) AS s FROM r GROUP BY a % 2",
    "v_any": "SELECT a, b FROM r WHERE a > ANY (SELECT c FROM s WHERE s.b = r.b)",
    "v_exists_theta": "SELECT a, b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.c > r.a)",
    "v_not_exists_theta": "SELECT a FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.b = r.b AND s.c <= r.a + 1)",
    # a correlation that holds where the outer column is NULL: the probe's NULL meets the semijoin NULL-safe
    # (with an equality beside it, which still meets no NULL), in NOT EXISTS and in an outer join's padding
    "v_not_exists_null_finds": "SELECT a, b FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.b = r.b "
                               "AND s.c > coalesce(r.a, 1))",
    "v_exists_null_finds": "SELECT a FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.c > coalesce(r.a, 2))",
    "v_left_null_finds": "SELECT r.a, s.c FROM r LEFT JOIN s ON s.c > coalesce(r.a, 1)",
    "v_in_null_finds": "SELECT a, b FROM r WHERE b IN (SELECT s.b FROM s WHERE s.c > coalesce(r.a, 1))",
    "v_not_in_null_finds": "SELECT a, b FROM r WHERE b NOT IN (SELECT s.b FROM s WHERE s.c > coalesce(r.a, 5))",
    "v_not_in": "SELECT a FROM r WHERE a NOT IN (SELECT c FROM s)",
    "v_not_in_correlated": "SELECT a, b FROM r WHERE a + 1 NOT IN (SELECT c FROM s WHERE s.b = r.b)",
    "v_left": "SELECT r.a, r.b, s.c FROM r LEFT JOIN s ON r.b = s.b",
    "v_left_cond": "SELECT r.a, s.c FROM r LEFT JOIN s ON r.b = s.b AND s.c > 1",
    "v_right": "SELECT r.a, s.b, s.c FROM r RIGHT JOIN s ON r.b = s.b",
    "v_full": "SELECT r.a, r.b, s.b AS sb, s.c FROM r FULL OUTER JOIN s ON r.b = s.b",
    # outer joins with any ON (#71): a condition on one side only, a non-equi one; and a RIGHT JOIN after an
    # inner join, whose padding asks which rows of that join match
    "v_full_one_side": "SELECT r.a, r.b, s.b AS sb, s.c FROM r FULL JOIN s ON r.b = s.b AND r.a > 1",
    "v_left_theta": "SELECT r.a, r.b, s.c FROM r LEFT JOIN s ON r.b = s.b AND s.c < r.a + 3",
    "v_right_theta": "SELECT r.a, s.b, s.c FROM r RIGHT JOIN s ON r.a < s.c AND s.c > 1",
    "v_inner_then_right": "SELECT r1.a, s.c FROM r r1 JOIN r r2 ON r1.b = r2.b AND r1.a < r2.a "
                          "RIGHT JOIN s ON r2.a = s.c",
    "v_left_agg": "SELECT r.b, count(s.c) AS n, count(*) AS m FROM r LEFT JOIN s ON r.b = s.b GROUP BY r.b",
    "v_left_is_null": "SELECT r.a FROM r LEFT JOIN s ON r.b = s.b WHERE s.b IS NULL",
    "v_left_chain": "SELECT l1.src, l2.dst, l3.dst AS d3 FROM link l1 LEFT JOIN link l2 ON l1.dst = l2.src "
                    "LEFT JOIN link l3 ON l2.dst = l3.src",
    "v_left_then_inner": "SELECT l1.src, l3.dst FROM link l1 LEFT JOIN link l2 ON l1.dst = l2.src "
                         "JOIN link l3 ON l3.src = l1.src",
    # a RIGHT / FULL JOIN after another outer join: the left side its matched and its padded rows — both
    # partners where ON names the preserved table (r2 finds its own row of r, with an s or without;
    # equality, and non-equi), none from the padded rows where it names the padded one (NULL matches nothing)
    "v_left_then_right": "SELECT r.a, s.c, r2.b AS b2 FROM r LEFT JOIN s ON r.b = s.b RIGHT JOIN r r2 ON r2.a = r.a",
    "v_left_then_full": "SELECT r.a, s.c, r2.a AS a2, r2.b AS b2 FROM r LEFT JOIN s ON r.b = s.b "
                        "FULL JOIN r r2 ON r2.a = r.a AND r2.b >= r.b",
    # (the right side's padding after a LEFT JOIN, by an ON that holds where the left side's padded NULL is)
    "v_left_then_full_null_finds": "SELECT r.a, s.c, r2.a AS a2 FROM r LEFT JOIN s ON r.b = s.b "
                                   "FULL JOIN r r2 ON r2.a > coalesce(s.c, 0)",
    "v_left_then_right_padded": "SELECT r.a, s.c, r2.b AS b2 FROM r LEFT JOIN s ON r.b = s.b "
                                "RIGHT JOIN r r2 ON r2.a = s.c",
}


#: view -> (Spark SQL, DuckDB SQL) where the dialects name a function differently
DIALECT_VIEWS = {
    "v_percentile": ("SELECT b, percentile(a, 0.5) AS p, median(a) AS med FROM r GROUP BY b",
                     "SELECT b, quantile_cont(a, 0.5), median(a) FROM r GROUP BY b"),
    # registered aggregates: a Spark SQL expression over the values, and a Python function of a list
    "v_uda": ("SELECT b, spread(a) AS sp, pylen(a) AS n, spread(DISTINCT a) AS spd FROM r GROUP BY b",
              "SELECT b, max(a) - min(a), count(a), max(a) - min(a) FROM r GROUP BY b"),
    # several non-distributive aggregates per view; MODE's ties go to the least value (Spark's deterministic
    # mode; DuckDB picks any, so its side says which one)
    "v_mode": ("SELECT b, mode(a) AS mo, count(DISTINCT a) AS d, median(a) AS med, pylen(a) AS n FROM r GROUP BY b",
               "SELECT r.b, m.mo, count(DISTINCT r.a), median(r.a), count(r.a) FROM r LEFT JOIN "
               "(SELECT b, min(a) AS mo FROM (SELECT b, a, count(*) AS n, max(count(*)) OVER (PARTITION BY b) AS mx "
               "FROM r WHERE a IS NOT NULL GROUP BY b, a) WHERE n = mx GROUP BY b) m ON r.b IS NOT DISTINCT FROM m.b "
               "GROUP BY r.b, m.mo"),
    # an aggregate's FILTER, count_if and count over two columns (rewritten by ivm.lang.aggregate_filters);
    # DuckDB's count takes one argument, and its count_if of only NULL conditions is NULL (Spark's: 0)
    "v_agg_filter": ("SELECT b, count(*) FILTER (WHERE a > 1) AS n1, sum(a) FILTER (WHERE a > 1) AS s1, "
                     "max(a) FILTER (WHERE a < 3) AS m1, count(DISTINCT a) FILTER (WHERE a <> 2) AS d1, "
                     "count_if(a > 2) AS c2, count(a, b) AS nab, count(DISTINCT a, b) AS dab, "
                     "avg(a) FILTER (WHERE a > 0) AS av1, min(a) FILTER (WHERE a > 1) AS mn1 FROM r GROUP BY b",
                     "SELECT b, count(*) FILTER (WHERE a > 1), sum(a) FILTER (WHERE a > 1), "
                     "max(a) FILTER (WHERE a < 3), count(DISTINCT a) FILTER (WHERE a <> 2), "
                     "count(*) FILTER (WHERE a > 2), count(a) FILTER (WHERE b IS NOT NULL), "
                     "count(DISTINCT a) FILTER (WHERE b IS NOT NULL), avg(a) FILTER (WHERE a > 0), "
                     "min(a) FILTER (WHERE a > 1) FROM r GROUP BY b"),
    "v_collect_set": ("SELECT b, collect_set(a) AS s FROM r GROUP BY b",
                      # Spark collects no values into an empty array, where SQL says NULL
                      "SELECT b, coalesce(list_sort(list(DISTINCT a) FILTER (WHERE a IS NOT NULL)), []::INTEGER[]) "
                      "FROM r GROUP BY b"),
}


#: 000's examples in Datalog, and the SQL DuckDB evaluates for each (set semantics)
DATALOG_VIEWS = {
    "hop": ("hop(X, Y) :- link(X, Z), link(Z, Y).",
            "SELECT DISTINCT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src"),
    "tri_hop": ("tri_hop(X, Y) :- hop(X, Z), link(Z, Y).",
                "SELECT DISTINCT h.x, l.dst FROM hop h JOIN link l ON h.y = l.src"),
    "only_tri_hop": ("only_tri_hop(X, Y) :- tri_hop(X, Y), not hop(X, Y).",
                     "SELECT DISTINCT * FROM tri_hop t WHERE NOT EXISTS "
                     "(SELECT 1 FROM hop h WHERE h.x = t.x AND h.y = t.y)"),
    "min_cost_hop": ("cost_hop(S, D, C1 + C2) :- clink(S, I, C1), clink(I, D, C2).\n"
                     "min_cost_hop(S, D, M) :- groupby(cost_hop(S, D, C), [S, D], M = min(C)).",
                     "SELECT s, d, min(c) AS m FROM (SELECT DISTINCT l1.src AS s, l2.dst AS d, "
                     "l1.cost + l2.cost AS c FROM clink l1 JOIN clink l2 ON l1.dst = l2.src) GROUP BY s, d"),
    # 001 §2: aggregates over sets built by setof
    "victories": ("victories(V, W) :- setof(D, tournament(V, D, L), S), count(S, W).",
                  "SELECT DISTINCT victor, count(DISTINCT defeated) FROM tournament GROUP BY victor, location"),
    "dominates": ("dominates(V, W) :- setof(D, tournament(V, D, L), W).",
                  "SELECT DISTINCT victor, list_sort(list(DISTINCT defeated)) FROM tournament "
                  "GROUP BY victor, location"),
    "cost_range": ("cost_range(S, Lo, Hi, T) :- setof(C, clink(S, D, C), X), min(X, Lo), max(X, Hi), sum(X, T).",
                   "SELECT DISTINCT src, min(cost), max(cost), sum(DISTINCT cost) FROM clink GROUP BY src, dst"),
    "yoda_wins": ("yoda_wins(N) :- setof((D, L), tournament(yoda, D, L), S), count(S, N).",
                  "SELECT count(*) FROM (SELECT DISTINCT defeated, location FROM tournament WHERE victor = 'yoda')"),
    "cost_spread": ("cost_spread(S, W, N) :- setof(C, clink(S, D, C), X), spread(X, W), pylen(X, N).",
                    "SELECT DISTINCT src, max(cost) - min(cost), count(DISTINCT cost) FROM clink GROUP BY src, dst"),
    # 001 §4: two setof subgoals, one auxiliary view each
    "rivals": ("rivals(V, W1, W2) :- setof(D, tournament(V, D, L), W1), setof(L2, tournament(V, yoda, L2), W2).",
               "SELECT DISTINCT a.victor, a.s1, b.s2 FROM (SELECT victor, list_sort(list(DISTINCT defeated)) AS s1 "
               "FROM tournament GROUP BY victor, location) a JOIN (SELECT victor, list_sort(list(DISTINCT location)) "
               "AS s2 FROM tournament WHERE defeated = 'yoda' GROUP BY victor) b ON a.victor = b.victor"),
    # 001 §3 Case 1: every outer variable in the head
    "dominates_at": ("dominates_at(V, L, W) :- setof(D, tournament(V, D, L), W).",
                     "SELECT victor, location, list_sort(list(DISTINCT defeated)) FROM tournament "
                     "GROUP BY victor, location"),
    # NULL elements: a set holds none, and a binding whose only elements are NULL has no set
    "r_sets": ("r_sets(B, S) :- setof(A, r(A, B), S).",
               "SELECT b, list_sort(list(DISTINCT a)) FROM r WHERE a IS NOT NULL GROUP BY b"),
    "cost_median": ("cost_median(S, M) :- setof(C, clink(S, D, C), X), median(X, M).",
                    "SELECT DISTINCT src, median(cost) FROM (SELECT DISTINCT src, dst, cost FROM clink) "
                    "GROUP BY src, dst"),
    "cost_spread_g": ("cost_spread_g(S, D, W) :- groupby(clink(S, D, C), [S, D], W = spread(C)).",
                      "SELECT DISTINCT src, dst, max(cost) - min(cost) FROM clink GROUP BY src, dst"),
    "reachable_pairs": ("reachable_pairs(X, Y) :- link(X, Y), X != Y.\nreachable_pairs(X, Y) :- hop(X, Y).",
                        "SELECT src, dst FROM link WHERE src <> dst UNION SELECT * FROM hop"),
}


AGGREGATES = {"spread": {"sql": "array_max(vals) - array_min(vals)"},
              "pylen": {"python": "builtins:len", "returns": "bigint"}}


PROJECT = parse_project({
    "tables": TABLES,
    "aggregates": AGGREGATES,
    "views": {**{n: {"sql": q} for n, q in SQL_VIEWS.items()},
              **{n: {"sql": q} for n, (q, _) in DIALECT_VIEWS.items()},
              **{n: {"datalog": d} for n, (d, _) in DATALOG_VIEWS.items()}},
})


PROGRAM = compile_project(PROJECT)


def norm(v):
    if isinstance(v, list):  # a set, as the sorted array Spark holds and the sorted list DuckDB returns
        return tuple(norm(x) for x in v)
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    return v


def rows(values) -> Counter:
    return Counter(tuple(norm(v) for v in r) for r in values)


def duckdb_views(data, extra: dict[str, str] | None = None) -> dict[str, Counter]:
    """Every library view (and ``extra`` ones: name -> SQL) evaluated by DuckDB over ``data``."""
    con = duckdb.connect()
    types = {"int": "INTEGER", "string": "VARCHAR"}
    for name, table in TABLES.items():
        cols = ", ".join(f"{c} {types[t]}" for c, t in table["columns"].items())
        con.execute(f"CREATE TABLE {name} ({cols})")
        if data[name]:
            marks = ", ".join("?" * len(table["columns"]))
            con.executemany(f"INSERT INTO {name} VALUES ({marks})", data[name])
    out = {}
    for view, sql in [*SQL_VIEWS.items(), *((n, q) for n, (_, q) in DIALECT_VIEWS.items()),
                      *((n, q) for n, (_, q) in DATALOG_VIEWS.items())]:
        cols = PROGRAM.predicates[view].columns
        con.execute(f"CREATE VIEW {view} ({', '.join(cols)}) AS {sql}")
        out[view] = rows(con.execute(f"SELECT * FROM {view}").fetchall())
    for view, sql in (extra or {}).items():
        out[view] = rows(con.execute(sql).fetchall())
    return out


def lines(path, rows, change=None, cols=("victor", "defeated", "location")):
    path.write_text("".join(json.dumps({**dict(zip(cols, r, strict=True)),
                                        **({"_change_type": change} if change else {})}) + "\n" for r in rows))
    return str(path)


def corrupt(p: Project, view: str, bad) -> None:
    """Publish a wrong delta layer into ``view`` (what a maintenance bug would leave behind)."""
    df = bad(p.read_zset(view).limit(1))
    layer = p.warehouse.write_layer(df, view, "delta")
    p.catalog.publish("corrupt", [PublishChange(view, p.catalog.state(view).version_id, [layer])], {})


REPO = Path(__file__).resolve().parents[1]


BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on loopback (held open together while chosen, so no two are the same)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port() -> int:
    return free_ports(1)[0]


def zset(rows) -> Counter:
    return Counter({tuple(tuple(x) if isinstance(x, list) else x for x in r[:-1]): r[-1] for r in rows})


def assert_views_recomputed(project: Project) -> None:
    program, strata = project.program
    full = Evaluator(program, strata, {t: project.read_zset(t) for t in project.config.tables},
                     scratch=Scratch(project.warehouse, project.spark, "check"))  # reach: a fixpoint's rounds
    for view in project.config.views:
        assert zset(project.read_zset(view).collect()) == zset(full.relation(view).collect()), view


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


KEYED_ROWS = {"emp": st.tuples(st.one_of(st.none(), st.sampled_from(["x", "y"])),
                               st.one_of(st.none(), st.integers(0, 3))),
              "dept": st.tuples(st.one_of(st.none(), st.sampled_from(["n", "s"]))),
              "mgr": st.tuples(st.one_of(st.none(), st.integers(1, 5)))}


KEYS = {"emp": range(1, 7), "dept": ["x", "y", "z"], "mgr": range(1, 6)}


@st.composite
def keyed_state(draw, tables: dict = KEYED) -> dict[str, dict]:
    return {t: {k: draw(KEYED_ROWS[t]) for k in draw(st.sets(st.sampled_from(list(KEYS[t]))))} for t in tables}


@st.composite
def keyed_batch(draw, state: dict[str, dict], truncates: bool = False) -> dict[str, list[tuple[str, tuple]]]:
    """Per table, each key at most once: insert an absent key, delete or update (new non-key values,
    key kept) a present one. A delete's or preimage's image is the whole stored row, or — as a CDC
    producer sends it by default (PostgreSQL's replica identity, MySQL's minimal row image) — the key
    alone, its other columns NULL (#69): drawn per change, so a batch mixes both. ``truncates``: now and
    then a table's batch opens with a truncate ``("truncate", None)``, its changes then drawn against
    an empty table."""
    out = {}
    for table, rows in state.items():
        changes = []
        if truncates and rows and draw(st.integers(0, 5)) == 0:
            changes, rows = [("truncate", None)], {}
        for k in draw(st.sets(st.sampled_from(list(KEYS[table])))):
            before = (k, *rows[k]) if k in rows else None
            if before is not None and draw(st.booleans()):  # (the key alone)
                before = (k, *[None] * len(rows[k]))
            if k not in rows:
                changes.append(("insert", (k, *draw(KEYED_ROWS[table]))))
            elif draw(st.booleans()):
                changes.append(("delete", before))
            else:
                changes += [("update_preimage", before), ("update_postimage", (k, *draw(KEYED_ROWS[table])))]
        if changes:
            out[table] = changes
    return out


def write_debezium(path: Path, columns: list[str], changes: list[tuple[str, tuple | None]], lsn: int) -> str:
    """A keyed batch (`keyed_batch`) as Debezium's PostgreSQL connector sends it, one transaction at
    ``lsn``: c with its after image, d with its before image (whole or the key alone: replica identity
    DEFAULT), u with both images — or with ``before: null`` when the preimage is the key alone, as the
    connector sends an update under replica identity DEFAULT — and t (a truncate) with none."""
    def image(row):
        return None if row is None else dict(zip(columns, row, strict=True))

    events, pending = [], None
    for kind, row in changes:
        if kind == "update_preimage":
            pending = row
            continue
        op = {"insert": "c", "delete": "d", "update_postimage": "u", "truncate": "t"}[kind]
        before = row if op == "d" else pending if op == "u" else None
        if op == "u" and all(v is None for v in pending[1:]):
            before = None
        events.append({"op": op, "before": image(before), "after": image(row) if op in ("c", "u") else None,
                       "source": {"lsn": lsn, "connector": "postgresql"}, "ts_ms": 1_700_000_000_000})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


KV_TABLES = {"t": {"columns": {"k": "string", "v": "int"}}, "u": {"columns": {"k": "string", "w": "int"}}}


def views(policy: str = "fail") -> dict:
    check = {"sample": 1000, "policy": policy}
    return {"per_k": {"sql": "SELECT k, count(*) AS n, sum(v) AS s FROM t GROUP BY k", "key": ["k"],
                      "validate": {**check, "expectations": [
                          {"type": "expect_column_values_to_be_between", "kwargs": {"column": "n", "min_value": 1}}]}},
            "joined": {"sql": "SELECT t.k, t.v, u.w FROM t JOIN u ON t.k = u.k", "validate": check}}


def load_and_change(p: Project, folder: Path) -> None:
    """Load t and u, refresh, and append a change to t."""
    p.load("t", lines(folder / "t.jsonl", [("a", 1), ("a", 2), ("b", 3), ("c", 4)], cols=("k", "v")))
    p.load("u", lines(folder / "u.jsonl", [("a", 10), ("b", 20)], cols=("k", "w")))
    p.refresh()
    p.append("t", lines(folder / "c1.jsonl", [("a", 5), ("d", 6)], "insert", cols=("k", "v")))


def inject(p: Project, run_id: str) -> None:
    """Into per_k's staged delta: a row the view does not have (zz), the removal of a row it has (c),
    and a second copy of a row it has (b)."""
    plan, _ = load_plan(p.ctx, run_id)
    delta = next(w for w in plan.views if w.view == "per_k").layers["per_k"]
    rows = p.read_zset("per_k").where(F.col("k").isin("b", "c"))
    bad = rows.withColumn("__count", F.when(F.col("k") == "c", -1).otherwise(1).cast("long")).unionByName(
        rows.limit(1).withColumn("k", F.lit("zz")))
    bad.write.mode("append").parquet(delta.path)


def staged_delta(p: Project, run_id: str, view: str):
    """Plan, trim and maintain run ``run_id``; the delta layer it staged for ``view``."""
    begin(p.ctx, plan(p.ctx, run_id=run_id))
    trim_stage(p.ctx, run_id)
    maintain_stage(p.ctx, run_id)
    staged, _ = load_plan(p.ctx, run_id)
    return next(w for w in staged.views if w.view == view).layers[view]


def stage_up_to_validate(p: Project, run_id: str) -> None:
    staged_delta(p, run_id, "per_k")
    inject(p, run_id)


# -- a table of realistic types, and change streams over it (the window-function and inductive-aggregate
#    differential tests) -------------------------------------------------------------------------------

SALES = {"id": "bigint", "region": "string", "day": "date", "ts": "timestamp", "amount": "decimal(12,2)",
         "price": "double", "qty": "int"}
SALES_ARROW = pa.schema([("id", pa.int64()), ("region", pa.string()), ("day", pa.date32()),
                         ("ts", pa.timestamp("us")), ("amount", pa.decimal128(12, 2)), ("price", pa.float64()),
                         ("qty", pa.int32())])
SALES_DUCK = "id BIGINT, region VARCHAR, day DATE, ts TIMESTAMP, amount DECIMAL(12,2), price DOUBLE, qty INTEGER"

sale = st.builds(
    lambda region, day, hour, cents, price, qty: {
        "region": region, "day": None if day is None else dt.date(2024, 3, 1) + dt.timedelta(days=day),
        "ts": None if hour is None else dt.datetime(2024, 3, 1, hour, 30),
        "amount": None if cents is None else Decimal(cents).scaleb(-2), "price": price, "qty": qty},
    st.sampled_from(["east", "west", None]), st.one_of(st.none(), st.integers(0, 3)),
    st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(-500, 99999)),
    st.one_of(st.none(), st.sampled_from([0.5, 1.25, 3.0, 10.1])), st.one_of(st.none(), st.integers(-1, 5)))


@st.composite
def sales_batch(draw, state: list[dict], ids, extreme) -> list[tuple[str, dict]]:
    """One commit of sales: deletes (a duplicate loses one copy), key-preserving updates of rows held
    once, inserts with fresh ids (and exact copies of rows kept), and on purpose a region's extreme row (``extreme``:
    the column and the key of max()) or a whole region deleted."""
    present = list(state)
    changes: list[tuple[str, dict]] = []
    how = draw(st.sampled_from(["mixed", "extreme", "region"]))
    column, key = extreme
    candidates = [r for r in present if r[column] is not None]
    if how == "extreme" and candidates:
        region = draw(st.sampled_from(candidates))["region"]
        top = max((r for r in candidates if r["region"] == region), key=key)
        present.remove(top)
        changes.append(("delete", top))
    elif how == "region" and present:
        region = draw(st.sampled_from(present))["region"]
        for r in [r for r in present if r["region"] == region]:
            present.remove(r)
            changes.append(("delete", r))
    for _ in range(draw(st.integers(0, 2))):
        if present:
            changes.append(("delete", present.pop(draw(st.integers(0, len(present) - 1)))))
    for _ in range(draw(st.integers(0, 2))):
        once = [r for r in present if present.count(r) == 1]
        if once:
            old = draw(st.sampled_from(once))
            present.remove(old)
            changes += [("update_preimage", old), ("update_postimage", {**draw(sale), "id": old["id"]})]
    # (a copy is of a row that stays as it is: a copy of a row this batch updates would share its id with
    # other values, and ``id`` orders the windows' rows totally only up to exact duplicates)
    for _ in range(draw(st.integers(0, 3))):
        copy = present and draw(st.booleans())
        changes.append(("insert", dict(draw(st.sampled_from(present))) if copy else {**draw(sale), "id": next(ids)}))
    return changes


def write_sales(path, rows: list[dict], kinds: list[str] | None = None) -> str:
    """Sales rows as Parquet, with ``_change_type`` when ``kinds`` is given (a change file)."""
    table = pa.Table.from_pylist(rows, schema=SALES_ARROW)
    if kinds:
        table = table.append_column("_change_type", pa.array(kinds, pa.string()))
    pq.write_table(table, path)
    return str(path)


def apply_sales(state: list[dict], changes: list[tuple[str, dict]]) -> None:
    for kind, r in changes:
        if kind in ("delete", "update_preimage"):
            state.remove(r)
        else:
            state.append(r)


def duckdb_sales(state: list[dict], views: dict[str, str]) -> dict[str, Counter]:
    """Each view's SQL run by DuckDB over the sales rows."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE sales ({SALES_DUCK})")
    if state:
        con.executemany("INSERT INTO sales VALUES (?, ?, ?, ?, ?, ?, ?)", [tuple(r[c] for c in SALES) for r in state])
    return {v: Counter(tuple(norm(x) for x in r) for r in con.execute(sql).fetchall()) for v, sql in views.items()}


def sales_stream(data, make_project, root: Path, views: list[str], extreme, check) -> None:
    """The change-stream test over sales: an initial load, three drawn batches refreshed one by one
    (``check(project, rows)`` after each, returning the views' Z-sets), then a second project that
    receives every batch before one refresh, which must end equal."""
    ids = iter(range(1, 10_000))
    initial = [{**r, "id": next(ids)} for r in data.draw(st.lists(sale, min_size=3, max_size=10), "initial")]
    one = make_project(root / "batch-by-batch")
    one.load("sales", write_sales(root / "sales-0.parquet", initial))
    assert {v.mode for v in one.refresh().views} == {"full"}
    final = check(one, initial)
    state, batches = list(initial), []
    for n in range(1, 4):
        changes = data.draw(sales_batch(state, ids, extreme), f"batch {n}")
        batches.append(changes)
        apply_sales(state, changes)
        if changes:
            one.append("sales", write_sales(root / f"sales-{n}.parquet", [r for _, r in changes],
                                            [k for k, _ in changes]))
        result = one.refresh()
        assert result.status == ("succeeded" if changes else "noop"), (result.status, changes)
        assert {v.mode for v in result.views} <= {"incremental", "noop"}
        final = check(one, state)
    everything = make_project(root / "all-at-once")
    everything.load("sales", write_sales(root / "sales-0.parquet", initial))
    everything.refresh()
    for n, changes in enumerate(batches, 1):
        if changes:
            everything.append("sales", write_sales(root / f"all-{n}.parquet", [r for _, r in changes],
                                                   [k for k, _ in changes]))
    assert {v.mode for v in everything.refresh().views} <= {"incremental", "noop"}
    for view in views:
        assert_close(as_zset(everything.read_zset(view).collect()), final[view], view)



def plan_text(df, mode: str = "simple") -> str:
    """``df``'s plan as Spark's ``explain`` prints it, through the DataFrame API alone (classic and Spark
    Connect sessions alike): ``simple``, the physical plan; ``extended``, every plan from the parsed one."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain(mode=mode)
    return out.getvalue()


def optimized_plan(df) -> list[str]:
    """The lines of ``df``'s optimized logical plan (from `plan_text`'s extended form)."""
    text = plan_text(df, "extended")
    section = text.split("== Optimized Logical Plan ==", 1)[1].split("== Physical Plan ==", 1)[0]
    return [line for line in section.splitlines() if line.strip()]
