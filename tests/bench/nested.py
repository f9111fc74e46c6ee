"""002 §5.1's experiment on Spark: one element changed in each of many nested sets, as the sets grow.

    .venv/bin/python tests/bench/nested.py [--parents 200] [--families 100,1000,10000] [--changed 20]
                                           [--out tests/bench/results/nested]

002 §5.1 keeps 200,000 nested tuples in sets of about 100 ("Small Family", 2,000 parents) or about
1,000 ("Large Family", 200 parents) and maintains

    Nest(A, C) := base1(A, N), N(B, C), pred(B)          (pred: 50% of the B values)

The paper's claim (§2.2) is that the work follows the changed elements, not the sizes of the nested sets
they sit in. Here the number of parents stays fixed (002's Large Family: 200) while the sets grow from
100 to 10,000 elements (20,000 to 2,000,000 elements in all); each refresh changes the C field of one
element in each of ``--changed`` sets, so the change is the same at every size and only the arrays
around it grow:

* **by value**: ``base1.n`` is an ``array<struct<b, c>>`` and the view explodes it. A parent update
  carries the whole before- and after-array in the log (that is the by-value representation), but the
  extraction's delta (Δe) is consolidated to the changed elements before anything joins it.
* **by value, whole sets**: the same with a view that also reads ``size(n)``: the extraction keeps the
  array, so an updated set is undone and redone in full (002 §1's "straightforward application").
  Every element's tuple then carries its whole set (n² values per set), so it runs at the smallest
  family size only.
* **by reference**: ``base1.n`` holds the id of a set stored in ``nset`` (``nested:``); the change is
  one ``nset`` row per changed set, and the owner index is probed with the changed set ids.

For each representation and family size: T_inc (`ivm refresh`) and T_full (`ivm backfill --full`) in
one warm session, the view tuples changed, Δe's elements (by value) or the probed ids (by reference),
the Spark jobs and the rows read. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

from run import DRIVER_MEMORY, SparkCounters, lower_middle, machine, ranged  # noqa: E402

ELEMENT = pa.struct([("b", pa.int32()), ("c", pa.int32())])
TABLES = {
    "value": {"base1": {"columns": {"a": "int", "n": "array<struct<b: int, c: int>>"}, "key": ["a"]},
              "pred": {"columns": {"b": "int"}, "key": ["b"]}},
    "whole": {"base1": {"columns": {"a": "int", "n": "array<struct<b: int, c: int>>"}, "key": ["a"]},
              "pred": {"columns": {"b": "int"}, "key": ["b"]}},
    "reference": {"base1": {"columns": {"a": "int", "n": "int"}, "key": ["a"],
                            "nested": {"n": {"collection": "nset", "id": "set_id"}}},
                  "nset": {"columns": {"set_id": "int", "b": "int", "c": "int"}, "key": ["set_id", "b"]},
                  "pred": {"columns": {"b": "int"}, "key": ["b"]}},
}
VIEWS = {
    "value": "SELECT b.a, x.e.c FROM base1 b LATERAL VIEW explode(b.n) x AS e JOIN pred p ON p.b = x.e.b",
    # 002 §1's "straightforward application": the view reads the whole array too (its size), so the
    # extraction keeps the array and an updated set is undone and redone in full
    "whole": "SELECT b.a, x.e.c, size(b.n) AS k FROM base1 b LATERAL VIEW explode(b.n) x AS e "
             "JOIN pred p ON p.b = x.e.b",
    "reference": "SELECT b.a, s.c FROM base1 b JOIN nset s ON s.set_id = b.n JOIN pred p ON p.b = s.b",
}


def families(parents: int, size: int, seed: int = 7) -> dict[int, list[tuple[int, int]]]:
    """``parents`` sets of ``size`` (b, c) pairs; b unique within a set, values in [1, parents × size]."""
    rnd = random.Random(seed)
    elements = parents * size
    return {a: [(b, rnd.randint(1, elements)) for b in rnd.sample(range(1, elements + 1), size)]
            for a in range(1, parents + 1)}


def write(path: Path, rows: dict[str, list], schema: pa.Schema) -> str:
    pq.write_table(pa.table(rows, schema=schema), path)
    return str(path)


def _value_rows(sets: dict[int, list[tuple[int, int]]], kinds: list[str] | None = None):
    rows = {"a": list(sets), "n": [[{"b": b, "c": c} for b, c in s] for s in sets.values()]}
    fields = [("a", pa.int32()), ("n", pa.list_(ELEMENT))]
    if kinds:
        rows["_change_type"] = kinds
        fields.append(("_change_type", pa.string()))
    return rows, pa.schema(fields)


def build(form: str, size: int, args, root: Path):
    from ivm import Project

    folder = root / f"{form}-{size}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "ivm.yaml").write_text(yaml.safe_dump({
        "warehouse": "./warehouse", "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4",
                                                                              "spark.driver.memory": DRIVER_MEMORY}},
        "tables": TABLES[form], "views": {"nest": {"sql": VIEWS[form], "validate": {"sample": 0}}}}, sort_keys=False))
    project = Project.open(str(folder / "ivm.yaml"))
    project.apply()
    sets = families(args.parents, size)
    pred = [b for b in range(1, args.parents * size + 1) if b % 2 == 0]  # 50% selectivity
    project.load("pred", write(folder / "pred.parquet", {"b": pred}, pa.schema([("b", pa.int32())])))
    if form in ("value", "whole"):
        rows, schema = _value_rows(sets)
        project.load("base1", write(folder / "base1.parquet", rows, schema))
    else:
        project.load("base1", write(folder / "base1.parquet", {"a": list(sets), "n": list(sets)},
                                    pa.schema([("a", pa.int32()), ("n", pa.int32())])))
        flat = [(s, b, c) for s, elems in sets.items() for b, c in elems]
        project.load("nset", write(folder / "nset.parquet", {"set_id": [x[0] for x in flat], "b": [x[1] for x in flat],
                                                              "c": [x[2] for x in flat]},
                                   pa.schema([("set_id", pa.int32()), ("b", pa.int32()), ("c", pa.int32())])))
    project.refresh()
    return project, sets, folder


def change(form: str, project, sets, folder: Path, changed: int, step: int) -> int:
    """The C field of one element replaced in each of ``changed`` sets (the paper's replace operation)."""
    rnd = random.Random(1000 + step)
    picks = rnd.sample(sorted(sets), min(changed, len(sets)))
    if form in ("value", "whole"):
        before = {a: list(sets[a]) for a in picks}
        for a in picks:
            i = rnd.randrange(len(sets[a]))
            b, c = sets[a][i]
            sets[a][i] = (b, c + 1)
        rows, schema = _value_rows({**{a: before[a] for a in picks}}, ["update_preimage"] * len(picks))
        after, _ = _value_rows({a: sets[a] for a in picks}, ["update_postimage"] * len(picks))
        # a preimage and its postimage in one commit, in this order
        merged = {k: [x for pair in zip(rows[k], after[k], strict=True) for x in pair] for k in rows}
        path = write(folder / f"change-{step}.parquet", merged, schema)
        return project.append("base1", path).rows
    ids, bs, cs, kinds = [], [], [], []
    for a in picks:
        i = rnd.randrange(len(sets[a]))
        b, c = sets[a][i]
        sets[a][i] = (b, c + 1)
        ids += [a, a]
        bs += [b, b]
        cs += [c, c + 1]
        kinds += ["update_preimage", "update_postimage"]
    path = write(folder / f"change-{step}.parquet", {"set_id": ids, "b": bs, "c": cs, "_change_type": kinds},
                 pa.schema([("set_id", pa.int32()), ("b", pa.int32()), ("c", pa.int32()),
                            ("_change_type", pa.string())]))
    return project.append("nset", path).rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parents", type=int, default=200, help="nesting rows, one set each (002 §5.1's Large "
                    "Family: 200)")
    ap.add_argument("--families", default="100,1000,10000", type=lambda s: [int(x) for x in s.split(",")],
                    help="elements per nested set (002: Small Family 100, Large Family 1,000)")
    ap.add_argument("--changed", type=int, default=20, help="sets changed per refresh, one element each")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per configuration first")
    ap.add_argument("--repeat", type=int, default=3,
                    help="measured rounds per configuration (an incremental refresh, then a full one); "
                         "medians reported")
    ap.add_argument("--work", default=str(REPO / ".bench" / "nested"))
    ap.add_argument("--out", default=str(REPO / "tests" / "bench" / "results" / "nested"))
    args = ap.parse_args(argv)
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    lines = ["# 002 §5.1: one element changed in each of many nested sets", "", *[f"- {m}" for m in machine()],
             f"- {args.parents} parents, one set each; per refresh, one element's C replaced in each of "
             f"{args.changed} sets; view Nest(A, C) := base1(A, N), N(B, C), pred(B), pred 50% of B",
             "- T_inc: `ivm refresh` (trim, maintain, publish); T_full: `ivm backfill --full`; one warm session, "
             f"validation off; per configuration {args.warmup} unmeasured round(s), then {args.repeat} rounds of an "
             "incremental refresh and a full one: the medians, with their range; jobs, rows and T_maintain are "
             "the median incremental refresh's", "",
             "- T_maintain: the maintain stage of the incremental refresh alone (the trim before it reads the "
             "changed parents, which by value carry their whole arrays)", "",
             "| representation | set size | parents | changed log rows | T_inc s | T_maintain s | T_full s | "
             "T_inc/T_full | view tuples changed | Δe elements / probed ids | jobs inc | rows read inc/full |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for form in ("value", "whole", "reference"):
        # the whole-set baseline keeps the array in every element's tuple (n² values per set): the
        # smallest family only, larger ones exhaust a local driver's memory
        for size in args.families[:1] if form == "whole" else args.families:
            project, sets, folder = build(form, size, args, root)
            counters = SparkCounters(project.spark)
            rounds = []  # (T_inc, jobs, rows read, the view's work, T_full, rows read by it) per round
            for step in range(args.warmup + args.repeat):  # each round: an incremental refresh, then a full one
                n = change(form, project, sets, folder, args.changed, step)
                result, t_inc, jobs, rows, _, _ = counters.measure(
                    lambda p=project: p.refresh(["nest"], mode="incremental"))
                _, t_full, _, rows_full, _, _ = counters.measure(lambda p=project: p.backfill(["nest"], full=True))
                if step >= args.warmup:
                    rounds.append((t_inc, jobs, rows, result.views[0], t_full, rows_full))
            # the median round by T_inc (its jobs, rows and maintain time), the median T_full
            t_inc, jobs, rows, work, _, _ = lower_middle(rounds, key=lambda r: r[0])
            t_full, rows_full = lower_middle(rounds, key=lambda r: r[4])[4:]
            detail = ", ".join(f"{v}" for v in work.detail.values()) or "—"
            label = {"value": "by value", "whole": "by value, whole sets (view reads size(n))",
                     "reference": "by reference"}[form]
            lines.append(f"| {label} | {size} | {len(sets)} | {n} | {ranged([r[0] for r in rounds])} | "
                         f"{work.seconds:.2f} | {ranged([r[4] for r in rounds])} | {t_inc / t_full:.3f} | "
                         f"{work.rows_changed} | {detail} | {jobs} | {rows}/{rows_full} |")
            print(lines[-1], flush=True)
            project.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
