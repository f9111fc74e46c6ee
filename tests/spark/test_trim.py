"""Trimming (002 §3) as a property: for random change sequences, the net delta applied to the snapshot
equals applying every change in order; the first change that does not apply is refused, naming its
commit version; and splitting a sequence across refreshes gives the same snapshot.

The model below is the specification: a keyed table is a dict key -> row, a bag is a Counter of rows.
"""

from __future__ import annotations

import datetime
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ivm.changes.trim import trim
from ivm.config import TableConfig
from ivm.errors import ChangeDataError
from ivm.zset import SKIP_MIN_ROWS

KEYED = TableConfig(columns={"k": "int", "v": "string"}, key=["k"])
BAG = TableConfig(columns={"a": "int", "b": "string"})
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))

keys = st.integers(0, 5)
values = st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))


class Invalid(Exception):
    def __init__(self, commit: int):
        self.commit = commit


# -- the specification ---------------------------------------------------------------------------------

def apply_keyed(state: dict, changes: list[tuple]) -> dict:
    """Apply (change_type, k, v, commit) in order; raise Invalid at the first that does not apply."""
    state = dict(state)
    open_pre: dict[int, int] = Counter()
    commits = [c[3] for c in changes]
    for i, (ct, k, v, commit) in enumerate(changes):
        if ct in ("delete", "update_preimage"):
            # (a removal naming the key alone — v, the one other column, NULL — removes whatever row the
            # key holds: the key identifies the row, #69; one that carries a value must match it)
            if k not in state or (v is not None and state[k] != v):
                raise Invalid(commit)
            del state[k]
        else:
            if k in state:
                raise Invalid(commit)
            state[k] = v
        open_pre[commit] += {"update_preimage": 1, "update_postimage": -1}.get(ct, 0)
        if open_pre[commit] < 0:
            raise Invalid(commit)
        last_of_commit = i + 1 == len(changes) or commits[i + 1] != commit
        if last_of_commit and open_pre[commit] > 0:
            raise Invalid(commit)
    return state


def apply_bag(state: Counter, changes: list[tuple]) -> Counter:
    state = Counter(state)
    open_pre: dict[int, int] = Counter()
    commits = [c[3] for c in changes]
    for i, (ct, a, b, commit) in enumerate(changes):
        if ct in ("delete", "update_preimage"):
            if state[(a, b)] <= 0:
                raise Invalid(commit)
            state[(a, b)] -= 1
        else:
            state[(a, b)] += 1
        open_pre[commit] += {"update_preimage": 1, "update_postimage": -1}.get(ct, 0)
        if open_pre[commit] < 0:
            raise Invalid(commit)
        if (i + 1 == len(changes) or commits[i + 1] != commit) and open_pre[commit] > 0:
            raise Invalid(commit)
    return +state


# -- generators: mostly valid sequences, drawn against the model's state --------------------------------

@st.composite
def keyed_case(draw, allow_invalid: bool):
    state = draw(st.dictionaries(keys, values, max_size=4))
    cur = dict(state)
    ops: list[tuple[str, int, object]] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["insert", "delete", "update", "key_update", "bad"] if allow_invalid
                                    else ["insert", "delete", "update", "key_update"]))
        free = [k for k in range(6) if k not in cur]
        if kind == "insert" and free:
            k = draw(st.sampled_from(free))
            cur[k] = draw(values)
            ops.append(("insert", k, cur[k]))
        elif kind == "delete" and cur:
            k = draw(st.sampled_from(sorted(cur)))
            ops.append(("delete", k, cur.pop(k)))
        elif kind == "update" and cur:
            k = draw(st.sampled_from(sorted(cur)))
            new = draw(values)
            ops += [("update_preimage", k, cur[k]), ("update_postimage", k, new)]
            cur[k] = new
        elif kind == "key_update" and cur and free:
            k1, k2 = draw(st.sampled_from(sorted(cur))), draw(st.sampled_from(free))
            v = cur.pop(k1)
            cur[k2] = draw(values)
            ops += [("update_preimage", k1, v), ("update_postimage", k2, cur[k2])]
        elif kind == "bad":
            ops.append(draw(st.sampled_from([
                ("delete", draw(keys), draw(values)), ("insert", draw(keys), draw(values)),
                ("update_postimage", draw(keys), draw(values)), ("update_preimage", draw(keys), draw(values))])))
    return state, _commits(draw, ops)


