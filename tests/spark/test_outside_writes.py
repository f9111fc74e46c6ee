"""A view's Delta table is ivm's (#69 item 4): before writing it, the sink checks that no other writer
changed it since ivm's last commit. A notebook's UPDATE or DELETE on the table is undone on the next write
— the table brought back to the view row by row, a warning in the progress and the run's sink record naming
the outside commit — never merged over; with ``storage.on_outside_write: fail`` the write is refused in one
line with the way out, and the table is written once it is restored. Upkeep by anyone (OPTIMIZE) is no
outside write."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from ivm import sinks
from ivm.errors import ChangeDataError
from tests.helpers import write_jsonl

TABLES = {"t": {"columns": {"k": "int", "v": "int"}, "key": ["k"]}}
VIEWS = {"per_v": {"sql": "SELECT v, count(*) AS n FROM t GROUP BY v", "key": ["v"]},
         "vs": {"sql": "SELECT v FROM t"}}  # (a keyless bag)


def table(p, view: str) -> Counter:
    return Counter(tuple(r.values()) for r in DeltaTable(sinks.location(p.ctx, view)).to_pandas()
                   .to_dict("records"))


def state(p, view: str) -> Counter:
    return Counter(tuple(r) for r in p.read(view).collect())


@pytest.mark.parametrize("sink_without_jvm_mb", [64, 0], ids=["delta-rs", "spark"])
def test_an_outside_write_is_undone_with_a_warning(make_project, spark, tmp_path, sink_without_jvm_mb):
    # (a name of its own: a Spark Connect server's catalog is shared by the tests that run on it)
    p = make_project(TABLES, views=VIEWS, name=f"outside_{sink_without_jvm_mb}",
                     storage={"delta_views": True, "sink_without_jvm_mb": sink_without_jvm_mb})
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v"], [(1, 10), (2, 10), (3, 20)]))
    p.refresh()
    for view in VIEWS:
        where = sinks.location(p.ctx, view)
        spark.sql(f"OPTIMIZE delta.`{where}`")  # (upkeep: not an outside write)
        spark.sql(f"UPDATE delta.`{where}` SET v = 99 WHERE v = 20")  # (a notebook's)
    p.append("t", write_jsonl(tmp_path / "c.jsonl", ["k", "v"], [(4, 30)], ["insert"]))
    lines = []
    p.refresh(progress=lines.append)
    for view in VIEWS:
        assert table(p, view) == state(p, view), view
        assert any(line.startswith(f"sink: {view}: warning: its Delta table was changed outside ivm at Delta "
                                   "version") and "(UPDATE)" in line for line in lines), lines
    record = p.ctx.catalog.latest_stage("sink", "per_v")
    assert record.detail["outside_write"]["operation"] == "UPDATE"
    # the next refresh finds the table ivm's again: no warning
    p.append("t", write_jsonl(tmp_path / "d.jsonl", ["k", "v"], [(5, 30)], ["insert"]))
    lines.clear()
    p.refresh(progress=lines.append)
    assert not any("outside ivm" in line for line in lines) and table(p, "per_v") == state(p, "per_v")


def test_on_outside_write_fail_refuses_in_one_line_until_the_table_is_restored(make_project, spark, tmp_path):
    p = make_project(TABLES, views={"per_v": VIEWS["per_v"]}, name="outside_fail",
                     storage={"delta_views": True, "on_outside_write": "fail"})
    p.load("t", write_jsonl(tmp_path / "t.jsonl", ["k", "v"], [(1, 10), (2, 20)]))
    p.refresh()
    where = sinks.location(p.ctx, "per_v")
    ours = DeltaTable(where).version()
    spark.sql(f"DELETE FROM delta.`{where}` WHERE v = 10")
    p.append("t", write_jsonl(tmp_path / "c.jsonl", ["k", "v"], [(3, 30)], ["insert"]))
    with pytest.raises(ChangeDataError, match=rf"^view per_v: its Delta table {where} was changed outside ivm at "
                                              rf"Delta version {ours + 1} \(DELETE\); not written"):
        p.refresh()
    assert sinks.state(p.ctx, "per_v").delta_version is None  # (behind the catalog, as the message says)
    spark.sql(f"RESTORE TABLE delta.`{where}` TO VERSION AS OF {ours}")  # (the way out the message names)
    p.refresh()  # (nothing new: it writes the table the failed sink left behind)
    assert table(p, "per_v") == state(p, "per_v") == Counter({(10, 1): 1, (20, 1): 1, (30, 1): 1})
    assert sinks.state(p.ctx, "per_v").delta_version == DeltaTable(where).version()
