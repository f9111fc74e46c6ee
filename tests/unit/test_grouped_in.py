"""ivm.lang.grouped_in's reading of [NOT] EXISTS / IN over GROUP BY / HAVING, checked as SQL: DuckDB runs the
query as written and as rewritten over drawn tables (NULLs, duplicates, empty groups; 150 drawn pairs,
no Spark) and must return the same rows. The change streams (tests/spark/test_counting.py) then check that
what the rewrite produces is maintained."""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify

from ivm.lang import grouped_in, scalar_subqueries
from tests.helpers import ROWS, SQL_VIEWS, TABLES

GROUPED = [name for name, sql in SQL_VIEWS.items()
           if any(k in name for k in ("grouped", "having", "any_group"))]
SCHEMA = {t: dict(spec["columns"]) for t, spec in TABLES.items() if t in ("r", "s")}


def _rewritten(sql: str) -> str:
    """The passes ivm.lang.sql runs, in its order: EXISTS over one group per outer row as its HAVING's value,
    scalar subqueries as joins, the other groupings through FROM."""
    tree = qualify(sqlglot.parse_one(sql, read="spark"), schema=SCHEMA, dialect="spark", quote_identifiers=False)
    return grouped_in.rewrite(scalar_subqueries.rewrite(grouped_in.exists_as_values(tree), "v")).sql(dialect="duckdb")


def _run(con, sql: str) -> Counter:
    return Counter(con.execute(sql).fetchall())


def test_the_library_names_the_rewritten_forms():
    assert {"v_exists_grouped_theta", "v_not_exists_having_outer", "v_exists_having_only", "v_exists_having_none",
            "v_not_exists_having_none", "v_exists_grouped_off", "v_not_exists_grouped_coalesce",
            "v_exists_having_outer", "v_in_grouped_correlated", "v_not_in_grouped_correlated",
            "v_any_grouped", "v_exists_grouped_two"} <= set(GROUPED)


@pytest.mark.parametrize("view", GROUPED)
def test_every_grouped_subquery_leaves_the_where_clause(view):
    """Each form the library maintains is read through a subquery in FROM: nothing reaches the compiler's
    refusal of GROUP BY / HAVING inside EXISTS (what the stream then maintains is the rewritten form)."""
    tree = sqlglot.parse_one(_rewritten(SQL_VIEWS[view]), read="duckdb")
    for exists in tree.find_all(exp.Exists):
        assert not any(exists.this.args.get(k) for k in ("group", "having")), view


@settings(max_examples=150, deadline=None)
@given(data=st.fixed_dictionaries({t: st.lists(ROWS[t], max_size=7) for t in ("r", "s")}))
def test_the_rewrite_returns_the_rows_of_the_query_as_written(data):
    con = duckdb.connect()
    for name in ("r", "s"):
        cols = ", ".join(f"{c} {'INTEGER' if t == 'int' else 'VARCHAR'}" for c, t in SCHEMA[name].items())
        con.execute(f"CREATE TABLE {name} ({cols})")
        if data[name]:
            con.executemany(f"INSERT INTO {name} VALUES (?, ?)", data[name])
    for view in GROUPED:
        assert _run(con, _rewritten(SQL_VIEWS[view])) == _run(con, SQL_VIEWS[view]), (view, data)