@st.composite
def bag_case(draw, allow_invalid: bool):
    rows = st.tuples(st.one_of(st.none(), st.integers(0, 3)), values)
    state = Counter(draw(st.lists(rows, max_size=5)))
    cur = Counter(state)
    ops: list[tuple] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["insert", "delete", "update", "bad"] if allow_invalid
                                    else ["insert", "delete", "update"]))
        present = sorted((+cur).keys(), key=repr)
        if kind == "insert":
            r = draw(rows)
            cur[r] += 1
            ops.append(("insert", *r))
        elif kind in ("delete", "update") and present:
            r = draw(st.sampled_from(present))
            cur[r] -= 1
            if kind == "delete":
                ops.append(("delete", *r))
            else:
                new = draw(rows)
                cur[new] += 1
                ops += [("update_preimage", *r), ("update_postimage", *new)]
        elif kind == "bad":
            ops.append(("delete", *draw(rows)))
    return state, _commits(draw, ops)


def _commits(draw, ops):
    """Group consecutive operations into commits; an update's two images stay in one commit."""
    out, commit, i = [], 1, 0
    while i < len(ops):
        take = 2 if ops[i][0] == "update_preimage" and i + 1 < len(ops) and ops[i + 1][0] == "update_postimage" else 1
        out += [(*op, commit) for op in ops[i:i + take]]
        i += take
        if draw(st.booleans()):
            commit += draw(st.integers(1, 3))
    return out


# -- running trim on Spark ------------------------------------------------------------------------------

def run_trim(spark, table: TableConfig, rows: list[tuple], changes: list[tuple], stored_rows: int = 0) -> Counter:
    """Trim ``changes`` against the snapshot ``rows`` (count 1 each, as tuples with count) and return
    the net delta as a Counter of rows (negative counts for deletions). ``stored_rows``: as many as
    SKIP_MIN_ROWS reads the snapshot through the skipping filter, as for a large table."""
    cols = list(table.columns)
    ddl = "k INT, v STRING" if table.keyed else "a INT, b STRING"
    snapshot = spark.createDataFrame([(*r, n) for r, n in rows], f"{ddl}, __count BIGINT")
    log = spark.createDataFrame([(x[1], x[2], x[0], x[3], seq) for seq, x in enumerate(changes)],
                                f"{ddl}, _change_type STRING, _commit_version BIGINT, _seq BIGINT")
    # half the cases (by the number of changes: reproducible) trimmed in one partition, as a small change is,
    # and half of those with the change's values of the first column as the driver reads them from the log
    # (ivm.changes.ingest.log_keys: the stored rows found by an IN list, NULLs too)
    small = len(changes) % 2 == 1
    keys = (sorted({x[1] for x in changes if x[1] is not None}), any(x[1] is None for x in changes)) \
        if len(changes) % 4 == 1 else None
    net = trim("t", table, log, snapshot, stored_rows, update_images=any(x[0].startswith("update") for x in changes),
               small=small, keys=keys)
    delta = net.delta.collect()
    net.check()
    out = Counter()
    for r in delta:
        assert r["__count"] != 0
        out[tuple(r[c] for c in cols)] += r["__count"]
    # the keys updated (a −1 and a +1 image), as observed while the delta was computed; a bag has no keys
    sides = Counter(k for k, _ in {(r[0], n > 0) for r, n in out.items()}) if table.keyed else None
    assert net.updated_keys() == (sum(1 for n in sides.values() if n == 2) if table.keyed else None)
    return out


def applied(state: Counter, delta: Counter) -> Counter:
    total = Counter(state)
    for r, n in delta.items():
        total[r] += n
    assert all(n >= 0 for n in total.values()), "the delta removes more than the snapshot holds"
    return +total


