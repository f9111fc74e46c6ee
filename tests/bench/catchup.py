"""The catch-up of a view that fell behind, against one incremental refresh of the same total change (#71
item 2; 002 §3(b): a view's own pointers into the logs, "time proportional to the relevant log"). Not a
test: figures are measured and reported, never asserted.

    .venv/bin/python tests/bench/catchup.py [--sf 0.1] [--delta 0.001] [--missed 3] [--repeat 3]
                                            [--out tests/bench/results/catchup]

One project holds TPC-H's q3 (customer ⋈ orders ⋈ lineitem, grouped) and q1 (lineitem alone, grouped),
loaded and materialized once (as run.py's projects are). Per repetition and way, ``--missed`` RF1/RF2
changes of ``--delta`` of the orders each are appended to the logs, then:

    behind        each change refreshed for q1 alone (`refresh(["q1"])`: its run trims lineitem, passing
                  q3 by), then q3 refreshed: it catches up from its own pointer — lineitem's layers
                  published since (the views' runs applied them) and orders' log, trimmed by this run
    compacted     the same, with lineitem compacted (`ivm compact`, unmeasured) before q3's refresh: its
                  layers at q3's pointer are no longer a prefix of its layers, so the catch-up reads
                  lineitem's log since the pointer, trimmed (`Maintenance._log_since`)
    difference    the same again, the log route turned off: the catch-up reads lineitem's new state less
                  its state at the pointer, the two whole tables (what ivm did before)
    at once       the ``--missed`` changes appended and q3 refreshed once, never behind: T_inc of the same
                  total change, the goal's yardstick (the catch-up ≤ 1.5× it)

Each T is the wall time of q3's `refresh --mode incremental` (plan, trim, maintain, publish; validation
off), the median of ``--repeat`` after one unrecorded warm-up round, with the rows the Spark jobs read.
Every relation is compacted (unmeasured) before each repetition, so each way starts from one base layer
per relation. Results go to ``<out>/results.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

import run  # noqa: E402
from workloads import TPCH_TABLES, TPCH_VIEWS, RefreshSets, tables_read, tpch  # noqa: E402

from ivm.modes import Mode  # noqa: E402
from ivm.spark import JobMetrics  # noqa: E402

VIEWS = ("q3", "q1")
WAYS = ("behind", "compacted", "difference", "at once")


def project(root: Path, data: Path):
    from ivm import Project

    names = sorted({t for v in VIEWS for t in tables_read(v)})
    tables = {n: {**TPCH_TABLES[n], "references": {c: t for c, t in TPCH_TABLES[n].get("references", {}).items()
                                                    if t.split(".")[0] in names}} for n in names}
    folder = root / "project-catchup"
    shutil.rmtree(folder, ignore_errors=True)  # (fresh: the refresh sets start from the generated data)
    folder.mkdir(parents=True)
    (folder / "ivm.yaml").write_text(yaml.safe_dump({
        "warehouse": "./warehouse",
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4",
                                                 "spark.driver.memory": run.DRIVER_MEMORY}},
        "storage": {"compact_max_layers": 100},  # (no compaction inside a measured refresh)
        "tables": tables, "views": {v: {"sql": TPCH_VIEWS[v], "validate": {"sample": 0}} for v in VIEWS}},
        sort_keys=False))
    p = Project.open(str(folder / "ivm.yaml"))
    p.apply()
    for t in tables:
        p.load(t, str(data / f"{t}.parquet"))
    p.refresh()
    return p


def append(p, changes: RefreshSets, fraction: float, folder: Path) -> int:
    files = changes.make(fraction, folder)
    for table, path in files.items():
        p.append(table, str(path))
    return sum(pq.read_metadata(str(f)).num_rows for f in files.values())


def one_way(p, way: str, changes: RefreshSets, args, folder: Path) -> tuple[float, int, int, str]:
    """q3's refresh after ``args.missed`` changes, the way ``way`` says; (seconds, rows changed, rows the
    Spark jobs read, q3's reason)."""
    from ivm.refresh.maintenance import Maintenance

    p.compact(force=True)  # (each way from one base layer per relation)
    rows = 0
    for _ in range(args.missed):
        rows += append(p, changes, args.delta, folder)
        if way != "at once":
            p.refresh(["q1"], mode=Mode.INCREMENTAL)
    if way in ("compacted", "difference"):
        p.compact(["lineitem"], force=True)
    real = Maintenance._pointer
    if way == "difference":
        Maintenance._pointer = lambda self, name, run: None
    try:
        with JobMetrics(p.spark).measure(way) as m:
            result = p.refresh(["q3"], mode=Mode.INCREMENTAL)
    finally:
        Maintenance._pointer = real
    [work] = [w for w in result.views if w.view == "q3"]
    return m.seconds, rows, m.rows_read, f"{work.mode}: {work.reason}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=0.001, help="fraction of the orders changed per missed refresh")
    ap.add_argument("--missed", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--driver-memory", default=run.DRIVER_MEMORY, help="spark.driver.memory of the local session "
                    "(the runs at SF 10 here used 14g; since ee2acc2 SF 10's `ivm load` of lineitem fits in 4g)")
    ap.add_argument("--work", default=str(REPO / ".bench"))
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "catchup"))
    args = ap.parse_args(argv)
    run.DRIVER_MEMORY = args.driver_memory  # (project and run.machine read it)
    root = Path(args.work) / f"catchup-sf{args.sf}"
    data = tpch(args.sf, Path(args.work))
    p = project(root, data)
    changes = RefreshSets(data)
    got: dict[str, list[tuple]] = {w: [] for w in WAYS}
    one_way(p, "at once", changes, args, root / "changes")  # (a warm-up, unrecorded: the first refresh's plans)
    for n in range(args.repeat):
        for way in WAYS:
            got[way].append(one_way(p, way, changes, args, root / "changes"))
            print(f"{way} #{n + 1}: {got[way][-1][0]:.2f} s; {got[way][-1][3][:160]}", flush=True)
    median = {w: statistics.median(x[0] for x in got[w]) for w in WAYS}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# ivm: the catch-up of a view that fell behind, against one refresh of the same change", "",
             *[f"- {m}" for m in run.machine()],
             f"- TPC-H SF {args.sf}; q3 misses {args.missed} refreshes of Δ {args.delta:.2%} of the orders each "
             f"(RF1+RF2, ~{statistics.median(x[1] for x in got['at once'])} changed rows in all); medians of "
             f"{args.repeat}", "",
             "| way | q3's refresh s (range) | ÷ at once (goal ≤ 1.5) | rows read by Spark | how q3 was refreshed |",
             "|---|---|---|---|---|"]
    for w in WAYS:
        times = [x[0] for x in got[w]]
        lines.append(f"| {w} | {median[w]:.2f} ({min(times):.2f}–{max(times):.2f}) | "
                     f"{median[w] / median['at once']:.2f} | {statistics.median(x[2] for x in got[w]):,.0f} | "
                     f"{got[w][-1][3][:200]} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
