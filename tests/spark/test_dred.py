"""Recursive views end to end: semi-naive evaluation and DRed (000 §7), differentially.

A library of recursive views — linear and nonlinear transitive closure in Datalog, WITH RECURSIVE in
SQL, mutual recursion, recursion over a negated and over an aggregated lower stratum, and views stacked
on a closure (an aggregate, NOT EXISTS, a selection) — is materialized over random graphs with many
cycles; hypothesis then draws change batches (deleting edges with alternative derivations, edges inside
cycles, whole cycles, inserting edges that close cycles, NULLs, duplicate edges) and after every
incremental refresh each view must equal

  (a) the full recomputation (the semi-naive fixpoint ``--mode full`` runs) over the same base state, and
  (b) DuckDB's WITH RECURSIVE over the same rows;

and a second project that receives all batches before one refresh must end with identical views (the
recursive-join retraction bug class).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm.errors import ConfigError
from ivm.maintain.recompute import Evaluator
from tests.conftest import DISTRIBUTED, drawn_stream
from tests.helpers import STREAMS, apply_batch, as_zset, assert_close, norm, write_jsonl

TABLES = {"link": {"columns": {"src": "string", "dst": "string"}},
          "blocked": {"columns": {"node": "string"}},
          "wlink": {"columns": {"src": "string", "dst": "string", "w": "int"}}}

TC_SQL = ("WITH RECURSIVE t(src, dst) AS (SELECT src, dst FROM link UNION "
          "SELECT t.src, l.dst FROM t JOIN link l ON t.dst = l.src) SELECT src, dst FROM t")
#: view -> (definition, the same query for DuckDB)
VIEWS = {
    # left-linear here, right-linear in SQL below: both get DRed's transitivity rule (fixpoint.transitive_rule)
    "tc": ({"datalog": "tc(X, Y) :- link(X, Y).\ntc(X, Y) :- link(X, Z), tc(Z, Y)."}, TC_SQL),
    "tc_nonlinear": ({"datalog": "tc_nonlinear(X, Y) :- link(X, Y).\n"
                                 "tc_nonlinear(X, Y) :- tc_nonlinear(X, Z), tc_nonlinear(Z, Y)."}, TC_SQL),
    "reach_sql": ({"sql": TC_SQL}, TC_SQL),
    # mutual recursion: pairs joined by a path of even length (odd is an auxiliary predicate)
    "even": ({"datalog": "odd(X, Y) :- link(X, Y).\nodd(X, Y) :- even(X, Z), link(Z, Y).\n"
                         "even(X, Y) :- odd(X, Z), link(Z, Y)."},
             "WITH RECURSIVE p(src, dst, odd) AS (SELECT src, dst, true FROM link UNION "
             "SELECT p.src, l.dst, NOT p.odd FROM p JOIN link l ON p.dst = l.src) "
             "SELECT src, dst FROM p WHERE NOT odd"),
    # recursion over a negated lower stratum
    "open_tc": ({"datalog": "open_tc(X, Y) :- link(X, Y), not blocked(Y).\n"
                            "open_tc(X, Y) :- open_tc(X, Z), link(Z, Y), not blocked(Y)."},
                "WITH RECURSIVE t(src, dst) AS (SELECT src, dst FROM link l WHERE NOT EXISTS "
                "(SELECT 1 FROM blocked b WHERE b.node = l.dst) UNION SELECT t.src, l.dst FROM t JOIN link l "
                "ON t.dst = l.src WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.node = l.dst)) SELECT * FROM t"),
    # recursion over an aggregated lower stratum: edges whose cheapest weight is at most 2
    "cheap_reach": ({"datalog": "cheap_reach(X, Y) :- groupby(wlink(X, Y, W), [X, Y], M = min(W)), M <= 2.\n"
                                "cheap_reach(X, Y) :- cheap_reach(X, Z), groupby(wlink(Z, Y, W), [Z, Y], "
                                "M = min(W)), M <= 2."},
                    "WITH RECURSIVE e AS (SELECT src, dst FROM wlink GROUP BY src, dst HAVING min(w) <= 2), "
                    "t(src, dst) AS (SELECT src, dst FROM e UNION SELECT t.src, e.dst FROM t JOIN e ON "
                    "t.dst = e.src) SELECT * FROM t"),
    # views stacked on a closure: an aggregate, NOT EXISTS, a selection with a constant
    "fanout": ({"sql": "SELECT x AS src, count(*) AS n FROM tc GROUP BY x"},
               f"SELECT src, count(*) AS n FROM ({TC_SQL}) GROUP BY src"),
    "off_cycle": ({"sql": "SELECT l.src, l.dst FROM link l WHERE NOT EXISTS "
                          "(SELECT 1 FROM tc t WHERE t.x = l.dst AND t.y = l.src)"},
                  f"SELECT l.src, l.dst FROM link l WHERE NOT EXISTS (SELECT 1 FROM ({TC_SQL}) t "
                  "WHERE t.src = l.dst AND t.dst = l.src)"),
    "from_a": ({"datalog": "from_a(Y) :- tc(a, Y)."}, f"SELECT DISTINCT dst FROM ({TC_SQL}) WHERE src = 'a'"),
}
DEFINITIONS = {v: d for v, (d, _) in VIEWS.items()}


def duck(state: dict[str, list[tuple]]) -> dict[str, Counter]:
    con = duckdb.connect()
    con.execute("CREATE TABLE link (src VARCHAR, dst VARCHAR)")
    con.execute("CREATE TABLE blocked (node VARCHAR)")
    con.execute("CREATE TABLE wlink (src VARCHAR, dst VARCHAR, w INTEGER)")
    for table, rows in state.items():
        if rows:
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    return {v: Counter(tuple(norm(x) for x in r) for r in con.execute(sql).fetchall()) for v, (_, sql) in VIEWS.items()}


def sets(project) -> dict[str, dict]:
    return {v: as_zset(project.read_zset(v).collect()) for v in project.config.views}


def recomputed(project, tmp: Path) -> dict[str, dict]:
    from ivm.storage import Scratch, Warehouse

    program, strata = project.program
    scratch = Scratch(Warehouse(str(tmp)), project.spark, "recompute")
    ev = Evaluator(program, strata, {t: project.read_zset(t) for t in TABLES}, scratch=scratch)
    return {v: as_zset(ev.relation(v).collect()) for v in project.config.views}


def check(project, state, tmp: Path) -> dict[str, dict]:
    ours, full, theirs = sets(project), recomputed(project, tmp), duck(state)
    program, _ = project.program
    for view in VIEWS:
        assert_close(ours[view], full[view], view)
        bag = {r: 1 if program.predicates[view].semantics == "set" else c for r, c in ours[view].items()}
        assert_close(bag, dict(theirs[view]), view)
    return ours


def load(project, root: Path, state: dict[str, list[tuple]]) -> None:
    for table, rows in state.items():
        project.load(table, write_jsonl(root / f"{table}-0.jsonl", list(TABLES[table]["columns"]), rows))


def append(project, root: Path, n: int, changes: dict[str, list[tuple[str, tuple]]]) -> None:
    for table, items in changes.items():
        project.append(table, write_jsonl(root / f"{table}-{n}.jsonl", list(TABLES[table]["columns"]),
                                     [r for _, r in items], [k for k, _ in items]))


def test_dred_steps_on_a_small_graph(make_project, tmp_path):
    """a→b→c and a→c: deleting a→b over-deletes tc(a,b) and tc(a,c) (step 1), rederives tc(a,c) through
    a→c (step 2); inserting c→a closes a cycle (step 3)."""
    p = make_project(TABLES, views={"tc": DEFINITIONS["tc"]})
    load(p, tmp_path, {"link": [("a", "b"), ("b", "c"), ("a", "c")], "blocked": [], "wlink": []})
    assert p.refresh().views[0].mode == "full"
    assert as_zset(p.read_zset("tc").collect()) == {("a", "b"): 1, ("b", "c"): 1, ("a", "c"): 1}
    append(p, tmp_path, 1, {"link": [("delete", ("a", "b"))]})
    work = p.refresh().views[0]
    assert work.mode == "incremental" and work.reason.startswith("DRed (000 §7) for tc")
    assert work.detail == {"over-deleted": 2, "rederived": 1, "inserted": 0}
    assert as_zset(p.last_delta("tc").collect()) == {("a", "b"): -1}
    append(p, tmp_path, 2, {"link": [("insert", ("c", "a"))]})
    work = p.refresh().views[0]
    assert work.detail == {"over-deleted": 0, "rederived": 0, "inserted": 4}
    assert as_zset(p.read_zset("tc").collect()) == {tuple(e): 1 for e in "ac ca aa cc bc ba".split()}


node = st.sampled_from(["a", "b", "c", "d", "e", None])
ROWS = {"link": st.tuples(node, node),
        "blocked": st.tuples(node),
        "wlink": st.tuples(node, node, st.integers(1, 4))}


def _cycle(edges: list[tuple]) -> list[tuple] | None:
    """The edges of some cycle of the graph (depth-first), or None."""
    succ: dict = {}
    for s, d in edges:
        if s is not None and d is not None:
            succ.setdefault(s, []).append(d)
    for start in sorted(succ):
        stack, seen = [(start, [])], set()
        while stack:
            n, path = stack.pop()
            for m in succ.get(n, []):
                if m == start:
                    return [*path, (n, m)]
                if m not in seen:
                    seen.add(m)
                    stack.append((m, [*path, (n, m)]))
    return None


def _reachable(edges: list[tuple], start) -> set:
    out, todo = set(), [start]
    while todo:
        n = todo.pop()
        for s, d in edges:
            if s == n and d is not None and d not in out:
                out.add(d)
                todo.append(d)
    return out


@st.composite
def batch(draw, state: dict[str, list[tuple]]) -> dict[str, list[tuple[str, tuple]]]:
    """One commit per table: random deletes (a duplicate edge loses one copy) and inserts (NULLs and
    duplicates included); for link, on purpose, a whole cycle deleted, an edge inside a cycle deleted,
    or an edge inserted that closes a cycle."""
    out = {}
    for table, rows in state.items():
        present = list(rows)
        changes: list[tuple[str, tuple]] = []
        how = draw(st.sampled_from(["mixed", "cycle", "cycle_edge", "close", "none"]))
        if how == "none":
            continue
        cycle = _cycle(present) if table == "link" else None
        if how in ("cycle", "cycle_edge") and cycle:
            for e in cycle if how == "cycle" else [draw(st.sampled_from(cycle))]:
                if e in present:
                    present.remove(e)
                    changes.append(("delete", e))
        elif how == "close" and table == "link" and present:
            s, d = draw(st.sampled_from(present))
            back = sorted(n for n in _reachable(present, d) if n is not None) or ([d] if d is not None else [])
            if back and s is not None:
                changes.append(("insert", (draw(st.sampled_from(back)), s)))
        for _ in range(draw(st.integers(0, 2))):
            if present:
                changes.append(("delete", present.pop(draw(st.integers(0, len(present) - 1)))))
        for _ in range(draw(st.integers(0, 2))):
            changes.append(("insert", draw(st.sampled_from(rows)) if rows and draw(st.booleans())
                            else draw(ROWS[table])))
        if changes:
            out[table] = changes
    return out


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_dred_matches_full_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    initial = data.draw(st.fixed_dictionaries({
        "link": st.lists(ROWS["link"], min_size=3, max_size=10),
        "blocked": st.lists(ROWS["blocked"], max_size=2),
        "wlink": st.lists(ROWS["wlink"], max_size=8)}), "initial")
    root = tmp_path_factory.mktemp("dred")
    one = make_project(TABLES, root=root / "batch-by-batch", views=DEFINITIONS)
    load(one, root, initial)
    assert {v.mode for v in one.refresh().views} == {"full"}
    state = {t: list(rows) for t, rows in initial.items()}
    batches = []
    for n in range(1, 3):
        changes = data.draw(batch(state), f"batch {n}")
        batches.append(changes)
        apply_batch(state, changes)
        append(one, root, n, changes)
        assert {v.mode for v in one.refresh().views} <= {"incremental", "noop"}
        final = check(one, state, root / f"recompute-{n}")

    everything = make_project(TABLES, root=root / "all-at-once", views=DEFINITIONS, spark=DISTRIBUTED)
    load(everything, root, initial)
    everything.refresh()
    for n, changes in enumerate(batches, 1):
        append(everything, root, n, changes)
    assert {v.mode for v in everything.refresh().views} <= {"incremental", "noop"}
    at_once = sets(everything)
    for view in VIEWS:
        assert_close(at_once[view], final[view], view)


def test_explain_shows_dred_and_its_rules(make_project):
    p = make_project(TABLES, views={"tc": DEFINITIONS["tc"], "fanout": DEFINITIONS["fanout"]})
    e = p.explain("tc")
    assert e.algorithm == "DRed" and e.recursive and e.recursive_components == [["tc"]]
    assert e.delta_rules == []  # nothing is maintained by counting
    rules = {(r["step"], r["rule"]) for r in e.dred_rules}
    assert rules == {
        ("1 over-delete", "δ⁻tc(X, Y) :- δ⁻(link(X, Y))."),
        ("2 rederive", "δ⁺tc(X, Y) :- δ⁻tc(X, Y), linkᵛ(X, Y)."),
        ("3 insert", "Δ⁺tc(X, Y) :- Δ⁺(link(X, Y))."),
        ("1 over-delete", "δ⁻tc(X, Y) :- δ⁻(link(X, Z)), tc(Z, Y)."),
        ("1 over-delete", "δ⁻tc(X, Y) :- link(X, Z), δ⁻(tc(Z, Y))."),
        ("2 rederive", "δ⁺tc(X, Y) :- δ⁻tc(X, Y), linkᵛ(X, Z), tcᵛ(Z, Y)."),
        ("3 insert", "Δ⁺tc(X, Y) :- Δ⁺(link(X, Z)), tcᵛ(Z, Y)."),
        ("3 insert", "Δ⁺tc(X, Y) :- linkᵛ(X, Z), Δ⁺(tc(Z, Y))."),
        # tc is link⁺: its transitivity rule, in steps 1 and 3 only
        ("1 over-delete", "δ⁻tc(X, Y) :- δ⁻(tc(X, Z)), tc(Z, Y)."),
        ("1 over-delete", "δ⁻tc(X, Y) :- tc(X, Z), δ⁻(tc(Z, Y))."),
        ("3 insert", "Δ⁺tc(X, Y) :- Δ⁺(tc(X, Z)), tcᵛ(Z, Y)."),
        ("3 insert", "Δ⁺tc(X, Y) :- tcᵛ(X, Z), Δ⁺(tc(Z, Y))."),
    }
    text = e.to_text()
    assert "maintenance: DRed" in text and "recursive component tc" in text
    assert "  step 2 rederive: δ⁺tc(X, Y) :- δ⁻tc(X, Y), linkᵛ(X, Z), tcᵛ(Z, Y)." in text
    stacked = p.explain("fanout")
    assert stacked.algorithm == "counting" and stacked.recursive_components == [] and stacked.delta_rules


@pytest.mark.parametrize("view, message", [
    ({"sql": "WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION ALL "
             "SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src) SELECT * FROM r"},
     r"views.bad: bad__\d+ is recursive with bag semantics \(WITH RECURSIVE ... UNION ALL\); use UNION"),
    ({"datalog": "bad(X) :- bad(X), link(X, _)."},
     "views.bad: bad has no rule that does not depend on itself: the recursion has no base case"),
])
def test_recursive_definitions_refused_at_apply(tmp_path, spark, view, message):
    from ivm import Project
    from tests.conftest import write_project

    project = Project.open(str(write_project(tmp_path / "p", TABLES, views={"bad": view})))
    with pytest.raises(ConfigError, match=message):
        project.apply()
    assert project.catalog.view_defs() == {}
    project.close()


def test_iteration_limit_fails_the_refresh_and_applies_nothing(make_project, tmp_path):
    """A chain a→b→c→d→e needs five rounds; with max_iterations: 3 the refresh fails naming the view,
    and nothing is published: the table's watermark and the view stay as they were."""
    views = {"tc": {**DEFINITIONS["tc"], "max_iterations": 3}}
    p = make_project(TABLES, views=views)
    load(p, tmp_path, {"link": [tuple(e) for e in "ab bc cd de".split()], "blocked": [], "wlink": []})
    before = p.catalog.watermarks()
    with pytest.raises(ConfigError, match=r"views.tc: the fixpoint of tc \(fixpoint\) did not converge within 3 "
                                          "rounds; raise max_iterations"):
        p.refresh()
    assert p.catalog.state("tc").version_id is None and p.catalog.watermarks() == before
    assert p.runs(1)[0].status == "failed"
    longer = make_project(TABLES, root=tmp_path / "longer", views={"tc": {**DEFINITIONS["tc"], "max_iterations": 5}})
    load(longer, tmp_path, {"link": [tuple(e) for e in "ab bc cd de".split()], "blocked": [], "wlink": []})
    longer.refresh()
    assert len(as_zset(longer.read_zset("tc").collect())) == 10


