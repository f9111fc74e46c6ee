"""Delta rules that take subgoals from the run's deltas (ivm.maintain.references): a keyed table looked
up at the keys a delta binds, and a table whose declared foreign key (``references:``) is bound by the
referenced table's delta. Differentially: orders and lineitems change in the style of TPC-H's RF1/RF2
(an order inserted or deleted with its lineitems) and also by updates of orders and lineitems,
lineitems added to and removed from kept orders, NULLs; after every refresh each view equals its full
recomputation and DuckDB, and a project taking all batches at once ends equal. The RF-style refresh
must read no lineitem in the maintain stage."""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivm.maintain.delta_rules import delta_rules
from ivm.maintain.recompute import Evaluator
from ivm.maintain.references import shortcuts
from ivm.spark import JobMetrics
from tests.conftest import DISTRIBUTED, drawn_stream
from tests.helpers import STREAMS, as_zset, assert_close, norm, write_jsonl

TABLES = {
    "customer": {"columns": {"ck": "int", "seg": "string"}, "key": ["ck"]},
    "orders": {"columns": {"ok": "int", "ck": "int", "pri": "int"}, "key": ["ok"],
               "references": {"ck": "customer.ck"}},
    "lineitem": {"columns": {"ok": "int", "ln": "int", "price": "int"}, "key": ["ok", "ln"],
                 "references": {"ok": "orders.ok"}},
}
VIEWS = {
    # Q3's shape: a GROUP BY over customer ⋈ orders ⋈ lineitem
    "revenue": "SELECT o.ok, o.pri, sum(l.price) AS rev, count(*) AS n FROM customer c "
               "JOIN orders o ON c.ck = o.ck JOIN lineitem l ON l.ok = o.ok WHERE c.seg = 'B' GROUP BY o.ok, o.pri",
    # lineitem before orders in the body: the Δorders term reads lineitem at its new state
    "lines": "SELECT l.ok, l.ln, l.price, o.pri FROM lineitem l JOIN orders o ON o.ok = l.ok WHERE l.price > 1",
    "pri_segs": "SELECT DISTINCT o.pri, c.seg FROM orders o JOIN lineitem l ON l.ok = o.ok JOIN customer c "
                "ON c.ck = o.ck",
}
DUCK_TYPES = {"int": "INTEGER", "string": "VARCHAR"}

maybe = st.one_of(st.none(), st.integers(0, 3))


@st.composite
def initial(draw) -> dict[str, dict]:
    customers = {k: (draw(st.sampled_from(["A", "B", None])),) for k in range(1, 4)}
    orders = {k: (draw(st.sampled_from([1, 2, 3, None])), draw(maybe)) for k in draw(st.sets(st.integers(1, 6)))}
    lines = {(o, n): (draw(maybe),) for o in orders for n in draw(st.sets(st.integers(1, 3)))}
    return {"customer": customers, "orders": orders, "lineitem": lines}


@st.composite
def batch(draw, state: dict[str, dict], next_key: int) -> dict[str, list[tuple[str, tuple]]]:
    """RF1/RF2 (orders inserted with lineitems, deleted with all of theirs), then per kept order maybe an
    update of the order, lineitems added, removed or updated. Referential integrity holds after it."""
    orders, lines = state["orders"], state["lineitem"]
    out: dict[str, list] = {"orders": [], "lineitem": []}
    for k in range(next_key, next_key + draw(st.integers(0, 2))):  # RF1
        out["orders"].append(("insert", (k, draw(st.sampled_from([1, 2, 3, None])), draw(maybe))))
        out["lineitem"] += [("insert", (k, n, draw(maybe))) for n in draw(st.sets(st.integers(1, 3)))]
    kept = sorted(orders)
    gone = draw(st.sets(st.sampled_from(kept))) if kept else set()
    for k in sorted(gone):  # RF2
        out["orders"].append(("delete", (k, *orders[k])))
        out["lineitem"] += [("delete", (o, n, *v)) for (o, n), v in sorted(lines.items()) if o == k]
    for k in kept:
        if k in gone:
            continue
        if draw(st.booleans()):
            out["orders"] += [("update_preimage", (k, *orders[k])),
                              ("update_postimage", (k, draw(st.sampled_from([1, 2, 3, None])), draw(maybe)))]
        for n in draw(st.sets(st.integers(1, 3), max_size=2)):
            if (k, n) not in lines:
                out["lineitem"].append(("insert", (k, n, draw(maybe))))
            elif draw(st.booleans()):
                out["lineitem"].append(("delete", (k, n, *lines[(k, n)])))
            else:
                out["lineitem"] += [("update_preimage", (k, n, *lines[(k, n)])),
                                    ("update_postimage", (k, n, draw(maybe)))]
    if draw(st.booleans()):  # a customer changes segment (customer is looked up by orders' deltas)
        ck = draw(st.integers(1, 3))
        out["customer"] = [("update_preimage", (ck, *state["customer"][ck])),
                           ("update_postimage", (ck, draw(st.sampled_from(["A", "B", None]))))]
    return {t: c for t, c in out.items() if c}


