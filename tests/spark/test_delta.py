"""Delta Lake on both ends (ivm.changes.delta, ivm.sinks): tables whose source is a Delta table with its
change data feed on, changed by Spark SQL as a user's pipeline would (INSERT, UPDATE, DELETE, MERGE INTO,
several commits between refreshes, a commit that changes nothing), and every view published as a Delta
table. After every refresh each view — as ivm holds it, read back from its Delta table with Spark and
with delta-rs — equals DuckDB's result of the same SQL over the sources' state at that moment."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st

from ivm import Project, sinks
from ivm.config import COUNT_COLUMN
from ivm.errors import ChangeDataError, ConfigError
from ivm.modes import Mode
from ivm.spark import delta_package
from tests.conftest import drawn_stream, write_project
from tests.helpers import KV_TABLES, STREAMS, lines, norm

DAYS = [dt.date(2026, 11, d) for d in (1, 2, 3)]
ORDERS = {"columns": {"id": "int", "cust": "string", "amount": "decimal(10,2)", "day": "date"}, "key": ["id"]}
EVENTS = {"columns": {"day": "date", "kind": "string", "value": "double"}}
VIEWS = {
    "per_cust": {"sql": "SELECT cust, count(*) AS n, sum(amount) AS total, max(day) AS last_day FROM orders "
                        "GROUP BY cust", "key": ["cust"]},
    "big": {"sql": "SELECT id, cust, amount FROM orders WHERE amount > 50", "key": ["id"]},
    "kinds": {"sql": "SELECT kind, count(*) AS n, sum(value) AS total FROM events GROUP BY kind"},
    "daily": {"sql": "SELECT o.day, e.kind, count(*) AS n FROM orders o JOIN events e ON o.day = e.day "
                     "GROUP BY o.day, e.kind", "key": ["day", "kind"]},
}
DDL = {"orders": "id INT, cust STRING, amount DECIMAL(10,2), day DATE",
       "events": "day DATE, kind STRING, value DOUBLE"}


def create(spark, path: Path, table: str, rows: list[tuple], cdf: bool = True) -> str:
    where = str(path)
    spark.createDataFrame(rows, DDL[table]).write.format("delta") \
        .option("delta.enableChangeDataFeed", "true" if cdf else "false").save(where)
    return where


def project_with_sources(make_project, spark, root: Path, orders: list[tuple], events: list[tuple],
                         spark_sink: bool = False, verify: bool | None = None):
    """``spark_sink``: every view's Delta table written by Spark (a MERGE where it has a key), not by
    delta-rs as small views are (`storage.sink_without_jvm_mb`). ``verify``: both tables' `verify_changes`
    (by default their feeds are trusted)."""
    sources = {"orders": create(spark, root / "lake" / "orders", "orders", orders),
               "events": create(spark, root / "lake" / "events", "events", events)}
    check = {} if verify is None else {"verify_changes": verify}
    tables = {"orders": {**ORDERS, "source": {"delta": sources["orders"]}, **check},
              "events": {**EVENTS, "source": {"delta": sources["events"]}, **check}}
    p = make_project(tables, root=root / "project", views=VIEWS,
                     storage={"delta_views": True, **({"sink_without_jvm_mb": 0} if spark_sink else {})})
    return p, sources


def bag(rows) -> Counter:
    return Counter(tuple(norm(v) for v in r) for r in rows)


def duck(sources: dict[str, str]) -> dict[str, Counter]:
    con = duckdb.connect()
    for table, where in sources.items():
        arrow = DeltaTable(where).to_pyarrow_table()  # noqa: F841 - DuckDB scans the local by name
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM arrow")
    return {v: bag(con.execute(spec["sql"]).fetchall()) for v, spec in VIEWS.items()}


def assert_views(spark, p, sources: dict[str, str]) -> None:
    expected = duck(sources)
    for view in VIEWS:
        sink = sinks.location(p.ctx, view)
        columns = list(p.schema(view).names)
        ours = bag(tuple(r) for r in p.read(view).collect())
        by_spark = bag(tuple(r[c] for c in columns) for r in spark.read.format("delta").load(sink).collect())
        by_rs = bag(tuple(d[c] for c in columns) for d in DeltaTable(sink).to_pyarrow_table().to_pylist())
        assert ours == expected[view], f"{view}: ivm {ours} != DuckDB {expected[view]}"
        assert by_spark == ours, f"{view}: its Delta table (Spark) {by_spark} != {ours}"
        assert by_rs == ours, f"{view}: its Delta table (delta-rs) {by_rs} != {ours}"


def tables_now(p) -> dict[str, tuple[int, Counter]]:
    """Each view's Delta version and rows (as ivm holds the view)."""
    return {v: (DeltaTable(sinks.location(p.ctx, v)).version(),
                bag(tuple(r) for r in p.read(v).collect()) if p.catalog.state(v).version_id else Counter())
            for v in VIEWS}


