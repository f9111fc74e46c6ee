"""Chained projects (#67 item 2): a project whose sources are another project's views — a keyed view and a
keyless bag by their Delta tables' paths, a set by its name in the Spark catalog — maintains its own views
incrementally from the change data feeds of the upstream views' tables (ivm.sinks writes only the rows
that change). On a randomized change stream of the upstream base table (inserts, deletes, updates, NULLs,
duplicates, the MIN/MAX deleted, emptied groups), after every refresh of both, each downstream view equals
its recompute and DuckDB's result of the composed SQL over the upstream base rows."""

from __future__ import annotations

from collections import Counter

import duckdb
from hypothesis import given
from hypothesis import strategies as st

from ivm import sinks
from tests.conftest import drawn_stream
from tests.helpers import STREAMS, apply_batch, assert_views_recomputed, batch, norm, write_jsonl

UPSTREAM = {
    # keyed (a GROUP BY with its key declared)
    "per_b": {"sql": "SELECT b, count(*) AS n, sum(a) AS total FROM r WHERE b IS NOT NULL GROUP BY b", "key": ["b"]},
    # a set (SELECT DISTINCT): each row once
    "vals": {"sql": "SELECT DISTINCT a FROM r WHERE a IS NOT NULL"},
    # a keyless bag: a row as often as r holds it
    "bs": {"sql": "SELECT b FROM r"},
}
DOWNSTREAM = {
    "joined": {"sql": "SELECT p.b, p.n, count(*) AS copies FROM per_b p JOIN bs ON p.b = bs.b GROUP BY p.b, p.n",
               "key": ["b"]},
    "big_vals": {"sql": "SELECT a FROM vals WHERE a > 1"},
    "per_bs": {"sql": "SELECT b, count(*) AS c FROM bs GROUP BY b"},
}


def duck(rows: list[tuple]) -> dict[str, Counter]:
    """The downstream views over the upstream views over ``rows``, by DuckDB."""
    con = duckdb.connect()
    con.execute("CREATE TABLE r (a INTEGER, b VARCHAR)")
    if rows:
        con.executemany("INSERT INTO r VALUES (?, ?)", rows)
    for view, spec in UPSTREAM.items():
        con.execute(f"CREATE VIEW {view} AS {spec['sql']}")
    return {v: Counter(tuple(norm(x) for x in r) for r in con.execute(spec["sql"]).fetchall())
            for v, spec in DOWNSTREAM.items()}


@STREAMS
@given(data=st.data())
def test_a_project_over_another_projects_views_keeps_them_incrementally(make_project, tmp_path_factory, data):
    drawn_stream(data)
    root = tmp_path_factory.mktemp("chained")
    up = make_project({"r": {"columns": {"a": "int", "b": "string"}}}, root=root / "up", name="upstream",
                      views=UPSTREAM, storage={"delta_views": True})
    where = {v: sinks.location(up.ctx, v) for v in UPSTREAM}
    down = make_project({
        "per_b": {"columns": {"b": "string", "n": "bigint", "total": "bigint"}, "key": ["b"],
                  "source": {"delta": where["per_b"]}},
        "vals": {"columns": {"a": "int"}, "key": ["a"], "source": {"table": "upstream.vals"}},
        "bs": {"columns": {"b": "string"}, "source": {"delta": where["bs"]}},
    }, root=root / "down", name="downstream", views=DOWNSTREAM)
    state = {"r": data.draw(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 4)),
                                               st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))),
                                     max_size=8), "r")}
    up.load("r", write_jsonl(root / "r.jsonl", ["a", "b"], state["r"]))
    for n in range(4):
        if n:
            changes = data.draw(batch(state), f"batch {n}")
            if "r" in changes:
                kinds, rows = zip(*changes["r"], strict=True)
                up.append("r", write_jsonl(root / f"c{n}.jsonl", ["a", "b"], list(rows), list(kinds)))
            apply_batch(state, changes)
        up.refresh()
        result = down.refresh()
        if n:  # (the first materializes them)
            assert {v.mode for v in result.views} <= {"incremental", "noop"}, result.views
        assert_views_recomputed(down)
        expected = duck(state["r"])
        for view in DOWNSTREAM:
            ours = Counter(tuple(norm(x) for x in r) for r in down.read(view).collect())
            assert ours == expected[view], f"batch {n}, {view}: ivm {ours} != DuckDB {expected[view]}"