def apply(state: dict[str, dict], changes: dict) -> None:
    width = {"customer": 1, "orders": 1, "lineitem": 2}
    for table, items in changes.items():
        for kind, row in items:
            key = row[0] if width[table] == 1 else row[:2]
            if kind in ("delete", "update_preimage"):
                del state[table][key]
            else:
                state[table][key] = row[width[table]:]


def rows(state: dict[str, dict], table: str) -> list[tuple]:
    return [((*k,) if isinstance(k, tuple) else (k,)) + v for k, v in state[table].items()]


def append(project, root, n: int, changes: dict) -> None:
    for table, items in changes.items():
        project.append(table, write_jsonl(root / f"{table}-{n}.jsonl", list(TABLES[table]["columns"]),
                                     [r for _, r in items], [k for k, _ in items]))


def check(project, state: dict[str, dict]) -> dict[str, dict]:
    program, strata = project.program
    ev = Evaluator(program, strata, {t: project.read_zset(t) for t in TABLES})
    con = duckdb.connect()
    for table, spec in TABLES.items():
        con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {DUCK_TYPES[t]}' for c, t in spec['columns'].items())})")
        if state[table]:
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(spec['columns']))})", rows(state, table))
    out = {}
    for view, sql in VIEWS.items():
        ours = as_zset(project.read_zset(view).collect())
        assert_close(ours, as_zset(ev.relation(view).collect()), view)
        bag = {r: (1 if program.predicates[view].semantics == "set" else c) for r, c in ours.items()}
        assert_close(bag, dict(Counter(tuple(norm(x) for x in r) for r in con.execute(sql).fetchall())), view)
        out[view] = ours
    return out


def _project(make_project, root, state, **settings):
    p = make_project(TABLES, root=root, views={v: {"sql": q} for v, q in VIEWS.items()}, **settings)
    for table in TABLES:
        p.load(table, write_jsonl(root.parent / f"{root.name}-{table}-0.jsonl", list(TABLES[table]["columns"]),
                             rows(state, table)))
    p.refresh()
    return p


@pytest.mark.e2e
@STREAMS  # one stream per CI run (about a minute)
@given(data=st.data())
def test_references_stream_matches_recompute_and_duckdb(make_project, tmp_path_factory, data):
    drawn_stream(data)
    start = data.draw(initial(), "initial")
    state = {t: dict(v) for t, v in start.items()}
    root = tmp_path_factory.mktemp("references")
    one = _project(make_project, root / "batch-by-batch", state)
    batches = []
    for n in range(1, 4):
        changes = data.draw(batch(state, 100 * n), f"batch {n}")
        batches.append(changes)
        apply(state, changes)
        append(one, root, n, changes)
        assert {v.mode for v in one.refresh().views} <= {"incremental", "noop"}
        final = check(one, state)
    everything = _project(make_project, root / "all-at-once", {t: dict(v) for t, v in start.items()},
                          spark=DISTRIBUTED)
    for n, changes in enumerate(batches, 1):
        append(everything, root, n, changes)
    everything.refresh()
    for view in VIEWS:
        assert_close(as_zset(everything.read_zset(view).collect()), final[view], view)


def test_shortcuts_of_the_q3_shape(make_project, tmp_path):
    """Δorders reads lineitem through lineitem's foreign key and customer by key lookup; Δlineitem
    looks orders up by key; Δcustomer reads orders through orders' foreign key (and nothing joins
    lineitem to customer directly)."""
    p = make_project(TABLES, views={"revenue": {"sql": VIEWS["revenue"]}})
    program, _ = p.program
    [rule] = [r for r in program.rules if r.head.pred != "revenue"]
    found = {}
    for d in delta_rules(rule):
        i = d.states.index("delta")
        found[rule.body[i].atom.pred] = {rule.body[j].atom.pred: s.kind for j, s in shortcuts(program, d, i).items()}
    assert found == {"customer": {"orders": "reference"}, "orders": {"customer": "lookup", "lineitem": "reference"},
                     "lineitem": {"orders": "lookup"}}
    text = p.explain("revenue").to_text()
    assert "-- lineitem at the keys of Δorders (lineitem.ok references orders): from Δlineitem for deleted and " \
           "inserted keys" in text
    assert "-- orders at the keys Δlineitem binds (ok): from Δorders where it holds the key" in text