def assert_feeds(p, before: dict[str, tuple[int, Counter]]) -> None:
    """Each view's Delta table moved by at most one commit, whose change data feed is exactly the view's
    change: its net effect the new rows minus the old, and no row that did not change (a keyed or set
    view: one feed row per row gained or lost; a keyless bag: the copies a row gained, or, for a row
    that lost copies, all its old copies deleted and those it keeps inserted); the commit's userMetadata
    names the view and the run."""
    runs = [r.id for r in p.runs(1)]
    for view, (version, old) in tables_now(p).items():
        then, was = before[view]
        if version == then:
            assert old == was, f"{view}: changed with no Delta commit"
            continue
        assert version == then + 1, f"{view}: {version - then} Delta commits in one refresh"
        table = DeltaTable(sinks.location(p.ctx, view))
        columns = list(p.schema(view).names)
        feed = pa.table(table.load_cdf(starting_version=version, ending_version=version).read_all()).to_pylist()
        plus, minus = Counter(), Counter()
        for r in feed:
            (plus if r["_change_type"] in ("insert", "update_postimage") else minus)[
                tuple(norm(r[c]) for c in columns)] += 1
        gained, lost = old - was, was - old
        net = (plus - minus, minus - plus)
        assert net == (gained, lost), f"{view}: its feed nets to {net}, the view changed by {(gained, lost)}"
        keyed = bool(VIEWS[view].get("key"))
        rows = sum(gained.values()) + (sum(lost.values()) if keyed else sum(was[r] + old[r] for r in lost))
        assert len(feed) == rows, f"{view}: {len(feed)} feed rows for a change of {rows}: {feed}"
        meta = json.loads(table.history(1)[0]["userMetadata"])["ivm"]
        assert (meta["view"], meta["run"], meta["view_version"]) == (view, runs[0], p.catalog.state(view).version_id)


ids = st.integers(1, 8)
order = st.tuples(ids, st.sampled_from(["ann", "bob", None]),
                  st.decimals(0, 120, places=2, allow_nan=False, allow_infinity=False), st.sampled_from(DAYS))
event = st.tuples(st.sampled_from(DAYS), st.sampled_from(["click", "view"]),
                  st.one_of(st.none(), st.floats(-5, 5, allow_nan=False, width=32)))
#: one Delta commit of a user's pipeline
commit = st.one_of(
    st.tuples(st.just("insert"), st.lists(order, max_size=3)),
    st.tuples(st.just("update"), st.lists(ids, max_size=3), st.decimals(0, 120, places=2, allow_nan=False,
                                                                        allow_infinity=False)),
    st.tuples(st.just("delete"), st.lists(ids, max_size=3)),
    st.tuples(st.just("merge"), st.lists(order, max_size=3)),
    st.tuples(st.just("events"), st.lists(event, max_size=3)),
    st.tuples(st.just("forget"), st.sampled_from(["click", "view"])),
    st.tuples(st.just("nothing")),
)


def append_orders(spark, sources: dict[str, str], rows: list[tuple]) -> None:
    """A Delta commit appending ``rows`` to orders (Delta checks no key)."""
    spark.createDataFrame(rows, DDL["orders"]).write.format("delta").mode("append").save(sources["orders"])


