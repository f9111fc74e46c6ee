"""003's key-based analysis on the paper's airline examples (§5.5, §6.4, §7.3): bound columns,
duplicates, and the per-table, per-operation decision with its reason."""

from __future__ import annotations

import pytest

from ivm.analysis import analyse
from ivm.config import parse_project
from ivm.lang import compile_project

#: 003 §5.5's schema: primary keys, and the alternate keys the paper lists
TABLES = {
    "flight": {"columns": {"flight_id": "int", "flight_no": "string", "date": "string"}, "key": ["flight_id"],
               "unique": [["flight_no", "date"]]},
    "res": {"columns": {"res_id": "int", "psgr_id": "int", "flight_id": "int", "seat": "string"}, "key": ["res_id"],
            "unique": [["psgr_id", "flight_id"], ["flight_id", "seat"]]},
    "psgr": {"columns": {"psgr_id": "int", "name": "string", "phone": "string", "meal": "string", "ffn": "int"},
             "key": ["psgr_id"], "unique": [["ffn"]]},
    "ff": {"columns": {"ffn": "int", "miles": "int"}, "key": ["ffn"]},
}
VIEWS = {
    "special_meals": "SELECT res.seat, psgr.meal FROM res, psgr WHERE res.flight_id = 100 "
                     "AND res.psgr_id = psgr.psgr_id AND psgr.meal IS NOT NULL",
    "ff_res": "SELECT psgr.ffn FROM psgr, res WHERE psgr.psgr_id = res.psgr_id",
    "ff_res_distinct": "SELECT DISTINCT psgr.ffn FROM psgr, res WHERE psgr.psgr_id = res.psgr_id",
    "many_miles": "SELECT psgr_id FROM psgr WHERE psgr.ffn IN (SELECT ffn FROM ff WHERE miles > 50000)",
    "bad_flight": "SELECT res_id FROM res WHERE NOT EXISTS "
                  "(SELECT * FROM flight WHERE flight.flight_id = res.flight_id)",
    "seat_taken": "SELECT seat FROM res WHERE NOT EXISTS (SELECT * FROM flight WHERE flight.flight_id = res.flight_id)",
    "all_ffn": "SELECT ffn FROM psgr UNION SELECT ffn FROM ff",
    "per_flight": "SELECT flight_id, count(*) AS n FROM res GROUP BY flight_id",
}
PROGRAM = compile_project(parse_project({"tables": TABLES, "views": {v: {"sql": q} for v, q in VIEWS.items()}}))


def decisions(view: str) -> dict[tuple[str, str], str]:
    return {(t, op): d for t, op, d, _ in analyse(PROGRAM, view).table()}


def test_special_meals_both_references_safe_no_duplicates():
    a = analyse(PROGRAM, "special_meals")
    assert a.applicable and not a.may_have_duplicates
    # res.flight_id = constant, <flight_id, seat> is a key, res.psgr_id = psgr.psgr_id, psgr_id a key
    assert set(a.bound) == {f"res.{c}" for c in TABLES["res"]["columns"]} | {
        f"psgr.{c}" for c in TABLES["psgr"]["columns"]}
    assert set(decisions("special_meals").values()) == {"incremental"}


def test_ff_res_may_hold_duplicates_and_res_is_unsafe_for_deletes_and_updates():
    a = analyse(PROGRAM, "ff_res")
    assert a.may_have_duplicates and not a.applicable
    assert "needs DISTINCT; counting keeps derivation counts" in a.reason
    assert set(a.bound) == {f"psgr.{c}" for c in TABLES["psgr"]["columns"]} | {"res.psgr_id"}
    d = decisions("ff_res")
    assert {op: d[("psgr", op)] for op in ("insert", "delete", "update")} == dict.fromkeys(
        ("insert", "delete", "update"), "incremental")
    assert (d[("res", "insert")], d[("res", "delete")], d[("res", "update")]) == (
        "incremental", "rematerialize", "rematerialize")
    why = {op: r for t, op, _, r in analyse(PROGRAM, "ff_res").table() if t == "res"}
    assert "add (res_id) or (psgr_id, flight_id) or (flight_id, seat)" in why["delete"]
    # with DISTINCT (as 003 asks) the strategy applies, still rematerializing on res deletes and updates
    assert analyse(PROGRAM, "ff_res_distinct").applicable
    assert decisions("ff_res_distinct")[("res", "delete")] == "rematerialize"


def test_many_miles_ff_is_safe_in_the_in_subquery():
    d = decisions("many_miles")
    assert all(d[("ff", op)] == "incremental" for op in ("insert", "delete", "update"))
    reasons = {r for t, _, _, r in analyse(PROGRAM, "many_miles").table() if t == "ff"}
    assert reasons == {"safe in EXISTS/IN: the correlated bound columns include the key (ffn) (003 Def. 6.3)"}


def test_bad_flight_flight_is_i_safe_and_du_safe():
    rows = {(t, op): (d, r) for t, op, d, r in analyse(PROGRAM, "bad_flight").table()}
    assert rows[("flight", "insert")] == ("incremental", "I-safe (003 Def. 7.1)")
    assert rows[("flight", "delete")][0] == "incremental" and "DU-safe" in rows[("flight", "delete")][1]


def test_not_exists_over_an_unbound_column_is_not_i_safe():
    # only seat is projected: res.flight_id is not bound, so flight is not I-safe (003 Def. 7.1)
    d = decisions("seat_taken")
    assert d[("flight", "insert")] == "rematerialize" and d[("flight", "delete")] == "rematerialize"


def test_union_is_analysed_per_select_expression():
    a = analyse(PROGRAM, "all_ffn")
    assert a.applicable
    assert set(decisions("all_ffn")) == {(t, op) for t in ("psgr", "ff") for op in ("insert", "delete", "update")}


@pytest.mark.parametrize("view", ["per_flight"])
def test_aggregate_views_are_outside_003(view):
    a = analyse(PROGRAM, view)
    assert not a.applicable and "aggregates" in a.reason


def test_003_rules_for_special_meals_and_ff_res():
    from ivm.maintain.keyed import derived_rules

    rules = {r.name: r for r in derived_rules(PROGRAM, "special_meals")}
    assert set(rules) == {"ins-res-special_meals", "del-res-special_meals", "ins-psgr-special_meals",
                          "del-psgr-special_meals"}
    ins = rules["ins-res-special_meals"].sql
    assert "FROM res__inserted AS t1, psgr AS t2" in ins
    assert ins.endswith("AND (seat, meal) NOT IN (SELECT seat, meal FROM inserted_special_meals)")
    assert "FROM res__deleted AS t1, psgr__old AS t2" in rules["del-res-special_meals"].sql
    ff = {r.name: r for r in derived_rules(PROGRAM, "ff_res_distinct")}
    # res is unsafe: its inserts check the whole view, its deletes and updates rematerialize (003 §5.5)
    assert ff["ins-res-ff_res_distinct"].sql.endswith("(ffn) NOT IN (SELECT ffn FROM ff_res_distinct)")
    assert ff["rematerialize-ff_res_distinct"].when == "deleted from res, updated res"
    assert "del-res-ff_res_distinct" not in ff
    assert derived_rules(PROGRAM, "ff_res") == []  # duplicates: the strategy does not apply
