"""The sampled comparison's floating-point tolerance and its JSON (ivm.validate.reconcile, jsonable):
rows that differ only by rounding in DOUBLE columns are one row; rows that differ beyond the tolerance,
in an exact column, or in count stay mismatches; whatever a comparison holds becomes JSON."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import numpy as np
import pandas as pd
from pyspark.sql import Row

from ivm.expectations import EXPECTED, STAGED
from ivm.validate import Comparison, jsonable


def frame(rows):
    return pd.DataFrame(rows, columns=["k", "d", "s", STAGED, EXPECTED])


def comparison(rows, tolerance=1e-9):
    return Comparison("v", ["k", "d"], 10, 0, frame(rows), False, floats=["s"], tolerance=tolerance)


def test_rounding_in_a_double_column_is_no_mismatch():
    day = dt.date(1998, 9, 2)
    c = comparison([("a", day, 0.5000000000000001, 1, 0), ("a", day, 0.5, 0, 1),  # rounding: one row
                    ("b", day, 3.0, 1, 1)])
    assert c.mismatches.empty and len(c.rows) == 2
    assert c.rows[STAGED].tolist() == c.rows[EXPECTED].tolist() == [1, 1]


def test_differences_beyond_rounding_stay():
    day, other = dt.date(1998, 9, 2), dt.date(1998, 9, 3)
    c = comparison([("a", day, 0.5001, 1, 0), ("a", day, 0.5, 0, 1),  # beyond 1e-9 relative
                    ("b", day, 1.0, 1, 0), ("b", other, 1.0, 0, 1),  # an exact column differs
                    ("c", day, 2.0, 2, 0), ("c", day, 2.0000000000000004, 0, 1),  # one copy too many
                    ("d", day, None, 1, 0), ("d", day, 0.0, 0, 1)])  # NULL is not 0
    assert sorted(c.mismatches["k"]) == ["a", "a", "b", "b", "c", "d", "d"]
    (extra,) = c.mismatches[c.mismatches["k"] == "c"].itertuples(index=False)
    assert (extra[3], extra[4]) == (2, 1)  # matched once; the second copy is the mismatch
    assert len(comparison([("a", day, 0.5000000000000001, 1, 0), ("a", day, 0.5, 0, 1)], 0.0).mismatches) == 2


def test_near_zero_and_nan_agree():
    day = dt.date(2000, 1, 1)
    c = comparison([("a", day, 2.7755575615628914e-17, 1, 0), ("a", day, 0.0, 0, 1),  # a sum back at zero
                    ("b", day, float("nan"), 1, 1)])
    assert c.mismatches.empty


def test_everything_a_comparison_holds_is_json():
    row = {"d": dt.date(1998, 9, 2), "ts": pd.Timestamp("2024-01-02 03:04:05"), "x": decimal.Decimal("10.25"),
           "b": bytearray(b"\x00\xff"), "a": np.array([1, 2]), "s": Row(n=1, t=dt.datetime(2024, 1, 1)),
           "i": np.int64(3), "f": np.float64("nan"), "nat": pd.NaT, "m": {"k": [dt.date(2020, 1, 1)]}}
    out = jsonable(row)
    assert json.loads(json.dumps(out, allow_nan=False)) == {
        "d": "1998-09-02", "ts": "2024-01-02T03:04:05", "x": "10.25", "b": "AP8=", "a": [1, 2],
        "s": {"n": 1, "t": "2024-01-01T00:00:00"}, "i": 3, "f": None, "nat": None, "m": {"k": ["2020-01-01"]}}