def run_commit(spark, sources: dict[str, str], c: tuple) -> None:
    orders, events = f"delta.`{sources['orders']}`", f"delta.`{sources['events']}`"
    kind = c[0]
    if kind in ("insert", "merge") and c[1]:
        rows = list({r[0]: r for r in c[1]}.values())  # one row per key in a commit
        spark.createDataFrame(rows, DDL["orders"]).createOrReplaceTempView("incoming")
        if kind == "insert":
            spark.sql(f"MERGE INTO {orders} t USING incoming s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")
        else:
            spark.sql(f"MERGE INTO {orders} t USING incoming s ON t.id = s.id "
                      "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    elif kind == "update" and c[1]:
        spark.sql(f"UPDATE {orders} SET amount = {c[2]} WHERE id IN ({', '.join(map(str, c[1]))})")
    elif kind == "delete" and c[1]:
        spark.sql(f"DELETE FROM {orders} WHERE id IN ({', '.join(map(str, c[1]))})")
    elif kind == "events" and c[1]:
        spark.createDataFrame(c[1], DDL["events"]).write.format("delta").mode("append").save(sources["events"])
    elif kind == "forget":
        spark.sql(f"DELETE FROM {events} WHERE kind = '{c[1]}'")
    else:  # a commit that touches no row
        spark.sql(f"UPDATE {orders} SET amount = amount WHERE id < 0")


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_delta_sources_and_views_match_duckdb(make_project, spark, tmp_path_factory, data):
    drawn_stream(data)
    root = tmp_path_factory.mktemp("delta")
    orders = list({r[0]: r for r in data.draw(st.lists(order, max_size=6), "orders")}.values())
    events = data.draw(st.lists(event, max_size=6), "events")
    # the feeds trusted as Delta wrote them (the default), or each change checked against the stored rows
    verify = data.draw(st.booleans(), "verify_changes")
    # each view's Delta table written by Spark, or (small as they are) by delta-rs
    spark_sink = data.draw(st.booleans(), "Spark writes the views' tables")
    p, sources = project_with_sources(make_project, spark, root, orders, events, spark_sink=spark_sink,
                                      verify=verify)
    before = tables_now(p)
    first = p.refresh()
    assert {v.mode for v in first.views} == {"full"}
    assert_views(spark, p, sources)
    assert_feeds(p, before)
    for n in range(1, 4):
        for c in data.draw(st.lists(commit, min_size=1, max_size=3), f"batch {n}"):
            run_commit(spark, sources, c)
        before = tables_now(p)
        result = p.refresh()
        assert {v.mode for v in result.views} <= {"incremental", "noop"}
        assert_views(spark, p, sources)
        assert_feeds(p, before)


@pytest.mark.e2e
@STREAMS
@given(data=st.data())
def test_views_left_behind_catch_up_from_their_sources_feeds(make_project, spark, tmp_path_factory, data):
    """002's per-view pointers into a Delta source's log: a refresh of per_cust alone moves orders on,
    leaving big and daily behind; the next refresh of every view catches them up incrementally from the
    feed since the Delta version each holds (no recompute), and each equals DuckDB's result. Once the
    feed since a view's pointer is vacuumed away, that view is recomputed, and the plan says why."""
    drawn_stream(data)
    root = tmp_path_factory.mktemp("behind")
    orders = list({r[0]: r for r in data.draw(st.lists(order, max_size=6), "orders")}.values())
    p, sources = project_with_sources(make_project, spark, root, orders, data.draw(st.lists(event, max_size=4)))
    p.refresh()
    for n in range(1, 3):
        for c in data.draw(st.lists(commit, min_size=1, max_size=3), f"batch {n}"):
            run_commit(spark, sources, c)
        run_commit(spark, sources, ("insert", [(9, "cy", Decimal("70.00"), DAYS[n])]) if n == 1 else
                   ("delete", [9]))  # (so that the run of per_cust alone moves orders on for certain)
        p.refresh(["per_cust"])
        works = {w.view: w for w in p.refresh().views}
        assert {w.mode for w in works.values()} <= {Mode.INCREMENTAL}, [(w.view, w.reason) for w in works.values()]
        assert {"big", "daily"} <= {v for v, w in works.items() if "catches up from its own pointer" in w.reason}, [
            (w.view, w.reason) for w in works.values()]
        assert_views(spark, p, sources)
    # the feed since daily's pointer gone: the log's older commits cleaned up past a checkpoint, as Delta's
    # log retention does, while per_cust's watermark is still in it
    bump = f"UPDATE delta.`{sources['orders']}` SET amount = amount + 1"
    spark.sql(bump)
    p.refresh(["per_cust"])
    spark.sql(bump)
    DeltaTable(sources["orders"]).create_checkpoint()
    for f in sorted((Path(sources["orders"]) / "_delta_log").glob("*.json"))[:-1]:
        f.unlink()
    works = {w.view: w for w in p.refresh().views}
    assert works["daily"].mode is Mode.FULL and "change data feed of the Delta source orders" in works["daily"].reason
    assert_views(spark, p, sources)


def test_a_source_created_anew_at_its_location_recomputes_the_views_that_read_it(make_project, spark, tmp_path):
    """A Delta source deleted and written again at its location (its versions start over, its feed says
    nothing of the old table): the next refresh recomputes every view that reads it and says why — the
    new table behind the version ivm holds, or at it (another table id) — and each equals DuckDB's
    result; a refresh of some of its readers only is refused, naming the others, nothing applied.
    Before, a table behind ivm's version gave "nothing to refresh", and one at or past it was read from
    ivm's version on: the old views, quietly."""
    import shutil

    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0])],
                                      [(DAYS[0], "click", 1.0)])
    p.refresh()
    for i in (2, 3, 4):
        append_orders(spark, sources, [(i, "bob", Decimal(f"{10 * i + 50}.00"), DAYS[1])])
    p.refresh()
    assert_views(spark, p, sources)
    shutil.rmtree(sources["orders"])  # the pipeline writes the table again from scratch: Delta version 0, 1
    create(spark, Path(sources["orders"]), "orders", [(7, "cy", Decimal("70.00"), DAYS[2])])
    append_orders(spark, sources, [(8, "dee", Decimal("80.00"), DAYS[2])])
    with pytest.raises(ChangeDataError, match=r"^table orders: the Delta table at .* was created anew \(its newest "
                                              r"version 1 is behind version 3, .*\); .* leaves out daily, per_cust: "
                                              r"refresh them all \(`ivm refresh`, or `ivm refresh big daily "
                                              r"per_cust`\)$"):
        p.refresh(["big"])
    assert sorted(r.id for r in p.read("big").collect()) == [1, 2, 3, 4]  # (nothing applied)
    works = {w.view: w for w in p.refresh().views}
    assert {v: w.mode for v, w in works.items()} == {"big": Mode.FULL, "per_cust": Mode.FULL, "daily": Mode.FULL}
    assert "Delta source orders: the Delta table at" in works["big"].reason, works["big"].reason
    assert_views(spark, p, sources)
    append_orders(spark, sources, [(9, "eve", Decimal("90.00"), DAYS[0])])  # the new table goes on: maintained
    assert {w.mode for w in p.refresh().views} == {Mode.INCREMENTAL}
    assert_views(spark, p, sources)
    # written anew up to the very version ivm holds (2): only the table id tells
    shutil.rmtree(sources["orders"])
    create(spark, Path(sources["orders"]), "orders", [(5, "fay", Decimal("55.00"), DAYS[1])])
    for i in (6, 7):
        append_orders(spark, sources, [(i, "gus", Decimal("66.00"), DAYS[1])])
    works = {w.view: w for w in p.refresh().views}
    assert {w.mode for w in works.values()} == {Mode.FULL} and "was created anew (table id" in works["daily"].reason
    assert_views(spark, p, sources)


