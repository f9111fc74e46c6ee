"""``fixpoint.transitive_rule``: which recursive definitions are the transitive closure of one relation
(and so may be extended by ``p(X, Y) :- p(X, Z), p(Z, Y)`` without changing their fixpoint), and which
only look like one."""

from __future__ import annotations

import pytest

from ivm.config import parse_project
from ivm.lang import compile_project
from ivm.maintain.fixpoint import transitive_extensions, transitive_rule
from ivm.stratify import stratify

TABLES = {"link": {"columns": {"src": "string", "dst": "string"}},
          "hop": {"columns": {"src": "string", "dst": "string"}},
          "wlink": {"columns": {"src": "string", "dst": "string", "w": "int"}}}
CLOSURES = {
    "right": "right(X, Y) :- link(X, Y).\nright(X, Y) :- right(X, Z), link(Z, Y).",
    "left": "left(X, Y) :- link(X, Y).\nleft(X, Y) :- link(X, Z), left(Z, Y).",
    "both": "both(X, Y) :- link(X, Y).\nboth(X, Y) :- link(X, Z), both(Z, Y).\nboth(X, Y) :- both(X, Z), link(Z, Y).",
    "swapped": "swapped(A, B) :- link(A, B).\nswapped(P, Q) :- link(M, Q), swapped(P, M).",
}
NOT_CLOSURES = {
    # link·hop*: not transitive (a→b by link, b→c by link is not derived unless hop has b→c)
    "mixed": "mixed(X, Y) :- link(X, Y).\nmixed(X, Y) :- mixed(X, Z), hop(Z, Y).",
    "two_exits": "two_exits(X, Y) :- link(X, Y).\ntwo_exits(X, Y) :- hop(X, Y).\n"
                 "two_exits(X, Y) :- two_exits(X, Z), link(Z, Y).",
    "reversed_exit": "reversed_exit(X, Y) :- link(Y, X).\nreversed_exit(X, Y) :- reversed_exit(X, Z), link(Z, Y).",
    "filtered": "filtered(X, Y) :- link(X, Y).\nfiltered(X, Y) :- filtered(X, Z), link(Z, Y), Y <> 'a'.",
    "negated": "negated(X, Y) :- link(X, Y).\nnegated(X, Y) :- negated(X, Z), link(Z, Y), not hop(Z, Y).",
    "constant": "constant(X, Y) :- link(X, Y).\nconstant(X, Y) :- constant(X, 'a'), link('a', Y).",
    "weighted": "weighted(X, Y, W) :- wlink(X, Y, W).\nweighted(X, Y, W) :- weighted(X, Z, W), wlink(Z, Y, W).",
    "loop_var": "loop_var(X, Y) :- link(X, Y).\nloop_var(X, Y) :- loop_var(X, X), link(X, Y).",
    "nonlinear": "nonlinear(X, Y) :- link(X, Y).\nnonlinear(X, Y) :- nonlinear(X, Z), nonlinear(Z, Y).",
}
PROGRAM = compile_project(parse_project({
    "tables": TABLES,
    "views": {**{v: {"datalog": d} for v, d in {**CLOSURES, **NOT_CLOSURES}.items()},
              "reach_sql": {"sql": "WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION "
                                   "SELECT r.src, l.dst FROM r JOIN link l ON r.dst = l.src) SELECT src, dst FROM r"},
              "set_sql": {"sql": "WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM link UNION "
                                 "SELECT r.src, l.dst FROM r JOIN link l ON r.dst IS NOT DISTINCT FROM l.src) "
                                 "SELECT src, dst FROM r"}},
}))
STRATA = stratify(PROGRAM)


def rule_for(pred: str):
    [component] = [c for c in STRATA.components if pred in c.predicates]
    return transitive_rule(PROGRAM, pred, component.predicates)


@pytest.mark.parametrize("view", [*CLOSURES, "reach_sql"])
def test_closures_get_the_transitivity_rule(view):  # (reach_sql: the view is its CTE's predicate)
    assert str(rule_for(view)) == f"{view}(X, Y) :- {view}(X, Z), {view}(Z, Y)."


@pytest.mark.parametrize("view", [*NOT_CLOSURES, "set_sql"])
def test_lookalikes_do_not(view):
    assert rule_for(view) is None


@pytest.mark.parametrize("view, positions", [("right", {0}), ("swapped", {0}), ("reach_sql", {0}), ("left", {1}),
                                             ("both", {0, 1}), ("mixed", set()), ("nonlinear", set())])
def test_the_first_round_is_extended_on_the_side_the_linear_rules_leave_open(view, positions):
    # p(X, Z), e(Z, Y) derives (x, b) for every x reaching a changed edge (a, b): only Δ(X, Z), p(Z, Y)
    # reaches further; e(X, Z), p(Z, Y) the mirror image; both shapes need both terms; no closure, none
    [component] = [c for c in STRATA.components if view in c.predicates]
    assert transitive_extensions(PROGRAM, view, component.predicates) == positions
