"""Planning's decisions without Spark or a catalog: the recompute rules over a view's facts
(ivm.refresh.plan), the run record's JSON round trip (ivm.refresh.record), the strategy registry and
the modes."""

from __future__ import annotations

import pytest

from ivm.catalog.store import StageRecord, WrittenLayer
from ivm.errors import ConfigError
from ivm.explain import choose
from ivm.maintain.crossover import Estimate
from ivm.maintain.strategy import COUNTING, KEYED, REDUCE, REGISTRY, Choice, lookup, stored_form
from ivm.modes import Mode
from ivm.refresh.plan import DEFINITION_CHANGED, RULES, ViewFacts, recompute_reason
from ivm.refresh.record import Plan, Replay, TableDelta, ViewWork
from ivm.stratify import stratify
from ivm.vocabulary import Form
from tests.helpers import PROGRAM, PROJECT


def reason(**facts) -> str | None:
    found = recompute_reason(ViewFacts("v", **facts))
    return found and found[1]


def test_a_view_with_nothing_against_it_is_maintained():
    assert reason() is None


@pytest.mark.parametrize(("facts", "expected"), [
    ({"asked": Mode.FULL}, "--mode full"),
    ({"configured": Mode.FULL}, "the view is configured with mode: full"),
    ({"materialized": False}, "first materialization"),
    ({"definition_changed": ""}, "the definition changed"),
    ({"definition_changed": " after run r1"}, "the definition changed after run r1"),
    ({"missing": ["v__agg0_1"]}, "v__agg0_1 is not materialized yet"),
    ({"missed": [("t", 3, 5)], "lost": "its state there was garbage-collected"},
     "commit versions 3..5 of t were applied by a run that did not refresh this view, and its state there was "
     "garbage-collected"),
    ({"form_switch": "keyed stores the view as presence, its state holds counts"},
     "keyed stores the view as presence, its state holds counts"),
    ({"crossover": Estimate(10, 9.0, 1.0, 3, True, "the recompute is cheaper")}, "auto: the recompute is cheaper"),
])
def test_each_rule_names_its_reason(facts, expected):
    assert reason(**facts) == expected


def test_the_rules_are_tried_in_order():
    """The first that holds wins: a first materialization under --mode full is said to be --mode full, a
    changed definition shadows a missing relation, a crossover that says incremental is no reason."""
    assert reason(asked=Mode.FULL, materialized=False) == "--mode full"
    found = recompute_reason(ViewFacts("v", definition_changed="", missing=["x"]))
    assert found is not None and found[0] is DEFINITION_CHANGED
    assert reason(crossover=Estimate(10, 1.0, 9.0, 3, False, "incremental")) is None
    found = recompute_reason(ViewFacts("v", definition_changed="", replaced="Delta source t: created anew"))
    assert found is not None and found[0].name == "replaced"  # (not DRed across the definition: from the new table)
    assert [r.name for r in RULES] == ["asked", "configured", "first", "replaced", "definition", "missing", "missed",
                                       "form", "crossover"]


def test_explain_says_the_planner_rules():
    """`ivm explain` prints the rules' own words, so it cannot say other than what the planner does."""
    _, reasons = choose(PROGRAM, stratify(PROGRAM), PROJECT, "v_agg")
    said = next(r for r in reasons if r.startswith("a full recompute happens only when"))
    assert all(rule.when in said for rule in RULES)


def test_the_run_record_round_trips():
    layer = WrittenLayer("l1", "t", "delta", "/w/t/l1", 3, 120)
    p = Plan("run-1", {"t": 4, "u": 2}, mode=Mode.REPLAY,
             replay=Replay(2, "run-0", {"t": 1, "u": 1}, {"t": [{"id": "b", "path": "/w/t/b"}]}))
    p.tables = [TableDelta("t", 1, 4, 7)]
    p.views = [ViewWork("v", 1, Mode.INCREMENTAL, "counting (000 §4-6): inputs changed: t", ["t"], ["t"],
                        strategy=KEYED.name, choice={"strategy": "keyed"})]
    records = [p.record({"t": 10, "v": 11})]
    trimmed = TableDelta("t", 1, 4, 7, delta_rows=3, seconds=0.5, layer=layer, updated_keys=1)
    records.append(trimmed.trim_record())
    done = ViewWork("v", 1, Mode.NOOP, "the net deltas of its inputs are empty or cancel out", ["t"], ["t"],
                    delta_in=3, rows=0, rows_changed=0, detail={"joined once": 1}, strategy=KEYED.name)
    records.append(done.maintain_record())
    back, versions, planned = Plan.from_records("run-1", records)
    assert versions == {"t": 10, "v": 11} and back.mode is Mode.REPLAY and back.replay == p.replay
    assert back.tables == [TableDelta("t", 1, 4, 7, 3, 0.5, layer, trimmed=True, updated_keys=1)]
    [v] = back.views
    assert (v.mode, v.reason, v.maintained) == (Mode.NOOP, done.reason, True)
    assert v.planned == (Mode.INCREMENTAL, p.views[0].reason)
    assert (v.strategy, v.delta_in, v.detail, v.layers) == ("keyed", 3, {"joined once": 1}, {})
    assert planned[0]["rule_change"] is False
    assert isinstance(records[0], StageRecord) and records[0].detail["mode"] == "replay"


def test_the_strategy_registry():
    assert set(REGISTRY) == {"counting", "keyed", "reduce"}
    assert lookup("counting") is COUNTING and not COUNTING.count_free
    assert KEYED.count_free and REDUCE.count_free
    assert stored_form("reduce") is Form.PRESENCE and stored_form("counting") == "counts"
    with pytest.raises(ConfigError, match="unknown strategy 'ivm'; use one of counting, keyed, reduce"):
        lookup("ivm")


def test_explain_asks_the_views_strategy():
    """`ivm explain`'s algorithm and steps are the chosen strategy's own (`Strategy.explain`), the planner's
    rules after them; a view configured ``mode: full`` is a recompute whatever the strategy."""
    program, strata = PROGRAM, stratify(PROGRAM)
    for s in REGISTRY.values():
        choice = Choice("v_agg", s.name, "test")
        algorithm, reasons = choose(program, strata, PROJECT, "v_agg", choice)
        own = s.explain(program, strata, PROJECT, "v_agg")
        assert (algorithm, reasons[:len(own[1])]) == own and reasons[-1].startswith("a full recompute happens")
    assert choose(program, strata, PROJECT, "v_agg")[0] == "counting"


def test_modes():
    assert Mode.parse("incremental") is Mode.INCREMENTAL and Mode("noop") is Mode.NOOP
    for bad in ("noop", "replay", "fast"):
        with pytest.raises(ConfigError, match=f"unknown mode '{bad}'; use one of auto, incremental, full"):
            Mode.parse(bad)