def test_a_source_without_its_change_data_feed_is_refused_at_apply(make_project, spark, tmp_path):
    where = create(spark, tmp_path / "lake" / "orders", "orders", [(1, "ann", Decimal("5.00"), DAYS[0])], cdf=False)
    with pytest.raises(ConfigError, match=r"tables\.orders: the change data feed of Delta table .* is off; turn it on "
                                          r"with `ALTER TABLE delta\.`.*` SET TBLPROPERTIES "
                                          r"\(delta\.enableChangeDataFeed = true\)`"):
        make_project({"orders": {**ORDERS, "source": {"delta": where}}}, root=tmp_path / "p",
                     views={"big": VIEWS["big"]})
    # turned off after an apply: the same project file applied again answers without Spark (#49 item 4)
    # but asks delta-rs for the feed first, and refuses the same way
    on = create(spark, tmp_path / "lake" / "on", "orders", [(1, "ann", Decimal("5.00"), DAYS[0])])
    make_project({"orders": {**ORDERS, "source": {"delta": on}}}, root=tmp_path / "q", views={"big": VIEWS["big"]})
    spark.sql(f"ALTER TABLE delta.`{on}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    again = Project.open(str(tmp_path / "q" / "ivm.yaml"))
    try:
        with pytest.raises(ConfigError, match=r"tables\.orders: the change data feed of Delta table .* is off"):
            again.apply()
        assert not again.ctx.spark_started
    finally:
        again.close()


def test_a_delta_source_is_changed_where_it_is_and_its_schema_is_checked(make_project, spark, tmp_path):
    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0])],
                                      [(DAYS[0], "click", 1.0)], spark_sink=True)
    with pytest.raises(ConfigError, match="table orders reads Delta table .*: change it there"):
        p.append("orders", str(tmp_path / "changes.jsonl"))
    p.refresh()
    assert [tuple(r) for r in p.read("big").collect()] == [(1, "ann", Decimal("60.00"))]
    spark.sql(f"UPDATE delta.`{sources['orders']}` SET amount = 70 WHERE id = 1")
    assert [v.mode for v in p.refresh().views if v.view == "big"] == ["incremental"]
    # `ivm snapshot`: each view's Delta table at the version holding the catalog's snapshot, by its SQL
    [big] = [s for s in sinks.snapshot(p.ctx) if s.view == "big"]
    # (apply created it empty: version 0; the first refresh overwrote it, the second merged into it)
    assert big.delta_version == 2 and [tuple(r) for r in spark.sql(big.sql()).collect()] == [
        (1, "ann", Decimal("70.00"))]
    assert p.catalog.latest_stage("sink", "big").detail["how"] == "merge"  # keyed, incremental: one MERGE
    # upkeep: `ivm compact` OPTIMIZEs the views' Delta tables, `ivm gc` VACUUMs them; the views stay as they are
    p.compact(["big"])
    p.gc()
    assert [tuple(r) for r in spark.read.format("delta").load(big.location).collect()] == [
        (1, "ann", Decimal("70.00"))]
    # the source is rewritten without a column a view uses: the next refresh names it, nothing applied
    spark.createDataFrame([(2, "bob", DAYS[1])], "id INT, cust STRING, day DATE").write.format("delta") \
        .mode("overwrite").option("overwriteSchema", "true").save(sources["orders"])
    with pytest.raises(ChangeDataError, match="table orders: column amount is not in Delta table"):
        p.refresh()
    assert [tuple(r) for r in p.read("big").collect()] == [(1, "ann", Decimal("70.00"))]


