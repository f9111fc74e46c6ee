"""Incremental refresh against full recompute, side by side, in one warm Spark session (the benchmark
issue). Not a test: figures are measured and reported, never asserted.

    .venv/bin/python tests/bench/run.py [--sf 0.1] [--deltas 0.0001,0.001,0.01,0.1] [--edges 10000] [--sources ivm]
                                        [--views q1,q3,q5,reach,cust_dates,nations@reduce,...] [--repeat 3]
                                        [--out tests/bench/results]

(`make bench` runs it at SF 0.1.) For each view a project of its own holds the tables it reads (so a
refresh of one view never costs another's), loaded from TPC-H (``tpchgen-cli``) or the generated
graph and materialized once — or, with ``--sources delta``, the TPC-H tables written as Delta tables
with the change data feed on, which the project reads in place (`source: {delta: ...}`), each change
committed to them as a user's pipeline does (`MERGE ... DELETE`, `INSERT`, in place of the appends
below). Then for each Δ (a fraction of the orders, or of the edges):

    T_inc   append the change files, `refresh --mode incremental` (trim the logs, maintain the view, publish)
    T_full  append a second change of the same size, `refresh --mode full` (trim the logs, recompute the
            view and everything it stores, publish)
    T_auto  append a third, `refresh` (`--mode auto`: the crossover by the view's measured costs decides)
    T_plain what a user without ivm runs instead: the view's SQL as Spark SQL's
            `CREATE OR REPLACE TABLE ... USING delta AS SELECT` in the same Spark (a session of its own),
            over Delta copies of the view's tables (written, unmeasured, at each Δ's start; with
            ``--sources delta`` the Delta tables themselves)
    T_floor Q3 and Q5: floor.py's hand-written, unchecked incremental refresh of the same view, over
            copies of the same tables changed by the same sequence of RF1/RF2 changes (the least a
            refresh persisting its changes does; see floor.py)
    noop    a `refresh` with nothing new

``--repeat`` times (3), the modes interleaved, each T the median (reported with the range), after every
relation was compacted (unmeasured) to one base layer. Each measurement comes with the Spark jobs
launched, the rows read (input records of their stages) and the bytes written (output bytes), from
Spark's status store. The validation stage is off (`validate.sample: 0`):
it is measured on its own. The results go to ``<out>/results.md`` (with the machine's facts) and
``<out>/results.png`` (time against Δ).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DRIVER_MEMORY = "4g"
sys.path.insert(0, str(REPO / "tests" / "bench"))

from floor import GROUPS as FLOOR_VIEWS  # noqa: E402
from floor import Floor  # noqa: E402
from workloads import (  # noqa: E402
    AGGREGATES,
    CLOSURE_TABLES,
    CLOSURE_VIEWS,
    CREAM_VIEWS,
    PROJECTION_VIEWS,
    TPCH_TABLES,
    TPCH_VIEWS,
    EdgeChanges,
    RefreshSets,
    commit,
    graph,
    lake,
    lake_paths,
    tables_read,
    tpch,
)

from ivm.spark import ADAPTIVE, JobMetrics  # noqa: E402


@dataclass
class Figure:
    view: str
    delta: float  # fraction
    change: str  # RF1+RF2 | insert | delete | noop
    mode: str  # incremental | full | auto
    changes: int  # rows in the change files
    seconds: float
    jobs: int
    rows_read: int
    bytes_written: int
    shuffled: int = 0  # records written to shuffles: the intermediate rows the plans exchanged
    detail: str = ""  # what the maintenance reported (REDUCE: join steps, relations written)
    warmup: list[float] | None = None  # the unmeasured warm-up refreshes before it (seconds)
    times: list[float] | None = None  # every measurement of the figure (seconds), in order; it reports their median


def lower_middle(items: list, key=None):
    """The median item of ``items`` by ``key``: the lower middle of an even count (always one measured)."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def median_of(figures: list[Figure]) -> Figure:
    """The measurement of median time among repeated ones, with every measurement's time: its jobs, rows
    and bytes are that refresh's own."""
    return replace(lower_middle(figures, key=lambda f: f.seconds), times=[f.seconds for f in figures])


def ranged(times: list[float]) -> str:
    """The median of ``times``, with their range when there are several."""
    if len(times) < 2:
        return f"{times[0]:.2f}"
    return f"{lower_middle(times):.2f} ({min(times):.2f}–{max(times):.2f})"


