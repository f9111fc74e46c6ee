"""Many views, a small change (the plain Spark issue, item 3; the performance issue's item 3 at SF 1): the
22 TPC-H queries as one project's views over TPC-H (SF 0.01 by default), the change a round of
tests/spark/test_tpch.py's (RF1, RF2 and key-preserving updates of customers, parts, suppliers and
partsupp: ~250 changed rows in 6 tables at SF 0.01; ``--delta`` changes that fraction of the orders
instead of 24, half deleted, half copied as new ones, with their line items, and moves that fraction of
the suppliers between nations, where test_tpch.py moves 1.3% of them; ``--all-moved-suppliers``: as it
does). Not a test: figures are measured and reported, never asserted.

    .venv/bin/python tests/bench/many.py [--sf 0.01] [--delta F [--all-moved-suppliers]] [--rounds 3] [--validate]
                                         [--connect] [--no-warm-copy] [--out tests/bench/results/many]

Measures, in one warm Spark session: the first full materialization of all views (T_first, after an
unmeasured one of a copy of the project, so both pay the same warm JVM; ``--no-warm-copy``: none), then
``--rounds`` incremental refreshes (the default mode, `auto`: the cost model may recompute a view; one
warm-up round before them, unmeasured), each of one round of changes. The issue's goal: T_refresh /
T_first ≤ 0.3. Reports per round the Spark jobs and each view's mode and seconds (the run record's), per
view the median of its seconds and its Spark jobs in the median round, so the fixed cost of one more view
is visible, and the bound that cost sets: the round's time were every view as cheap as the cheapest
incremental one.

``--connect``: then the project's Spark Connect server is started (`ivm server start`), warmed by one
round, and as many rounds are refreshed by `ivm refresh` in a new process against it (what a user's
scheduled command costs on a warm server), against the warm in-process rounds (the issue's goal: ≤ 1.3×).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "include"), str(REPO), str(REPO / "tests" / "bench")]

from run import lower_middle, machine  # noqa: E402

from ivm.modes import Mode  # noqa: E402
from ivm.spark import JobMetrics  # noqa: E402
from tests.tpch import QUERIES, TABLES, Tables, round_of_changes  # noqa: E402

VALIDATION = {True: "on (each view's default sample)", False: "off"}


def project(root: Path, data: Path, t: Tables, validate: bool):
    """The 22 views' project in ``root``, its tables loaded from DuckDB's current state."""
    from ivm import Project

    root.mkdir(parents=True, exist_ok=True)
    views = {q: {"sql": sql, **({} if validate else {"validate": {"sample": 0}})} for q, sql in QUERIES.items()}
    (root / "ivm.yaml").write_text(yaml.safe_dump({
        # (4g: Spark's default 1 GiB ran out of heap in run.py's SF 1 recomputes; the views not registered by
        # name: this process's Spark and a --connect server would both open the embedded metastore, which one
        # JVM holds at a time, and refreshes never read it)
        "warehouse": "./warehouse", "storage": {"register_views": False},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "4g"}},
        "tables": TABLES, "views": views}, sort_keys=False))
    p = Project.open(str(root / "ivm.yaml"))
    p.apply()
    for name in TABLES:
        p.load(name, t.snapshot(name))
    return p


class Round(NamedTuple):
    """One measured incremental refresh."""

    seconds: float
    jobs: int
    changed: int  # rows appended to the tables' logs before it
    result: object  # its RefreshResult
    view_jobs: dict[str, int]  # Spark jobs per view (`ViewJobs`)


class ViewJobs:
    """The Spark jobs each view's maintenance launched in a measured round: the round's job group counted
    as each view's ``maintain:`` line arrives (the listener may deliver a job's start a moment late, so a
    view's count can be off by one, to its neighbour's)."""

    def __init__(self, sc):
        self.sc, self.seen, self.per_view = sc, None, {}

    def count(self) -> int:
        group = self.sc.getLocalProperty("spark.jobGroup.id")
        return len(self.sc.statusTracker().getJobIdsForGroup(group)) if group else 0

    def progress(self, line: str) -> None:
        if line.startswith("trim:") or self.seen is None:
            self.seen = self.count()
        if line.startswith("maintain: "):
            now = self.count()
            self.per_view[line.split()[1].rstrip(":")] = now - self.seen
            self.seen = now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", type=float, default=0.01, help="TPC-H scale factor (tpchgen-cli)")
    ap.add_argument("--delta", type=float, default=None,
                    help="fraction of the orders changed per round, half deleted, half copied as new orders "
                         "(default: test_tpch.py's round, 12 of each)")
    ap.add_argument("--all-moved-suppliers", action="store_true",
                    help="with --delta, move a third of nation 2's suppliers as test_tpch.py does (1.3%% of them) "
                         "instead of the same fraction of the suppliers")
    ap.add_argument("--connect", action="store_true",
                    help="then the same rounds through `ivm refresh` against the project's warm Spark Connect server")
    ap.add_argument("--rounds", type=int, default=3, help="measured incremental refreshes (their median reported)")
    ap.add_argument("--validate", action="store_true",
                    help="keep each view's default sampled recomputation on (off by default, as in run.py)")
    ap.add_argument("--no-warm-copy", action="store_true",
                    help="measure T_first without materializing a copy of the project first (at SF 1 the copy "
                         "costs as much as T_first, the JVM's warm-up a few seconds of it)")
    ap.add_argument("--work", default=str(REPO / ".bench" / "many"), help="data, project and warehouse")
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "many"))
    args = ap.parse_args(argv)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    data.mkdir(parents=True)
    subprocess.run([str(Path(sys.executable).parent / "tpchgen-cli"), "parquet", "-s", f"{args.sf:g}",
                    f"--output-dir={data}"], check=True, capture_output=True)
    t = Tables(data, work / "changes")
    (work / "changes").mkdir()

    warm = None if args.no_warm_copy else project(work / "warm", data, t, args.validate)
    if warm is not None:
        warm.refresh()  # unmeasured: the JVM's first plans and code generation
    p = project(work / "project", data, t, args.validate)
    metrics = JobMetrics(p.spark)
    print("first full materialization of", len(QUERIES), "views", flush=True)
    with metrics.measure("first") as first:
        p.refresh(progress=lambda line: print(f"    {line}", flush=True))
    print(f"  {first.seconds:.1f} s, {first.jobs} jobs", flush=True)

    rng = random.Random(49)
    per_side = 12 if args.delta is None else max(12, round(args.delta * t.query("SELECT count(*) FROM orders")[0][0]
                                                           / 2))
    # (test_tpch.py moves a third of nation 2's suppliers, 1.3% of them at any SF: at SF 1 ~130 suppliers, whose
    # ~80,000 line items change nation in Q5, Q7, Q8 and Q9 — 13× the orders' change; ``--delta`` holds the move
    # to the same fraction of the suppliers)
    moved = None if args.delta is None or args.all_moved_suppliers else \
        max(1, round(args.delta * t.query("SELECT count(*) FROM supplier")[0][0]))

    def append() -> int:
        """One round of changes appended to the tables' logs (unmeasured): the rows."""
        return sum(p.append(name, path).rows for name, paths in round_of_changes(t, rng, per_side, moved).items()
                   for path in paths)

    rounds = []
    for i in range(args.rounds + 1):
        changed = append()
        jobs = ViewJobs(p.spark.sparkContext)
        with metrics.measure(f"round {i}") as m:
            result = p.refresh(progress=jobs.progress)
        print(f"  round {i}{' (warm-up)' if i == 0 else ''}: {changed} changed rows, {m.seconds:.1f} s, {m.jobs} jobs",
              flush=True)
        if i:
            rounds.append(Round(m.seconds, m.jobs, changed, result, jobs.per_view))
    served = on_server(p, work / "project" / "ivm.yaml", append, args.rounds) if args.connect else []
    p.close()
    if warm is not None:
        warm.close()
    report(rounds, first, args, Path(args.out), served)
    return 0


