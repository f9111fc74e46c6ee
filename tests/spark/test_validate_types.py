"""Validation over every Spark SQL type a table may hold (#46): date, timestamp, decimal, double,
float, boolean, binary, array and struct columns, as a view's key and as its measures, go through the
sampled recomputation and Great Expectations after an incremental refresh and pass; a wrong row of
each is caught, named in one line and recorded as JSON; DOUBLE sums that differ from a recompute only
by rounding pass under the default tolerance and fail with ``tolerance: 0``; an error inside the check
is a failed validation with one line, never a traceback."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from ivm.errors import ValidationError
from tests.helpers import corrupt

TYPES = {"day": "date", "at": "timestamp", "amount": "decimal(12,2)", "price": "double", "ratio": "float",
         "flag": "boolean", "blob": "binary", "tags": "array<int>", "info": "struct<a: int, b: string>"}
ARROW = pa.schema([("k", pa.int64()), ("day", pa.date32()), ("at", pa.timestamp("us")),
                   ("amount", pa.decimal128(12, 2)), ("price", pa.float64()), ("ratio", pa.float32()),
                   ("flag", pa.bool_()), ("blob", pa.binary()), ("tags", pa.list_(pa.int32())),
                   ("info", pa.struct([("a", pa.int32()), ("b", pa.string())]))])
CHECK = {"sample": 1000}
KEYS = [("day", "blob"), ("at", "tags"), ("amount", "info"), ("flag", "price", "ratio")]


def row(k: int, scale: float = 1.0, nulls: bool = False) -> dict:
    if nulls:
        return {"k": k, **{c: None for c in TYPES}}
    return {"k": k, "day": dt.date(1998, 9, 1 + k % 3), "at": dt.datetime(2024, 1, 1, k % 2, 30),
            "amount": decimal.Decimal(f"{k}.{k % 100:02d}"), "price": 0.1 * k * scale, "ratio": 0.5 * k,
            "flag": k % 2 == 0, "blob": bytes([k % 256, 255]), "tags": [k, k % 3] if k % 4 else [],
            "info": {"a": k % 3, "b": f"s{k % 2}"}}


def write(path, rows: list[dict], change: str | list[str] | None = None) -> str:
    table = pa.Table.from_pylist(rows, schema=ARROW)
    if change:
        kinds = [change] * len(rows) if isinstance(change, str) else change
        table = table.append_column("_change_type", pa.array(kinds, pa.string()))
    pq.write_table(table, path)
    return str(path)


def project(make_project, tolerance: float | None = None):
    # each type as a grouping key (the sample's hash is over them, the rows' JSON holds them), two at a time
    views = {"by_" + "_".join(g): {"sql": f"SELECT {', '.join(g)}, count(*) AS n FROM m GROUP BY {', '.join(g)}",
                                   "validate": CHECK} for g in KEYS}
    views["whole"] = {"sql": "SELECT * FROM m", "key": ["k"], "validate": CHECK}
    sums = {**CHECK, **({"tolerance": tolerance} if tolerance is not None else {})}
    views["sums"] = {"sql": "SELECT day, at, sum(amount) AS amount, sum(price) AS price, sum(ratio) AS ratio, "
                            "avg(price) AS mean, count(*) AS n FROM m GROUP BY day, at", "validate": sums}
    return make_project({"m": {"columns": {"k": "bigint", **TYPES}, "key": ["k"]}}, views=views)


def test_every_type_passes_validation_and_a_wrong_row_of_each_is_named(make_project, tmp_path):
    p = project(make_project)
    p.load("m", write(tmp_path / "m.parquet", [row(k) for k in range(1, 40)] + [row(40, nulls=True)]))
    p.refresh()
    p.append("m", write(tmp_path / "c1.parquet", [row(k) for k in range(41, 50)] + [row(50, nulls=True)], "insert"))
    p.append("m", write(tmp_path / "c2.parquet", [row(3), row(7), row(40, nulls=True)], "delete"))
    p.append("m", write(tmp_path / "c3.parquet", [row(5), row(5, scale=3.0), row(9), row(9, scale=3.0)],
                        ["update_preimage", "update_postimage"] * 2))
    result = p.refresh()
    assert result.status == "succeeded"
    checks = {v.view: v for v in p.catalog.validations(run_id=result.run_id)}
    assert set(checks) == {*("by_" + "_".join(g) for g in KEYS), "whole", "sums"}
    assert {v: c.status for v, c in checks.items() if c.status != "passed"} == {}
    assert all(c.sample_size > 0 for c in checks.values())
    # a wrong row in each view: caught, named, and its summary is JSON (dates, decimals, bytes, ...)
    for view in checks:
        corrupt(p, view, lambda df: df.withColumn("n", F.lit(999).cast("bigint")) if "n" in df.columns
                else df.withColumn("k", F.lit(999).cast("bigint")))
    for check in p.validate():
        assert check.status == "failed", check.view
        assert re.fullmatch(r"1 of \d+ sampled rows differ from the recomputation: \(.*\) has count 1, recomputed 0",
                            check.problem), check.problem
    for view in checks:
        (check,) = p.catalog.validations(view=view, limit=1)
        assert check.status == "failed" and check.mismatches == 1
        json.dumps(check.summary, allow_nan=False)
    by_day = p.catalog.validations(view="by_day_blob", limit=1)[0].summary["mismatches"][0]["row"]
    assert by_day["day"] in {"1998-09-01", "1998-09-02", "1998-09-03", None}
    assert by_day["blob"] is None or isinstance(by_day["blob"], str)


@pytest.mark.parametrize("tolerance", [None, 0.0], ids=["default", "exact"])
def test_double_sums_differing_by_rounding(make_project, tmp_path, tolerance):
    """0.1 + 0.2 + 0.3 kept incrementally, then 0.1 taken away, is 0.5000000000000001; recomputed, 0.5."""
    p = make_project({"m": {"columns": {"g": "string", "x": "double"}}},
                     views={"s": {"sql": "SELECT g, sum(x) AS x, count(*) AS n FROM m GROUP BY g",
                                  "validate": {"sample": 100, **({"tolerance": tolerance} if tolerance is not None
                                                                  else {})}}})
    rows = lambda path, values, change=None: str(path) if path.write_text("".join(  # noqa: E731
        json.dumps({"g": "a", "x": v, **({"_change_type": change} if change else {})}) + "\n"
        for v in values)) else ""
    p.load("m", rows(tmp_path / "m.jsonl", [0.1, 0.2]))
    p.refresh()
    p.append("m", rows(tmp_path / "c1.jsonl", [0.3], "insert"))
    p.refresh()
    p.append("m", rows(tmp_path / "c2.jsonl", [0.1], "delete"))
    kept, recomputed = None, 0.2 + 0.3
    if tolerance is None:
        result = p.refresh()
        (check,) = p.catalog.validations(view="s", run_id=result.run_id)
        assert check.status == "passed"
        kept = p.read("s").collect()[0]["x"]
        assert kept != recomputed and abs(kept - recomputed) < 1e-15  # the rounding was there to forgive
    else:
        with pytest.raises(ValidationError, match=r"^view s: .*\(g='a', x=0\.5000000000000001, n=2\) has count 1, "
                                                   r"recomputed 0"):
            p.refresh()