def timed(f: Figure) -> str:
    """A figure's time: the median, with the range of the measurements when there are several."""
    return ranged(f.times or [f.seconds])


class SparkCounters:
    """Jobs, input records and output bytes of what runs inside ``measure`` (ivm.spark.JobMetrics: a job
    group per measurement, the stages' metrics from Spark's status store: the numbers its UI shows)."""

    def __init__(self, spark):
        self.metrics = JobMetrics(spark)

    def measure(self, fn):
        with self.metrics.measure("bench") as m:
            result = fn()
        return result, m.seconds, m.jobs, m.rows_read, m.bytes_written, m.shuffled


def view_sql(view: str) -> str | None:
    """The view's SQL as plain Spark runs it (None for a Datalog view)."""
    definition = {**TPCH_VIEWS, **PROJECTION_VIEWS, **CREAM_VIEWS, **CLOSURE_VIEWS}[view.split("@")[0]]
    return definition if isinstance(definition, str) else definition.get("plain", definition.get("sql"))


class PlainSpark:
    """T_plain: the view's SQL run by plain Spark as a user without ivm would, `CREATE OR REPLACE TABLE
    delta.`<folder>/view` USING delta AS <the view's SQL>`, in a new session of ivm's Spark (the same warm
    JVM and executors; temporary views of its own: each of the view's tables by its name, read from a
    Delta copy of the table's state, written unmeasured by `copy_tables` — or, with ``lake`` (`--sources
    delta`), the Delta tables ivm reads in place, at their current version)."""

    def __init__(self, project, view: str, folder: Path, lake: dict[str, str] | None = None):
        self.project, self.sql, self.folder, self.lake = project, view_sql(view), folder, lake
        self.spark = project.spark.newSession()
        # each CREATE OR REPLACE of a path's table gives it a new table id, which Delta warns of with both
        # snapshots printed whole (~40 lines per run); the benchmark's own doing, so quieted in its JVM
        log4j = project.spark.sparkContext._jvm.org.apache.logging.log4j  # noqa: SLF001 - no Python API
        for name in ("org.apache.spark.sql.delta.OptimisticTransaction", "org.apache.spark.sql.delta.DeltaLog"):
            log4j.core.config.Configurator.setLevel(name, log4j.Level.ERROR)

    def copy_tables(self) -> None:
        for table in self.project.config.tables:
            where = self.lake[table] if self.lake else str(self.folder / table)
            if not self.lake:
                (self.project.read(table).write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                 .save(where))
            self.spark.read.format("delta").load(where).createOrReplaceTempView(table)

    def run(self) -> None:
        if self.lake:  # (the tables resolved at the query, at their current versions, as a user's query does)
            self.copy_tables()
        self.spark.sql(f"CREATE OR REPLACE TABLE delta.`{self.folder / 'view'}` USING delta AS {self.sql}")


class FloorRefresh:
    """T_floor: floor.py's hand-written incremental refresh of the view (Q3, Q5), over its own copies of
    the tables and its own sequence of RF1/RF2 changes (``changes``, a copy of ivm's `RefreshSets` made
    before its first change: the same changes ivm's project gets, in the same order; the copy shares the
    tables it draws from, which at SF 10 hold GBs), with adaptive execution off as floor.py runs it."""

    def __init__(self, spark, view: str, data: Path, root: Path, changes: RefreshSets, checked: bool = False):
        name = f"floor-checked-{view}" if checked else f"floor-{view}"
        self.spark, self.folder = spark, root / f"changes-{name}"
        self.floor = Floor(spark, view, data, root / name, checked)
        self.changes = changes

    def change(self, fraction: float):
        """The next change of ``fraction`` written (unmeasured); returns the refresh that applies it."""
        files = self.changes.make(fraction, self.folder)

        def refresh() -> None:
            adaptive = self.spark.conf.get(ADAPTIVE)
            self.spark.conf.set(ADAPTIVE, "false")
            try:
                self.floor.incremental(files)
            finally:
                self.spark.conf.set(ADAPTIVE, adaptive)
        return refresh