def on_server(p, path: Path, append, count: int) -> list[tuple[float, int, str]]:
    """``count`` rounds through `ivm refresh` in a new process against the project's Spark Connect server
    (started here, warmed by one round): each round's seconds, changed rows and the views' modes."""
    from ivm import server

    user = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}  # (the project's own server)
    server.stop(p.config)
    state = server.start(p.config)
    print(f"Spark Connect server at {state.address}", flush=True)
    served = []
    try:
        for i in range(count + 1):
            changed = append()
            started = time.perf_counter()
            done = subprocess.run([str(Path(sys.executable).parent / "ivm"), "refresh", "--project", str(path)],
                                  env=user, capture_output=True, text=True)
            seconds = time.perf_counter() - started
            if done.returncode:
                raise SystemExit(done.stderr)
            run = p.runs(1)[0]
            modes = Counter(str(s.mode) for s in run.stages if s.stage == "maintain")
            print(f"  ivm refresh on the server, round {i}{' (warm-up)' if i == 0 else ''}: {changed} changed rows, "
                  f"{seconds:.1f} s", flush=True)
            if i:
                served.append((seconds, changed, ", ".join(f"{n} {m}" for m, n in sorted(modes.items()))))
    finally:
        server.stop(p.config)
    return served


def served_rows(served: list[tuple[float, int, str]], in_process: float) -> list[str]:
    """The rounds through `ivm refresh` against the warm server (``--connect``), against the in-process
    median ``in_process``."""
    if not served:
        return []
    seconds, changed, modes = lower_middle(served, key=lambda r: r[0])
    return [f"| `ivm refresh` against a warm Spark Connect server, median of {len(served)} ({changed} changed rows; "
            f"views {modes}; every round: {', '.join(f'{r[0]:.1f}' for r in served)} s) | {seconds:.1f} | |",
            f"| **on the server / in-process** (goal ≤ 1.3) | **{seconds / in_process:.2f}** | |"]


