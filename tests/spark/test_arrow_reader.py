"""`ivm log append` reads a small change file without a JVM (ivm.changes.arrow_reader): the same files
read both ways. Where the Arrow reader takes a file, its rows must be those of Spark's reader
(ivm.changes.reader) and Spark's must hold no bad row; every file Spark finds a bad row in must be
declined (Spark words the error). Files of well-formed values must be taken, or the reader would be
Spark's alone."""

from __future__ import annotations

import csv
import datetime
import decimal
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivm.changes import arrow_reader, reader
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, TableConfig

TABLE = TableConfig(columns={"order_id": "bigint", "day": "date", "at": "timestamp", "amount": "decimal(12,2)",
                             "price": "double", "qty": "int", "note": "string", "paid": "boolean",
                             "small": "smallint"}, key=["order_id"])
ARROW = {"order_id": pa.int64(), "day": pa.date32(), "at": pa.timestamp("us", tz="UTC"),
         "amount": pa.decimal128(12, 2), "price": pa.float64(), "qty": pa.int32(), "note": pa.string(),
         "paid": pa.bool_(), "small": pa.int16()}

clean = {
    "order_id": st.integers(-(2 ** 63), 2 ** 63 - 1),
    "day": st.dates(datetime.date(1900, 1, 1), datetime.date(2200, 12, 31)),
    "at": st.datetimes(datetime.datetime(1950, 1, 1), datetime.datetime(2100, 1, 1)),
    "amount": st.decimals(-(10 ** 10) + 1, 10 ** 10 - 1, places=2),
    "price": st.floats(allow_nan=False, allow_infinity=False, width=64),
    "qty": st.integers(-(2 ** 31), 2 ** 31 - 1),
    "note": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8),
    "paid": st.booleans(),
    "small": st.integers(-(2 ** 15), 2 ** 15 - 1),
}
# text Spark reads by rules of its own (or refuses): the Arrow reader must decline it, or agree
odd_text = st.sampled_from([" 12", "+5", "1.0", "1e2", "2024-1-2", "2024-01-02 10:00", "2024-01-02T10:00:00Z",
                            "TRUE", "yes", "1", "0.125", "NaN", "", "99999999999", "2024-02-30", "-0", "007",
                            "12.345", "a,b", 'say "hi"', "x\\y", " padded ", "2024-01-02T03:04:05.1234567",
                            "\u0663", "\uff11\uff12", "t", "1_000"])


def _text(column: str, value) -> str:
    """A value as a CSV or JSON string holds it, in its plain form."""
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bool):
        return str(value).lower()
    return value.isoformat() if isinstance(value, datetime.date) else str(value) if value is not None else ""


@st.composite
def change_files(draw, odd: bool):
    n = draw(st.integers(0, 6))
    rows = []
    for _ in range(n):
        row = {c: draw(st.none() | s) if c != "order_id" else draw(s) for c, s in clean.items()}
        if odd and draw(st.booleans()):
            row[draw(st.sampled_from(list(clean)))] = draw(odd_text)
        rows.append(row)
    kinds = [draw(st.sampled_from(["insert", "delete", "update_preimage", "update_postimage", " Insert",
                                   "DELETE"] + (["upsert"] if odd else []))) for _ in rows]
    versioned = draw(st.booleans())
    versions = [draw(st.integers(1, 10 ** 12)) for _ in rows] if versioned else [None] * n
    if odd and versioned and n and draw(st.booleans()):
        versions[draw(st.integers(0, n - 1))] = draw(st.sampled_from([None, "7", "x"]))
    return rows, kinds, versions, draw(st.sampled_from(["csv", "jsonl", "parquet"]))