def test_views_are_found_by_name_shown_without_a_jvm_and_announced_when_changed(make_project, spark, tmp_path,
                                                                                monkeypatch, capsys):
    """`ivm apply` registers every view's Delta table in the Spark catalog as ``<project>.<view>`` (an
    external table: dropping the name keeps the files; a name held by a managed table is refused);
    `ivm show` of a view reads its Delta table with delta-rs, without Spark; the views a run changed are
    the ones the DAG announces as assets, with their Delta versions."""
    from ivm.cli import main
    from ivm.orchestration.stages import changed_views

    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0]),
                                                                     (2, "bob", Decimal("10.00"), DAYS[1])],
                                      [(DAYS[0], "click", 1.0)])
    db = p.config.database
    assert db == "project"  # (the project folder's name)
    assert [tuple(r) for r in spark.sql(f"SELECT * FROM {db}.big").collect()] == []  # apply made it, empty
    p.refresh()
    spark.sql(f"UPDATE delta.`{sources['orders']}` SET amount = 70 WHERE id = 1")
    run = p.refresh()
    for view in VIEWS:
        assert bag(spark.sql(f"SELECT * FROM {db}.{view}").collect()) == bag(p.read(view).collect()), view
    # announced: the views whose content changed (big: a row; per_cust: ann's total), with their Delta versions
    changed = changed_views(p.ctx, run.run_id)
    assert set(changed) == {"big", "per_cust"}
    assert changed["big"]["delta_version"] == DeltaTable(sinks.location(p.ctx, "big")).version()
    assert changed["big"]["rows_changed"] == 2 and changed["big"]["view_version"] == p.catalog.state("big").version_id
    # `ivm show` without Spark: the Delta table at the snapshot's version, in the order Spark's gives
    for view in VIEWS:
        ours = p.read(view)
        rows = [tuple(r) for r in ours.orderBy(*ours.columns).collect()]
        assert [tuple(d.values()) for d in sinks.read_without_jvm(p.ctx, view).to_pylist()] == rows, view
    monkeypatch.setattr("ivm.context.project_session", lambda *a, **k: pytest.fail("ivm show started Spark"))
    assert main(["show", "big", "--format", "csv", "--project", str(p.config.root)]) == 0
    assert capsys.readouterr().out.splitlines() == ["id,cust,amount", "1,ann,70.00"]
    monkeypatch.undo()
    # applied again in full (`--recheck`: the same file alone would not reach Spark): nothing to register
    # anew; a sink moved: its name points at the new table, the old table's files stay
    assert not [c for c in p.apply(recheck=True) if "registered" in c]
    tables = {"orders": {**ORDERS, "source": {"delta": sources["orders"]}},
              "events": {**EVENTS, "source": {"delta": sources["events"]}}}
    old, moved = sinks.location(p.ctx, "big"), str(tmp_path / "moved" / "big")
    path = write_project(tmp_path / "project", tables, views={**VIEWS, "big": {**VIEWS["big"], "sink": moved}},
                         storage={"delta_views": True})
    again = Project.open(str(path))
    try:
        assert [c for c in again.apply() if "registered" in c] == ["view project.big registered in the Spark catalog"]
    finally:
        again.close()
    assert sinks.delta.local_path(spark.sql(f"DESCRIBE DETAIL {db}.big").first()["location"]) == moved
    assert DeltaTable.is_deltatable(old)
    spark.sql("CREATE DATABASE IF NOT EXISTS taken")
    spark.sql("CREATE TABLE taken.big (x INT) USING parquet")
    path = write_project(tmp_path / "project", tables, views=VIEWS, storage={"delta_views": True, "database": "taken"})
    taken = Project.open(str(path))
    try:
        with pytest.raises(ConfigError, match=r"views\.big: the Spark catalog's taken\.big is a managed table"):
            taken.apply()
    finally:
        taken.close()


def test_a_source_named_in_the_spark_catalog(make_project, spark, tmp_path):
    """``source: {table: NAME}``: the Delta table the Spark catalog names, changed by its name; an unknown
    name or a table that is not Delta is refused at apply with the table named."""
    where = create(spark, tmp_path / "lake" / "orders", "orders", [(1, "ann", Decimal("60.00"), DAYS[0])])
    spark.sql("CREATE DATABASE IF NOT EXISTS shop")
    spark.sql(f"CREATE TABLE IF NOT EXISTS shop.orders_{tmp_path.name} USING delta LOCATION '{where}'")
    name = f"shop.orders_{tmp_path.name}"
    p = make_project({"orders": {**ORDERS, "source": {"table": name}}}, root=tmp_path / "p",
                     views={"big": VIEWS["big"]})
    p.refresh()
    spark.sql(f"INSERT INTO {name} VALUES (2, 'bob', 99.50, DATE'2026-11-02')")
    spark.sql(f"UPDATE {name} SET amount = 10 WHERE id = 1")
    assert [v.mode for v in p.refresh().views] == ["incremental"]
    assert [tuple(r) for r in p.read("big").collect()] == [(2, "bob", Decimal("99.50"))]
    spark.sql(f"CREATE TABLE shop.plain_{tmp_path.name} (id INT) USING parquet")
    for source, message in [("shop.nowhere", "tables.orders: source table shop.nowhere: .*"),
                            (f"shop.plain_{tmp_path.name}", "tables.orders: source table .* is not a Delta table")]:
        with pytest.raises(ConfigError, match=message):
            make_project({"orders": {**ORDERS, "source": {"table": source}}}, root=tmp_path / "q",
                         views={"big": VIEWS["big"]})


