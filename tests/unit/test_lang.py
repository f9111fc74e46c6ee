"""The front ends and stratification: golden rules for the papers' examples, and every class of bad
definition refused with the view and construct named (no Spark needed)."""

from __future__ import annotations

import pytest

from ivm.config import parse_project
from ivm.errors import ConfigError
from ivm.ir import GroupBy, aggregate_kind
from ivm.lang import compile_project
from ivm.lang.sql import union_in_recursion
from ivm.maintain.counting import ephemeral
from ivm.stratify import stratify

TABLES = {
    "link": {"columns": {"src": "string", "dst": "string"}},
    "clink": {"columns": {"src": "string", "dst": "string", "cost": "int"}},
    "flight": {"columns": {"flight_id": "int", "miles": "int"}, "key": ["flight_id"]},
    "res": {"columns": {"res_id": "int", "flight_id": "int", "seat": "string"}, "key": ["res_id"]},
}


def program(views: dict):
    cfg = parse_project({"tables": TABLES, "views": views})
    prog = compile_project(cfg)
    return prog, stratify(prog)


def rules_of(prog, view: str) -> list[str]:
    preds = [view] + sorted(p for p, d in prog.predicates.items() if d.owner == view and p != view)
    return [str(r) for p in preds for r in prog.rules_for(p)]


def test_000_examples_rules_and_strata():
    prog, strata = program({
        "hop": {"datalog": "hop(X, Y) :- link(X, Z), link(Z, Y)."},
        "tri_hop": {"datalog": "tri_hop(X, Y) :- hop(X, Z), link(Z, Y)."},
        "only_tri_hop": {"datalog": "only_tri_hop(X, Y) :- tri_hop(X, Y), not hop(X, Y)."},
        "min_cost_hop": {"datalog": "cost_hop(S, D, C1 + C2) :- clink(S, I, C1), clink(I, D, C2).\n"
                                    "min_cost_hop(S, D, M) :- groupby(cost_hop(S, D, C), [S, D], M = min(C))."},
    })
    assert rules_of(prog, "only_tri_hop") == ["only_tri_hop(X, Y) :- tri_hop(X, Y), not hop(X, Y)."]
    assert rules_of(prog, "min_cost_hop") == [
        "min_cost_hop(S, D, M) :- groupby(cost_hop(S, D, C), [S, D], M = min(`C`)).",
        "cost_hop(S, D, (`C1` + `C2`)) :- clink(S, I, C1), clink(I, D, C2)."]
    # 000 Definition 3.1 and Example 4.2 / 6.1: hop 1, tri_hop 2, only_tri_hop 3
    assert {p: strata.stratum_of[p] for p in ["link", "hop", "tri_hop", "only_tri_hop", "cost_hop",
                                              "min_cost_hop"]} == {
        "link": 0, "hop": 1, "tri_hop": 2, "only_tri_hop": 3, "cost_hop": 1, "min_cost_hop": 2}
    assert prog.predicates["cost_hop"].kind == "aux" and prog.predicates["cost_hop"].owner == "min_cost_hop"
    assert prog.predicates["min_cost_hop"].columns == ["s", "d", "m"]


