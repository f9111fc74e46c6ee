"""The ivm demo: load tables, append change logs in several formats, refresh tables and views.

Run with `make demo` from the repository root. It starts from an empty warehouse next to this file,
uses the embedded defaults (local Spark, SQLite catalog), and prints what happens at each step.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from tabulate import tabulate

from ivm import IvmError, Project
from ivm.modes import Mode

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def say(text: str = "") -> None:
    print(text, flush=True)


def show(project: Project, name: str) -> None:
    df = project.read(name)
    rows = [tuple(r) for r in df.orderBy(*df.columns).limit(50).collect()]
    say(tabulate(rows, headers=df.columns, tablefmt="psql", missingval="NULL"))


def main() -> int:
    started = time.perf_counter()
    shutil.rmtree(HERE / "warehouse", ignore_errors=True)
    project = Project.open(str(HERE / "ivm.yaml"))
    say(f"== ivm demo: project {HERE / 'ivm.yaml'}")
    say(f"   warehouse {project.config.warehouse_uri}, catalog {project.catalog.masked_url}")

    say("\n== ivm apply")
    for line in project.apply():
        say(f"   {line}")

    say("\n== ivm load: initial snapshots (CSV and JSON lines)")
    for table, file in [("flight", "flight.csv"), ("res", "res.jsonl"), ("link", "link.csv"),
                        ("page_view", "page_view.csv"), ("passenger", "passenger.jsonl"),
                        ("companion", "companion.csv"), ("trip", "trip.jsonl")]:
        rows, version = project.load(table, str(DATA / file))
        say(f"   {table}: {rows} rows from {file} -> version {version}")

    say("\n== ivm refresh: materialize the views at the loaded snapshot")
    result = project.refresh(progress=lambda line: say(f"   {line}"))
    for name in ("seats_per_flight", "unbooked_flights", "only_tri_hop", "reach", "minor_companions",
                 "nights_per_city"):
        say(f"\n   {name}:")
        show(project, name)

    say("\n== ivm explain miles_per_passenger")
    say("   " + project.explain("miles_per_passenger").to_text().replace("\n", "\n   "))
    say("\n== ivm explain route_geo_miles (a user's inductive aggregate, 001 §2; up to the key-based analysis)")
    text = project.explain("route_geo_miles").to_text()
    say("   " + text[:text.index("key-based analysis")].rstrip().replace("\n", "\n   "))

    say("\n== ivm explain page_visitors (up to the key-based analysis)")
    text = project.explain("page_visitors").to_text()
    say("   " + text[:text.index("key-based analysis")].rstrip().replace("\n", "\n   "))

    say("\n== ivm explain minor_companions (nested data: the collection, its log, the owner index)")
    text = project.explain("minor_companions").to_text()
    say("   " + text[:text.index("key-based analysis")].rstrip().replace("\n", "\n   "))

    say("\n== ivm log append: changes in the native format and as Debezium events")
    for table, file, fmt in [("res", "res_changes_1.jsonl", "cdf"), ("res", "res_debezium.jsonl", "debezium"),
                             ("link", "link_changes.csv", "cdf"), ("page_view", "page_view_changes.csv", "cdf"),
                             ("res", "res_changes_1.jsonl", "cdf"), ("companion", "companion_changes.csv", "cdf"),
                             ("trip", "trip_changes.jsonl", "cdf")]:
        say(f"   {project.append(table, str(DATA / file), fmt).describe()}")

    say("\n== ivm refresh: trim every log into a net delta, maintain the views that read a changed table")
    say("   incrementally (counting: delta rules, GROUPBY states; DRed for the recursive reach: the cycle")
    say("   a->b->c->d->a loses d->a), publish everything at one snapshot")
    result = project.refresh(progress=lambda line: say(f"   {line}"))
    say(tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))
    say("\n   what the incremental refresh changed in each view (+1 a tuple derived once more, -1 once less):")
    for work in result.views:
        delta = project.last_delta(work.view)
        if work.mode is Mode.INCREMENTAL and delta is not None:
            say(f"\n   Δ {work.view}:")
            rows = [tuple(r) for r in delta.orderBy(*delta.columns).limit(50).collect()]
            say(tabulate(rows, headers=delta.columns, tablefmt="psql", missingval="NULL"))
    for name in ("res", "seats_per_flight", "route_stats", "route_geo_miles", "busy_flights", "unbooked_flights",
                 "only_tri_hop", "page_counts", "page_visitors", "reach", "minor_companions", "nights_per_city"):
        say(f"\n   {name} now:")
        show(project, name)

    say("\n== bad change data is refused, with nothing applied")
    say(f"   {project.append('res', str(DATA / 'res_bad.jsonl')).describe()}")
    try:
        project.refresh(progress=lambda line: say(f"   {line}"))
    except IvmError as e:
        say(f"   refused: {e}")
    say("   the missing insert arrives late, at an earlier commit version; the log is whole again")
    say(f"   {project.append('res', str(DATA / 'res_fix.jsonl')).describe()}")
    result = project.refresh(progress=lambda line: say(f"   {line}"))
    say(tabulate(result.summary_rows(), headers=result.SUMMARY_HEADERS, tablefmt="simple"))

    say("\n== a refresh with nothing new launches no Spark job")
    result = project.refresh(progress=lambda line: say(f"   {line}"))

    say("\n== per-view pointers (002): a refresh of seats_per_flight alone applies a new reservation; the other")
    say("   views that read res catch up from their own pointers into the log on the next refresh")
    say(f"   {project.append('res', str(DATA / 'res_changes_2.jsonl')).describe()}")
    project.refresh(["seats_per_flight"])
    for work in project.refresh().views:
        say(f"   {work.view}: {work.mode}: {work.reason}")

    say("\n== ivm validate: every view against a recomputation of a sample of its keys (Great Expectations)")
    checks = project.validate(progress=lambda line: say(f"   {line}"))
    say(f"   {sum(c.status == 'passed' for c in checks)} of {len(checks)} views passed; Data Docs: "
        f"{project.warehouse.path('reports', 'data_docs', 'index.html')}")

    say("\n== ivm backfill reach --from-version 2: replay reach from its state before commit version 2")
    result = project.backfill(["reach"], from_version=2, progress=lambda line: say(f"   {line}"))

    lakehouse(project.spark)

    say("\n== ivm runs")
    rows = [[r.id, r.kind, r.status, ", ".join(f"{s.relation}:{s.delta_rows}" for s in r.stages
                                               if s.delta_rows is not None), r.error or ""]
            for r in project.runs(10)]
    say(tabulate(rows, headers=["run", "kind", "status", "net delta rows", "error"], tablefmt="simple"))
    say(f"\ndemo finished in {time.perf_counter() - started:.1f} s")
    project.close()
    return 0


def lakehouse(spark) -> None:
    """A table read from a Delta table's change data feed, changed by Spark SQL as a user's pipeline would
    (UPDATE, DELETE, MERGE INTO), and views published as Delta tables, read back with plain Spark SQL and
    with delta-rs (no JVM)."""
    from deltalake import DeltaTable

    from ivm import sinks

    say("\n== Delta Lake: a table read where it lives (its change data feed), views published as Delta tables")
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