def report(rounds, first, args, out: Path, served: list[tuple[float, int, str]]) -> None:
    seconds, jobs, changed, result, view_jobs = lower_middle(rounds, key=lambda r: r.seconds)
    per_view = {v.view: [] for v in rounds[0].result.views}
    for r in rounds:
        for v in r.result.views:
            per_view[v.view].append(v)
    lines = [f"# Many views, a small change: 22 TPC-H views over SF {args.sf:g}", "", *[f"- {m}" for m in machine()],
             "- each round's change: " + ("a round of tests/spark/test_tpch.py's changes" if args.delta is None else
                                          f"{args.delta:.2%} of the orders (half deleted, half copied as new orders, "
                                          "with their line items) and test_tpch.py's updates" + (
                                              ", a third of nation 2's suppliers moved to nation 3 (1.3% of them)"
                                              if args.all_moved_suppliers else
                                              f", of them {args.delta:.2%} of the suppliers moved between nations")),
             *([] if not args.no_warm_copy else ["- T_first measured in the session's first refresh "
                                                 "(`--no-warm-copy`: no unmeasured copy materialized before it)"]),
             f"- validation {VALIDATION[args.validate]}; "
             "the default refresh mode (`auto`); views published as Delta tables (the default); one unmeasured "
             "warm-up round",
             "", "| measure | seconds | Spark jobs |", "|---|---|---|",
             f"| first full materialization (T_first) | {first.seconds:.1f} | {first.jobs} |",
             f"| incremental refresh, median of {len(rounds)} (T_refresh; {changed} changed rows) | {seconds:.1f} | "
             f"{jobs} |",
             f"| **T_refresh / T_first** (goal ≤ 0.3) | **{seconds / first.seconds:.2f}** | |",
             *served_rows(served, seconds),
             "", "Every round: " + ", ".join(f"{r.seconds:.1f} s ({r.jobs} jobs, {r.changed} rows)"
                                             for r in rounds) + ".", "",
             "Tables: " + ", ".join(f"{d.table} {d.log_rows} → {d.delta_rows} rows, {d.seconds:.2f} s"
                                    for d in result.tables) + " (the median round's trim).", "",
             "| view | modes | seconds (median) | rows changed (median round) | Spark jobs (median round) |",
             "|---|---|---|---|---|"]
    for view, works in per_view.items():
        median = lower_middle(works, key=lambda v: v.seconds)
        modes = ", ".join(sorted({str(v.mode) for v in works}))
        this = next(v for v in result.views if v.view == view)
        changed = "—" if this.rows_changed is None else this.rows_changed  # (a recompute does not count them)
        lines.append(f"| {view} | {modes} | {median.seconds:.2f} | {changed} | {view_jobs.get(view, '—')} |")
    total = sum(lower_middle([v.seconds for v in works]) for works in per_view.values())
    lines.append(f"| sum of the views | | {total:.1f} | | |")
    incremental = [(lower_middle([v.seconds for v in works]), view) for view, works in per_view.items()
                   if all(v.mode is Mode.INCREMENTAL for v in works)]
    if incremental:
        cheapest, view = min(incremental)
        trims = max(d.seconds for d in result.tables)
        bound = trims + cheapest * len(per_view)
        lines += ["", f"Were every view as cheap to refresh as the cheapest one refreshed incrementally in every round "
                  f"({view}: {cheapest:.2f} s, {view_jobs.get(view, '—')} Spark jobs), a round would still take the "
                  f"trims ({trims:.2f} s, side by side) plus {len(per_view)} × {cheapest:.2f} s = {bound:.1f} s: "
                  f"**{bound / first.seconds:.2f}** of T_first."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