def test_001_setof_views():
    tables = {"tournament": {"columns": {"victor": "string", "defeated": "string", "location": "string"}}}
    cfg = parse_project({"tables": tables, "views": {
        "victories": {"datalog": "victories(V, W) :- setof(D, tournament(V, D, L), S), count(S, W)."},
        "dominates": {"datalog": "dominates(V, W) :- setof(D, tournament(V, D, L), W)."}}})
    prog = compile_project(cfg)
    strata = stratify(prog)
    # CReaM Step 1 (001 Figure 1): each setof reads an auxiliary view of all of φ's variables (stored
    # unnested: (X̄, Z̄, Ȳ) with derivation counts)
    assert [str(r) for r in prog.rules] == [
        "victories__va1(V, L, D) :- tournament(V, D, L).",
        "victories(V, W) :- setof(D, victories__va1(V, L, D), S), W = SIZE(`S`).",
        "dominates__va1(V, L, D) :- tournament(V, D, L).",
        "dominates(V, W) :- setof(D, dominates__va1(V, L, D), W)."]
    va = prog.predicates["dominates__va1"]
    assert (va.kind, va.owner, va.semantics, va.columns) == ("aux", "dominates", "set", ["v", "l", "d"])
    assert strata.stratum_of["victories"] == strata.stratum_of["dominates"] == 2
    # without auxiliary views the setof reads the table; Case 1 over a keyed table (a set, read whole)
    # needs none: the view is its own v_a
    keyed = {"t": {"columns": {"v": "string", "d": "string", "l": "string"}, "key": ["v", "d", "l"]}}
    prog = compile_project(parse_project({"tables": {**tables, **keyed}, "views": {
        "plain": {"datalog": "plain(V, W) :- setof(D, tournament(V, D, L), W).", "auxiliary_views": False},
        "at": {"datalog": "at(V, L, W) :- setof(D, t(V, D, L), W)."},
        "at_bag": {"datalog": "at_bag(V, L, W) :- setof(D, tournament(V, D, L), W)."}}}))
    assert [str(r) for r in prog.rules] == [
        "plain(V, W) :- setof(D, tournament(V, D, L), W).",
        "at(V, L, W) :- setof(D, t(V, D, L), W).",
        "at_bag__va1(V, L, D) :- tournament(V, D, L).",
        "at_bag(V, L, W) :- setof(D, at_bag__va1(V, L, D), W)."]
    with pytest.raises(ConfigError, match="the set's elements must be variables of tournament"):
        compile_project(parse_project({"tables": tables, "views": {
            "bad": {"datalog": "bad(V, S) :- setof(Q, tournament(V, D, L), S)."}}}))


def test_sql_join_unifies_columns_and_keeps_bag_semantics():
    prog, _ = program({"hop": {"sql": "SELECT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src"}})
    [rule] = prog.rules_for("hop")
    assert str(rule) == "hop(l1_src_1, l2_dst_1) :- link(l1_src_1, l1_dst_1), link(l1_dst_1, l2_dst_1)."
    assert prog.predicates["hop"].semantics == "bag"
    assert prog.predicates["hop"].columns == ["src", "dst"]


def test_sql_aggregate_is_a_groupby_subgoal():
    prog, strata = program({"miles": {"sql": "SELECT r.flight_id, count(*) AS n, sum(f.miles) AS total "
                                             "FROM res r JOIN flight f ON r.flight_id = f.flight_id "
                                             "GROUP BY r.flight_id HAVING count(*) > 1"}})
    assert rules_of(prog, "miles") == [
        "miles(g_1, count_1, sum_1) :- groupby(miles__1(g_1, a_1), [g_1], count_1 = count(*), sum_1 = sum(`a_1`)), "
        "`count_1` > 1.",
        "miles__1(r_flight_id_1, f_miles_1) :- res(r_res_id_1, r_flight_id_1, r_seat_1), "
        "flight(r_flight_id_1, f_miles_1)."]
    assert strata.stratum_of["miles"] == 2



SUM_STEPS = {"initial": "0L", "iterate": "state + x", "merge": "state + other", "final": "state"}


def test_inductive_aggregates_in_sql_groupby_and_over_sets():
    """An inductive aggregate (001 §2) is the fold of its steps in every place an aggregate is called; with
    ``retract`` its GROUP BY input is ephemeral (never read by Algorithm 6.1), without it stored."""
    cfg = parse_project({"tables": TABLES, "aggregates": {"isum": {**SUM_STEPS, "retract": "state - x"},
                                                         "grow": SUM_STEPS},
                         "views": {"a": {"sql": "SELECT flight_id, isum(miles) AS s FROM flight GROUP BY flight_id"},
                                   "b": {"sql": "SELECT flight_id, grow(miles) AS s FROM flight GROUP BY flight_id"},
                                   "c": {"datalog": "c(S, W) :- groupby(clink(S, D, C), [S], W = isum(C))."},
                                   "d": {"datalog": "d(S, W) :- setof(C, clink(S, D, C), X), isum(X, W)."}}})
    prog = compile_project(cfg)
    fold = "aggregate({}, 0L, (state, x) -> state + x, state -> state)"
    assert rules_of(prog, "a")[0].endswith(f"isum_1 = {fold.format('array_sort(collect_list(`a_1`))')}).")
    (g,) = [i for r in prog.rules_for("c") for i in r.body if isinstance(i, GroupBy)]
    assert g.aggregates[0].inductive.retract == "state - x" and aggregate_kind(g.aggregates[0]) == "inductive"
    assert "W = AGGREGATE(`X`, CAST(0 AS BIGINT), (state, x) -> state + x, state -> state)." in rules_of(prog, "d")[0]
    owner = {p: d.owner for p, d in prog.predicates.items() if d.kind == "aux"}
    assert sorted(owner[p] for p in ephemeral(prog, stratify(prog))) == ["a"]


