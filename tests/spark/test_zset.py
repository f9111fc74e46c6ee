"""Reading a relation's layers consolidated (`Warehouse.read_consolidated`, `zset.consolidate_onto`) as a
property: for a random consolidated base layer and random delta layers (inserts, deletes, updates of a
key's other columns, duplicates, NULLs, tuples deleted to nothing), the Z-set read equals the counts
added up in Python, whichever columns decide which base tuples are grouped with the deltas."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ivm import storage
from ivm.storage import Warehouse
from tests.helpers import plan_text

SCHEMA = StructType([StructField("k", IntegerType()), StructField("v", StringType())])
tuples = st.tuples(st.one_of(st.none(), st.integers(0, 6)), st.one_of(st.none(), st.sampled_from(["x", "y"])))


@st.composite
def layers(draw):
    """A consolidated base (positive counts) and 1-3 delta layers whose counts keep every tuple ≥ 0."""
    base = Counter({t: n for t, n in draw(st.dictionaries(tuples, st.integers(1, 3), max_size=10)).items()})
    state, deltas = Counter(base), []
    for _ in range(draw(st.integers(1, 3))):
        delta: Counter = Counter()
        for t in draw(st.lists(tuples, max_size=6)):
            n = draw(st.integers(-state[t], 2).filter(lambda x: x != 0))  # (−count deletes the tuple)
            delta[t] += n
            state[t] += n
        deltas.append(delta)
    return base, deltas, +state


def rows(z: Counter) -> list[tuple]:
    return [(*t, n) for t, n in z.items() if n != 0]


def read(spark, warehouse, base, deltas, columns):
    refs = []
    for i, z in enumerate([base, *deltas]):
        kind = "base" if i == 0 else "delta"
        df = spark.createDataFrame(rows(z), "k int, v string, __count long")
        refs.append(warehouse.write_layer(df, "r", kind))
    return warehouse.read_consolidated(spark, refs, SCHEMA, columns)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=layers(), columns=st.sampled_from([["k"], ["v"], ["k", "v"]]))
def test_base_and_deltas_read_consolidated(spark, tmp_path_factory, case, columns):
    base, deltas, expected = case
    got = read(spark, Warehouse(str(tmp_path_factory.mktemp("wh"))), base, deltas, columns)
    result = got.collect()
    assert len(result) == len({(r["k"], r["v"]) for r in result})  # one row per tuple
    assert Counter({(r["k"], r["v"]): r["__count"] for r in result}) == expected


@pytest.mark.parametrize("limit, grouped_all", [(storage.BROADCAST_BYTES, False), (0, True)])
def test_large_deltas_group_every_tuple(spark, tmp_path, monkeypatch, limit, grouped_all):
    """Delta layers past BROADCAST_BYTES are not broadcast: every tuple is grouped (one aggregate over
    all layers); small ones leave the base tuples they do not touch alone (an anti-join)."""
    monkeypatch.setattr(storage, "BROADCAST_BYTES", limit)
    base, deltas = Counter({(1, "x"): 1, (2, "y"): 2}), [Counter({(1, "x"): -1, (3, None): 1})]
    got = read(spark, Warehouse(str(tmp_path)), base, deltas, ["k"])
    assert Counter({(r["k"], r["v"]): r["__count"] for r in got.collect()}) == Counter({(2, "y"): 2, (3, None): 1})
    plan = plan_text(got)
    assert ("LeftAnti" not in plan) == grouped_all, plan


def test_reads_of_layers_are_reused_until_a_layer_is_rewritten(spark, tmp_path):
    """`read_layers` builds the DataFrame over a set of layers once; a retried stage's overwrite
    (``write_layer`` with the same run id) or a delete forgets it, and ``reuse=False`` lists the files
    anew (validation reads what is on disk)."""
    wh = Warehouse(str(tmp_path))

    def write(ks, run_id=None):
        df = spark.createDataFrame([(k, "x", 1) for k in ks], "k int, v string, __count long")
        return wh.write_layer(df, "r", "delta", run_id=run_id)

    def keys(df):
        return sorted(r["k"] for r in df.collect())

    base, layer = write([1]), write([2, 3], run_id="retried")
    first = wh.read_layers(spark, [base.path, layer.path], SCHEMA)
    assert wh.read_layers(spark, [base.path, layer.path], SCHEMA) is first
    assert keys(first) == [1, 2, 3]
    write([4], run_id="retried")  # the same layer, overwritten
    assert keys(wh.read_layers(spark, [base.path, layer.path], SCHEMA)) == [1, 4]
    assert keys(wh.read_layers(spark, [layer.path], SCHEMA)) == [4]
    spark.createDataFrame([(5, "y", 1)], "k int, v string, __count long").write.mode("append").parquet(layer.path)
    assert keys(wh.read_layers(spark, [layer.path], SCHEMA)) == [4]  # (written behind the warehouse's back)
    assert keys(wh.read_layers(spark, [layer.path], SCHEMA, reuse=False)) == [4, 5]
    wh.delete(layer.path)
    with pytest.raises(Exception, match="PATH_NOT_FOUND|does not exist"):  # (a Connect plan: when it runs)
        wh.read_layers(spark, [layer.path], SCHEMA).collect()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["int", "bigint", "string", "date", "decimal(12,2)"]), data=st.data())
def test_at_values_keeps_the_rows_at_the_values_the_driver_holds(spark, kind, data):
    """`zset.at_values` (an IN list as SQL text, `sql_literal`) keeps exactly the rows whose column is one
    of the values, and the NULL rows when asked: strings with quotes, backslashes and other scripts'
    letters, dates, decimals, integers past INT."""
    import datetime
    import decimal

    from ivm.zset import at_values

    values = {"int": st.integers(-2**31, 2**31 - 1), "bigint": st.integers(-2**63, 2**63 - 1),
              "string": st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6),
              "date": st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31)),
              "decimal(12,2)": st.decimals(-10**10 + 1, 10**10 - 1, places=2, allow_nan=False)}[kind]
    rows = data.draw(st.lists(st.one_of(st.none(), values), max_size=12), "rows")
    held = sorted(set(data.draw(st.lists(st.one_of(st.sampled_from(rows) if any(r is not None for r in rows)
                                                    else values, values), max_size=6), "held")) - {None})
    nulls = data.draw(st.booleans(), "nulls")
    df = spark.createDataFrame([(i, r) for i, r in enumerate(rows)], f"i int, v {kind}")
    kept = sorted(r.i for r in at_values(df, "v", held, nulls).collect())
    as_held = {decimal.Decimal(v) for v in held} if kind.startswith("decimal") else set(held)
    assert kept == [i for i, r in enumerate(rows) if (r is None and nulls) or (r is not None and r in as_held)]
