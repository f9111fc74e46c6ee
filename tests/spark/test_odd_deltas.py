"""Large and odd deltas (#46, item 4): a commit deleting every row (a truncate), a delta 100 times the
table, and a refresh after a long pause (300 log segments, one commit each, absorbed at once) stay
correct: after the refresh the tables hold what the changes say and every view equals DuckDB's result
of its SQL over that state, and its recomputation."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers import assert_views_recomputed, rows

TABLES = {"acct": {"columns": {"id": "int", "owner": "string", "day": "date", "balance": "decimal(12,2)"},
                   "key": ["id"]},
          "event": {"columns": {"owner": "string", "kind": "string", "value": "double"}}}
VIEWS = {
    "per_owner": "SELECT owner, count(*) AS n, sum(balance) AS total, min(day) AS first_day, max(balance) AS top "
                 "FROM acct GROUP BY owner",
    "joined": "SELECT a.owner, e.kind, count(*) AS n, sum(a.balance) AS total FROM acct a JOIN event e "
              "ON a.owner = e.owner WHERE e.value > 0.5 GROUP BY a.owner, e.kind",
    "kinds": "SELECT DISTINCT owner, kind FROM event",
}
OWNERS = ["ann", "bob", "cy", None]


def acct_row(rng: random.Random, i: int) -> tuple:
    return (i, rng.choice(OWNERS), dt.date(2026, rng.randint(1, 9), rng.randint(10, 19)),
            decimal.Decimal(f"{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}"))


def event_row(rng: random.Random) -> tuple:
    return (rng.choice(OWNERS), rng.choice(["a", "b", None]), rng.choice([0.25, 0.75, 1.5]))


def write(path: Path, table: str, changes: list[tuple[str | None, tuple]]) -> str:
    cols = list(TABLES[table]["columns"])
    path.write_text("".join(json.dumps({**dict(zip(cols, r, strict=True)), **({"_change_type": k} if k else {})},
                                       default=str) + "\n" for k, r in changes))
    return str(path)


def duck(state: dict[str, Counter]) -> dict[str, Counter]:
    con = duckdb.connect()
    types = {"int": "INTEGER", "string": "VARCHAR", "date": "DATE", "decimal(12,2)": "DECIMAL(12,2)",
             "double": "DOUBLE"}
    for name, t in TABLES.items():
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c} {types[ty]}' for c, ty in t['columns'].items())})")
        data = [r for r, n in state[name].items() for _ in range(n)]
        if data:
            con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(t['columns']))})", data)
    return {v: rows(con.execute(sql).fetchall()) for v, sql in VIEWS.items()}


def check(p, state: dict[str, Counter]) -> None:
    for table in TABLES:
        assert rows(p.read(table).collect()) == rows(r for r, n in state[table].items() for _ in range(n)), table
    expected = duck(state)
    for view in VIEWS:
        assert rows(p.read(view).collect()) == expected[view], view
    assert_views_recomputed(p)


def project(make_project, tmp_path, rng, accounts: int, events: int):
    p = make_project(TABLES, views={v: {"sql": sql} for v, sql in VIEWS.items()})
    state = {"acct": Counter(acct_row(rng, i) for i in range(accounts)),
             "event": Counter(event_row(rng) for _ in range(events))}
    p.load("acct", write(tmp_path / "acct.jsonl", "acct", [(None, r) for r in state["acct"]]))
    p.load("event", write(tmp_path / "event.jsonl", "event", [(None, r) for r in state["event"].elements()]))
    p.refresh()
    return p, state


def test_a_truncate_and_a_delta_a_hundred_times_the_table(make_project, tmp_path):
    rng = random.Random(4601)
    p, state = project(make_project, tmp_path, rng, 20, 30)
    # every row deleted in one commit, in each table
    p.append("acct", write(tmp_path / "t1.jsonl", "acct", [("delete", r) for r in state["acct"]]))
    p.append("event", write(tmp_path / "t2.jsonl", "event", [("delete", r) for r in state["event"].elements()]))
    state = {"acct": Counter(), "event": Counter()}
    assert p.refresh(mode="incremental").status == "succeeded"
    check(p, state)
    assert all(p.read(v).count() == 0 for v in VIEWS)
    # then 100 times what the tables held: 2,000 accounts and 3,000 events in one commit each
    state["acct"] = Counter(acct_row(rng, i) for i in range(100, 2100))
    state["event"] = Counter(event_row(rng) for _ in range(3000))
    p.append("acct", write(tmp_path / "b1.jsonl", "acct", [("insert", r) for r in state["acct"]]))
    p.append("event", write(tmp_path / "b2.jsonl", "event", [("insert", r) for r in state["event"].elements()]))
    assert p.refresh(mode="incremental").status == "succeeded"
    check(p, state)


def test_a_refresh_after_a_long_pause_absorbs_hundreds_of_segments(make_project, tmp_path):
    """300 commits, each its own segment (written as `ivm log append` writes them and recorded in the
    catalog, to keep the test fast: 300 appends would take minutes), absorbed by one refresh."""
    rng = random.Random(4602)
    p, state = project(make_project, tmp_path, rng, 30, 30)
    acct = {r[0]: r for r in state["acct"]}
    next_id = 1000
    for version in range(1, 301):
        table = "acct" if version % 3 else "event"
        changes: list[tuple[str, tuple]] = []
        if table == "acct":
            changes.append(("insert", acct.setdefault(next_id, acct_row(rng, next_id))))
            next_id += 1
            old = acct[rng.choice(sorted(acct))]
            if version % 2:  # an update
                new = acct[old[0]] = acct_row(rng, old[0])
                changes += [("update_preimage", old), ("update_postimage", new)]
            else:
                changes.append(("delete", acct.pop(old[0])))
        else:
            new_event = event_row(rng)
            state["event"][new_event] += 1
            changes.append(("insert", new_event))
            gone = rng.choice(sorted(state["event"].elements(), key=repr))
            state["event"][gone] -= 1
            changes.append(("delete", gone))
        segment(p, table, changes)
    state["acct"] = Counter(acct.values())
    state["event"] = +state["event"]
    result = p.refresh(mode="incremental")
    assert result.status == "succeeded"
    assert {t.table: t.log_rows for t in result.tables} == {
        "acct": sum(3 if v % 2 else 2 for v in range(1, 301) if v % 3), "event": 2 * 100}
    check(p, state)


def segment(p, table: str, changes: list[tuple[str, tuple]]) -> None:
    """One commit (the table's next version) as a log segment: the Parquet file `ivm log append` writes,
    recorded in the catalog."""
    cols = TABLES[table]["columns"]
    arrow = {"int": pa.int32(), "string": pa.string(), "date": pa.date32(), "decimal(12,2)": pa.decimal128(12, 2),
             "double": pa.float64()}

    version = p.catalog.last_commit_version(table) + 1
    schema = pa.schema([(c, arrow[t]) for c, t in cols.items()] + [
        ("_change_type", pa.string()), ("_commit_version", pa.int64()), ("_seq", pa.int64())])
    path = p.warehouse.log_path(table, f"{version:020d}-test")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({**{c: [r[i] for _, r in changes] for i, c in enumerate(cols)},
                             "_change_type": [k for k, _ in changes], "_commit_version": [version] * len(changes),
                             "_seq": list(range(len(changes)))}, schema=schema), path)
    p.catalog.add_segment(table, path, path, "cdf", hashlib.sha256(path.encode()).hexdigest(), version, version,
                          len(changes))