@SETTINGS
@given(case=keyed_case(allow_invalid=False))
def test_keyed_net_delta_equals_in_order_application(spark, case):
    state, changes = case
    expected = apply_keyed(state, changes)
    delta = run_trim(spark, KEYED, [((k, v), 1) for k, v in state.items()], changes, SKIP_MIN_ROWS)
    assert applied(Counter({(k, v): 1 for k, v in state.items()}), delta) == Counter(
        {(k, v): 1 for k, v in expected.items()})
    # net effect: a key appears at most once on each side, and never as a no-op pair
    assert all(abs(n) == 1 for n in delta.values())
    assert not [r for r in delta if delta[r] < 0 and r in expected.items()]


@SETTINGS
@given(case=keyed_case(allow_invalid=True))
def test_keyed_bad_changes_are_refused_at_the_first_bad_commit(spark, case):
    state, changes = case
    rows = [((k, v), 1) for k, v in state.items()]
    try:
        expected = apply_keyed(state, changes)
    except Invalid as bad:
        with pytest.raises(ChangeDataError, match=rf"table t: commit version {bad.commit}, row \(k="):
            run_trim(spark, KEYED, rows, changes)
        return
    delta = run_trim(spark, KEYED, rows, changes)
    assert applied(Counter(dict(rows)), delta) == Counter({(k, v): 1 for k, v in expected.items()})


@SETTINGS
@given(case=bag_case(allow_invalid=True))
def test_bag_net_delta_equals_in_order_application(spark, case):
    state, changes = case
    try:
        expected = apply_bag(state, changes)
    except Invalid as bad:
        with pytest.raises(ChangeDataError, match=rf"commit version {bad.commit}, row"):
            run_trim(spark, BAG, list(state.items()), changes, SKIP_MIN_ROWS)
        return
    delta = run_trim(spark, BAG, list(state.items()), changes, SKIP_MIN_ROWS)
    assert applied(state, delta) == expected


def test_skipping_ranges_lose_no_stored_row(spark, monkeypatch):
    """The skipping filter's ranges (two here, cut by Spark): the stored rows the changes touch (one at
    each end, one in the middle, a NULL tuple of a bag) are all still found."""
    from ivm import zset

    monkeypatch.setattr(zset, "SKIP_RANGES", 2)
    state = {k: f"v{k}" for k in range(200)}
    changes = [("delete", 0, "v0", 1), ("update_preimage", 100, "v100", 2), ("update_postimage", 100, "w", 2),
               ("delete", 199, "v199", 3), ("insert", 500, "new", 3)]
    delta = run_trim(spark, KEYED, [((k, v), 1) for k, v in state.items()], changes, SKIP_MIN_ROWS)
    assert applied(Counter({(k, v): 1 for k, v in state.items()}), delta) == Counter(
        {(k, v): 1 for k, v in apply_keyed(state, changes).items()})
    bag = Counter({(None, "x"): 2, (7, "y"): 1})
    delta = run_trim(spark, BAG, list(bag.items()), [("delete", None, "x", 1), ("delete", 7, "y", 1)], SKIP_MIN_ROWS)
    assert applied(bag, delta) == Counter({(None, "x"): 1})


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=keyed_case(allow_invalid=False), cut=st.floats(0, 1))
def test_splitting_across_refreshes_gives_the_same_snapshot(spark, case, cut):
    state, changes = case
    assume(changes)
    commits = sorted({c[3] for c in changes})
    boundary = commits[int(cut * (len(commits) - 1))]
    first = [c for c in changes if c[3] <= boundary]
    second = [c for c in changes if c[3] > boundary]
    start = Counter({(k, v): 1 for k, v in state.items()})
    middle = applied(start, run_trim(spark, KEYED, list(start.items()), first))
    end = applied(middle, run_trim(spark, KEYED, list(middle.items()), second)) if second else middle
    at_once = applied(start, run_trim(spark, KEYED, list(start.items()), changes))
    assert end == at_once == Counter({(k, v): 1 for k, v in apply_keyed(state, changes).items()})