def test_pre_aggregation_rows_are_ephemeral_when_no_aggregate_reads_them():
    """A GROUP BY's input is stored only when Algorithm 6.1 may read it: MIN/MAX (a deleted extreme),
    DISTINCT, or an aggregate that is not incrementally computable; or when anything else uses it."""
    join = "FROM res r JOIN flight f ON r.flight_id = f.flight_id GROUP BY r.flight_id"
    prog, strata = program({
        "sums": {"sql": f"SELECT r.flight_id, count(*) AS n, sum(f.miles) AS s, avg(f.miles) AS a, "
                        f"var_samp(f.miles) AS v {join}"},
        "extremes": {"sql": f"SELECT r.flight_id, sum(f.miles) AS s, max(f.miles) AS m {join}"},
        "distinct": {"sql": f"SELECT r.flight_id, count(DISTINCT f.miles) AS d {join}"},
        "median": {"sql": f"SELECT r.flight_id, median(f.miles) AS m {join}"},
        # a Datalog predicate is a set: what it passes upward is a set change, read against its stored
        # counts (000 Algorithm 4.1 statement (2))
        "cost_sum": {"datalog": "cost_hop(S, D, C1 + C2) :- clink(S, I, C1), clink(I, D, C2).\n"
                                "cost_sum(S, D, M) :- groupby(cost_hop(S, D, C), [S, D], M = sum(C))."},
    })
    owner = {p: d.owner for p, d in prog.predicates.items() if d.kind == "aux"}
    assert sorted(owner[p] for p in ephemeral(prog, strata)) == ["sums"]

def test_sql_left_join_is_a_matched_and_a_padded_rule():
    prog, _ = program({"v": {"sql": "SELECT l.src, m.dst FROM link l LEFT JOIN link m ON l.dst = m.src"}})
    assert rules_of(prog, "v") == [
        "v(l_src_1, m_dst_1) :- link(l_src_1, l_dst_1), link(l_dst_1, m_dst_1).",
        "v(l_src_1, NULL) :- link(l_src_1, l_dst_1), not v__1(l_dst_1).",
        "v__1(m_src_3) :- link(m_src_3, m_dst_3)."]


def test_a_right_join_after_an_inner_join_pads_against_that_joins_rows():
    """The padding's partners are the rows of the inner join before it (its ON applied), not the product
    of its tables: a right row matching an l2 that no l1 reaches is padded."""
    prog, _ = program({"v": {"sql": "SELECT l1.src, m.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src "
                                    "RIGHT JOIN link m ON l2.dst = m.src"}})
    assert rules_of(prog, "v")[1:] == [
        "v(NULL, m_dst_2) :- link(m_src_2, m_dst_2), not v__1(m_src_2).",
        "v__1(l2_dst_1) :- link(l1_src_1, l1_dst_1), link(l1_dst_1, l2_dst_1)."]


