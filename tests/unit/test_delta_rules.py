"""000 Definition 4.1's delta rules: their shape for the paper's examples, and — run as the SQL that
`ivm explain` prints, in DuckDB — that they add up to the change of the view (new minus old)."""

from __future__ import annotations

from collections import Counter

import duckdb

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain.delta_rules import delta_rules, rule_sql

PROGRAM = compile_project(parse_project({
    "tables": {"link": {"columns": {"src": "string", "dst": "string"}}},
    "views": {"hop": {"datalog": "hop(X, Y) :- link(X, Z), link(Z, Y)."},
              "tri_hop": {"datalog": "tri_hop(X, Y) :- hop(X, Z), link(Z, Y)."},
              "shop": {"sql": "SELECT l1.src, l2.dst FROM link l1 JOIN link l2 ON l1.dst = l2.src "
                              "WHERE l1.src <> 'z'"}},
}))


def test_hop_delta_rules_are_000_d1_and_d2():
    [rule] = PROGRAM.rules_for("hop")
    assert [str(d) for d in delta_rules(rule)] == [
        "Δhop(X, Y) :- Δ(link(X, Z)), link(Z, Y).",      # (d1): Δ(link) joined with the old link
        "Δhop(X, Y) :- linkᵛ(X, Z), Δ(link(Z, Y)).",     # (d2): the new link joined with Δ(link)
    ]


def as_zset(con, sql: str) -> Counter:
    out: Counter = Counter()
    for *row, count in con.execute(sql).fetchall():
        out[tuple(row)] += count
    return Counter({k: v for k, v in out.items() if v})


def test_delta_rules_as_sql_add_up_to_the_change_of_the_view():
    # 000 Example 4.2's link, then a batch that deletes ab and inserts df and af (a Z-set delta)
    old = Counter(["ab", "ad", "dc", "bc", "ch", "fg"])
    delta = Counter({"ab": -1, "df": 1, "af": 1})
    new = Counter(old)
    new.update(delta)
    con = duckdb.connect()
    for name, rows in [("link__old", old), ("link__new", +new), ("link__delta", delta)]:
        con.execute(f"CREATE TABLE {name} (src VARCHAR, dst VARCHAR, __count BIGINT)")
        con.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", [(k[0], k[1], n) for k, n in rows.items()])
    for view in ("hop", "shop"):
        [rule] = PROGRAM.rules_for(view)
        total: Counter = Counter()
        for d in delta_rules(rule):
            total.update(as_zset(con, d.sql(PROGRAM)))
        expected = as_zset(con, rule_sql(PROGRAM, rule, tuple("new" for _ in rule.body)))
        expected.subtract(as_zset(con, rule_sql(PROGRAM, rule, tuple("old" for _ in rule.body))))
        assert {k: v for k, v in total.items() if v} == {k: v for k, v in expected.items() if v}, view
        assert total, "the batch changes the view"


def test_terms_join_their_changed_subgoals_without_a_cross_product():
    """`Counting.factored` joins the unchanged subgoals once after the terms, only where each term's
    changed subgoals join one another: in a(X), b(X, Y), c(Y) with a and c changed, Δa ⋈ c would be a
    cross product (b joins them), so the rule is evaluated term by term; with a and b changed, c joins
    the terms' sum."""
    from ivm.ir import Atom, Literal, Var
    from ivm.maintain.recompute import connected, join_order

    def lit(pred, *names):
        return Literal(Atom(pred, tuple(Var(n) for n in names)))

    body = (lit("a", "X"), lit("b", "X", "Y"), lit("c", "Y"))
    assert join_order(body, 0, {0, 2}) == [0, 2] and not connected(body, [0, 2])
    assert all(connected(body, join_order(body, i, {0, 1})) for i in (0, 1))
    # the unchanged subgoals after the terms: started from the variables the terms bind
    assert join_order(body, among={2}, bound=frozenset({"X", "Y"})) == [2]
    assert join_order(body, among={0, 2}, bound=frozenset({"Y"})) == [2, 0]
    assert connected(body, [2], frozenset({"Y"})) and not connected(body, [0], frozenset({"Y"}))