def test_a_closure_extends_a_changed_edge_through_itself_in_two_rounds(make_project, tmp_path):
    """Two chains a0→…→a3 and b0→…→b3: their full fixpoint takes four rounds (max_iterations: 4). The
    edge a3→b0 adds the 16 pairs (ai, bj): by the rules as written in one round per edge along b's
    chain (five rounds); with the transitivity rule the edge's tuples (ai, b0) are extended through
    the closure at once (two, DRed.closed_after_extension). Deleting it over-deletes the 16 pairs as
    fast; the view is the closure each time."""
    p = make_project(TABLES, views={"reach_sql": {**DEFINITIONS["reach_sql"], "max_iterations": 4}})
    chains = [(f"{c}{i}", f"{c}{i + 1}") for c in "ab" for i in range(3)]
    load(p, tmp_path, {"link": chains, "blocked": [], "wlink": []})
    p.refresh()
    closure = {(f"{c}{i}", f"{c}{j}") for c in "ab" for i in range(4) for j in range(i + 1, 4)}
    joined = closure | {(f"a{i}", f"b{j}") for i in range(4) for j in range(4)}
    for n, (kind, expect) in enumerate([("insert", joined), ("delete", closure)], start=1):
        append(p, tmp_path, n, {"link": [(kind, ("a3", "b0"))]})
        assert [w.mode for w in p.refresh().views] == ["incremental"]
        assert as_zset(p.read_zset("reach_sql").collect()) == dict.fromkeys(expect, 1)