def test_a_right_join_after_a_left_join_pads_against_both_its_blocks():
    """After a LEFT JOIN the left side is its matched and its padded rows: each a rule of the partners
    predicate (#71 item 4), but a padded row's NULL, which matches no right row."""
    prog, _ = program({"v": {"sql": "SELECT l.src, m.dst, n.dst AS d3 FROM link l LEFT JOIN link m ON l.dst = m.src "
                                    "RIGHT JOIN link n ON n.src = m.dst"}})
    assert rules_of(prog, "v") == [
        "v(l_src_1, n_src_1, n_dst_1) :- link(l_src_1, l_dst_1), link(l_dst_1, n_src_1), link(n_src_1, n_dst_1).",
        "v(NULL, NULL, n_dst_3) :- link(n_src_3, n_dst_3), not v__2(n_src_3).",
        "v__1(m_src_3) :- link(m_src_3, m_dst_3).",
        "v__2(m_dst_1) :- link(l_src_1, l_dst_1), link(l_dst_1, m_dst_1)."]
    # a non-equi ON: the partners of each block through a probe of the right side's rows — but the padded
    # block's where ON equates the column it pads (its NULL meets no right row: the probe joins it, no rule)
    for on, rules in (("n.src = m.dst AND n.dst > l.src", 1), ("n.dst > l.src", 2)):
        prog, _ = program({"v": {"sql": "SELECT l.src, m.dst, n.dst AS d3 FROM link l LEFT JOIN link m "
                                        f"ON l.dst = m.src FULL JOIN link n ON {on}"}})
        [padded] = [r for r in rules_of(prog, "v") if r.startswith("v(NULL, NULL")]
        partners = padded.split("not ")[1].split("(")[0]
        assert len(prog.rules_for(partners)) == rules, on


def test_recursion_is_a_recursive_stratum():
    prog, strata = program({
        "reach": {"sql": "WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION "
                         "SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src) SELECT * FROM r"},
        "reach_dl": {"datalog": "reach_dl(X, Y) :- link(X, Y).\nreach_dl(X, Y) :- reach_dl(X, Z), link(Z, Y)."},
    })
    recursive = {c.predicates for c in strata.components if c.recursive}
    assert ("reach_dl",) in recursive and ("reach",) in recursive
    assert "reach_dl(X, Y) :- reach_dl(X, Z), link(Z, Y)." in rules_of(prog, "reach_dl")


def test_a_view_that_selects_its_recursive_cte_as_is_is_the_cte():
    """SELECT src, dst FROM r (or *) over WITH RECURSIVE r: the view's own rules are the CTE's, no
    stored copy; reordered, filtered or read twice, the CTE stays a predicate of its own."""
    cte = ("WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION "
           "SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src) ")
    prog, _ = program({"reach": {"sql": cte + "SELECT src, dst FROM r"}, "star": {"sql": cte + "SELECT * FROM r"},
                       "swapped": {"sql": cte + "SELECT dst, src FROM r"},
                       "filtered": {"sql": cte + "SELECT src, dst FROM r WHERE src <> 'a'"},
                       "twice": {"sql": cte + "SELECT src, dst FROM r WHERE NOT EXISTS "
                                              "(SELECT 1 FROM r r2 WHERE r2.src = r.dst AND r2.dst = r.src)"}})
    for view in ("reach", "star"):
        assert rules_of(prog, view) == [f"{view}(link_src_1, link_dst_1) :- link(link_src_1, link_dst_1).",
                                        f"{view}(r_src_1, l_dst_1) :- {view}(r_src_1, r_dst_1), "
                                        "link(r_dst_1, l_dst_1)."]
        assert prog.predicates[view].semantics == "set" and prog.predicates[view].columns == ["src", "dst"]
        assert not [p for p in prog.predicates if p.startswith(f"{view}__")]
    for view in ("swapped", "filtered", "twice"):
        assert f"{view}__1" in prog.predicates and prog.predicates[view].semantics == "bag"


def test_a_recursive_cte_that_unions_as_a_set_is_named_before_spark_sql_is_asked():
    """ivm keeps WITH RECURSIVE ... UNION (a set: DRed); Spark SQL runs recursive CTEs with UNION ALL
    only, so the validation's run of a view's own text asks `union_in_recursion` first."""
    body = "SELECT src, dst FROM link {} SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src"
    assert union_in_recursion(f"WITH RECURSIVE r(src, dst) AS ({body.format('UNION')}) SELECT * FROM r") == "r"
    assert union_in_recursion(f"WITH RECURSIVE r(src, dst) AS ({body.format('UNION ALL')}) SELECT * FROM r") is None
    # a CTE that does not read itself may union as a set, recursive clause or not; so may the query
    assert union_in_recursion("WITH RECURSIVE a AS (SELECT src FROM link UNION SELECT dst FROM link), "
                              "r(x) AS (SELECT src FROM a UNION ALL SELECT x FROM r) SELECT * FROM r") is None
    assert union_in_recursion("SELECT src FROM link UNION SELECT dst FROM link") is None
    assert union_in_recursion("SELEC nothing") is None  # (Spark SQL's own error says why)