def test_chains_collapse_to_nothing(spark):
    # 002 §3: insert→update→delete of one key in one range is no change at all
    changes = [("insert", 1, "a", 1), ("update_preimage", 1, "a", 2), ("update_postimage", 1, "b", 2),
               ("delete", 1, "b", 3),
               ("update_preimage", 2, "x", 4), ("update_postimage", 2, "y", 4),
               ("update_preimage", 2, "y", 5), ("update_postimage", 2, "x", 5)]
    assert run_trim(spark, KEYED, [((2, "x"), 1)], changes) == Counter()


def test_error_names_table_commit_and_row(spark):
    with pytest.raises(ChangeDataError) as e:
        run_trim(spark, KEYED, [((1, "a"), 1)], [("insert", 2, "b", 7), ("insert", 1, "c", 8)])
    assert str(e.value) == ("table t: commit version 8, row (k=1, v='c'): insert of a key that exists "
                            '(stored row {"k":1,"v":"a"}); nothing was applied (to go on without it: '
                            '`ivm log quarantine t --version 8`)')


@pytest.mark.parametrize("table", [KEYED, BAG], ids=["keyed", "bag"])
def test_nothing_to_trim_is_nothing(spark, table):
    # the check is observed on the delta's plan: a plan Spark proves empty drops the observation with it
    assert run_trim(spark, table, [], []) == Counter()
    assert run_trim(spark, table, [((1, "a"), 1)], [], SKIP_MIN_ROWS) == Counter()


def test_log_keys_are_the_ranges_keys_as_spark_reads_them(spark, tmp_path):
    """`ingest.log_keys` (a small change's keys read by pyarrow on the driver) gives the distinct values
    of the first key column among the changes `read_log` reads — commit versions in the range, the
    quarantined ones skipped — and whether one is NULL; it declines a TIMESTAMP key (whose Python value
    would depend on the time zone) and more values than the driver holds."""
    from types import SimpleNamespace

    from ivm.changes.ingest import log_keys, read_log
    from ivm.storage import Warehouse

    warehouse = Warehouse(str(tmp_path))
    table = TableConfig(columns={"d": "date", "k": "int", "v": "string"}, key=["d", "k"])
    # commit version 1 + i % 4, each version its own dates (and a NULL here and there)
    rows = [(datetime.date(2024, 1, 3 * (1 + i % 4) + i % 2) if i % 7 else None, i, "x", "insert", 1 + i % 4, i)
            for i in range(40)]
    schema = f"{table.ddl()}, _change_type STRING, _commit_version BIGINT, _seq BIGINT"
    segments = []
    for n, part in enumerate((rows[:25], rows[25:])):  # two segments: versions 1..4 in each
        path = str(tmp_path / f"segment-{n}")
        spark.createDataFrame(part, schema).write.parquet(path)
        segments.append(SimpleNamespace(path=path, min_commit_version=1, max_commit_version=4))
    for after, upto, skip in [(0, 4, ()), (1, 3, ()), (0, 4, (2, 4)), (4, 4, ())]:
        spark_reads = read_log(spark, table, segments, after, upto, skip).select("d").distinct().collect()
        expected = (sorted(r.d for r in spark_reads if r.d is not None), any(r.d is None for r in spark_reads))
        assert log_keys(warehouse, table, segments, after, upto, skip) == expected, (after, upto, skip)
    stamped = TableConfig(columns={"t": "timestamp", "v": "string"}, key=["t"])
    path = str(tmp_path / "stamped")
    spark.createDataFrame([(datetime.datetime(2024, 1, 1), "x", "insert", 1, 0)],
                          schema.replace(table.ddl(), stamped.ddl())).write.parquet(path)
    assert log_keys(warehouse, stamped, [SimpleNamespace(path=path)], 0, 1) is None
    assert warehouse.distinct_values([s.path for s in segments], "k", limit=39) is None  # 40 keys
    assert warehouse.distinct_values([s.path for s in segments], "k", limit=40) == (list(range(40)), False)