def test_a_closure_change_ends_after_two_rounds_unless_changed_edges_chain(make_project, tmp_path):
    """Chains a0→a1, b0→b1, c0→c1 (a full fixpoint of two rounds). Inserting a1→b0 and then deleting it
    takes two rounds each (max_iterations: 2; the semi-naive round that would only find nothing is not
    run: DRed.closed_after_extension). Inserting a1→b0 and b1→c0 in one commit chains the two: a0 reaches
    c1 only through both, which the round after the second finds; the view is the closure each time."""
    chains = [(f"{c}0", f"{c}1") for c in "abc"]

    def closure(edges: list[tuple]) -> dict[tuple, int]:
        return {(s, t): 1 for s in {s for s, _ in edges} for t in _reachable(edges, s)}

    p = make_project(TABLES, views={"reach_sql": {**DEFINITIONS["reach_sql"], "max_iterations": 2}})
    load(p, tmp_path, {"link": chains, "blocked": [], "wlink": []})
    p.refresh()
    for n, (kind, edges) in enumerate([("insert", [*chains, ("a1", "b0")]), ("delete", chains)], start=1):
        append(p, tmp_path, n, {"link": [(kind, ("a1", "b0"))]})
        assert [w.mode for w in p.refresh().views] == ["incremental"]
        assert as_zset(p.read_zset("reach_sql").collect()) == closure(edges)
    chained = make_project(TABLES, root=tmp_path / "chained", views={"reach_sql": DEFINITIONS["reach_sql"]})
    load(chained, tmp_path, {"link": chains, "blocked": [], "wlink": []})
    chained.refresh()
    append(chained, tmp_path, 3, {"link": [("insert", ("a1", "b0")), ("insert", ("b1", "c0"))]})
    assert [w.mode for w in chained.refresh().views] == ["incremental"]
    view = as_zset(chained.read_zset("reach_sql").collect())
    assert view == closure([*chains, ("a1", "b0"), ("b1", "c0")]) and ("a0", "c1") in view