@pytest.mark.classic  # (JobMetrics: the status store of a classic session)
@pytest.mark.parametrize("partitions", ["one", "distributed"])
def test_rf_refresh_reads_no_lineitem_while_maintaining(make_project, tmp_path, spark, partitions):
    """An order inserted and one deleted, each with its lineitems: the maintain stage reads the deltas,
    customer (unchanged: joined once with both delta rules' results) and no row of lineitem's or orders'
    stored layers: its input records are far fewer than lineitem's rows (with the shortcuts off, the
    Δorders terms read all of lineitem). A change this small is planned in one partition: no stage of
    the refresh shuffles (`spark.single_partition_rows`), and it launches few jobs; the distributed
    plan shuffles."""
    from ivm import refresh

    orders = {k: (1 + k % 3, k % 4) for k in range(1, 301)}
    lines = {(k, n): (k + n,) for k in orders for n in range(1, 11)}
    state = {"customer": {k: ("B",) for k in range(1, 4)}, "orders": orders, "lineitem": lines}
    p = _project(make_project, tmp_path / "p", state, **({"spark": DISTRIBUTED} if partitions == "distributed" else {}))
    changes = {"orders": [("insert", (1000, 1, 0)), ("delete", (5, *orders[5]))],
               "lineitem": [("insert", (1000, 1, 7)), ("insert", (1000, 2, 8))]
               + [("delete", (5, n, *lines[(5, n)])) for n in range(1, 11)]}
    append(p, tmp_path, 1, changes)
    apply(state, changes)
    plan = refresh.plan(p.ctx)
    refresh.begin(p.ctx, plan)
    metrics = JobMetrics(spark)
    with metrics.measure("trim") as t:
        refresh.trim_stage(p.ctx, plan.run_id)
    with metrics.measure("maintain") as m:
        refresh.maintain_stage(p.ctx, plan.run_id)
    with metrics.measure("validate") as v:
        refresh.validate_stage(p.ctx, plan.run_id)
    stages = (t, m, v)
    assert all(s.shuffled == 0 if partitions == "one" else s.shuffled > 0 for s in stages), stages
    if partitions == "one":
        # few jobs (the performance issue): a trim is its delta's write alone (the change's keys read on
        # the driver, the stored rows found at them by an IN list: no broadcast of the keys; 4 jobs
        # before), and the deltas' joins stay in their one partition, where each broadcast was a job:
        # the three views' delta and state writes and customer's broadcast, 8 jobs (19 before)
        assert (t.jobs, m.jobs) == (2, 8), stages
    result = refresh.publish_stage(p.ctx, plan.run_id)
    check(p, state)
    # Δorders: lineitem by the foreign key; Δlineitem: orders by key (in every view); customer did not
    # change: joined once for both delta rules (revenue and pri_segs), not looked up per term
    assert {w.view: w.detail.get("subgoals from deltas") for w in result.views} == \
        {"revenue": 2, "lines": 2, "pri_segs": 2}
    assert {w.view: w.detail.get("joined once") for w in result.views} == {"revenue": 1, "lines": None, "pri_segs": 1}
    # the trims counted no updated order (RF1/RF2 only): the foreign key's "read for updated keys" is
    # not even looked for (no job to find none)
    assert {r.relation: r.detail["updated_keys"] for r in p.catalog.stage_records(plan.run_id)
            if r.stage == "trim"} == {"orders": 0, "lineitem": 0}
    assert m.jobs > 0
    # lineitem holds 3,000 rows: reading it would show here (what is read: the deltas, customer, the
    # GROUP BY state at the changed orders (one row per order), the set view's counts)
    assert m.rows_read < 1000, m


def test_skipping_filter_cuts_the_keys_at_their_widest_gaps(spark, monkeypatch):
    """The ranges the trim and the shortcuts' reads give the Parquet reader: never a key lost (NULLs
    included), and cut where the keys are farthest apart."""
    from ivm import zset

    monkeypatch.setattr(zset, "SKIP_RANGES", 2)
    rows = spark.range(0, 6000).selectExpr("CAST(id AS INT) AS k")
    keys = spark.createDataFrame([(1,), (3,), (2,), (100,), (101,), (5000,)], "k int")
    kept = rows.where(zset.skipping_filter(keys, "k"))
    assert kept.count() == 102  # 1..101 and 5000: the widest gap (101 -> 5000) is the cut
    with_null = spark.createDataFrame([(None,), (7,)], "k int")
    both = spark.createDataFrame([(None,), (7,), (8,)], "k int")
    assert sorted(r.k for r in both.where(zset.skipping_filter(with_null, "k")).collect()
                  if r.k is not None) == [7] and both.where(zset.skipping_filter(with_null, "k")).count() == 2
    words = spark.createDataFrame([(w,) for w in "abcdefgh"], "k string")
    assert words.where(zset.skipping_filter(spark.createDataFrame([("b",), ("g",)], "k string"), "k")).count() == 2
    assert rows.where(zset.skipping_filter(keys.where("k < 0"), "k")).count() == 0
    days = rows.selectExpr("date_add(DATE'2020-01-01', k) AS d")
    picked = spark.createDataFrame([("2020-01-02",), ("2020-01-05",), ("2020-03-01",)], "d string").selectExpr(
        "CAST(d AS DATE) AS d")
    assert days.where(zset.skipping_filter(picked, "d")).count() == 5  # Jan 2..5 and Mar 1


