"""The floor of a small refresh on this machine: Q3 or Q5 kept by a hand-written Spark job that does the
least any refresh persisting its changes must do, against a hand-written full recompute of the same view,
in one warm session (the benchmark issue's goals "T_inc / T_full ≤ 0.25 for Q3/Q5 at SF 1, Δ 0.1%" and
"≤ 0.1 for Q3 at SF 10, Δ 1%"). Not ivm, and not a test: a measurement of what Spark itself costs
here, to set ivm's figures against.

    .venv/bin/python tests/bench/floor.py [--view q3] [--sf 1] [--delta 0.001] [--warmup 8] [--rounds 5] [--checked]

Each round appends an RF1/RF2 change (``workloads.RefreshSets``: orders deleted and inserted with their
lineitems) and refreshes the view one way; the rounds alternate the two ways, each on a change of its
own, after ``--warmup`` unmeasured rounds of both.

- **floor (incremental)**: the two change files' rows, signed, each written as its table's delta layer
  (two writes side by side) — *no check* that a deleted row is there or an inserted key is new (ivm's
  trim finds the stored rows at the changed keys for that); then Δview = the view's query over
  Δorders and Δlineitem alone (the other tables as they are), which holds *only* because RF1/RF2
  insert and delete each order with all its lineitems (every other term of 000 §4's delta rules is
  then empty; ivm derives the general rules and shortens them by the declared foreign keys, after a
  look at the keys); added to the stored sums of the changed groups (the view's layers at those
  groups) and written as one delta layer of the view — no separate state, no catalog, no commit.
  Adaptive execution off, as ivm runs a small change.
- **full**: the same two change layers written, then the view's query over the tables' new state
  (each base layer without the deleted keys, with the inserted rows: right for this workload only,
  where no inserted row is deleted later) and the view written whole. Adaptive execution on, as ivm
  runs a recompute.

- **``--checked``**: both ways first make the lookups ivm's trim makes of a hand-appended log (002 §3,
  `ivm.changes.trim`): the stored rows at the changed keys (each table's current state filtered by the
  keys' values — Parquet could skip row groups without them, but the layers here hold one row group per
  file, as ivm's do — then semi-joined with the keys), against
  which every deleted row must be there with its values and every inserted key must be new — both
  tables in one Spark job, a bad change refused. The floor then checks
  what ivm checks on its own logs (the issue's T_inc / T_floor(checked)); without it, what a Delta
  source's trusted change data feed needs.

At the end the incrementally kept view is compared with a recompute (it must match, or the floor
measured the wrong thing; exit status 1). Prints each way's median and range and the ratio of the
medians.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

from workloads import TPCH_TABLES, TPCH_VIEWS, RefreshSets, tables_read, tpch  # noqa: E402

C = "__count"
KEYS = {t: spec["key"] for t, spec in TPCH_TABLES.items()}
#: the views' one aggregate, as their SQL spells it, and their GROUP BY columns
REVENUE = "sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue"
GROUPS = {"q3": ["l_orderkey", "o_orderdate", "o_shippriority"], "q5": ["n_name"]}


class Floor:
    """The base layers, the change layers appended since, and the view's layers, as folders."""

    def __init__(self, spark, view: str, data: Path, work: Path, checked: bool = False):
        from pyspark.sql import functions as F

        self.spark, self.F, self.work, self.n, self.checked = spark, F, work, 0, checked
        self.sql, self.group, self.tables = TPCH_VIEWS[view], GROUPS[view], tables_read(view)
        shutil.rmtree(work, ignore_errors=True)
        for t in self.tables:  # sorted by key, as ivm writes base layers
            spark.read.parquet(str(data / f"{t}.parquet")).sortWithinPartitions(*KEYS[t]).write.parquet(str(work / t))
        self.deltas: dict[str, list[str]] = {"orders": [], "lineitem": []}
        self.view = [self._write(self._counted(self.recompute()), "view")]

    def _counted(self, view):
        return view.withColumn(C, self.F.lit(1).cast("long"))

    def _write(self, df, name: str) -> str:
        self.n += 1
        path = str(self.work / f"{name}-{self.n}")
        df.write.parquet(path)
        return path

    def _append_changes(self, files: dict[str, Path]) -> dict:
        """Each table's change file signed (insert +1, delete −1) and written as a delta layer, the two
        writes side by side; the layers as DataFrames."""
        F, written = self.F, {}
        if self.checked:
            self._check(files)

        def write(t: str) -> None:
            log = self.spark.read.parquet(str(files[t]))
            sign = F.when(F.col("_change_type") == "insert", 1).otherwise(-1).cast("long").alias(C)
            written[t] = self._write(log.select(*[c for c in log.columns if c != "_change_type"], sign), f"d{t}")

        threads = [threading.Thread(target=write, args=(t,)) for t in self.deltas]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for t, path in written.items():
            self.deltas[t].append(path)
        return {t: self.spark.read.parquet(path) for t, path in written.items()}

    def _check(self, files: dict[str, Path]) -> None:
        """ivm's trim's lookups (`--checked`): each table's stored rows at its change's keys; a deleted row
        must be among them with its values, an inserted key must not be. The keys' first column is read from
        the change file on the driver (pyarrow, no Spark job) and filters the stored layers by value, the
        deleted orders' and the inserted ones' apart, each a narrow range (a layer of several row groups
        skips those without them; these layers hold one per file); one Spark job for both tables."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        F, bad = self.F, []
        for t in self.deltas:
            log, keys = self.spark.read.parquet(str(files[t])), KEYS[t]
            columns = [c for c in log.columns if c != "_change_type"]
            head = pq.read_table(files[t], columns=[keys[0], "_change_type"])
            for kind in ("delete", "insert"):
                values = pc.unique(head.filter(pc.equal(head["_change_type"], kind))[keys[0]]).to_pylist()
                rows = log.where(F.col("_change_type") == kind).select(*columns)
                # (the values as SQL text, parsed at once: PySpark's isin makes a py4j call per value — for
                # 1,500 order keys, seconds on the driver before any job; ivm's trim writes its IN list so too)
                listed = F.expr(f"{keys[0]} IN ({', '.join(map(str, values))})") if values else F.lit(False)
                stored = self._current(t).where(listed).join(
                    F.broadcast(rows.select(*keys)), keys, "left_semi")
                found = (rows.join(stored, columns, "left_anti") if kind == "delete"   # a delete of a row not there
                         else rows.join(stored.select(*keys), keys, "left_semi"))      # an insert of a stored key
                bad.append(found.select(F.lit(f"{t} {kind}").alias("what"), *[F.col(k).cast("string") for k in keys]))
        found = bad[0]
        for x in bad[1:]:
            found = found.unionByName(x, allowMissingColumns=True)
        if not found.isEmpty():
            raise SystemExit(f"a bad change: {found.first()}")

    def _current(self, t: str):
        """Table ``t`` now: its base layer without the deleted keys, with the inserted rows."""
        F = self.F
        base = self.spark.read.parquet(str(self.work / t))
        if not self.deltas.get(t):
            return base
        changes = self.spark.read.parquet(*self.deltas[t])
        gone = changes.where(F.col(C) < 0).select(*KEYS[t])
        return base.join(F.broadcast(gone), KEYS[t], "left_anti").unionByName(
            changes.where(F.col(C) > 0).drop(C))

    def _tables(self, delta: dict | None = None) -> None:
        """The view's tables as temporary views: at their new state, or orders and lineitem as the
        run's delta layers (``delta``)."""
        for t in self.tables:
            (delta[t] if delta and t in delta else self._current(t)).createOrReplaceTempView(t)

    def recompute(self):
        self._tables()
        # the view with its rows per group, so a delta can tell an emptied group
        return self.spark.sql(self.sql.replace(REVENUE, f"{REVENUE}, count(*) AS __rows"))

    def full(self, files: dict[str, Path]) -> None:
        self._append_changes(files)
        self.view = [self._write(self._counted(self.recompute()), "view")]

    def incremental(self, files: dict[str, Path]) -> None:
        """Δview = the view's query over Δorders and Δlineitem (the other tables as they are), each
        joined row signed by its lineitem's count (an order and its lineitems change together, with one
        sign); then added to the stored sums of the changed groups."""
        F, group = self.F, self.group
        self._tables(self._append_changes(files))
        dq = self.spark.sql(self.sql.replace(REVENUE, "sum(l.__count * l.l_extendedprice * (1 - l.l_discount)) AS dr, "
                                                      "sum(l.__count) AS dn"))
        # the stored sums at the changed groups (the view's layers, summed: −1 rows undo +1 rows)
        stored = self.spark.read.parquet(*self.view)
        old = (stored.join(F.broadcast(dq.select(*group)), group, "left_semi").groupBy(*group)
               .agg(F.sum(F.col(C) * F.col("revenue")).alias("r"), F.sum(F.col(C) * F.col("__rows")).alias("n"))
               .where(F.col("n") != 0))
        both = dq.join(old, group, "full")
        new_n = F.coalesce(F.col("n"), F.lit(0)) + F.col("dn")
        new_r = F.coalesce(F.col("r"), F.lit(0)) + F.col("dr")
        rows = F.array_compact(F.array(
            F.when(F.col("n").isNotNull(), F.struct(F.col("r").alias("revenue"), F.col("n").alias("__rows"),
                                                    F.lit(-1).cast("long").alias(C))),
            F.when(new_n > 0, F.struct(new_r.alias("revenue"), new_n.alias("__rows"), F.lit(1).cast("long").alias(C)))))
        out = (both.where(F.col("dn").isNotNull())
               .select(*group, F.explode(rows).alias("x")).select(*group, "x.revenue", "x.__rows", f"x.{C}"))
        self.view.append(self._write(out, "view"))

    def check(self) -> bool:
        """The incrementally kept view (its layers summed) equals a recompute."""
        F = self.F
        group = self.group
        kept = (self.spark.read.parquet(*self.view).groupBy(*group)
                .agg(F.sum(F.col(C) * F.col("revenue")).alias("revenue"),
                     F.sum(F.col(C) * F.col("__rows")).alias("__rows"))
                .where(F.col("__rows") != 0))
        fresh = self.recompute().select(*group, "revenue", "__rows")
        return kept.exceptAll(fresh).isEmpty() and fresh.exceptAll(kept).isEmpty()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--view", default="q3", choices=sorted(GROUPS))
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=0.001, help="fraction of the orders changed per round")
    ap.add_argument("--warmup", type=int, default=8, help="unmeasured rounds of each way first")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds of each way (alternating)")
    ap.add_argument("--checked", action="store_true",
                    help="make the lookups ivm's trim makes of a hand-appended log first (both ways)")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--work", default=str(REPO / ".bench"))
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "floor"),
                    help="folder of the results: <view>-sf<sf>-d<delta>.md")
    args = ap.parse_args(argv)
    import run  # (the machine's facts, as the benchmark's results give them)

    run.DRIVER_MEMORY = args.driver_memory

    from ivm.config import SparkSettings
    from ivm.spark import ADAPTIVE, session

    spark = session(SparkSettings(master="local[2]", conf={"spark.driver.memory": args.driver_memory}))
    root = Path(args.work)
    data = tpch(args.sf, root)
    floor = Floor(spark, args.view, data, root / f"floor-{args.view}-sf{args.sf:g}", args.checked)
    changes = RefreshSets(data)
    folder = root / "changes-floor"
    times: dict[str, list[float]] = {"incremental": [], "full": []}
    for i in range(args.warmup + args.rounds):
        for way in times:
            files = changes.make(args.delta, folder)
            spark.conf.set(ADAPTIVE, "false" if way == "incremental" else "true")
            started = time.perf_counter()
            getattr(floor, way)(files)
            took = time.perf_counter() - started
            if i >= args.warmup:
                times[way].append(took)
            print(f"round {i}{' (warm-up)' if i < args.warmup else ''}: {way} {took:.2f} s", flush=True)
    spark.conf.set(ADAPTIVE, "true")
    med = {way: run.lower_middle(t) for way, t in times.items()}
    how = " --checked (with the trim's lookups)" if args.checked else ""
    lines = [f"# The floor of a refresh: {args.view} at SF {args.sf:g}, Δ {args.delta:.2%} (tests/bench/floor.py"
             f"{how})", "",
             *[f"- {m}" for m in run.machine()], f"- {args.warmup} warm-up rounds of each way, then {args.rounds} "
             "measured, alternating", ""]
    for way, t in times.items():
        lines.append(f"- {way}: median {run.ranged(t)} s; every round: "
                     + ", ".join(f"{x:.2f}" for x in t))
    lines.append(f"- ratio of the medians: **{med['incremental'] / med['full']:.3f}**")
    ok = floor.check()
    lines.append(f"- the incrementally kept view equals a recompute: {'yes' if ok else 'NO'}")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.view}-sf{args.sf:g}-d{args.delta:g}{'-checked' if args.checked else ''}.md").write_text(
        "\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