def test_a_bad_commit_of_a_delta_source_is_named_by_its_delta_version_and_set_aside(make_project, spark, tmp_path):
    """Delta enforces no primary key: an append of an existing id is an insert of a key that exists for
    ivm, found where `verify_changes: true` looks each change up in the stored rows. The refusal names the
    Delta version; quarantined by that version, the refreshes go on; it cannot be restored once absorbed
    (the source's versions are its table's)."""
    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0])],
                                      [(DAYS[0], "click", 1.0)], verify=True)
    p.refresh()
    append_orders(spark, sources, [(1, "dup", Decimal("99.00"), DAYS[1])])  # Delta version 1
    append_orders(spark, sources, [(2, "bob", Decimal("80.00"), DAYS[1])])  # Delta version 2
    with pytest.raises(ChangeDataError, match=r"^table orders: Delta version 1, row \(id=1, cust='dup', .*insert "
                                              r"of a key that exists .*`ivm log quarantine orders --version 1`\)$"):
        p.refresh()
    assert "Delta version 1 is set aside" in p.quarantine("orders", 1)
    assert p.refresh().status == "succeeded"
    assert sorted(tuple(r) for r in p.read("big").collect()) == [(1, "ann", Decimal("60.00")),
                                                                 (2, "bob", Decimal("80.00"))]
    with pytest.raises(ChangeDataError, match="a Delta source's versions are its table's: correct the Delta table"):
        p.restore("orders", 1)


def test_a_trusted_feed_is_trimmed_without_the_stored_rows_and_still_refuses_what_contradicts_itself(
        make_project, spark, tmp_path):
    """By default a Delta source's feed is trimmed as Delta wrote it, with no stored row of the table (an
    update's net delta from its two images alone). A key appended twice within the refreshed versions
    (Delta declares no key) contradicts itself and is refused by its Delta version all the same."""
    from ivm.changes import delta
    from ivm.changes.trim import trim

    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0])],
                                      [(DAYS[0], "click", 1.0)])
    p.refresh()
    table = p.config.tables["orders"]
    assert not table.verified and table.model_copy(update={"verify_changes": True}).verified
    spark.sql(f"UPDATE delta.`{sources['orders']}` SET amount = 70 WHERE id = 1")  # Delta version 1
    feed = delta.changes(spark, "orders", table, sources["orders"], 0, 1)
    net = trim("orders", table, feed, None)
    net_rows = sorted((r.id, float(r.amount), r[COUNT_COLUMN]) for r in net.delta.collect())
    assert net_rows == [(1, 60.0, -1), (1, 70.0, 1)]
    net.check()
    append_orders(spark, sources, [(3, "cy", Decimal("5.00"), DAYS[1])])  # Delta version 2
    append_orders(spark, sources, [(3, "cy2", Decimal("6.00"), DAYS[1])])  # Delta version 3
    with pytest.raises(ChangeDataError, match=r"^table orders: Delta version 3, row \(id=3, cust='cy2', .*insert "
                                              r"of a key that exists"):
        p.refresh()


def test_the_planner_weighs_each_commit_by_the_rows_its_change_data_feed_holds(spark, tmp_path):
    """The planner reads a Delta source's change size from the commits' metrics before reading the feed
    (`delta.change_rows`): for each kind of commit a pipeline makes — a MERGE that deletes a few rows of a
    large file (and copies the rest), an upsert MERGE, UPDATE, DELETE, an append, an OPTIMIZE, an
    overwrite, by Spark or by delta-rs — the estimate is the rows the feed holds for it, not the rows the
    commit rewrote."""
    from deltalake import write_deltalake

    from ivm.changes import delta

    where = str(tmp_path / "orders")
    rows = [(i, "c", Decimal(i % 100), DAYS[i % 3]) for i in range(1, 2001)]
    create(spark, Path(where), "orders", rows)
    orders = f"delta.`{where}`"
    spark.createDataFrame(rows[:5], DDL["orders"]).createOrReplaceTempView("gone")
    spark.createDataFrame([(3000, "n", Decimal(1), DAYS[0]), (10, "u", Decimal(2), DAYS[1])],
                          DDL["orders"]).createOrReplaceTempView("incoming")
    commits = [
        f"MERGE INTO {orders} t USING gone s ON t.id = s.id WHEN MATCHED THEN DELETE",
        f"MERGE INTO {orders} t USING incoming s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *",
        f"UPDATE {orders} SET amount = amount + 1 WHERE id BETWEEN 100 AND 102",
        f"DELETE FROM {orders} WHERE id > 1990",
        f"INSERT INTO {orders} VALUES (4000, 'a', 1.00, DATE'2026-11-01')",
        f"OPTIMIZE {orders}",
        f"INSERT OVERWRITE {orders} SELECT * FROM {orders} WHERE id < 50",
        lambda: write_deltalake(where, DeltaTable(where).to_pyarrow_table().slice(0, 3), mode="append"),
        lambda: DeltaTable(where).delete("id < 20"),
        lambda: DeltaTable(where).update(updates={"cust": "'z'"}, predicate="id = 30"),
        lambda: write_deltalake(where, DeltaTable(where).to_pyarrow_table().slice(0, 4), mode="overwrite"),
    ]
    total = 0
    for i, change in enumerate(commits):
        change() if callable(change) else spark.sql(change)
        version = DeltaTable(where).version()
        feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
                .option("endingVersion", version).load(where).count())
        assert delta.change_rows(where, "orders", version - 1, version) == feed, f"commit {i}: {change}"
        total += feed
    assert delta.change_rows(where, "orders", 0, DeltaTable(where).version()) == total


