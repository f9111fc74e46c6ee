"""The counting algorithm end to end (000 §4-6), differentially: the view library of test_recompute (every
nonrecursive construct, 000's hop/tri_hop/only_tri_hop/min_cost_hop, 001's setof views) is materialized,
then hypothesis draws change batches — inserts, deletes, updates, NULLs, duplicate rows, deletes of the
current MIN/MAX, whole groups emptied — and after every incremental refresh each view must equal

  (a) the full recomputation (what ``--mode full`` writes) over the same base state, derivation counts
      included, and
  (b) DuckDB running the same SQL over the same rows;

and a second project that receives all batches before one refresh must end with identical views.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm.maintain.counting import Counting
from ivm.maintain.recompute import Evaluator
from ivm.maintain.states import RunStates
from ivm.storage import Scratch, Warehouse
from tests.conftest import drawn_stream
from tests.helpers import (
    AGGREGATES,
    DATALOG_VIEWS,
    DIALECT_VIEWS,
    KEYED,
    ROWS,
    SQL_VIEWS,
    STREAMS,
    TABLES,
    apply_batch,
    as_zset,
    assert_close,
    batch,
    duckdb_views,
    keyed_batch,
    keyed_state,
    norm,
    write_debezium,
    write_jsonl,
)

VIEWS = {**{n: {"sql": q} for n, q in SQL_VIEWS.items()},
         **{n: {"sql": q} for n, (q, _) in DIALECT_VIEWS.items()},
         **{n: {"datalog": d} for n, (d, _) in DATALOG_VIEWS.items()},
         # 004's running example: a projection of a three-way join, set semantics
         "v_004": {"sql": "SELECT DISTINCT r.a, s.c, l.dst FROM r JOIN s ON r.b = s.b JOIN clink l ON s.c = l.cost"},
         # 001: a setof maintained without CReaM's auxiliary view (the touched groups re-read)
         "dominates_plain": {"datalog": DATALOG_VIEWS["dominates"][0].replace("dominates", "dominates_plain"),
                             "auxiliary_views": False}}
DUCK_EXTRA = {"v_004": "SELECT DISTINCT r.a, s.c, l.dst FROM r JOIN s ON r.b = s.b JOIN clink l ON s.c = l.cost",
              "dominates_plain": DATALOG_VIEWS["dominates"][1]}









def append_batch(project, root: Path, n: int, changes: dict) -> None:
    for table, items in changes.items():
        cols = list(TABLES[table]["columns"])
        project.append(table, write_jsonl(root / f"{table}-{n}.jsonl", cols, [r for _, r in items],
                                     [k for k, _ in items]))


def load(project, root: Path, data: dict[str, list[tuple]]) -> None:
    for table, rows in data.items():
        cols = list(TABLES[table]["columns"])
        project.load(table, write_jsonl(root / f"{table}-0.jsonl", cols, rows))


def zsets(project) -> dict[str, dict]:
    """Every view as {row: derivation count}, straight from its stored layers."""
    return {v: as_zset(project.read_zset(v).collect()) for v in VIEWS}




def recomputed(project) -> dict[str, dict]:
    """Every view recomputed in full from the published base tables (the plan ``--mode full`` runs)."""
    program, strata = project.program
    ev = Evaluator(program, strata, {t: project.read_zset(t) for t in TABLES})
    return {v: as_zset(ev.relation(v).collect()) for v in VIEWS}


def as_bags(project, zs: dict[str, dict]) -> dict[str, Counter]:
    """What SQL returns for each view: bag views repeat a row ``count`` times, set views once."""
    program, _ = project.program
    return {v: Counter({row: (1 if program.predicates[v].semantics == "set" else c) for row, c in z.items()})
            for v, z in zs.items()}




def check(project, state: dict[str, list[tuple]]) -> dict[str, dict]:
    ours = zsets(project)
    full = recomputed(project)
    theirs = duckdb_views(state, DUCK_EXTRA)
    bags = as_bags(project, ours)
    for view in VIEWS:
        assert_close(ours[view], full[view], view)
        assert_close(dict(bags[view]), dict(theirs[view]), view)
    return ours




@pytest.mark.e2e
@STREAMS  # the whole library: one stream per run (~13 minutes on an idle Connect server, ~20 in CI)
@given(data=st.data())
def test_counting_matches_full_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    initial = data.draw(st.fixed_dictionaries({t: st.lists(s, max_size=6) for t, s in ROWS.items()}), "initial")
    root = tmp_path_factory.mktemp("stream")
    one = make_project(TABLES, root=root / "batch-by-batch", views=VIEWS, aggregates=AGGREGATES)
    load(one, root, initial)
    assert {v.mode for v in one.refresh().views} == {"full"}
    state = {t: list(rows) for t, rows in initial.items()}
    batches = []
    for n in range(1, 3):
        changes = data.draw(batch(state), f"batch {n}")
        batches.append(changes)
        apply_batch(state, changes)
        append_batch(one, root, n, changes)
        result = one.refresh()
        assert {v.mode for v in result.views} <= {"incremental", "noop"}
        final = check(one, state)

    # (past 2 changed rows the run is planned distributed, and each GROUP BY's Δ(U) per group is written
    # first: paired with the old state in one partition when it touches at most 2 groups, distributed
    # when more, `Counting._settled`; the other streams' all-at-once projects never plan small)
    everything = make_project(TABLES, root=root / "all-at-once", views=VIEWS, aggregates=AGGREGATES,
                              spark={"single_partition_rows": 2})
    load(everything, root, initial)
    everything.refresh()
    for n, changes in enumerate(batches, 1):
        append_batch(everything, root, n, changes)
    assert {v.mode for v in everything.refresh().views} <= {"incremental", "noop"}
    at_once = zsets(everything)
    for view in VIEWS:
        assert_close(at_once[view], final[view], view)


def _delta(project, view) -> dict:
    return as_zset(project.last_delta(view).collect())


def test_000_example_4_2_step_by_step(make_project, tmp_path):
    """000 Example 4.2 with duplicate semantics: link = {ab, ad, dc, bc, ch, fg}, Δ(link) = {ab*-1, df, af}
    gives Δ(hop) = {ac*-1, ag, dg, af} and Δ(tri_hop) = {ah*-1, ag}; and with set semantics (§5.1,
    statement (2)), hop(a, c) losing one of its two derivations changes nothing above it."""
    tables = {"link": {"columns": {"src": "string", "dst": "string"}, "key": ["src", "dst"]}}
    views = {"hop": {"sql": "SELECT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src"},
             "tri_hop": {"sql": "SELECT h.src, l.dst FROM hop h JOIN link l ON h.dst = l.src"},
             "hop_set": {"datalog": "hop_set(X, Y) :- link(X, Z), link(Z, Y)."},
             "from_a": {"datalog": "from_a(Y) :- hop_set(a, Y)."}}
    p = make_project(tables, views=views)
    cols = ["src", "dst"]
    p.load("link", write_jsonl(tmp_path / "link.jsonl", cols, [tuple(e) for e in "ab ad dc bc ch fg".split()]))
    p.refresh()
    assert as_zset(p.read_zset("hop").collect()) == {("a", "c"): 2, ("d", "h"): 1, ("b", "h"): 1}
    assert as_zset(p.read_zset("tri_hop").collect()) == {("a", "h"): 2}
    p.append("link", write_jsonl(tmp_path / "d1.jsonl", cols, [("a", "b"), ("d", "f"), ("a", "f")],
                            ["delete", "insert", "insert"]))
    result = p.refresh()
    assert {v.view: v.mode for v in result.views} == {v: "incremental" for v in views}
    assert _delta(p, "hop") == {("a", "c"): -1, ("a", "g"): 1, ("d", "g"): 1, ("a", "f"): 1}
    assert _delta(p, "tri_hop") == {("a", "h"): -1, ("a", "g"): 1}
    assert as_zset(p.read_zset("tri_hop").collect()) == {("a", "h"): 1, ("a", "g"): 1}
    # the set view keeps derivation counts; from_a sees only the new tuples (a, g) and (a, f)
    assert _delta(p, "hop_set") == {("a", "c"): -1, ("a", "g"): 1, ("d", "g"): 1, ("a", "f"): 1}
    assert _delta(p, "from_a") == {("g",): 1, ("f",): 1}
    # deleting d->c removes hop(a, c)'s last derivation: now the set changes and from_a loses c
    p.append("link", write_jsonl(tmp_path / "d2.jsonl", cols, [("d", "c")], ["delete"]))
    p.refresh()
    assert _delta(p, "from_a") == {("c",): -1}


@pytest.mark.parametrize("whole", [True, False], ids=["state-read-whole", "state-at-touched-groups"])
def test_aggregates_keep_sql_semantics_when_groups_empty(make_project, tmp_path, monkeypatch, whole):
    """A group whose rows are all deleted disappears; the global aggregate keeps its one row (count 0,
    sum NULL); deleting the current MIN recomputes that group only; an untouched group (c) is left
    alone — whether the small run reads the stored GROUP BY state whole or at the touched groups only
    (`RunStates.fits_one_partition`)."""
    monkeypatch.setattr(RunStates, "fits_one_partition", lambda self, name: self.small and whole)
    tables = {"t": {"columns": {"k": "string", "v": "int"}}}
    views = {"per_k": {"sql": "SELECT k, count(*) AS n, min(v) AS lo, max(v) AS hi, sum(v) AS s FROM t GROUP BY k"},
             "total": {"sql": "SELECT count(*) AS n, sum(v) AS s, min(v) AS lo FROM t"}}
    p = make_project(tables, views=views)
    cols = ["k", "v"]
    p.load("t", write_jsonl(tmp_path / "t.jsonl", cols, [("a", 1), ("a", 5), ("b", 2), ("c", 7)]))
    p.refresh()
    p.append("t", write_jsonl(tmp_path / "c1.jsonl", cols, [("a", 1), ("b", 2)], ["delete", "delete"]))
    p.refresh()
    assert as_zset(p.read_zset("per_k").collect()) == {("a", 1, 5, 5, 5): 1, ("c", 1, 7, 7, 7): 1}
    assert _delta(p, "per_k") == {("a", 2, 1, 5, 6): -1, ("a", 1, 5, 5, 5): 1, ("b", 1, 2, 2, 2): -1}
    assert as_zset(p.read_zset("total").collect()) == {(2, 12, 5): 1}
    p.append("t", write_jsonl(tmp_path / "c2.jsonl", cols, [("a", 5), ("c", 7)], ["delete", "delete"]))
    p.refresh()
    assert as_zset(p.read_zset("per_k").collect()) == {}
    assert as_zset(p.read_zset("total").collect()) == {(0, None, None): 1}


@pytest.mark.parametrize("whole", [True, False], ids=["state-read-whole", "state-at-touched-groups"])
def test_distinct_aggregate_when_no_distinct_value_changes(make_project, tmp_path, monkeypatch, whole):
    """A batch that adds a duplicate and a NULL changes COUNT(*) but no (group, value) pair of the
    DISTINCT aggregates: their counts and sums stay (found by the differential test)."""
    monkeypatch.setattr(RunStates, "fits_one_partition", lambda self, name: self.small and whole)
    tables = {"t": {"columns": {"k": "string", "v": "int"}}}
    views = {"d": {"sql": "SELECT k, count(DISTINCT v) AS nd, sum(DISTINCT v) AS sd, count(*) AS n FROM t GROUP BY k"}}
    p = make_project(tables, views=views)
    cols = ["k", "v"]
    p.load("t", write_jsonl(tmp_path / "t.jsonl", cols, [("a", 1), ("a", 2)]))
    p.refresh()
    p.append("t", write_jsonl(tmp_path / "c1.jsonl", cols, [("a", 1), ("a", None)], ["insert", "insert"]))
    assert p.refresh().views[0].mode == "incremental"
    assert as_zset(p.read_zset("d").collect()) == {("a", 2, 3, 4): 1}


@pytest.mark.parametrize("case", ["few-groups", "many-groups"])
def test_a_large_run_pairs_its_touched_groups_by_their_number(make_project, tmp_path, monkeypatch, case):
    """A run past `spark.single_partition_rows` (3 here: 5 changed rows) writes Δ(U) per group first and
    pairs it with the old state in one partition when it touches at most 3 groups, distributed when it
    touches more (`Counting._settled`); the groups come out the same either way: a deleted MIN
    recomputed, a duplicate and a NULL counted, an emptied group gone, a new group added."""
    settled = []
    real = Counting._settled

    def spy(self, name, partial):
        out = real(self, name, partial)
        settled.append(out[1])
        return out

    monkeypatch.setattr(Counting, "_settled", spy)
    tables = {"t": {"columns": {"k": "string", "v": "int"}}}
    views = {"per_k": {"sql": "SELECT k, count(*) AS n, min(v) AS lo, max(v) AS hi, sum(v) AS s FROM t GROUP BY k"}}
    p = make_project(tables, views=views, spark={"single_partition_rows": 3})
    cols = ["k", "v"]
    p.load("t", write_jsonl(tmp_path / "t.jsonl", cols, [("a", 1), ("a", 5), ("b", 2), ("c", 7), ("d", 3), ("e", 4)]))
    p.refresh()
    if case == "few-groups":  # groups a and b
        change = ([("a", 1), ("a", 9), ("a", None), ("b", 2), ("a", 5)],
                  ["delete", "insert", "insert", "delete", "insert"])
        expected = {("a", 4, 5, 9, 19): 1, ("c", 1, 7, 7, 7): 1, ("d", 1, 3, 3, 3): 1, ("e", 1, 4, 4, 4): 1}
    else:  # groups a, b, c, d and f
        change = [("a", 1), ("b", 2), ("c", 8), ("d", 3), ("f", 6)], ["delete", "delete", "insert", "delete", "insert"]
        expected = {("a", 1, 5, 5, 5): 1, ("c", 2, 7, 8, 15): 1, ("e", 1, 4, 4, 4): 1, ("f", 1, 6, 6, 6): 1}
    p.append("t", write_jsonl(tmp_path / "c.jsonl", cols, *change))
    assert p.refresh().views[0].mode == "incremental"
    assert settled == [case == "few-groups"]
    assert as_zset(p.read_zset("per_k").collect()) == expected


#: a keyed table for the Datalog views below (kept apart: other tests draw KEYED's tables alone)
MGR = {"mgr": {"columns": {"id": "int", "boss": "int"}, "key": ["id"]}}
KEYED_VIEWS = {
    "by_dept": "SELECT dept, count(*) AS n, sum(sal) AS s, min(sal) AS lo, max(sal) AS hi, avg(sal) AS a "
               "FROM emp GROUP BY dept",
    "emp_region": "SELECT e.id, d.region FROM emp e LEFT JOIN dept d ON e.dept = d.name",
    "idle_depts": "SELECT name FROM dept WHERE name NOT IN (SELECT dept FROM emp WHERE dept IS NOT NULL)",
}
#: Datalog views over keyed tables, whose deltas are their set changes (`Counting.set_changes`): a negated
#: selection of a table and a closure DRed maintains (updates of a boss over- and re-derive), with the SQL
#: DuckDB runs for them
KEYED_DATALOG = {
    "outside_n": ("outside_n(I) :- emp(I, D, S), not dept(D, 'n').",
                  "SELECT id FROM emp e WHERE NOT EXISTS "
                  "(SELECT 1 FROM dept d WHERE d.name = e.dept AND d.region = 'n')"),
    "above": ("above(X, Y) :- mgr(X, Y).\nabove(X, Y) :- above(X, Z), mgr(Z, Y).",
              "WITH RECURSIVE t(id, boss) AS (SELECT id, boss FROM mgr UNION "
              "SELECT t.id, m.boss FROM t JOIN mgr m ON t.boss = m.id) SELECT id, boss FROM t"),
}






@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_counting_on_keyed_tables_with_updates(make_project, tmp_path_factory, data):
    """Keyed tables: updates arrive as preimage/postimage pairs of one key — in the native format or as
    Debezium events (#69: key-only deletes, updates without a before image, truncates), drawn per table
    and batch; each view after each refresh equals the full recomputation and DuckDB."""
    drawn_stream(data)
    import duckdb

    tables = KEYED | MGR
    state = data.draw(keyed_state(tables), "initial")
    root = tmp_path_factory.mktemp("keyed")
    p = make_project(tables, root=root / "p", views={v: {"sql": q} for v, q in KEYED_VIEWS.items()}
                     | {v: {"datalog": d} for v, (d, _) in KEYED_DATALOG.items()})
    for table, rows in state.items():
        p.load(table, write_jsonl(root / f"{table}-0.jsonl", list(tables[table]["columns"]),
                             [(k, *v) for k, v in rows.items()]))
    p.refresh()
    for n in range(1, 3):
        changes = data.draw(keyed_batch(state, truncates=True), f"batch {n}")
        for table, items in changes.items():
            columns = list(tables[table]["columns"])
            if items[0][0] == "truncate" or data.draw(st.booleans(), f"{table} {n} from Debezium"):
                p.append(table, write_debezium(root / f"{table}-{n}.jsonl", columns, items,
                                               p.catalog.last_commit_version(table) + 1), "debezium")
            else:
                p.append(table, write_jsonl(root / f"{table}-{n}.jsonl", columns,
                                            [r for _, r in items], [k for k, _ in items]))
            for kind, row in items:
                if kind == "truncate":
                    state[table].clear()
                elif kind in ("delete", "update_preimage"):
                    del state[table][row[0]]
                else:
                    state[table][row[0]] = row[1:]
        assert {v.mode for v in p.refresh().views} <= {"incremental", "noop"}
        program, strata = p.program
        ev = Evaluator(program, strata, {t: p.read_zset(t) for t in tables},
                       scratch=Scratch(Warehouse(str(root / f"recompute-{n}")), p.spark, "recompute"))
        con = duckdb.connect()
        con.execute("CREATE TABLE emp (id INTEGER, dept VARCHAR, sal INTEGER)")
        con.execute("CREATE TABLE dept (name VARCHAR, region VARCHAR)")
        con.execute("CREATE TABLE mgr (id INTEGER, boss INTEGER)")
        for table, rows in state.items():
            if rows:
                marks = ", ".join("?" * len(tables[table]["columns"]))
                con.executemany(f"INSERT INTO {table} VALUES ({marks})", [(k, *v) for k, v in rows.items()])
        for view, sql in (KEYED_VIEWS | {v: q for v, (_, q) in KEYED_DATALOG.items()}).items():
            ours = as_zset(p.read_zset(view).collect())
            assert_close(ours, as_zset(ev.relation(view).collect()), view)
            theirs = Counter(tuple(norm(x) for x in r) for r in con.execute(sql).fetchall())
            assert_close(ours, dict(theirs), view)