def project_for(view: str, root: Path, sf: float, edges: int, sources: str = "ivm"):
    """A project holding ``view`` and the tables it reads, loaded and materialized; and, with ``sources``
    "delta", where its tables' Delta tables are (else None)."""
    from ivm import Project

    closure = view == "reach"
    tables = CLOSURE_TABLES if closure else {t: TPCH_TABLES[t] for t in tables_read(view)}
    tables = {name: {**spec, "references": {c: target for c, target in spec.get("references", {}).items()
                                            if target.split(".")[0] in tables}} for name, spec in tables.items()}
    data = graph(edges, root) if closure else tpch(sf, root)
    where = None
    if sources == "delta" and not closure:  # the tables as a user's Delta tables, read in place by their feed
        lake_root = root / f"lake-{view.replace('@', '-')}"
        shutil.rmtree(lake_root, ignore_errors=True)  # (fresh: the refresh sets start from the generated data)
        where = lake_paths(lake_root, list(tables))
        tables = {name: {**spec, "source": {"delta": where[name]}} for name, spec in tables.items()}
    name, _, strategy = view.partition("@")  # e.g. nations@reduce: the view under one strategy
    definition = CLOSURE_VIEWS[view] if closure else {**TPCH_VIEWS, **PROJECTION_VIEWS, **CREAM_VIEWS}[name]
    spec = {**({k: v for k, v in definition.items() if k != "plain"} if isinstance(definition, dict)
               else {"sql": definition}), "validate": {"sample": 0},
            **({"strategy": strategy} if strategy else {})}
    folder = root / f"project-{view.replace('@', '-')}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ivm.yaml").write_text(yaml.safe_dump({
        # the local driver is the executor too: Spark's default 1 GiB ran out of heap in a hash aggregate of
        # SF 1's full recompute (--driver-memory, 4g by default)
        "warehouse": "./warehouse", "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4",
                                                                              "spark.driver.memory": DRIVER_MEMORY}},
        # no compaction inside a measured refresh: a refresh that compacts rewrites a whole table, a
        # periodic cost no single figure should carry (run_view compacts, unmeasured, before each Δ)
        "storage": {"compact_max_layers": 100},
        "tables": tables, "aggregates": AGGREGATES, "views": {name: spec}}, sort_keys=False))
    project = Project.open(str(folder / "ivm.yaml"))
    if where is not None:  # (written by the project's own Spark, before `apply` reads their schemas)
        lake(project.spark, data, lake_root, list(tables))
    project.apply()
    if where is None:
        for t in tables:
            project.load(t, str(data / f"{t}.parquet"))
    project.refresh()
    return project, data, where