def test_changed_rules_are_followed_by_dred(make_project, tmp_path):
    """000 §7: a rule added to or removed from a recursive view is maintained incrementally (the removed
    rule's derivations over-deleted and rederived where possible, the added rule's inserted), equal to
    recomputing; a change DRed cannot follow (a nonrecursive view) recomputes."""
    from ivm import Project
    from tests.conftest import write_project

    views = {"tc": DEFINITIONS["tc"], "fanout": DEFINITIONS["fanout"]}
    p = make_project(TABLES, root=tmp_path / "p", views=views)
    load(p, tmp_path, {"link": [tuple(e) for e in "ab bc cd da ce".split()], "blocked": [],
                       "wlink": [("a", "e", 1), ("e", "b", 5)]})
    p.refresh()

    def redefine(tc: str, fanout: str = DEFINITIONS["fanout"]["sql"]) -> Project:
        path = write_project(tmp_path / "p", TABLES, views={"tc": {"datalog": tc}, "fanout": {"sql": fanout}})
        project = Project.open(str(path))
        assert any(c.startswith("updated view") for c in project.apply())
        return project

    # a rule added: wlink edges are links too
    added = redefine(DEFINITIONS["tc"]["datalog"] + "\ntc(X, Y) :- wlink(X, Y, _).")
    result = {w.view: w for w in added.refresh().views}
    assert result["tc"].mode == "incremental" and "1 rule removed" not in result["tc"].reason
    assert result["tc"].reason.startswith("DRed (000 §7) across the changed definition: 0 rules removed, 1 added")
    assert result["fanout"].mode == "incremental"
    assert sets(added)["tc"] == recomputed(added, tmp_path / "r1")["tc"]
    assert ("e", "b") in sets(added)["tc"] and ("a", "e") in sets(added)["tc"]
    # the base rule removed: only the wlink edges end paths now
    removed = redefine("tc(X, Y) :- wlink(X, Y, _).\ntc(X, Y) :- link(X, Z), tc(Z, Y).")
    work = {w.view: w for w in removed.refresh().views}["tc"]
    assert work.mode == "incremental" and "1 rule removed, 0 added" in work.reason
    assert work.detail["over-deleted"] > 0
    ours, full = sets(removed), recomputed(removed, tmp_path / "r2")
    assert ours["tc"] == full["tc"] and ours["fanout"] == full["fanout"]
    assert ("b", "c") not in ours["tc"] and ("d", "b") in ours["tc"]
    # the next refresh sees the new definition as materialized: nothing to do
    assert removed.refresh().status == "noop"
    # a change of the nonrecursive view on top is a full recompute
    again = redefine("tc(X, Y) :- wlink(X, Y, _).\ntc(X, Y) :- link(X, Z), tc(Z, Y).",
                     "SELECT x AS src, count(*) + 0 AS n FROM tc GROUP BY x")
    work = {w.view: w for w in again.refresh().views}["fanout"]
    assert work.mode == "full" and work.reason.startswith("the definition changed")
    for project in (added, removed, again):
        project.close()


def test_rederivation_keeps_paths_that_start_or_end_at_null(make_project, tmp_path):
    """Step 2 restricts to the over-deleted tuples null-safely (a restriction, not a join of the rule):
    deleting d→b over-deletes (NULL, a), which keeps the derivation NULL→d→a and must be rederived."""
    p = make_project(TABLES, views={"tc": DEFINITIONS["tc"]})
    load(p, tmp_path, {"link": [(None, "d"), ("d", "b"), ("b", "a"), ("d", "a"), ("b", None)], "blocked": [],
                       "wlink": []})
    p.refresh()
    append(p, tmp_path, 1, {"link": [("delete", ("d", "b"))]})
    assert p.refresh().views[0].detail == {"over-deleted": 6, "rederived": 2, "inserted": 0}
    assert sets(p)["tc"] == recomputed(p, tmp_path / "r")["tc"] == {
        ("b", "a"): 1, ("b", None): 1, ("d", "a"): 1, (None, "a"): 1, (None, "d"): 1}
