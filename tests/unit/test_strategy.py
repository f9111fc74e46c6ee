"""Which of counting, key-based (003) and REDUCE (004) applies to a view, and the cost model's choice."""

from __future__ import annotations

import pytest

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain import reduce, strategy
from ivm.stratify import stratify

TABLES = {
    "emp": {"columns": {"id": "int", "dept": "string", "sal": "int"}, "key": ["id"]},
    "dept": {"columns": {"name": "string", "region": "string"}, "key": ["name"]},
    "edge": {"columns": {"src": "string", "dst": "string"}},
    "proj": {"columns": {"pid": "int", "dept": "string"}, "key": ["pid"]},
}
VIEWS = {
    "staff": {"sql": "SELECT DISTINCT e.id, e.dept, d.region FROM emp e JOIN dept d ON e.dept = d.name"},
    "regions": {"sql": "SELECT DISTINCT e.dept, d.region FROM emp e JOIN dept d ON e.dept = d.name"},
    "pairs": {"sql": "SELECT DISTINCT e.dept, p.dept AS other FROM emp e JOIN proj p ON e.sal = p.pid"},
    "bag": {"sql": "SELECT e.dept FROM emp e"},
    "per_dept": {"sql": "SELECT dept, count(*) AS n FROM emp GROUP BY dept"},
    "north": {"sql": "SELECT DISTINCT e.dept FROM emp e WHERE EXISTS "
                     "(SELECT 1 FROM dept d WHERE d.name = e.dept AND d.region = 'n')"},
    "names": {"sql": "SELECT dept FROM emp UNION SELECT name FROM dept"},
    "reach": {"datalog": "reach(X, Y) :- edge(X, Y).\nreach(X, Y) :- reach(X, Z), edge(Z, Y)."},
    "on_top": {"sql": "SELECT DISTINCT dept FROM staff"},
    "computed": {"sql": "SELECT DISTINCT e.sal + 1 AS s FROM emp e"},
}
PROGRAM = compile_project(parse_project({"tables": TABLES, "views": VIEWS}))
STRATA = stratify(PROGRAM)


def applies(view: str) -> dict[str, bool]:
    return {c.strategy: c.applicable for c in strategy.applicability(PROGRAM, STRATA, view)}


@pytest.mark.parametrize(("view", "keyed", "reduced"), [
    ("staff", True, True), ("regions", True, True), ("north", True, False), ("names", True, False),
    ("bag", False, False), ("per_dept", False, False), ("reach", False, False), ("on_top", False, False),
    ("computed", True, False)])
def test_applicability(view, keyed, reduced):
    assert applies(view) == {"counting": True, "keyed": keyed, "reduce": reduced}


def test_why_not_is_given_in_words():
    why = {c.strategy: c.why for c in strategy.applicability(PROGRAM, STRATA, "bag")}
    assert "bag" in why["reduce"] and "DISTINCT" in why["reduce"]
    assert "computes a column" in reduce.shape(PROGRAM, "computed")
    assert "several select expressions" in reduce.shape(PROGRAM, "names")


def test_forced_strategy_must_apply():
    with pytest.raises(ValueError, match="views.north: strategy reduce does not apply"):
        strategy.choose(PROGRAM, STRATA, "north", "reduce", None, {}, {}, None)
    c = strategy.choose(PROGRAM, STRATA, "north", "keyed", None, {"emp": 10, "dept": 10}, {"emp": 1}, None)
    assert c.strategy == "keyed" and "forced" in c.reason


def test_views_with_auxiliary_predicates_stay_with_counting_unless_forced():
    c = strategy.choose(PROGRAM, STRATA, "north", None, None, {"emp": 10, "dept": 10}, {"emp": 1}, None)
    assert c.strategy == "counting" and "auxiliary predicates" in c.reason


def test_reduce_wins_where_many_join_paths_meet_and_the_view_holds_keys():
    # a delete-heavy change of dept under a huge emp: counting joins every employee of the changed
    # departments; REDUCE looks the deletions up in the view (Theorem 3: the view holds dept's key)
    sizes = {"emp": 10_000_000, "dept": 100}
    c = strategy.choose(PROGRAM, STRATA, "regions", None, None, sizes, {"dept": 50}, None)
    cost = {x.strategy: x.cost for x in c.candidates}
    assert c.strategy == "reduce", c.reason
    assert cost["reduce"] < cost["counting"] <= cost["keyed"]


def test_small_changes_stay_with_counting_and_the_stored_form_is_sticky():
    sizes = {"emp": 1000, "dept": 10}
    c = strategy.choose(PROGRAM, STRATA, "staff", None, None, sizes, {"emp": 5}, None)
    assert c.strategy == "counting"
    # a view stored without counts stays so unless counting saves more than a recompute
    sticky = strategy.choose(PROGRAM, STRATA, "staff", None, None, sizes, {"emp": 5}, "presence")
    cost = {x.strategy: x.cost for x in sticky.candidates}
    assert sticky.strategy in ("keyed", "reduce") and cost["counting"] > min(cost["keyed"], cost["reduce"])


def test_join_order_starts_at_the_changed_reference_and_stays_connected():
    s = reduce.shape(PROGRAM, "staff")
    assert reduce.join_order(PROGRAM, s, 1) == [1, 0]
    assert reduce.key_in_view(PROGRAM, s.atoms[0], set(s.head_vars)) == ["id"]
    assert reduce.key_in_view(PROGRAM, reduce.shape(PROGRAM, "pairs").atoms[1], {"e_dept_2", "p_dept_5"}) is None


def test_join_order_puts_a_table_whose_key_the_view_holds_first():
    """004 §4 (Theorem 3) and §7: from a change of r2, r3 (keyed by e, which the view holds: V_E = ∅ past
    it) joins before r1, though the view names r1 first; without keys, the table bringing more view
    columns first; ties in body order. ``ivm explain`` shows the order."""
    tables = {"r1": {"columns": {"a": "string", "b": "string"}},
              "r2": {"columns": {"b": "string", "c": "string", "d": "string"}},
              "r3": {"columns": {"d": "string", "e": "string", "f": "string"}, "key": ["e"]}}
    views = {"v": {"sql": "SELECT DISTINCT r1.a, r2.c, r3.e FROM r1 JOIN r2 ON r1.b = r2.b JOIN r3 ON r2.d = r3.d"},
             "w": {"sql": "SELECT DISTINCT r1.a, r2.c, r3.e, r3.f FROM r1 JOIN r2 ON r1.b = r2.b "
                          "JOIN r3 ON r2.d = r3.d"}}
    config = parse_project({"tables": {**tables, "r3": {**tables["r3"], "key": None}}, "views": views})
    keyed_config = parse_project({"tables": tables, "views": views})
    for cfg, expected in ((keyed_config, {"v": ["r2", "r3", "r1"], "w": ["r2", "r3", "r1"]}),
                          (config, {"v": ["r2", "r1", "r3"], "w": ["r2", "r3", "r1"]})):
        program = compile_project(cfg)
        for view, order in expected.items():
            s = reduce.shape(program, view)
            assert [s.atoms[j].pred for j in reduce.join_order(program, s, 1)] == order, (view, order)
    program = compile_project(keyed_config)
    _, steps = strategy.REDUCE.explain(program, stratify(program), keyed_config, "v")
    assert any("r2 → r3 → r1" in line for line in steps)