def run_view(view: str, args, root: Path, counters_for) -> list[Figure]:
    project, data, where = project_for(view, root, args.sf, args.edges, args.sources)
    counters = counters_for(project.spark)
    figures = []
    changes_dir = root / f"changes-{view}"
    if view == "reach":
        changes = EdgeChanges(args.edges)
        plan = [(d, kind) for d in args.deltas for kind in ("insert", "delete")]
    else:
        changes = RefreshSets(data)
        floor_changes = copy.copy(changes)  # (before the first change: FloorRefresh's sequence)
        checked_changes = copy.copy(changes)  # (and the checked floor's)
        plan = [(d, "RF1+RF2") for d in args.deltas]
    name = view.split("@")[0]

    def append(fraction: float, kind: str) -> int:
        """The next change (unmeasured): appended to ivm's logs, or committed to the Delta tables as a
        user's pipeline does (`--sources delta`); its rows."""
        if where is not None:
            return commit(project.spark, changes, fraction, where, changes_dir)
        files = changes.make(fraction, kind, changes_dir) if view == "reach" else changes.make(fraction, changes_dir)
        return sum(project.append(table, str(path)).rows for table, path in files.items()
                   if table in project.config.tables)

    # a warm session: the initial materialization ran the full path; WARMUP unmeasured incremental refreshes
    # of each kind of change at the smallest Δ run the incremental one (its first plans pay
    # for class loading and code generation, ~4 s of the closure's first DRed refresh, and the JVM compiles
    # the hot paths over the next few: a trim of 6,000 lineitem changes took 4.4, 1.3, 1.0, 0.9 ... 0.55 s)
    warmup = {}
    for kind in dict.fromkeys(k for _, k in plan):
        warmup[kind] = warm_up(lambda kind=kind: append(min(args.deltas), kind),
                               lambda: project.refresh([name], mode="incremental"))
        print(f"{view} {kind}: warm-up refreshes {', '.join(f'{t:.2f}' for t in warmup[kind])} s", flush=True)
    # and FULL_WARMUP unmeasured full refreshes, so that both measured paths run warm (the initial
    # materialization ran long before; in one run without them Q3's T_full at SF 10, Δ 1%, was 46.4 s,
    # against 25-29 s for every full refresh of the next run, warm-ups included)
    full_warmup = warm_up(lambda: append(min(args.deltas), plan[0][1]),
                          lambda: project.refresh([name], mode="full"), FULL_WARMUP)
    print(f"{view}: full warm-up refreshes {', '.join(f'{t:.2f}' for t in full_warmup)} s", flush=True)
    plain = PlainSpark(project, view, root / f"plain-{view.replace('@', '-')}", where) if view_sql(view) else None
    if plain is not None:  # (as many unmeasured runs as the full refreshes had)
        plain.copy_tables()
        plain_warmup = warm_up(lambda: None, plain.run, FULL_WARMUP)
        print(f"{view}: plain Spark warm-up {', '.join(f'{t:.2f}' for t in plain_warmup)} s", flush=True)
    floors = {}  # T_floor, unchecked and --checked (the trim's lookups of a hand-appended log first)
    if view in FLOOR_VIEWS:
        floors = {"floor": FloorRefresh(project.spark, view, data, root, floor_changes),
                  "floor_checked": FloorRefresh(project.spark, view, data, root, checked_changes, checked=True)}
    for way, floor in floors.items():  # (as many unmeasured rounds as ivm's incremental refreshes had)
        floor_warmup = warm_up(lambda: None, lambda floor=floor: floor.change(min(args.deltas))())
        print(f"{view}: {way} warm-up {', '.join(f'{t:.2f}' for t in floor_warmup)} s", flush=True)
    for fraction, kind in plan:
        # each Δ's measurements start from compacted relations (one base layer each; unmeasured): the
        # figures run at the few layers a compacted project holds, not at however many the earlier
        # figures left (past 32 a read lists its layers in a Spark job of its own)
        project.compact(force=True)
        if plain is not None:
            plain.copy_tables()
        rounds: dict[str, list[Figure]] = {}
        for _ in range(args.repeat):  # the modes interleaved: a slow minute of the machine hits each alike
            n = append(fraction, kind)
            result, *numbers = counters.measure(lambda: project.refresh([name], mode="incremental"))
            detail = ", ".join(f"{k} {v}" for w in result.views for k, v in w.detail.items())
            rounds.setdefault("incremental", []).append(
                Figure(view, fraction, kind, "incremental", n, *numbers, detail=detail, warmup=warmup[kind]))
            # T_full: a refresh in full mode of a second change of the same size; like any refresh it applies
            # the change to the tables (the trim) before recomputing the view and publishing
            n_full = append(fraction, kind)
            _, *numbers = counters.measure(lambda: project.refresh([name], mode="full"))
            rounds.setdefault("full", []).append(Figure(view, fraction, kind, "full", n_full, *numbers,
                                                        warmup=full_warmup if (fraction, kind) == plan[0] else None))
            if plain is not None:  # T_plain: the user's CREATE OR REPLACE TABLE ... AS SELECT
                _, *numbers = counters.measure(plain.run)
                rounds.setdefault("plain", []).append(Figure(view, fraction, kind, "plain", 0, *numbers))
            for way, floor in floors.items():  # T_floor: the hand-written refresh of a change of the same size
                _, *numbers = counters.measure(floor.change(fraction))
                rounds.setdefault(way, []).append(Figure(view, fraction, kind, way, 0, *numbers))
            if args.auto:  # a third change of the same size under --mode auto: the crossover's choice
                n = append(fraction, kind)
                result, *numbers = counters.measure(lambda: project.refresh([name]))
                [work] = result.views
                est = work.choice.get("crossover") or {}
                rounds.setdefault("auto", []).append(Figure(
                    view, fraction, kind, "auto", n, *numbers, detail=f"{work.mode} (estimated "
                    f"{est.get('incremental_s')} s incremental, {est.get('full_s')} s full)"))
        medians = {mode: median_of(fs) for mode, fs in rounds.items()}
        chosen = [f.detail.split(" ")[0] for f in rounds.get("auto", [])]
        if len(set(chosen)) > 1:  # (the median's choice is reported; the others too when they differ)
            medians["auto"] = replace(medians["auto"], detail=f"{medians['auto'].detail}; the rounds chose "
                                                              f"{', '.join(chosen)}")
        figures += medians.values()
        print(f"{view} Δ={fraction:g} {kind}: incremental {medians['incremental'].seconds:.2f} s, full "
              f"{medians['full'].seconds:.2f} s" + (f", plain Spark {medians['plain'].seconds:.2f} s"
                                                     if "plain" in medians else "")
              + f" ({n} changed rows; medians of {args.repeat})", flush=True)
        if "auto" in medians:
            print(f"{view} Δ={fraction:g} {kind}: auto chose {', '.join(f.detail for f in rounds['auto'])}: "
                  f"{medians['auto'].seconds:.2f} s", flush=True)
    _, *numbers = counters.measure(lambda: project.refresh([name]))
    figures.append(Figure(view, 0.0, "noop", "incremental", 0, *numbers))
    said = []
    for way, floor in floors.items():  # (else the floor measured the wrong thing: floor.py's own check)
        checked = "equals" if floor.floor.check() else "does NOT equal"
        print(f"{view}: the {way}'s incrementally kept view {checked} a recompute", flush=True)
        said.append(f"the {way}'s view {checked} a recompute")
    if said:
        figures[-1] = replace(figures[-1], detail="; ".join(said))
    project.close()
    return figures


