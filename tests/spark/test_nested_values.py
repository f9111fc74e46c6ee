"""Views over arrays held by value (LATERAL VIEW explode / inline, 002 §2.2's extraction), evaluated
on Spark and compared with DuckDB's UNNEST over the same rows."""

from __future__ import annotations

from collections import Counter

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain.recompute import Evaluator
from ivm.stratify import stratify
from ivm.zset import as_used, expand

TABLES = {"emp": {"columns": {"id": "int", "kids": "array<struct<name: string, age: int>>",
                              "tags": "array<string>"}}}
#: view -> (Spark SQL, DuckDB SQL)
VIEWS = {
    "tags": ("SELECT e.id, t FROM emp e LATERAL VIEW explode(e.tags) x AS t",
             "SELECT e.id, x.t FROM emp e, unnest(e.tags) AS x(t)"),
    "kids": ("SELECT e.id, x.k.name AS name, x.k.age AS age FROM emp e LATERAL VIEW explode(e.kids) x AS k "
             "WHERE x.k.age > 1",
             "SELECT e.id, x.k.name, x.k.age FROM emp e, unnest(e.kids) AS x(k) WHERE x.k.age > 1"),
    "kids_inline": ("SELECT e.id, x.name, x.age FROM emp e LATERAL VIEW inline(e.kids) x AS name, age",
                    "SELECT e.id, x.k.name, x.k.age FROM emp e, unnest(e.kids) AS x(k)"),
    "tags_outer": ("SELECT e.id, t FROM emp e LATERAL VIEW OUTER explode(e.tags) x AS t",
                   "SELECT e.id, x.t FROM emp e LEFT JOIN LATERAL (SELECT unnest(e.tags) AS t) x ON true"),
    "tags_select": ("SELECT id, explode(tags) AS t FROM emp",
                    "SELECT e.id, x.t FROM emp e, unnest(e.tags) AS x(t)"),
    "tags_select_outer": ("SELECT id, explode_outer(tags) AS t FROM emp",
                          "SELECT e.id, x.t FROM emp e LEFT JOIN LATERAL (SELECT unnest(e.tags) AS t) x ON true"),
    "per_name": ("SELECT x.k.name AS name, count(*) AS n, sum(x.k.age) AS total FROM emp e "
                 "LATERAL VIEW explode(e.kids) x AS k GROUP BY x.k.name",
                 "SELECT x.k.name, count(*), sum(x.k.age) FROM emp e, unnest(e.kids) AS x(k) GROUP BY x.k.name"),
}
PROJECT = parse_project({"tables": TABLES, "views": {v: {"sql": q} for v, (q, _) in VIEWS.items()}})
PROGRAM = compile_project(PROJECT)
STRATA = stratify(PROGRAM)

kid = st.tuples(st.one_of(st.none(), st.sampled_from(["ann", "bo"])), st.one_of(st.none(), st.integers(0, 4)))
ROWS = st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.lists(kid, max_size=3)),
                          st.one_of(st.none(), st.lists(st.sampled_from(["x", "y"]), max_size=3))), max_size=5)


def ours(spark, rows) -> dict[str, Counter]:
    df = spark.createDataFrame(rows, PROJECT.tables["emp"].ddl())
    ev = Evaluator(PROGRAM, STRATA, {"emp": df.groupBy(*df.columns).count().withColumnRenamed("count", "__count")})
    return {v: Counter(tuple(r) for r in expand(as_used(PROGRAM.predicates[v], ev.relation(v))).collect())
            for v in VIEWS}


def theirs(rows) -> dict[str, Counter]:
    con = duckdb.connect()
    con.execute("CREATE TABLE emp (id INTEGER, kids STRUCT(name VARCHAR, age INTEGER)[], tags VARCHAR[])")
    for i, kids, tags in rows:
        con.execute("INSERT INTO emp VALUES (?, ?, ?)",
                    [i, None if kids is None else [{"name": n, "age": a} for n, a in kids], tags])
    return {v: Counter(tuple(r) for r in con.execute(q).fetchall()) for v, (_, q) in VIEWS.items()}


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS)
def test_unnest_matches_duckdb(spark, rows):
    got, want = ours(spark, rows), theirs(rows)
    for v in VIEWS:
        assert got[v] == want[v], v


def test_unnest_rule_and_analysis():
    from ivm.analysis import analyse

    [rule] = PROGRAM.rules_for("tags")  # 002 §2.2 (1): the parent and its unnest are one extraction literal
    assert str(rule) == "tags(e_id_1, x_t_1) :- e_emp_tags(e_id_1, x_t_1)."
    [extraction] = PROGRAM.rules_for("e_emp_tags")
    assert str(extraction) == "e_emp_tags(C0, E1) :- emp(C0, C1, C2), explode(`C2`) AS (E1)."
    assert PROGRAM.predicates["e_emp_tags"].kind == "extraction"
    # the outer form is its own extraction (a row with an empty array keeps a NULL element)
    [outer] = PROGRAM.rules_for("tags_outer")
    assert "explode_outer" in str(PROGRAM.rules_for(outer.body[0].atom.pred)[0])
    assert "unnests a nested collection" in analyse(PROGRAM, "tags").reason
