"""The delta rule of each subgoal kind (ivm.maintain.subgoals): every kind a compiled view can hold is
classified, has one entry, and is what counting, `ivm explain` and the cost model's shape read (no Spark)."""

from __future__ import annotations

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain import reduce, subgoals
from ivm.maintain.delta_rules import delta_rules
from ivm.vocabulary import SubgoalKind

TABLES = {
    "emp": {"columns": {"id": "int", "dept": "string", "pay": "double", "skills": "array<string>"}, "key": ["id"]},
    "dept": {"columns": {"name": "string", "boss": "int"}, "key": ["name"]},
    "team": {"columns": {"id": "int", "members": "int"}, "key": ["id"],
             "nested": {"members": {"collection": "member", "id": "set_id"}}},
    "member": {"columns": {"set_id": "int", "name": "string"}},
}
VIEWS = {
    "pay": {"sql": "SELECT dept, SUM(pay) AS total FROM emp GROUP BY dept"},
    "lonely": {"sql": "SELECT DISTINCT name FROM dept d WHERE NOT EXISTS (SELECT 1 FROM emp e WHERE e.dept = d.name)"},
    "skill": {"sql": "SELECT e.id, s FROM emp e LATERAL VIEW explode(e.skills) x AS s"},
    "roster": {"datalog": "roster(I, N) :- team(I, S), S(N)."},
    "crew": {"datalog": "crew(D, S) :- setof(I, emp(I, D, P, K), S)."},
    "bosses": {"sql": "SELECT DISTINCT d.name, e.pay FROM dept d JOIN emp e ON e.id = d.boss"},
}
PROGRAM = compile_project(parse_project({"tables": TABLES, "views": VIEWS}))


def kinds(view: str) -> set[SubgoalKind]:
    preds = [view, *(p for p, d in PROGRAM.predicates.items() if d.owner == view)]
    return {subgoals.kind(PROGRAM, item) for p in preds for r in PROGRAM.rules_for(p) for item in r.body} - {None}


def test_every_kind_is_classified_and_has_one_rule():
    assert kinds("pay") >= {SubgoalKind.GROUPBY}
    assert kinds("lonely") >= {SubgoalKind.NEGATION, SubgoalKind.ATOM}
    assert SubgoalKind.EXTRACTION in kinds("skill")
    assert SubgoalKind.OWNER_INDEX in kinds("roster")
    assert kinds("crew") >= {SubgoalKind.SETOF}
    assert set(subgoals.RULES) == set(SubgoalKind)
    assert all(k is entry.kind for k, entry in subgoals.RULES.items())


def test_a_delta_rule_per_subgoal_and_none_for_conditions():
    """000 Definition 4.1: one delta rule per body item the table has an entry for, none for a condition."""
    [rule] = PROGRAM.rules_for("bosses")
    assert len(delta_rules(rule)) == sum(subgoals.rule_for(PROGRAM, i) is not None for i in rule.body) == 2


def test_only_plain_atoms_share_their_joins_and_make_a_one_join_shape():
    assert {k for k, e in subgoals.RULES.items() if e.joins} == {SubgoalKind.ATOM}
    assert isinstance(reduce.shape(PROGRAM, "bosses"), reduce.Shape)
    assert "not a join of tables" in reduce.shape(PROGRAM, "lonely")


def test_explain_says_what_each_kinds_rule_does_once():
    lines = subgoals.explain_lines(PROGRAM, ["pay"])
    assert lines[0].startswith("aggregation (") and "000 Algorithm 6.1 with the stored state pay__agg0_" in lines[0]
    lonely = [p for p, d in PROGRAM.predicates.items() if d.owner == "lonely"] + ["lonely"]
    negation = [line for line in subgoals.explain_lines(PROGRAM, lonely) if line.startswith("negation")]
    assert len(negation) == 1 and "000 Definition 6.1" in negation[0]
    assert any("Δ1–Δ6" in line or "Γ1–Γ6" in line for line in subgoals.explain_lines(PROGRAM, ["crew"]))