def test_sql_subqueries_and_set_operators():
    prog, _ = program({
        "free": {"sql": "SELECT flight_id FROM flight f WHERE NOT EXISTS "
                        "(SELECT 1 FROM res r WHERE r.flight_id = f.flight_id)"},
        "both": {"sql": "SELECT src FROM link INTERSECT SELECT dst FROM link"},
    })
    assert rules_of(prog, "free")[0] == ("free(f_flight_id_1) :- flight(f_flight_id_1, f_miles_1), "
                                         "not free__1(f_flight_id_1).")
    assert rules_of(prog, "free")[1] == "free__1(r_flight_id_1) :- res(r_res_id_1, r_flight_id_1, r_seat_1)."
    assert prog.predicates["free__1"].semantics == "set"
    assert rules_of(prog, "both")[0] == "both(C0) :- both__1(C0), both__2(C0) (null-safe)."
    assert prog.predicates["both"].semantics == "set"


@pytest.mark.parametrize("views, message", [
    ({"v": {"sql": "SELECT * FROM nope"}}, "views.v: unknown table or view 'nope'"),
    ({"v": {"sql": "SELECT nope FROM link"}}, "views.v: Column 'nope' could not be resolved"),
    ({"v": {"sql": "SELEC src FROM link"}}, "views.v: SQL syntax error"),
    ({"v": {"sql": "SELECT src FROM link INTERSECT ALL SELECT src, dst FROM link"}},
     "views.v: the sides of INTERSECT ALL have 1 and 2 columns"),
    ({"v": {"sql": "SELECT src FROM link ORDER BY src"}}, "views.v: ORDER BY / LIMIT in a view"),
    ({"v": {"sql": "SELECT src, count(*) AS n FROM link"}}, "link.src must appear in GROUP BY or in an aggregate"),
    ({"v": {"datalog": "v(X) :- link(X)."}}, "views.v: link has 2 columns (src, dst) but `link(X)` gives 1"),
    ({"v": {"datalog": "v(X) :- nope(X)."}}, "views.v: unknown predicate nope"),
    ({"v": {"datalog": "w(X) :- link(X, _)."}}, "views.v: the Datalog program does not define the predicate v"),
    ({"v": {"datalog": "v(X, Y) :- link(X, _)."}}, "views.v: unsafe variable Y in the head"),
    ({"v": {"datalog": "v(X) :- link(X, _), not link(X, Y)."}}, "views.v: unsafe variable Y in `not link(X, Y)`"),
    ({"v": {"datalog": "v(X) :- link(X, Y), not w(X).\nw(X) :- v(X)."}},
     "views.v: v depends on w through negation or aggregation inside a recursive cycle"),
    ({"v": {"datalog": "v(X) :- link(X, Y"}}, "views.v: Datalog syntax error at line 1, column 17"),
    ({"v": {"sql": "SELECT * FROM w"}, "w": {"sql": "SELECT * FROM v"}}, "views read each other in a cycle"),
    ({"v": {"datalog": "v(X) :- link(X, _).\nlink(X, Y) :- v(X), v(Y)."}}, "predicate link is already defined"),
])
def test_bad_definitions_name_view_and_construct(views, message):
    with pytest.raises(ConfigError) as e:
        program(views)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_all_22_tpch_queries_compile_for_the_counting_algorithm():
    """#45: the 22 TPC-H queries (tests/tpch.py) compile together, each maintained by counting (000
    Algorithm 4.1), as docs/guide.md's table says; the scalar subqueries of Q2, Q11, Q15, Q17, Q20 and Q22 are
    decorrelated into aggregate subviews (the view reads one more GROUP BY than its own)."""
    from ivm import explain
    from tests.tpch import QUERIES
    from tests.tpch import TABLES as TPCH

    cfg = parse_project({"tables": TPCH, "views": {q: {"sql": sql} for q, sql in QUERIES.items()}})
    prog = compile_project(cfg)
    strata = stratify(prog)
    assert {q: explain.explain(prog, strata, cfg, q).algorithm for q in QUERIES} == dict.fromkeys(QUERIES, "counting")
    owned = {q: [r for p, d in prog.predicates.items() if d.owner == q or p == q for r in prog.rules_for(p)]
             for q in ("q2", "q11", "q15", "q17", "q20", "q22")}
    grouped = {q: sum(isinstance(item, GroupBy) for r in rules for item in r.body) for q, rules in owned.items()}
    assert grouped == {"q2": 1, "q11": 2, "q15": 2, "q17": 2, "q20": 1, "q22": 2}