def _write(path, rows, kinds, versions, fmt, odd: bool, snapshot: bool = False) -> None:
    """A change file of the drawn rows (a ``snapshot``: the rows alone, for `ivm load`)."""
    columns = list(TABLE.columns)
    extra = [] if snapshot else [CHANGE_TYPE] + ([COMMIT_VERSION] if any(v is not None for v in versions) else [])
    if fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns + extra)
            for r, k, v in zip(rows, kinds, versions, strict=True):
                w.writerow([_text(c, r[c]) for c in columns] + [k][:len(extra)]
                           + ([_text("", v)] if len(extra) > 1 else []))
    elif fmt == "jsonl":
        def plain(c, value):
            return _text(c, value) if isinstance(value, datetime.date) else value

        def dump(value):  # (decimals as JSON numbers, written exactly)
            return json.dumps(value, default=str).replace('"__dec__', "").replace('__dec__"', "")
        with open(path, "w") as f:
            for r, k, v in zip(rows, kinds, versions, strict=True):
                doc = {c: plain(c, r[c]) for c in columns}
                doc = {c: f"__dec__{x}__dec__" if isinstance(x, decimal.Decimal) else x for c, x in doc.items()}
                f.write(dump({**doc, **({CHANGE_TYPE: k} if extra else {}),
                              **({COMMIT_VERSION: v} if len(extra) > 1 else {})}) + "\n")
    else:
        def typed(c):
            values = [r[c] for r in rows]
            if ARROW[c] != pa.string() and any(isinstance(x, str) for x in values):  # (an odd value)
                return pa.array([None if x is None else _text(c, x) for x in values], pa.string())
            if c == "at":
                values = [None if x is None else x.replace(tzinfo=datetime.UTC) for x in values]
            return pa.array(values, ARROW[c])
        data = {c: typed(c) for c in columns}
        if extra:
            data[CHANGE_TYPE] = pa.array(kinds, pa.string())
        if len(extra) > 1:
            data[COMMIT_VERSION] = pa.array([None if v is None else int(v) if str(v).isdigit() else None
                                             for v in versions], pa.int64())
        pq.write_table(pa.table(data), path)


@st.composite
def debezium_files(draw, odd: bool):
    """Debezium events over drawn rows: c/r/u/d with their images, t (a truncate) with none, wrapped or
    not, tombstones, versions from source.lsn, ts_ms or source.ts_ms; odd ones with an odd value, op,
    image or version."""
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        image = {c: draw(st.none() | s) if c != "order_id" else draw(s) for c, s in clean.items()}
        if odd and draw(st.booleans()):
            image[draw(st.sampled_from(list(clean)))] = draw(odd_text)
        doc = {c: _text(c, v) if isinstance(v, datetime.date) else v for c, v in image.items()}
        op = draw(st.sampled_from(["c", "r", "u", "d", "t"] + (["x", None] if odd else [])))
        event = {"op": op, "before": doc if op in ("u", "d") else None, "after": doc if op in ("c", "r", "u") else None}
        if odd and draw(st.booleans()):
            event[draw(st.sampled_from(["before", "after"]))] = draw(st.sampled_from([None, 5, {"order_id": 1}]))
        where = draw(st.sampled_from(["lsn", "ts_ms", "source.ts_ms"]))
        version = draw(st.integers(1, 10 ** 12) | (st.sampled_from(["7", 1.5, None]) if odd else st.nothing()))
        if where == "lsn":
            event["source"] = {"lsn": version, "ts_ms": 1}
        elif where == "ts_ms":
            event["ts_ms"] = version
        else:
            event["source"] = {"ts_ms": version}
        if draw(st.booleans()):
            event = {"schema": {}, "payload": event}
        lines.append(event)
        if draw(st.integers(0, 4)) == 0:
            lines.append(draw(st.sampled_from([None, {"schema": {}, "payload": None}])))  # tombstones
    return lines


def _spark_rows(spark, path, fmt: str = "cdf"):
    read = reader.read_cdf if fmt == "cdf" else reader.read_debezium
    df = read(spark, "orders", TABLE, str(path))
    got = df.orderBy(reader.SEQ).toArrow()
    bad = [x for x in got.column(reader.BAD).to_pylist() if x is not None]
    return got.drop_columns([reader.BAD, reader.RAW, reader.SEQ]).to_pylist(), bad


def _check(spark, tmp_path, drawn, odd: bool):
    if isinstance(drawn, list):  # Debezium events
        fmt, path = "debezium", tmp_path / "events.jsonl"
        path.write_text("".join(json.dumps(e, default=str).replace('"__dec__', "").replace('__dec__"', "") + "\n"
                                for e in _decimals_as_numbers(drawn)))
    else:
        rows, kinds, versions, fmt = drawn
        path = tmp_path / f"changes.{fmt}"
        path.unlink(missing_ok=True)
        _write(path, rows, kinds, versions, fmt, odd)
    fmt = "debezium" if fmt == "debezium" else "cdf"
    got = arrow_reader.read(fmt, TABLE, str(path))
    try:
        expected, bad = _spark_rows(spark, path, fmt)
    except Exception as e:  # (Spark's CSV parser fails a whole file it cannot split into records)
        assert got is None, f"Spark cannot read a file the Arrow reader took: {str(e).splitlines()[0]}"
        return None
    if bad:
        assert got is None, f"Spark found bad rows ({bad[0]}) in a file the Arrow reader took"
        return None
    if got is not None:
        assert got.column(reader.SEQ).to_pylist() == list(range(got.num_rows))
        assert got.drop_columns([reader.SEQ]).to_pylist() == expected
    return got


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])