def test_a_crash_between_the_catalog_commit_and_a_views_delta_commit(make_project, spark, tmp_path, monkeypatch):
    """Kill point (#46, item 5): the sink stage dies after one view's Delta commit, before the next's.
    Readers through ivm see the catalog's one snapshot; `ivm snapshot` names the Delta versions that hold
    it for the views written and says the other is behind; the next refresh, with nothing new to
    apply, writes the lagging table, and every Delta table then equals its view."""
    p, sources = project_with_sources(make_project, spark, tmp_path, [(1, "ann", Decimal("60.00"), DAYS[0])],
                                      [(DAYS[0], "click", 1.0)])
    p.refresh()
    spark.sql(f"UPDATE delta.`{sources['orders']}` SET amount = 70 WHERE id = 1")
    written, real = [], sinks.write_view

    def dies_on_the_second(ctx, view, *args):
        if written:
            raise RuntimeError("killed between two Delta commits")
        written.append(view)
        return real(ctx, view, *args)

    monkeypatch.setattr(sinks, "write_view", dies_on_the_second)
    with pytest.raises(RuntimeError, match="killed"):
        p.refresh()
    monkeypatch.setattr(sinks, "write_view", real)
    assert [tuple(r) for r in p.read("big").collect()] == [(1, "ann", Decimal("70.00"))]  # the catalog's snapshot
    states = {s.view: s for s in sinks.snapshot(p.ctx)}
    behind = [v for v, s in states.items() if s.delta_version is None]
    assert written and written[0] not in behind and behind  # one written, the rest behind, and said so
    assert all("behind the catalog" in states[v].note for v in behind)
    p.refresh()  # nothing new to apply: the sink catches up
    for s in sinks.snapshot(p.ctx):
        assert s.delta_version is not None, s
        assert bag(spark.sql(s.sql()).collect()) == bag(p.read(s.view).collect()), s.view