def test_window_functions_are_a_groupby_on_their_partition_unnested():
    """#45: a SELECT with window functions is a GROUPBY subgoal on each PARTITION BY (one layer each, in
    the order they first appear) whose one aggregate collects the partition's rows with their window
    values, unnested by the same rule; QUALIFY is a condition on the result; `ivm explain` names the
    windows and says the touched partitions are recomputed."""
    from ivm import explain
    from ivm.ir import Unnest

    views = {"top": {"sql": "SELECT src, dst, cost, row_number() OVER (PARTITION BY src ORDER BY cost DESC) AS rn, "
                            "sum(cost) OVER (PARTITION BY dst) AS per_dst FROM clink QUALIFY rn <= 2"}}
    prog, strata = program(views)
    rules = [r for p, d in prog.predicates.items() if d.owner == "top" or p == "top" for r in prog.rules_for(p)]
    layers = {g.aggregates[0].windows[0][1].split("(")[0]: (r, g) for r in rules for g in r.body
              if isinstance(g, GroupBy)}
    assert sorted(layers) == ["ROW_NUMBER", "SUM"]
    assert all(isinstance(r.body[1], Unnest) and r.body[1].kind == "inline" for r, _ in layers.values())
    (src,), (dst,) = layers["ROW_NUMBER"][1].by, layers["SUM"][1].by
    assert src != dst
    # equal costs tie: broken by the row's other values (dst), so a partition recomputed alone agrees
    row_number = layers["ROW_NUMBER"][1].aggregates[0].windows[0][1]
    assert row_number.startswith(f"ROW_NUMBER() OVER (PARTITION BY `{src}` ORDER BY `") and row_number.count(",") == 1
    assert "ORDER BY" not in layers["SUM"][1].aggregates[0].windows[0][1]
    (view_rule,) = prog.rules_for("top")
    assert "<= 2" in str(view_rule)
    text = explain.explain(prog, strata, parse_project({"tables": TABLES, "views": views}), "top").to_text()
    assert "the partitions a change touches are recomputed" in text


def test_the_table_columns_a_view_column_holds():
    """`Program.origins`: through joins (a shared variable is every column it binds), GROUP BY groups and the
    auxiliary predicates of subqueries, to the tables' columns; nothing for a computed column, an aggregate, a
    column one rule of a UNION computes, or a recursive view's."""
    prog, _ = program({
        "per_flight": {"sql": "SELECT r.flight_id, f.miles + 1 AS m, count(*) AS n FROM res r JOIN flight f "
                              "ON r.flight_id = f.flight_id GROUP BY r.flight_id, f.miles + 1"},
        "seats": {"sql": "SELECT flight_id, seat FROM (SELECT flight_id, seat FROM res WHERE seat <> 'x') s"},
        "both": {"sql": "SELECT flight_id, miles FROM flight UNION ALL SELECT flight_id, 0 FROM res"},
        "reach": {"datalog": "reach(X, Y) :- link(X, Y).\nreach(X, Y) :- reach(X, Z), link(Z, Y)."}})
    assert prog.origins("per_flight", "flight_id") == {("res", "flight_id"), ("flight", "flight_id")}
    assert prog.origins("per_flight", "m") == set() and prog.origins("per_flight", "n") == set()
    assert prog.origins("seats", "seat") == {("res", "seat")}
    assert prog.origins("both", "flight_id") == {("flight", "flight_id"), ("res", "flight_id")}
    assert prog.origins("both", "miles") == set()
    assert prog.origins("reach", "x") == set()
