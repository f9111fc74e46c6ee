"""Full refreshes over tables with delta layers, differentially (#49, item 1): a GROUP BY of linear
aggregates (COUNT, SUM, AVG, VARIANCE) is computed from its tables' layers as stored, unconsolidated, in
one aggregation (`GroupByState.full(weighted=True)`, `Evaluator.weighted`); any other GROUP BY from the
consolidated rows, its state and T's values in one aggregation. Hypothesis draws change streams over a
table of dates, timestamps, decimals and doubles — inserts, deletes, key-preserving updates, NULLs,
duplicate rows, the deletion of a region's largest amount and of whole regions (groups emptied, their
rows cancelling across layers) — and after every ``--mode full`` refresh (validation on, no compaction:
the layers pile up) each view must equal the Evaluator's recomputation and DuckDB's result of the same
SQL; a last batch is then maintained incrementally from the states those refreshes wrote. A keyed table
(a set: each key once) goes the same way through its updates.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm.maintain.counting import weighted
from ivm.maintain.recompute import Evaluator
from ivm.modes import Mode
from tests.conftest import drawn_stream
from tests.helpers import (
    SALES,
    STREAMS,
    apply_sales,
    as_zset,
    assert_close,
    duckdb_sales,
    sale,
    sales_batch,
    write_sales,
)

CHECK = {"validate": {"sample": 1000}}
VIEWS = {
    # linear: from the layers as stored
    "by_day": "SELECT day, sum(amount) AS amount, avg(price) AS price, count(qty) AS n, count(*) AS rows_ "
              "FROM sales GROUP BY day",
    "by_ts": "SELECT ts, region, sum(qty) AS qty, avg(amount) AS mean, variance(price) AS var FROM sales "
             "WHERE qty > 0 OR qty IS NULL GROUP BY ts, region",
    "overall": "SELECT sum(amount) AS amount, stddev_pop(price) AS sd, count(*) AS n FROM sales",
    # a join: counts multiply, each side's layers unconsolidated
    "pairs": "SELECT a.region, count(*) AS n, sum(b.amount) AS amount FROM sales a JOIN sales b "
             "ON a.day = b.day GROUP BY a.region",
    # not linear: MIN/MAX and DISTINCT from the consolidated rows
    "extremes": "SELECT region, max(amount) AS top, min(day) AS first, count(DISTINCT qty) AS qtys, "
                "sum(price) AS price FROM sales GROUP BY region",
}
LINEAR = {"by_day", "by_ts", "overall", "pairs"}


def project(make_project, root):
    views = {v: {"sql": q, **CHECK} for v, q in VIEWS.items()}
    return make_project({"sales": {"columns": SALES}}, root=root, views=views, storage={"compact_max_layers": 100})


def check(p, state: list[dict]) -> None:
    program, strata = p.program
    ev = Evaluator(program, strata, {"sales": p.read_zset("sales")})
    theirs = duckdb_sales(state, VIEWS)
    for view in VIEWS:
        ours = as_zset(p.read_zset(view).collect())
        assert_close(ours, as_zset(ev.relation(view).collect()), view)
        assert_close({r: 1 for r in ours}, {r: 1 for r in theirs[view]}, view)  # (every row once: GROUP BY)


def uses_layers(p) -> set[str]:
    """The views whose GROUP BY input a full refresh reads from the tables' layers."""
    program, strata = p.program
    return {program.predicates[u].owner for u in weighted(program, strata)}


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_full_refreshes_over_layers_match_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    root = tmp_path_factory.mktemp("full")
    p = project(make_project, root / "p")
    assert uses_layers(p) == LINEAR
    ids = iter(range(1, 10_000))
    state = [{**r, "id": next(ids)} for r in data.draw(st.lists(sale, min_size=3, max_size=10), "initial")]
    p.load("sales", write_sales(root / "sales-0.parquet", state))
    p.refresh()
    check(p, state)
    for n in range(1, 4):
        changes = data.draw(sales_batch(state, ids, ("amount", lambda r: r["amount"])), f"batch {n}")
        apply_sales(state, changes)
        if changes:
            p.append("sales", write_sales(root / f"sales-{n}.parquet", [r for _, r in changes],
                                          [k for k, _ in changes]))
        result = p.refresh(mode="full")
        assert result.status == "succeeded", result.status
        assert {v.mode for v in result.views} == {Mode.FULL}
        check(p, state)
    assert len(p.catalog.state("sales").layers) >= 2  # (what the refreshes read: a base layer and deltas)
    # the states those refreshes wrote are what an incremental refresh maintains next
    changes = data.draw(sales_batch(state, ids, ("amount", lambda r: r["amount"])), "batch 4")
    apply_sales(state, changes)
    if changes:
        p.append("sales", write_sales(root / "sales-4.parquet", [r for _, r in changes], [k for k, _ in changes]))
    assert {v.mode for v in p.refresh(mode="incremental").views} <= {Mode.INCREMENTAL, Mode.NOOP}
    check(p, state)


def test_a_keyed_table_through_its_updates(make_project, tmp_path):
    """A keyed table is a set (each key once, count 1): its layers, an update's -1 and +1 included, add up
    to it as the views use it."""
    keyed = {"sales": {"columns": SALES, "key": ["id"]}}
    p = make_project(keyed, root=tmp_path / "p", views={v: {"sql": VIEWS[v], **CHECK} for v in ("by_day", "pairs")},
                     storage={"compact_max_layers": 100})
    assert uses_layers(p) == {"by_day", "pairs"}

    def sold(i: int, day: int, cents: int) -> dict:
        return {"id": i, "region": "east" if i % 2 else None, "day": dt.date(2024, 3, day),
                "ts": dt.datetime(2024, 3, 1, 9), "amount": decimal.Decimal(cents).scaleb(-2),
                "price": 0.5 * i, "qty": i}

    state = [sold(i, 1 + i % 2, 100 * i) for i in range(1, 7)]
    p.load("sales", write_sales(tmp_path / "s0.parquet", state))
    p.refresh()
    moved, gone = sold(3, 3, 999), [r for r in state if r["day"] == dt.date(2024, 3, 2)]
    changes = [("update_preimage", state[2]), ("update_postimage", moved)] + [("delete", r) for r in gone
                                                                               if r["id"] != 3]
    p.append("sales", write_sales(tmp_path / "s1.parquet", [r for _, r in changes], [k for k, _ in changes]))
    apply_sales(state, changes)
    assert {v.mode for v in p.refresh(mode="full").views} == {Mode.FULL}
    theirs = duckdb_sales(state, {v: VIEWS[v] for v in ("by_day", "pairs")})
    for view in ("by_day", "pairs"):
        ours = as_zset(p.read_zset(view).collect())
        assert_close({r: 1 for r in ours}, {r: 1 for r in theirs[view]}, view)
    # day 2 lost every row: its group is gone, though its rows are still in the base layer (cancelled)
    assert dt.date(2024, 3, 2) not in {r[0] for r in as_zset(p.read_zset("by_day").collect())}
