"""The trim of a Delta source, trusted against verified (#67 item 4), at one scale factor. Not a test:
figures are measured and reported, never asserted.

    .venv/bin/python tests/bench/trim.py [--sf 1] [--delta 0.001] [--repeat 3] [--view q3]
                                         [--out tests/bench/results]

TPC-H's orders and lineitem (tpchgen-cli, workloads.tpch) are written as Delta tables with the change
data feed on, and customer beside them; two projects read them in place (`source: {delta: ...}`) and
keep the same view (Q3 by default), one trusting Delta's feed (the default), one with `verify_changes:
true` on every table (each change looked up in the table as of the watermark, as hand-appended logs
are). Each round changes the tables as a user's pipeline does — RF1/RF2's new orders with their
lineitems inserted, old ones deleted with theirs, as Spark SQL ``MERGE ... DELETE`` and ``INSERT`` commits (Δ of
the orders) — and refreshes both projects, in alternating order. Reported per round and as medians: the
trim stage's seconds (its record in the run: read the feed, net it per key, the lookups when
verifying, stage the delta) and the whole refresh's, both ways, and their ratio. Results go to
``<out>/trim-sf<SF>.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

from run import DRIVER_MEMORY, machine  # noqa: E402
from workloads import TPCH_TABLES, TPCH_VIEWS, RefreshSets, commit, lake, tables_read, tpch  # noqa: E402

CHANGED = ("orders", "lineitem")


def project(root: Path, name: str, view: str, where: dict[str, str], verify: bool):
    from ivm import Project

    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tables = {t: {"columns": TPCH_TABLES[t]["columns"], "key": TPCH_TABLES[t]["key"],
                  "source": {"delta": where[t]}, **({"verify_changes": True} if verify else {})} for t in where}
    (folder / "ivm.yaml").write_text(yaml.safe_dump({
        "name": name, "warehouse": "./warehouse",
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4",
                                                  "spark.driver.memory": DRIVER_MEMORY}},
        "storage": {"compact_max_layers": 100, "delta_views": False},
        "tables": tables, "views": {view: {"sql": TPCH_VIEWS[view], "validate": {"sample": 0},
                          # (always from the deltas: past its crossover `auto` recomputes instead, and the
                          # feed is then not read at all)
                          "crossover": {"enabled": False}}}}, sort_keys=False))
    p = Project.open(str(folder / "ivm.yaml"))
    p.apply()
    p.refresh()  # (the first materialization)
    return p


def refresh(p) -> dict[str, float]:
    """Seconds of one refresh: each changed table's trim (its record in the run; the trim stage trims the
    tables side by side, so each is timed on its own) and the whole refresh."""
    started = time.perf_counter()
    result = p.refresh()
    seconds = time.perf_counter() - started
    run = p.catalog.get_run(result.run_id)
    return {**{s.relation: s.seconds or 0.0 for s in run.stages if s.stage == "trim" and s.relation in CHANGED},
            "refresh": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=0.001, help="fraction of the orders changed per round")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--view", default="q3")
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results"))
    ap.add_argument("--work", default=str(REPO / ".bench"))
    a = ap.parse_args(argv)
    root = Path(a.work)
    data = tpch(a.sf, root)
    work = root / f"trim-sf{a.sf:g}"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    from ivm.spark import SparkSettings, session

    spark = session(SparkSettings(conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": DRIVER_MEMORY}),
                    "ivm-bench-trim")
    where = lake(spark, data, work, tables_read(a.view))
    trusted = project(work, "trusted", a.view, where, verify=False)
    verified = project(work, "verified", a.view, where, verify=True)
    print(f"set up in {time.perf_counter() - t0:.0f} s (SF {a.sf:g}: lake, two projects materialized)", flush=True)
    changes = RefreshSets(data)
    rounds = []
    for n in range(a.repeat + 1):  # (round 0: a warm-up, not reported)
        rows = commit(spark, changes, a.delta, where, work / "changes")
        order = [("trusted", trusted), ("verified", verified)]
        if n % 2:
            order.reverse()
        measured = {name: refresh(p) for name, p in order}
        print(f"round {n}: {rows} change rows; " + "; ".join(
            f"{k}: " + ", ".join(f"{c} {s:.2f} s" for c, s in v.items()) for k, v in measured.items()), flush=True)
        if n:
            rounds.append((rows, measured))
    columns = [*(f"trim {t}" for t in CHANGED), "refresh"]
    keys = [*CHANGED, "refresh"]
    med = {k: [statistics.median(r[1][k][c] for r in rounds) for c in keys] for k in ("trusted", "verified")}
    lines = ["# The trim of Delta sources, trusted against verified (tests/bench/trim.py)", "",
             *machine(), f"- TPC-H SF {a.sf:g}, view {a.view} over {', '.join(where)} as Delta tables (CDF on); "
             f"Δ {a.delta:g} of the orders per round as MERGE-delete + INSERT commits; {a.repeat} rounds after a "
             "warm-up, medians (seconds)", "",
             "| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns),
             *(f"| {k} | " + " | ".join(f"{x:.2f}" for x in v) + " |" for k, v in med.items()),
             "| verified / trusted | " + " | ".join(f"{v / t:.2f}" for v, t in zip(med["verified"], med["trusted"],
                                                                                  strict=True)) + " |",
             "", "Rounds:", "",
             *(f"- {rows} change rows: " + "; ".join(f"{k} " + ", ".join(f"{c} {s:.2f}" for c, s in v.items())
                                                    for k, v in m.items()) for rows, m in rounds)]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trim-sf{a.sf:g}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for p in (trusted, verified):
        p.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