@pytest.mark.classic
def test_job_metrics_count_only_their_own_blocks(spark):
    # the benchmark measures each view with a JobMetrics of its own on one SparkContext: the second one's
    # first block must not count the first one's first block
    first, second = JobMetrics(spark), JobMetrics(spark)
    with first.measure("block") as a:
        spark.range(10).collect()
        spark.range(10).collect()
    with second.measure("block") as b:
        spark.range(10).collect()
    assert a.jobs >= 2 and b.jobs == a.jobs // 2, (a, b)


def test_merged_key_bounds_keep_every_key_and_cut_at_the_widest_gaps(spark, monkeypatch):
    """Log segments' bounds (ivm.zset.KeyBounds) merged for a trim: overlapping ranges joined, then cut
    to SKIP_RANGES at the widest gaps between them; a NULL in any part keeps the NULL rows; and the
    bounds survive the catalog's JSON (numbers, dates, decimals)."""
    import datetime
    import decimal

    from ivm import zset
    from ivm.zset import KeyBounds

    monkeypatch.setattr(zset, "SKIP_RANGES", 2)
    parts = [zset.key_bounds(spark.createDataFrame([(k,) for k in keys], "k int"), "k")
             for keys in ([1, 2, 3], [2, 50], [None, 4000])]
    merged = KeyBounds.merged(parts)
    assert merged == KeyBounds(((1, 50), (4000, 4000)), nulls=True)
    rows = spark.createDataFrame([(k,) for k in [None, *range(0, 5000)]], "k int")
    assert sorted(r.k for r in rows.where(merged.filter("k")).collect() if r.k is not None) == [*range(1, 51), 4000]
    assert rows.where(merged.filter("k")).where("k IS NULL").count() == 1
    for bounds in (merged, KeyBounds(((datetime.date(2020, 1, 2), datetime.date(2020, 3, 1)),)),
                   KeyBounds(((decimal.Decimal("1.50"), decimal.Decimal("7.25")),))):
        assert KeyBounds.from_json(bounds.as_json()) == bounds
    assert KeyBounds((("a", "c"),)).as_json() is None  # equal runs of strings: nothing to merge at gaps
    assert KeyBounds(((datetime.datetime(2020, 1, 1, 8), datetime.datetime(2020, 1, 2)),)).as_json() is None
    assert KeyBounds(((1.5, float("nan")),)).as_json() is None
    days = KeyBounds.merged([KeyBounds(((datetime.date(2020, 1, 1), datetime.date(2020, 1, 3)),)),
                             KeyBounds(((datetime.date(2020, 1, 5), datetime.date(2020, 1, 5)),
                                        (datetime.date(2021, 1, 1), datetime.date(2021, 1, 1))))])
    assert days.ranges == ((datetime.date(2020, 1, 1), datetime.date(2020, 1, 5)),
                           (datetime.date(2021, 1, 1), datetime.date(2021, 1, 1)))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["int", "date", "decimal(12,2)"]), numbers=st.lists(st.none() | st.integers(-5000, 5000),
                                                                              max_size=40))
def test_bounds_of_keys_the_driver_holds_are_sparks(spark, kind, numbers):
    """A small change file read without Spark (ivm.changes.arrow_reader) records its segment's bounds from
    its keys on the driver (`KeyBounds.of`): every key inside them, at most SKIP_RANGES ranges, and —
    where no two gaps between neighbouring keys tie — the very bounds Spark's `key_bounds` finds."""
    import datetime
    import decimal

    from ivm import zset
    from ivm.zset import KeyBounds

    as_key = {"int": lambda n: n, "date": lambda n: datetime.date(2020, 1, 1) + datetime.timedelta(days=n),
              "decimal(12,2)": lambda n: decimal.Decimal(n).scaleb(-2)}[kind]
    keys = [None if n is None else as_key(n) for n in numbers]
    found = KeyBounds.of([k for k in keys if k is not None], None in keys)
    assert found.nulls == (None in keys) and len(found.ranges) <= zset.SKIP_RANGES
    assert all(any(lo <= k <= hi for lo, hi in found.ranges) for k in keys if k is not None)
    distinct = sorted({n for n in numbers if n is not None})
    gaps = [b - a for a, b in zip(distinct, distinct[1:], strict=False)]
    if len(set(gaps)) == len(gaps):
        assert found == zset.key_bounds(spark.createDataFrame([(k,) for k in keys], f"k {kind}"), "k")
