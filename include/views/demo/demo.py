"""The ivm demo: load tables, append change logs in several formats, refresh tables and views.

Run with `make demo` from the repository root. It starts from an empty warehouse next to this file,
uses the embedded defaults (local Spark, SQLite catalog), and prints what happens at each step.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tabulate import tabulate

from ivm import IvmError, Project, dataflow
from ivm.config import QUIET_JVM_ENV
from ivm.modes import Mode

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
#: the dataflow picture the README shows (rewritten by every run of the demo)
PICTURE = HERE.parents[2] / "docs" / "img" / "demo-dataflow.png"


def say(text: str = "") -> None:
    print(text, flush=True)


#: (step, seconds) of each step the demo ran, for its closing table
STEPS: list[tuple[str, float]] = []


@contextmanager
def step(title: str, *more: str):
    """A step of the demo: its title, what it does, and the seconds it took."""
    say(f"\n== {title}")
    for line in more:
        say(f"   {line}")
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    STEPS.append((title.split(":")[0], seconds))
    say(f"   ({seconds:.1f} s)")


def show(project: Project, name: str) -> None:
    df = project.read(name)
    rows = [tuple(r) for r in df.orderBy(*df.columns).limit(50).collect()]
    say(tabulate(rows, headers=df.columns, tablefmt="psql", missingval="NULL"))


def main() -> int:
    started = time.perf_counter()
    # the JVM's own console (its warnings, Spark's log) in a file, as under the `ivm` command
    os.environ.setdefault(QUIET_JVM_ENV, "1")
    shutil.rmtree(HERE / "warehouse", ignore_errors=True)
    project = Project.open(str(HERE / "ivm.yaml"))
    say(f"== ivm demo: project {HERE / 'ivm.yaml'}")
    say(f"   warehouse {project.config.warehouse_uri}, catalog {project.catalog.masked_url}")
    say("   (about 4 minutes on a 2-core machine; each step prints its seconds)")

    with step("ivm apply: record the tables and views, analyse every view (starts Spark: 10-20 s)"):
        for line in project.apply():
            say(f"   {line}")

    with step("ivm load: initial snapshots (CSV and JSON lines)"):
        for table, file in [("flight", "flight.csv"), ("res", "res.jsonl"), ("link", "link.csv"),
                            ("page_view", "page_view.csv"), ("passenger", "passenger.jsonl"),
                            ("companion", "companion.csv"), ("trip", "trip.jsonl")]:
            rows, version = project.load(table, str(DATA / file))
            say(f"   {table}: {rows} rows from {file} -> version {version}")

    with step("ivm refresh: materialize the views at the loaded snapshot"):
        project.refresh(progress=lambda line: say(f"   {line}"))
    for name in ("seats_per_flight", "unbooked_flights", "only_tri_hop", "reach", "minor_companions",
                 "nights_per_city"):
        say(f"\n   {name}:")
        show(project, name)

    with step("ivm explain: how each view is maintained, and why"):
        explained = {v: project.explain(v) for v in project.config.views}
        picture = dataflow.draw(list(project.config.tables), explained, project.program[1].depends_on, PICTURE,
                                title="The demo project: tables, strata and views (with the algorithm of each)")
        say(f"   the dataflow, tables -> strata -> views: {picture}")
        say("   " + explained["miles_per_passenger"].to_text().replace("\n", "\n   "))
        for view, why in [("route_geo_miles", "a user's inductive aggregate, 001 §2"),
                          ("page_visitors", "a bag, counted"),
                          ("minor_companions", "nested data: the collection, its log, the owner index")]:
            text = explained[view].to_text()
            say(f"\n   ivm explain {view} ({why}; up to the key-based analysis)")
            say("   " + text[:text.index("key-based analysis")].rstrip().replace("\n", "\n   "))

    with step("ivm log append: changes in the native format and as Debezium events"):
        for table, file, fmt in [("res", "res_changes_1.jsonl", "cdf"), ("res", "res_debezium.jsonl", "debezium"),
                                 ("link", "link_changes.csv", "cdf"), ("page_view", "page_view_changes.csv", "cdf"),
                                 ("res", "res_changes_1.jsonl", "cdf"), ("companion", "companion_changes.csv", "cdf"),
                                 ("trip", "trip_changes.jsonl", "cdf")]:
            say(f"   {project.append(table, str(DATA / file), fmt).describe()}")

    with step("ivm refresh: trim every log into a net delta, maintain the views that read a changed table",
              "incrementally (counting: delta rules, GROUPBY states; DRed for the recursive reach: the cycle",
              "a->b->c->d->a loses d->a), publish everything at one snapshot"):
        incremental = project.refresh(progress=lambda line: say(f"   {line}"))
    say(tabulate(incremental.summary_rows(), headers=incremental.SUMMARY_HEADERS, tablefmt="simple"))
    say("\n   what the incremental refresh changed in each view (+1 a tuple derived once more, -1 once less):")
    for work in incremental.views:
        delta = project.last_delta(work.view)
        if work.mode is Mode.INCREMENTAL and delta is not None:
            say(f"\n   Δ {work.view}:")
            rows = [tuple(r) for r in delta.orderBy(*delta.columns).limit(50).collect()]
            say(tabulate(rows, headers=delta.columns, tablefmt="psql", missingval="NULL"))
    for name in ("seats_per_flight", "route_geo_miles", "busy_flights", "unbooked_flights", "only_tri_hop",
                 "page_visitors", "reach", "minor_companions"):
        say(f"\n   {name} now:")
        show(project, name)

    # one view per algorithm (every view would double the demo's time for the same lesson)
    by_algorithm = {}
    for w in incremental.views:
        if w.mode is Mode.INCREMENTAL:
            by_algorithm.setdefault(explained[w.view].algorithm.split(" (")[0].split(":")[0], w.view)
    with step("ivm backfill --full: a view of each algorithm recomputed from the same snapshot, to compare"):
        full = project.backfill(sorted(by_algorithm.values()), full=True, progress=lambda line: say(f"   {line}"))
    seconds = {w.view: w.seconds for w in full.views}
    say("   each view's incremental refresh against its full recompute, on the same change (seconds of its")
    say("   maintain step; the demo's tables hold a few rows, so both are Spark's fixed costs — on real tables")
    say("   the incremental side stays with the change and the full side grows with the tables: docs/benchmarks.md)")
    say(tabulate([(w.view, explained[w.view].algorithm, w.rows_changed, f"{w.seconds:.2f}",
                   f"{seconds[w.view]:.2f}", f"{seconds[w.view] / w.seconds:.1f}x" if w.seconds else "")
                  for w in incremental.views if w.view in seconds],
                 headers=["view", "algorithm", "rows changed", "incremental s", "full s", "full / incremental"],
                 tablefmt="simple"))

    with step("bad change data is refused, with nothing applied"):
        say(f"   {project.append('res', str(DATA / 'res_bad.jsonl')).describe()}")
        try:
            project.refresh(progress=lambda line: say(f"   {line}"))
        except IvmError as e:
            say(f"   refused: {e}")
        say("   the missing insert arrives late, at an earlier commit version; the log is whole again")
        say(f"   {project.append('res', str(DATA / 'res_fix.jsonl')).describe()}")
        result = project.refresh(progress=lambda line: say(f"   {line}"))
        say(tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))

    with step("a refresh with nothing new launches no Spark job"):
        project.refresh(progress=lambda line: say(f"   {line}"))

    with step("ivm validate: every view against a recomputation of a sample of its keys (Great Expectations)"):
        checks = project.validate(progress=lambda line: say(f"   {line}"))
        say(f"   {sum(c.status == 'passed' for c in checks)} of {len(checks)} views passed; Data Docs: "
            f"{project.warehouse.path('reports', 'data_docs', 'index.html')}")

    with step("ivm backfill reach --from-version 2: replay reach from its state before commit version 2"):
        project.backfill(["reach"], from_version=2, progress=lambda line: say(f"   {line}"))

    with step("Delta Lake: a table read where it lives (its change data feed), views published as Delta tables"):
        lakehouse(project.spark)

    say("\n== ivm runs")
    rows = [[r.id, r.kind, r.status, ", ".join(f"{s.relation}:{s.delta_rows}" for s in r.stages
                                               if s.delta_rows is not None), r.error or ""]
            for r in project.runs(10)]
    say(tabulate(rows, headers=["run", "kind", "status", "net delta rows", "error"], tablefmt="simple"))
    project.close()
    say("\n== the demo's steps")
    say(tabulate([(name, f"{s:.1f}") for name, s in STEPS], headers=["step", "seconds"], tablefmt="simple"))
    say(f"\ndemo finished in {time.perf_counter() - started:.1f} s; its dataflow picture: {PICTURE}; Spark's own "
        f"log: {HERE / 'warehouse' / 'spark-driver.log'}")
    return 0


def lakehouse(spark) -> None:
    """A table read from a Delta table's change data feed, changed by Spark SQL as a user's pipeline would
    (UPDATE, DELETE, MERGE INTO), and views published as Delta tables, read back with plain Spark SQL and
    with delta-rs (no JVM)."""
    from deltalake import DeltaTable

    from ivm import sinks

    fares = HERE / "warehouse" / "lakehouse" / "fares"
    (spark.read.csv(str(DATA / "fares.csv"), header=True,
                    schema="flight_id INT, cabin STRING, fare DECIMAL(8,2), valid_from DATE")
     .write.format("delta").option("delta.enableChangeDataFeed", "true").save(str(fares)))
    say(f"   a user's Delta table {fares}, change data feed on")
    lake = Project.open(str(HERE / "lake" / "ivm.yaml"))
    lake.apply()
    lake.refresh(progress=lambda line: say(f"   {line}"))
    table = f"delta.`{fares}`"
    for sql in [f"UPDATE {table} SET fare = fare * 1.10 WHERE cabin = 'business'",
                f"DELETE FROM {table} WHERE flight_id = 4",
                f"MERGE INTO {table} t USING (SELECT 5 AS flight_id, 'business' AS cabin, "
                "CAST(520.00 AS DECIMAL(8,2)) AS fare, DATE'2026-11-03' AS valid_from) s "
                "ON t.flight_id = s.flight_id AND t.cabin = s.cabin WHEN MATCHED THEN UPDATE SET * "
                "WHEN NOT MATCHED THEN INSERT *"]:
        say(f"   the user's pipeline: {sql}")
        spark.sql(sql)
    say("   ivm refresh: the change data feed of the new versions, trimmed and maintained")
    lake.refresh(progress=lambda line: say(f"   {line}"))
    name = f"{lake.config.database}.premium_fares"  # (registered in the Spark catalog by `apply`)
    say(f"\n   premium_fares read back by plain Spark SQL, by its name: SELECT * FROM {name}")
    df = spark.sql(f"SELECT * FROM {name} ORDER BY flight_id, cabin")
    say(tabulate([tuple(r) for r in df.collect()], headers=df.columns, tablefmt="psql"))
    say("\n   fare_range read back by delta-rs (no JVM):")
    frame = DeltaTable(sinks.location(lake.ctx, "fare_range")).to_pandas().sort_values("cabin")
    say(tabulate(frame.values.tolist(), headers=list(frame.columns), tablefmt="psql"))
    say("\n   ivm snapshot: each view's Delta version holding the catalog's snapshot")
    for s in sinks.snapshot(lake.ctx):
        say(f"   {s.view}: {s.sql() if s.delta_version is not None else s.note}")
    lake.close()


if __name__ == "__main__":
    sys.exit(main())
