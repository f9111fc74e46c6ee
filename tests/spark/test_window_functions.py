"""Window functions end to end, differentially (#45): views with ROW_NUMBER / RANK / DENSE_RANK /
PERCENT_RANK / CUME_DIST / NTILE, LAG / LEAD, FIRST_VALUE, aggregates over RANGE and ROWS frames and over
whole partitions, QUALIFY (top-k per group), a window over a GROUP BY and windows with two different
PARTITION BY, over a table of dates, timestamps, decimals and doubles. Hypothesis draws change streams —
inserts, deletes, key-preserving updates, NULLs, duplicate rows, the deletion of a partition's current
top row and of a whole partition — and after every incremental refresh (validation on, against each
view's own SQL text) each view must equal its full recomputation and DuckDB's result of the same SQL
over the same rows; a second project that receives every batch before one refresh ends equal.

The ORDER BY of ROW_NUMBER, NTILE, LAG / LEAD and FIRST_VALUE over a ROWS frame is total here (``id``,
unique but for exact duplicate rows, which tie harmlessly): over ties SQL engines number rows in any
order (ivm breaks such ties by the row's values, ivm.lang.window_functions). NULLs are ordered
explicitly, as Spark (ASC NULLS FIRST) and DuckDB (ASC NULLS LAST) differ by default.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ivm.maintain.recompute import Evaluator
from tests.conftest import drawn_stream
from tests.helpers import STREAMS, as_zset, assert_close, norm

COLUMNS = {"id": "bigint", "region": "string", "day": "date", "ts": "timestamp", "amount": "decimal(12,2)",
           "price": "double", "qty": "int"}
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string()), ("day", pa.date32()), ("ts", pa.timestamp("us")),
                   ("amount", pa.decimal128(12, 2)), ("price", pa.float64()), ("qty", pa.int32())])
DUCK = "id BIGINT, region VARCHAR, day DATE, ts TIMESTAMP, amount DECIMAL(12,2), price DOUBLE, qty INTEGER"

VIEWS = {
    # top-k per group: QUALIFY over ROW_NUMBER
    "top2": "SELECT region, id, amount, row_number() OVER (PARTITION BY region ORDER BY amount DESC NULLS LAST, id) "
            "AS rn FROM sales QUALIFY rn <= 2",
    # ranks with ties and NULL keys
    "ranks": "SELECT region, day, price, rank() OVER (PARTITION BY region ORDER BY day NULLS FIRST) AS rk, "
             "dense_rank() OVER (PARTITION BY region ORDER BY day NULLS FIRST) AS drk, "
             "percent_rank() OVER (PARTITION BY region ORDER BY day NULLS FIRST) AS pr, "
             "cume_dist() OVER (PARTITION BY region ORDER BY day DESC NULLS LAST) AS cd FROM sales",
    # running totals: the default RANGE frame, peers included
    "running": "SELECT region, ts, amount, sum(amount) OVER (PARTITION BY region ORDER BY ts NULLS FIRST) AS total, "
               "count(*) OVER (PARTITION BY region ORDER BY ts NULLS FIRST) AS n FROM sales",
    # ROWS frames, offsets and values
    "moving": "SELECT id, region, avg(price) OVER (PARTITION BY region ORDER BY id "
              "ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS ma, "
              "lag(amount, 1) OVER (PARTITION BY region ORDER BY id) AS prev, "
              "lead(day, 1, DATE '2000-01-01') OVER (PARTITION BY region ORDER BY id) AS next_day, "
              "first_value(price) OVER (PARTITION BY region ORDER BY id "
              "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS first_price, "
              "ntile(2) OVER (PARTITION BY region ORDER BY id) AS half FROM sales",
    # a window over a GROUP BY, over the whole result (no PARTITION BY)
    "region_rank": "SELECT region, sum(amount) AS total, "
                   "rank() OVER (ORDER BY sum(amount) DESC NULLS LAST) AS rk FROM sales GROUP BY region",
    # two PARTITION BYs (two layers), a whole-partition aggregate inside an expression, a filter after
    "share": "SELECT id, region, day, price / sum(price) OVER (PARTITION BY region) AS share, "
             "max(amount) OVER (PARTITION BY day) AS day_max, "
             "min(qty) OVER (PARTITION BY region) AS least_qty FROM sales WHERE qty > 0",
}

REGIONS = ["east", "west", None]
row = st.builds(
    lambda region, day, hour, cents, price, qty: {
        "region": region, "day": None if day is None else dt.date(2024, 3, 1) + dt.timedelta(days=day),
        "ts": None if hour is None else dt.datetime(2024, 3, 1, hour, 30),
        "amount": None if cents is None else decimal.Decimal(cents).scaleb(-2), "price": price, "qty": qty},
    st.sampled_from(REGIONS), st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(0, 3)),
    st.one_of(st.none(), st.integers(-500, 99999)), st.one_of(st.none(), st.sampled_from([0.5, 1.25, 3.0, 10.1])),
    st.one_of(st.none(), st.integers(-1, 5)))


@st.composite
def batch(draw, state: list[dict], ids) -> list[tuple[str, dict]]:
    """One commit: deletes (a duplicate loses one copy), key-preserving updates of rows held once,
    inserts with fresh ids (and exact copies), and on purpose a partition's top row or a whole
    partition deleted."""
    present = list(state)
    changes: list[tuple[str, dict]] = []
    how = draw(st.sampled_from(["mixed", "top", "partition"]))
    with_amount = [r for r in present if r["amount"] is not None]
    if how == "top" and with_amount:
        region = draw(st.sampled_from(with_amount))["region"]
        top = max((r for r in with_amount if r["region"] == region), key=lambda r: (r["amount"], -r["id"]))
        present.remove(top)
        changes.append(("delete", top))
    elif how == "partition" and present:
        region = draw(st.sampled_from(present))["region"]
        for r in [r for r in present if r["region"] == region]:
            present.remove(r)
            changes.append(("delete", r))
    for _ in range(draw(st.integers(0, 2))):
        if present:
            changes.append(("delete", present.pop(draw(st.integers(0, len(present) - 1)))))
    for _ in range(draw(st.integers(0, 2))):
        once = [r for r in present if present.count(r) == 1]
        if once:
            old = draw(st.sampled_from(once))
            present.remove(old)
            changes += [("update_preimage", old), ("update_postimage", {**draw(row), "id": old["id"]})]
    for _ in range(draw(st.integers(0, 3))):
        copy = state and draw(st.booleans())
        changes.append(("insert", dict(draw(st.sampled_from(state))) if copy else {**draw(row), "id": next(ids)}))
    return changes


def write(path, rows: list[dict], kinds: list[str] | None = None) -> str:
    table = pa.Table.from_pylist(rows, schema=ARROW)
    if kinds:
        table = table.append_column("_change_type", pa.array(kinds, pa.string()))
    pq.write_table(table, path)
    return str(path)


def apply(state: list[dict], changes: list[tuple[str, dict]]) -> None:
    for kind, r in changes:
        if kind in ("delete", "update_preimage"):
            state.remove(r)
        else:
            state.append(r)


def duckdb_views(state: list[dict]) -> dict[str, Counter]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE sales ({DUCK})")
    if state:
        con.executemany("INSERT INTO sales VALUES (?, ?, ?, ?, ?, ?, ?)", [tuple(r[c] for c in COLUMNS) for r in state])
    return {v: Counter(tuple(norm(x) for x in r) for r in con.execute(sql).fetchall()) for v, sql in VIEWS.items()}


def project(make_project, root, **settings):
    views = {n: {"sql": q, "validate": {"sample": 1000}} for n, q in VIEWS.items()}
    return make_project({"sales": {"columns": COLUMNS}}, root=root, views=views, **settings)


def check(p, state: list[dict]) -> dict[str, dict]:
    ours = {v: as_zset(p.read_zset(v).collect()) for v in VIEWS}
    program, strata = p.program
    ev = Evaluator(program, strata, {"sales": p.read_zset("sales")})
    theirs = duckdb_views(state)
    for view in VIEWS:
        assert_close(ours[view], as_zset(ev.relation(view).collect()), view)
        assert_close(ours[view], dict(theirs[view]), view)  # (every view here is a bag)
    return ours


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_window_views_match_full_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    ids = iter(range(1, 10_000))
    initial = [{**r, "id": next(ids)} for r in data.draw(st.lists(row, min_size=3, max_size=10), "initial")]
    root = tmp_path_factory.mktemp("windows")
    one = project(make_project, root / "batch-by-batch")
    one.load("sales", write(root / "sales-0.parquet", initial))
    assert {v.mode for v in one.refresh().views} == {"full"}
    state, batches = list(initial), []
    for n in range(1, 4):
        changes = data.draw(batch(state, ids), f"batch {n}")
        batches.append(changes)
        apply(state, changes)
        if changes:
            one.append("sales", write(root / f"sales-{n}.parquet", [r for _, r in changes], [k for k, _ in changes]))
        result = one.refresh()
        assert result.status == "succeeded"
        assert {v.mode for v in result.views} <= {"incremental", "noop"}
        final = check(one, state)
    everything = project(make_project, root / "all-at-once")
    everything.load("sales", write(root / "sales-0.parquet", initial))
    everything.refresh()
    for n, changes in enumerate(batches, 1):
        if changes:
            everything.append("sales", write(root / f"all-{n}.parquet", [r for _, r in changes],
                                             [k for k, _ in changes]))
    assert {v.mode for v in everything.refresh().views} <= {"incremental", "noop"}
    for view in VIEWS:
        assert_close(as_zset(everything.read_zset(view).collect()), final[view], view)