def test_small_views_are_written_by_delta_rs_without_a_jvm(make_project, spark, tmp_path, monkeypatch):
    """A view whose layers are small (`storage.sink_without_jvm_mb`) is consolidated by pyarrow and written
    by delta-rs — merged by its key, a set by its columns, a bag's new copies appended and its lost ones
    merged by every column; DATE, TIMESTAMP, DECIMAL, DOUBLE, NULLs, a bag's duplicate rows — so the DAG's
    sink task needs no spark-submit (`publish.sink_without_jvm`), and Spark reads each table as ivm holds
    the view; a later Spark MERGE (the threshold at 0) continues the table delta-rs wrote."""
    import pyarrow.parquet as pq

    from ivm.refresh import publish

    # what the DAG's sink task asks before it writes: whether it needs Spark
    asked, sink_stage = [], publish.sink_stage
    monkeypatch.setattr(publish, "sink_stage", lambda ctx, run_id, say: (
        asked.append(publish.sink_without_jvm(ctx, run_id)), sink_stage(ctx, run_id, say))[1])

    schema = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("ts", pa.timestamp("us")),
                        ("amount", pa.decimal128(10, 2)), ("price", pa.float64())])

    def parquet(name: str, rows: list[tuple], kinds: list[str] | None = None) -> str:
        table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)
        if kinds:
            table = table.append_column("_change_type", pa.array(kinds, pa.string()))
        pq.write_table(table, tmp_path / name)
        return str(tmp_path / name)

    ts = dt.datetime(2026, 11, 1, 23, 30)
    rows = [(1, DAYS[0], ts, Decimal("1.50"), 0.25), (2, DAYS[1], None, None, None),
            (3, DAYS[0], ts, Decimal("1.50"), 0.25)]
    views = {"copies": {"sql": "SELECT day, ts, amount, price FROM m"},  # (rows 1 and 3 are one row twice)
             # (under REDUCE: its delta layers differ from its base layer in __count's nullability alone)
             "days": {"sql": "SELECT DISTINCT day FROM m", "strategy": "reduce"},
             "per_day": {"sql": "SELECT day, max(ts) AS last, sum(amount) AS total FROM m GROUP BY day",
                         "key": ["day"]}}
    table = {"m": {"columns": {"id": "bigint", "day": "date", "ts": "timestamp", "amount": "decimal(10,2)",
                               "price": "double"}, "key": ["id"]}}
    p = make_project(table, root=tmp_path / "p", views=views, storage={"delta_views": True})
    p.load("m", parquet("m.parquet", rows))
    p.refresh()
    # inserts only: a bag gains copies, which delta-rs appends
    p.append("m", parquet("c1.parquet", [(4, DAYS[2], ts, Decimal("-2.00"), 1e-3), (7, DAYS[0], ts, Decimal("1.50"),
                                                                                   0.25)], ["insert", "insert"]))
    def written(project, jvm: bool, hows: dict[str, str]) -> None:
        """The sink stage asked for no JVM unless ``jvm``, wrote each view as ``hows`` says, and every
        table holds its view."""
        assert asked.pop() is not jvm
        assert {v: project.catalog.latest_stage("sink", v).detail["how"] for v in hows} == hows
        for view in views:
            assert bag(spark.read.format("delta").load(sinks.location(project.ctx, view)).collect()) == bag(
                project.read(view).collect()), view

    p.refresh()
    # (a keyed view, and a set by all its columns: a MERGE of the keys its delta layer touched)
    keys = "merge of the delta's keys (delta-rs)"
    written(p, False, {"per_day": keys, "days": keys, "copies": "append (delta-rs)"})
    assert spark.read.format("delta").load(sinks.location(p.ctx, "copies")).schema == p.ctx.schema("copies")
    # deletes: the bag loses a copy of a row it holds three times, merged by delta-rs all the same; the
    # last row of DAYS[1] goes, and with it a key of per_day and a row of days (a key with no row now)
    p.append("m", parquet("c2.parquet", [rows[0], rows[1]], ["delete", "delete"]))
    p.refresh()
    written(p, False, {"copies": "merge (copies, delta-rs)", "days": keys})
    assert DAYS[1] not in {r.day for r in spark.read.format("delta").load(sinks.location(p.ctx, "days")).collect()}
    # a full recompute: the bag's whole new state against the rows its table holds (a row loses one of its
    # two copies, another comes back), by delta-rs all the same
    p.append("m", parquet("c2f.parquet", [rows[2], (8, DAYS[1], None, None, None)], ["delete", "insert"]))
    p.refresh(mode="full")
    written(p, False, {"per_day": "merge (delta-rs)", "days": "merge (delta-rs)", "copies": "merge (copies, delta-rs)"})
    # a state above WHOLE_STATE_ROWS after a full recompute: Spark's MERGE of the whole state, not delta-rs's
    limit = sinks.WHOLE_STATE_ROWS
    monkeypatch.setattr(sinks, "WHOLE_STATE_ROWS", 1)
    p.append("m", parquet("c2g.parquet", [(9, DAYS[2], ts, Decimal("0.10"), 2.0)], ["insert"]))
    p.refresh(mode="full")
    written(p, True, {"per_day": "merge (whole state)", "days": "merge (whole state)", "copies": "merge (copies)"})
    monkeypatch.setattr(sinks, "WHOLE_STATE_ROWS", limit)
    # over the threshold: Spark's MERGE, into the table delta-rs wrote
    again = make_project(table, root=tmp_path / "p", views=views,
                         storage={"delta_views": True, "sink_without_jvm_mb": 0})
    again.append("m", parquet("c3.parquet", [(5, DAYS[2], None, Decimal("3.00"), None),
                                             (6, dt.date(2026, 11, 4), ts, None, 0.5)], ["insert", "insert"]))
    again.refresh()
    # keyed by its key; a set without a key (each row once) by all its columns; a bag by its rows' copies
    written(again, True, {"per_day": "merge", "days": "merge", "copies": "merge (copies)"})

PIP_ONLY = """
import sys
from pathlib import Path

import ivm.spark
ivm.spark.JARS_DIR = Path(sys.argv[2])  # as `pip install` leaves ivm: no jars vendored by `make venv`
from ivm import Project

p = Project.open(sys.argv[1])
p.apply()
p.load("t", sys.argv[3])
print(p.refresh().status, p.spark.conf.get("spark.jars.packages"))
p.close()
"""


@pytest.mark.e2e
def test_an_ivm_installed_by_pip_alone_fetches_delta_as_delta_spark_documents(tmp_path):
    """Without vendored jars, Spark starts with `spark.jars.packages` naming the Delta build of the
    installed delta-spark (ivm.spark.delta_package) and the views are written as Delta tables by Spark."""
    path = write_project(tmp_path / "p", {"t": KV_TABLES["t"]}, storage={"delta_views": True, "sink_without_jvm_mb": 0},
                         views={"per_k": {"sql": "SELECT k, sum(v) AS s FROM t GROUP BY k", "key": ["k"]}})
    (tmp_path / "no-jars").mkdir()
    data = lines(tmp_path / "t.jsonl", [("a", 1), ("a", 2), ("b", 5)], cols=("k", "v"))
    # local Spark in that process, its Ivy resolving in a home of its own as on a machine that only ran pip
    # (this one's ~/.m2, which `make venv`'s Maven filled, holds poms whose jars it never fetched, and Ivy's
    # local-m2 resolver then fails on them)
    # (PySpark marks a process that connected to a server with SPARK_CONNECT_MODE_ENABLED: not inherited)
    env = {**{k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")},
           "SPARK_SUBMIT_OPTS": f"-Duser.home={tmp_path / 'home'}"}
    done = subprocess.run([sys.executable, "-c", PIP_ONLY, str(path), str(tmp_path / "no-jars"), data], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["succeeded", delta_package()]
    table = DeltaTable(str(tmp_path / "p" / "warehouse" / "delta" / "per_k"))
    assert sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist()) == [("a", 3), ("b", 5)]