#: unmeasured refreshes per kind of change before the figures: JMH's default count of warm-up iterations
#: (a steadiness test, two in a row within 10%, stopped at a plateau after 3 while later ones were still
#: 25% faster)
WARMUP = 5
#: unmeasured full refreshes per view before the figures (each a recompute of the view from all its
#: tables: the JVM compiles its hot paths in the first, and the tables' files are read once)
FULL_WARMUP = 2


def warm_up(prepare, refresh, count: int = WARMUP) -> list[float]:
    """``count`` unmeasured refreshes, each after ``prepare()`` (a change appended): their times."""
    times: list[float] = []
    for _ in range(count):
        prepare()
        started = time.perf_counter()
        refresh()
        times.append(time.perf_counter() - started)
    return times


def machine() -> list[str]:
    import pyspark

    mem = ""
    try:
        kb = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.1f} GiB RAM"
    except (OSError, StopIteration):
        pass
    return [f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", f"{platform.node()}: {os.cpu_count()} cores{mem}, "
            f"{platform.system()} {platform.release()}", f"Python {platform.python_version()}, "
            f"PySpark {pyspark.__version__}, local[2] ({DRIVER_MEMORY} driver memory), 4 shuffle partitions"]


def report(figures: list[Figure], args, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# ivm benchmark: incremental refresh vs full recompute vs plain Spark", "",
             *[f"- {m}" for m in machine()],
             f"- TPC-H SF {args.sf:g} (tpchgen-cli); closure over {args.edges} edges (chains of 10 nodes)",
             *(["- `--sources delta`: the TPC-H tables are Delta tables with the change data feed on, read by ivm in "
                "place (`source: {delta: ...}`, the feed trusted: no lookup of the changes); each change is "
                "committed as a user's pipeline does (per table a `MERGE ... WHEN MATCHED THEN DELETE` of the old "
                "orders' rows and an `INSERT` of the new ones, unmeasured); T_plain reads the same Delta tables"]
               if args.sources == "delta" else
               ["- `--sources ivm`: the tables loaded into ivm, each change appended to its logs as change files "
                "(`ivm log append`, unmeasured; the trim looks each change up in the stored rows)"]),
             "- one warm Spark session: the initial materialization ran before the figures, then "
             f"{WARMUP} unmeasured incremental refreshes of each kind of change at the smallest Δ (JMH's default "
             f"count of warm-up iterations) and {FULL_WARMUP} unmeasured full refreshes (their times are listed "
             "below the table); validation off; no compaction inside a refresh "
             "(`storage.compact_max_layers: 100`), every relation compacted (unmeasured) before each Δ's "
             "measurements; each T is a whole `ivm refresh` (plan, trim, maintain or "
             "recompute, publish): T_inc with `--mode incremental`, T_full with `--mode full` on a second change "
             "of the same size (both apply the change to the tables first)",
             f"- each T is the median of {args.repeat} measurements (the range in parentheses), the modes "
             f"interleaved (incremental, full, {'auto, ' if args.auto else ''}incremental, ...), each on a change "
             "of its own; jobs, rows "
             "and bytes are the median measurement's; T_inc/T_full is the medians' ratio", "",
             "- T_plain: the view's SQL as `CREATE OR REPLACE TABLE delta.`...` USING delta AS SELECT` in a new "
             "session of the same Spark, over " + ("the Delta tables ivm reads, at their current version, " if
                                                   args.sources == "delta" else "Delta copies of the tables at the "
                                                   "Δ's start (written unmeasured), ") +
             f"after {FULL_WARMUP} unmeasured runs; measured in the same rounds, after T_full (— for a Datalog view)",
             "- T_floor (Q3, Q5): floor.py's hand-written, unchecked incremental refresh of the same view over its "
             "own copies of the tables, changed by the same RF1/RF2 sequence, adaptive execution off; after "
             f"{WARMUP} unmeasured rounds, measured in the same rounds, after T_plain; T_floor✓ the same with "
             "`--checked` (the lookups ivm's trim makes of a hand-appended log first), after T_floor",
             "",
             "| view | Δ | kind | changed rows | T_inc s | T_full s | T_plain s | T_inc/T_plain | T_full/T_plain | "
             "T_floor s | T_inc/T_floor | T_floor✓ s | T_inc/T_floor✓ | T_inc/T_full | jobs inc/full | "
             "rows read inc/full | bytes written inc/full |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by: dict[tuple, dict[str, Figure]] = {}
    for f in figures:
        by.setdefault((f.view, f.delta, f.change), {})[f.mode] = f
    for (view, delta, kind), pair in by.items():
        inc, full, plain, floor = pair["incremental"], pair.get("full"), pair.get("plain"), pair.get("floor")
        floor_checked = pair.get("floor_checked")
        if full is None:
            lines.append(f"| {view} | — | no-op refresh | 0 | {inc.seconds:.2f} | | | | | | | | | | {inc.jobs} | "
                         f"{inc.rows_read} | {inc.bytes_written} |")
            continue
        vs_plain = (f"{timed(plain)} | {inc.seconds:.2f}/{plain.seconds:.2f} = {inc.seconds / plain.seconds:.3f} | "
                    f"{full.seconds / plain.seconds:.3f}") if plain else "— | — | —"
        vs_floor = f"{timed(floor)} | {inc.seconds / floor.seconds:.3f}" if floor else "— | —"
        vs_floor += (f" | {timed(floor_checked)} | {inc.seconds / floor_checked.seconds:.3f}" if floor_checked
                     else " | — | —")
        lines.append(f"| {view} | {delta:.2%} | {kind} | {inc.changes} | {timed(inc)} | {timed(full)} | {vs_plain} | "
                     f"{vs_floor} | {inc.seconds / full.seconds:.3f} | {inc.jobs}/{full.jobs} | "
                     f"{inc.rows_read}/{full.rows_read} | {inc.bytes_written}/{full.bytes_written} |")
    checks = [f"{f.view}: {f.detail}" for f in figures if f.change == "noop" and f.detail]
    if checks:
        lines += ["", "At the end, floor.py's check: " + "; ".join(checks) + "."]
    for mode, what in (("incremental", "incremental refreshes at the smallest Δ"), ("full", "full refreshes")):
        warmups = {(f.view, f.change): f.warmup for f in figures if f.warmup and f.mode == mode}
        if warmups:
            lines += ["", f"Warm-up (unmeasured {what}, in order): " + "; ".join(
                f"{view} {kind}: {', '.join(f'{t:.2f}' for t in times)} s" for (view, kind), times in warmups.items())]
    autos = [(key, pair) for key, pair in by.items() if "auto" in pair and "full" in pair]
    if autos:
        lines += ["", "## `--mode auto` (the crossover from measured costs)", "",
                  "In each round a third change of the same size after the incremental and full ones, refreshed "
                  "with `--mode auto`: what the median one chose (with its estimates, from this session's earlier "
                  "runs of the view; every round's choice when they differ) and the median time against the better "
                  "of T_inc and T_full.", "",
                  "| view | Δ | kind | T_auto s | chose | T_auto / min(T_inc, T_full) |", "|---|---|---|---|---|---|"]
        for (view, delta, kind), pair in autos:
            best = min(pair["incremental"].seconds, pair["full"].seconds)
            lines.append(f"| {view} | {delta:.2%} | {kind} | {timed(pair['auto'])} | {pair['auto'].detail} | "
                         f"{pair['auto'].seconds / best:.2f} |")
    projections = [(key, pair) for key, pair in by.items() if "@" in key[0] and "full" in pair]
    if projections:
        lines += ["", "## Set-semantics projections: counting vs REDUCE (004)", "",
                  "Intermediate rows: records the refresh's plans wrote to shuffles (both strategies); REDUCE also "
                  "reports its join steps and the relations it wrote before its view change (one plan per "
                  "changed table: its relations are not counted).", "",
                  "| view | strategy | Δ | T_inc s | T_full s | T_inc/T_full | jobs | shuffled rows | rows read | "
                  "REDUCE relations |", "|---|---|---|---|---|---|---|---|---|---|"]
        for (view, delta, _), pair in sorted(projections, key=lambda x: (x[0][0].split("@")[0], x[0][1], x[0][0])):
            inc, full = pair["incremental"], pair["full"]
            name, strategy = view.split("@")
            lines.append(f"| {name} | {strategy} | {delta:.2%} | {timed(inc)} | {timed(full)} | "
                         f"{inc.seconds / full.seconds:.3f} | {inc.jobs} | {inc.shuffled} | {inc.rows_read} | "
                         f"{inc.detail or '—'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    chart(by, out / "results.png")
    print("\n".join(lines))


def chart(by: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for (view, delta, kind), pair in by.items():
        if "full" not in pair:
            continue
        name = view if kind == "RF1+RF2" else f"{view} ({kind})"
        for side, f in pair.items():
            series.setdefault(name, {}).setdefault(side, []).append((delta, f.seconds))
    fig, axes = plt.subplots(1, len(series), figsize=(4 * len(series), 3.2), squeeze=False)
    for ax, (name, sides) in zip(axes[0], series.items(), strict=True):
        for side, label, style in [("incremental", "T_inc", "o-"), ("full", "T_full", "s--"),
                                   ("plain", "T_plain", "^:"), ("floor", "T_floor", "v-.")]:
            pts = sorted(sides.get(side, []))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("Δ (fraction)")
        ax.set_ylabel("seconds")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    global DRIVER_MEMORY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", type=float, default=0.1, help="TPC-H scale factor (0.1 quick, 1 and 10 for figures)")
    ap.add_argument("--deltas", default="0.0001,0.001,0.01,0.1",
                    type=lambda s: [float(x) for x in s.split(",")], help="fractions of the orders / edges")
    ap.add_argument("--edges", type=int, default=100_000, help="edges of the closure's graph")
    ap.add_argument("--sources", choices=("ivm", "delta"), default="ivm",
                    help="ivm: the tables loaded into ivm and changed by `ivm log append` (change files); delta: "
                         "Delta tables with the change data feed on, changed by MERGE/INSERT commits, read in place")
    ap.add_argument("--driver-memory", default=DRIVER_MEMORY, help="spark.driver.memory of the local session")
    ap.add_argument("--repeat", type=int, default=3,
                    help="measurements of each figure (each mode's, interleaved); the median is reported, "
                         "with the range")
    ap.add_argument("--no-auto", dest="auto", action="store_false",
                    help="skip the --mode auto refresh after each Δ's incremental and full ones")
    ap.add_argument("--views", type=lambda s: s.split(","),
                    default="q1,q3,q5,reach,cust_dates,supp_median,nations@counting,nations@reduce,"
                            "order_nations@counting,order_nations@reduce")
    ap.add_argument("--work", default=str(REPO / ".bench"), help="data, projects and warehouses (reused data)")
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results"))
    args = ap.parse_args(argv)
    DRIVER_MEMORY = args.driver_memory  # (project_for and machine read it)
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    figures = []
    for view in args.views:
        # a fresh project per run; the generated data is kept
        for old in root.glob(f"project-{view.replace('@', '-')}"):
            shutil.rmtree(old)
        figures += run_view(view, args, root, SparkCounters)
    report(figures, args, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
