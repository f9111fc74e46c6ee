"""Inductive user-defined aggregates end to end, differentially (#48, item 5; 001 §2): aggregates declared
by initial / iterate / merge / final (and retract) Spark SQL expressions over a state, kept per group
from that state (ivm.maintain.groupby), over a table of dates, timestamps, decimals and doubles:

  geo_mean   a DOUBLE state struct (count, sum of logs) with retract: self-maintainable
  amount_sq  a DECIMAL(38,4) sum of squares with retract
  latest     the latest DATE, without retract: incremental on insert, a group with a delete recomputed
             from its stored values (as MIN / MAX are)

in GROUP BYs on a DATE, a TIMESTAMP, a string with NULLs, a global aggregate, and under DISTINCT (which is
recomputed); the stream also calls them from Datalog's groupby. Hypothesis draws change streams — inserts,
deletes, key-preserving updates, NULLs, duplicate rows, the deletion of a group's latest row and of whole
groups — and after every incremental refresh (validation on) each view must equal its full recomputation and
DuckDB's result of the same query (DuckDB spells each aggregate by its SQL definition); a second project
that receives every batch before one refresh ends equal.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm import Project
from ivm.maintain.groupby import GroupByState, groupby_subgoals
from ivm.maintain.recompute import Evaluator
from ivm.modes import Mode
from tests.conftest import drawn_stream, write_project
from tests.helpers import SALES, STREAMS, as_zset, assert_close, duckdb_sales, sales_stream, write_sales

AGGREGATES = {
    "geo_mean": {"initial": "named_struct('n', 0L, 'logs', 0D)",
                 "iterate": "named_struct('n', state.n + 1, 'logs', state.logs + ln(x))",
                 "merge": "named_struct('n', state.n + other.n, 'logs', state.logs + other.logs)",
                 "final": "CASE WHEN state.n > 0 THEN exp(state.logs / state.n) END",
                 "retract": "named_struct('n', state.n - 1, 'logs', state.logs - ln(x))"},
    "amount_sq": {"initial": "CAST(0 AS DECIMAL(38,4))", "iterate": "CAST(state + x * x AS DECIMAL(38,4))",
                  "merge": "CAST(state + other AS DECIMAL(38,4))", "final": "state",
                  "retract": "CAST(state - x * x AS DECIMAL(38,4))"},
    "latest": {"initial": "CAST(NULL AS DATE)", "iterate": "greatest(state, x)", "merge": "greatest(state, other)",
               "final": "state"},
}

#: view -> (ivm's SQL, DuckDB's: each aggregate by its definition)
VIEWS = {
    # retract only: the state merged and retracted, the GROUP BY's input never stored
    "by_region": ("SELECT region, geo_mean(price) AS gm, amount_sq(amount) AS sq, count(*) AS n FROM sales "
                  "GROUP BY region",
                  "SELECT region, exp(avg(ln(price))), coalesce(sum(amount * amount), 0), count(*) FROM sales "
                  "GROUP BY region"),
    "by_day": ("SELECT day, geo_mean(price) AS gm, amount_sq(amount) AS sq FROM sales WHERE qty > 0 GROUP BY day",
               "SELECT day, exp(avg(ln(price))), coalesce(sum(amount * amount), 0) FROM sales WHERE qty > 0 "
               "GROUP BY day"),
    # no retract: a group with a deleted value recomputed from its stored values
    "latest_by_region": ("SELECT region, latest(day) AS last_day, geo_mean(price) AS gm FROM sales GROUP BY region",
                         "SELECT region, max(day), exp(avg(ln(price))) FROM sales GROUP BY region"),
    "by_ts": ("SELECT ts, latest(day) AS last_day, amount_sq(amount) AS sq FROM sales GROUP BY ts",
              "SELECT ts, max(day), coalesce(sum(amount * amount), 0) FROM sales GROUP BY ts"),
    # a global aggregate, and DISTINCT (recomputed)
    "overall": ("SELECT geo_mean(price) AS gm, amount_sq(DISTINCT amount) AS sqd, count(*) AS n FROM sales",
                "SELECT (SELECT exp(avg(ln(price))) FROM sales), "
                "(SELECT coalesce(sum(a * a), 0) FROM (SELECT DISTINCT amount AS a FROM sales)), "
                "(SELECT count(*) FROM sales)"),
}

#: the same aggregates called from Datalog's groupby (a bag of the atom's tuples per group; the head a
#: set, hence DuckDB's DISTINCT): view -> (rule, DuckDB's SQL)
DATALOG = {
    "region_gm_dl": ("region_gm_dl(R, G, S) :- groupby(sales(I, R, D, T, A, P, Q), [R], G = geo_mean(P), "
                     "S = amount_sq(A)).",
                     "SELECT DISTINCT region, exp(avg(ln(price))), coalesce(sum(amount * amount), 0) FROM sales "
                     "GROUP BY region"),
    "ts_latest_dl": ("ts_latest_dl(T, L) :- groupby(sales(I, R, D, T, A, P, Q), [T], L = latest(D)).",
                     "SELECT DISTINCT ts, max(day) FROM sales GROUP BY ts"),
}


def project(make_project, root, datalog: bool = False):
    views = {n: {"sql": q, "validate": {"sample": 1000}} for n, (q, _) in VIEWS.items()}
    if datalog:
        views.update({n: {"datalog": d, "validate": {"sample": 1000}} for n, (d, _) in DATALOG.items()})
    return make_project({"sales": {"columns": SALES}}, root=root, views=views, aggregates=AGGREGATES)


def check(p, state: list[dict]) -> dict[str, dict]:
    both = {**VIEWS, **DATALOG}
    names = [v for v in both if v in p.config.views]
    ours = {v: as_zset(p.read_zset(v).collect()) for v in names}
    program, strata = p.program
    ev = Evaluator(program, strata, {"sales": p.read_zset("sales")})
    theirs = duckdb_sales(state, {v: both[v][1] for v in names})
    for view in names:
        assert_close(ours[view], as_zset(ev.relation(view).collect()), view)
        assert_close(ours[view], dict(theirs[view]), view)
    return ours


def test_inductive_aggregates_are_kept_from_their_state(make_project, tmp_path):
    """With retract the GROUP BY is self-maintainable: its input is not stored (000 §6.2 never reads
    U); without retract (latest) the input is stored for the groups a delete recomputes; under DISTINCT
    the aggregate is recomputed. `ivm explain` says which. A delete from a group that keeps other rows is
    retracted from the state (caught by the comparisons when it is not)."""
    p = project(make_project, tmp_path / "p")
    program, _ = p.program
    maintained = {v: GroupByState.self_maintainable(g) for v in VIEWS for _, _, g in groupby_subgoals(program, v)}
    assert maintained == {"by_region": True, "by_day": True, "latest_by_region": False, "by_ts": False,
                          "overall": False}
    text = p.explain("latest_by_region").to_text()
    assert "from its stored state (001 §2): the inserted values' state merged in, each deleted value retracted" in text
    assert "a group with a deleted value is recomputed from its stored values (no retract declared)" in text
    rows = [{"id": i, "region": "east", "day": dt.date(2024, 3, i), "ts": dt.datetime(2024, 3, 1, 9),
             "amount": decimal.Decimal(f"{i}.50"), "price": float(i), "qty": 1} for i in (1, 2, 3)]
    p.load("sales", write_sales(tmp_path / "sales-0.parquet", rows))
    p.refresh()
    p.append("sales", write_sales(tmp_path / "sales-1.parquet", [rows[2], {**rows[0], "id": 4}], ["delete", "insert"]))
    result = p.refresh()
    assert {v.mode for v in result.views} == {"incremental"}
    check(p, [rows[0], rows[1], {**rows[0], "id": 4}])

    # a changed definition of an aggregate recomputes the views that call it (its stored state has the
    # old definition's shape), and only those
    final = "CASE WHEN state.n > 0 THEN round(exp(state.logs / state.n), 6) END"
    changed = {**AGGREGATES, "geo_mean": {**AGGREGATES["geo_mean"], "final": final}}
    write_project(tmp_path / "p", {"sales": {"columns": SALES}}, aggregates=changed,
                  views={n: {"sql": q, "validate": {"sample": 1000}} for n, (q, _) in VIEWS.items()})
    again = Project.open(str(tmp_path / "p" / "ivm.yaml"))
    try:
        applied = again.apply()
        assert "updated view by_region" in applied and "updated view by_ts" not in applied, applied
        modes = {v.view: v.mode for v in again.refresh().views}
        assert modes == {"by_region": Mode.FULL, "by_day": Mode.FULL, "latest_by_region": Mode.FULL,
                         "overall": Mode.FULL}, modes  # (by_ts: nothing to do)
    finally:
        again.close()


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_inductive_aggregates_match_full_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    # deleted on purpose: a region's latest row (latest's value leaves its group)
    sales_stream(data, lambda root: project(make_project, root, datalog=True), tmp_path_factory.mktemp("inductive"),
                 [*VIEWS, *DATALOG], ("day", lambda r: r["day"]), check)


def test_a_state_whose_type_changes_is_refused_at_apply(make_project, tmp_path):
    """`initial` an INT, `iterate` a DOUBLE: Spark's analysis refuses the fold; apply says so in one line
    with the view named, before any data is read."""
    from ivm.errors import IvmError

    bad = {"dsum": {"initial": "0", "iterate": "state + x", "merge": "state + other", "final": "state"}}
    with pytest.raises(IvmError) as e:
        make_project({"sales": {"columns": SALES}}, root=tmp_path / "p", aggregates=bad,
                     views={"v": {"sql": "SELECT region, dsum(price) AS s FROM sales GROUP BY region"}})
    assert str(e.value).endswith("views.v: the inductive aggregate dsum: `initial` gives its state the type INT, "
                                 "`iterate` DOUBLE; write both in one type (CAST)"), str(e.value)