@SETTINGS
@given(drawn=change_files(odd=False))
def test_well_formed_files_read_as_spark_reads_them(spark, tmp_path, drawn):
    rows, kinds, versions, fmt = drawn
    got = _check(spark, tmp_path, drawn, odd=False)
    # (a CSV holding a quote or a backslash in a note is Spark's to read: its escaping differs)
    tricky = fmt == "csv" and any(r["note"] is not None and ('"' in r["note"] or "\\" in r["note"]
                                                             or "\n" in r["note"] or "\r" in r["note"]
                                                             or r["note"] == "" or r["note"].strip() != r["note"])
                                  for r in rows)
    if not tricky:
        assert got is not None, "the Arrow reader declined a well-formed file"


@SETTINGS
@given(drawn=change_files(odd=True))
def test_odd_files_are_declined_or_read_as_spark_reads_them(spark, tmp_path, drawn):
    _check(spark, tmp_path, drawn, odd=True)


def _decimals_as_numbers(value):
    """Decimals marked so that `_check` writes them as JSON numbers, exactly."""
    if isinstance(value, dict):
        return {k: _decimals_as_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decimals_as_numbers(v) for v in value]
    return f"__dec__{value}__dec__" if isinstance(value, decimal.Decimal) else value


@SETTINGS
@given(events=debezium_files(odd=False))
def test_debezium_events_read_as_spark_reads_them(spark, tmp_path, events):
    assert _check(spark, tmp_path, events, odd=False) is not None, "the Arrow reader declined plain events"


@SETTINGS
@given(events=debezium_files(odd=True))
def test_odd_debezium_events_are_declined_or_read_as_spark_reads_them(spark, tmp_path, events):
    _check(spark, tmp_path, events, odd=True)


@SETTINGS
@given(drawn=change_files(odd=False) | change_files(odd=True))
def test_snapshot_files_are_declined_or_read_as_spark_reads_them(spark, tmp_path, drawn):
    """`ivm load`'s files (the rows alone): the Arrow reader's rows are Spark's `read_snapshot`'s, a file
    Spark finds a bad row in is declined, and a well-formed file of plain values is taken."""
    rows, kinds, versions, fmt = drawn
    path = tmp_path / f"snapshot.{fmt}"
    path.unlink(missing_ok=True)
    _write(path, rows, kinds, versions, fmt, odd=True, snapshot=True)
    got = arrow_reader.read_snapshot(TABLE, str(path))
    try:
        df = reader.read_snapshot(spark, "orders", TABLE, str(path)).orderBy(reader.SEQ).toArrow()
    except Exception as e:  # (Spark's CSV parser fails a whole file it cannot split into records)
        assert got is None, f"Spark cannot read a file the Arrow reader took: {str(e).splitlines()[0]}"
        return
    bad = [x for x in df.column(reader.BAD).to_pylist() if x is not None]
    if bad:
        assert got is None, f"Spark found bad rows ({bad[0]}) in a file the Arrow reader took"
        return
    plain = all(isinstance(r[c], str) is (c == "note") or r[c] is None for r in rows for c in r) and not (
        fmt == "csv" and any(r["note"] is not None and (r["note"] == "" or r["note"].strip() != r["note"]
                                                        or any(ch in r["note"] for ch in '"\\\n\r'))
                             for r in rows))
    if got is None:
        assert not plain or not rows, "the Arrow reader declined a well-formed snapshot"
        return
    assert got.column(reader.SEQ).to_pylist() == list(range(got.num_rows))
    expected = df.drop_columns([reader.BAD, reader.RAW, reader.SEQ]).to_pylist()
    assert got.drop_columns([reader.SEQ]).to_pylist() == expected


@pytest.mark.parametrize("content, fmt", [
    ("order_id,day,_change_type\n1,2024-01-01,insert\n", "csv"),             # columns missing
    ('{"order_id": 1, "nope": 2, "_change_type": "insert"}\n', "jsonl"),      # an unknown column
    ("order_id,_change_type\n", "csv"),
])
def test_files_spark_refuses_whole_are_declined(tmp_path, content, fmt):
    path = tmp_path / f"c.{fmt}"
    path.write_text(content)
    assert arrow_reader.read("cdf", TABLE, str(path)) is None
