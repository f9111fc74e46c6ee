"""Whether a Delta source's commits since a version are still in its log (`ivm.changes.delta.history_gone`),
on a table delta-rs writes (no Spark): log retention drops the commits before a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from ivm.changes.delta import history_gone


def test_history_gone_names_the_oldest_version_left_once_a_version_is_dropped(tmp_path):
    where = str(tmp_path / "orders")
    for n in range(4):  # versions 0..3
        write_deltalake(where, pa.table({"id": [n]}), mode="append")
    assert [history_gone("orders", where, v) for v in (0, 1, 3, 4)] == [None, None, None, None]
    DeltaTable(where).create_checkpoint()  # at version 3; the commits before it may go, as retention does
    for f in sorted((Path(where) / "_delta_log").glob("*.json"))[:2]:
        f.unlink()  # versions 0 and 1
    assert history_gone("orders", where, 1) == 2
    assert history_gone("orders", where, 0) == 2
    assert history_gone("orders", where, 2) is None
    assert history_gone("orders", where, 5) is None  # nothing to read yet
