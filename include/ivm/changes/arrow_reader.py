"""Reading a small change file (native or Debezium) or snapshot file on the driver with pyarrow and
Python: `ivm log append` and `ivm load` without a JVM (#49 item 4: a script that appends a few changes
spent most of its time starting Spark).

Spark's reader (ivm.changes.reader) stays the reference. This one takes a file only where its rows are
sure to be Spark's, and hands anything else to Spark by returning None:

* a file past APPEND_WITHOUT_JVM_MB, a directory, or a remote file;
* a table with a column of a type not read here (nested, FLOAT, VARCHAR, TIMESTAMP_NTZ, BINARY, ...), or
  a TIMESTAMP column in a project whose Spark session is not in UTC;
* a value Spark reads by rules of its own: a number with spaces, a '+' or an exponent where a whole
  number or a decimal goes, '1.0' for an integer, a decimal with more digits than its type keeps (Spark
  rounds), a date other than yyyy-mm-dd, a timestamp with a zone, a boolean other than true/false;
* a CSV with a backslash or a doubled quote (Spark's CSV escapes with backslashes, RFC 4180's by
  doubling), a line break inside a value, a row with more or fewer fields than the header;
* a JSON line that is not a plain object (repeated keys, NaN, a nested value for a flat column), a
  number for a STRING or a string for a number; a Debezium event whose op, image or version is not
  plainly there (an op other than c, r, u, d, t; a missing image; a version that is not a JSON integer);
* a Parquet column of another type than the table's;
* and every bad row: Spark's reader names it in its error.

So a file gets exactly the rows Spark's reader would give it, or goes through Spark, which also words
every error. tests/spark/test_arrow_reader.py reads the same random files both ways and compares.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
import os
import re
from collections.abc import Callable, Collection
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ivm.changes.reader import CHANGE_TYPES, SEQ, TRUNCATE, check_file_columns, file_format
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, TableConfig
from ivm.errors import ChangeDataError

#: a change file larger than this is read by Spark (parsing here costs ~1 s per few MiB)
APPEND_WITHOUT_JVM_MB = 8

# (ASCII: Python's \d and int() take any script's digits, Spark's casts only 0-9)
_WHOLE = re.compile(r"-?\d+\Z", re.ASCII)
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\Z", re.ASCII)
_DECIMAL = re.compile(r"-?\d+(\.\d+)?\Z", re.ASCII)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z", re.ASCII)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}:\d{2}(\.\d{1,6})?)?\Z", re.ASCII)
_DECIMAL_TYPE = re.compile(r"DECIMAL(?:\((\d+), (\d+)\))?\Z")
_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64}
_UTC_NAMES = {"UTC", "Etc/UTC", "+00:00", "Z"}


class _Decline(Exception):
    """The file may not read here as Spark reads it: Spark reads it."""


Convert = Callable[[object], object]


def read(fmt: str, table: TableConfig, path: str, optional: Collection[str] = (),
         time_zone: str = "UTC") -> pa.Table | None:
    """A change file's rows as Spark's reader gives them when no row is bad (`read_cdf`, or for ``fmt``
    "debezium" `read_debezium`): the table's columns in their Arrow types, ``_change_type`` (lower
    case), ``_commit_version`` (NULL when a native file has none) and ``_seq`` (the rows' order in the
    file); None when Spark must read it."""
    return _read(fmt, table, path, optional, time_zone, changes=True)


def read_snapshot(table: TableConfig, path: str, time_zone: str = "UTC") -> pa.Table | None:
    """A snapshot file's rows (`ivm load`) as Spark's reader gives them when no row is bad
    (`read_snapshot`): the table's columns in their Arrow types and ``_seq``; None when Spark must read it."""
    return _read(file_format(path), table, path, (), time_zone, changes=False)


def check_columns(name: str, table: TableConfig, path: str, fmt: str = "cdf", optional: Collection[str] = (),
                  changes: bool = True) -> None:
    """A local file's columns against the table's, for a file `read` declined, before Spark starts (a
    misspelt column answered in milliseconds, not after a JVM's start): a CSV's header, a Parquet file's
    schema, the keys of small JSON lines — the check Spark's reader makes (`check_file_columns`), in its
    words. Debezium events, large JSON lines (any line may name a column) and remote files are Spark's to
    check."""
    if fmt == "debezium" or "://" in path or not Path(path).is_file():
        return
    kind = file_format(path)
    try:
        if kind == "csv":
            with open(path, newline="", encoding="utf-8") as f:
                names = next(csv.reader(f), [])
        elif kind == "parquet":
            names = pq.read_schema(path).names
        elif os.path.getsize(path) <= APPEND_WITHOUT_JVM_MB * 2**20:
            names = _json_lines(path)[0]
            if not names:  # (no line names a column: Spark's reader decides)
                return
        else:
            return
    except (_Decline, ValueError, UnicodeError, csv.Error, pa.ArrowException, OSError):
        return  # (a file pyarrow or Python cannot read: Spark's reader words what is wrong)
    check_file_columns(name, table, names, {CHANGE_TYPE, COMMIT_VERSION} if changes else set(), path, optional)


def _read(fmt: str, table: TableConfig, path: str, optional: Collection[str], time_zone: str,
          changes: bool) -> pa.Table | None:
    if "://" in path or not Path(path).is_file() or os.path.getsize(path) > APPEND_WITHOUT_JVM_MB * 2**20:
        return None
    columns = {c: _column(t, time_zone) for c, t in table.columns.items()}
    if any(c is None for c in columns.values()):
        return None
    try:
        if fmt == "debezium":
            return _build(table, _debezium(table, path, optional), optional, columns, "debezium")
        kind = file_format(path)
        if kind == "parquet":
            return _parquet(table, path, optional, columns, changes)
        records = _csv(path) if kind == "csv" else _json_lines(path)
        return _build(table, records, optional, columns, kind, changes)
    except (_Decline, ChangeDataError, ValueError, UnicodeError, csv.Error, pa.ArrowException,
            decimal.DecimalException):  # (ChangeDataError: Spark's own column checks, `_check_names`)
        return None


def _column(type_text: str, time_zone: str) -> tuple[pa.DataType, Convert, Convert] | None:
    """A column type's Arrow type and converters from CSV text and from a JSON value (each raising
    _Decline for a value Spark may read otherwise); None for a type not read here."""
    if type_text in _INT_BITS:
        bits = _INT_BITS[type_text]

        def whole(v: int) -> int:
            if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
                raise _Decline(type_text)
            return v
        return (pa.int8() if bits == 8 else pa.int16() if bits == 16 else pa.int32() if bits == 32 else pa.int64(),
                lambda s: whole(int(_match(_WHOLE, s))), lambda v: whole(_of(v, int)))
    if type_text == "DOUBLE":
        return pa.float64(), lambda s: float(_match(_NUMBER, s)), lambda v: float(_of(v, int, decimal.Decimal))
    if type_text == "STRING":
        return pa.string(), lambda s: s, lambda v: _of(v, str)
    if type_text == "BOOLEAN":
        def boolean(s: str) -> bool:
            if s.lower() not in ("true", "false"):  # (Spark takes t, y, yes, 1, ... too)
                raise _Decline(s)
            return s.lower() == "true"
        return pa.bool_(), boolean, lambda v: _of(v, bool)
    if type_text == "DATE":
        def date(s) -> datetime.date:
            return datetime.date.fromisoformat(_match(_DATE, s))
        return pa.date32(), date, lambda v: date(_of(v, str))
    if type_text == "TIMESTAMP":
        if time_zone not in _UTC_NAMES:  # (Spark reads a zone-less timestamp in the session's zone)
            return None

        def timestamp(s) -> datetime.datetime:
            return datetime.datetime.fromisoformat(_match(_TIMESTAMP, s)).replace(tzinfo=datetime.UTC)
        return pa.timestamp("us", tz="UTC"), timestamp, lambda v: timestamp(_of(v, str))
    m = _DECIMAL_TYPE.match(type_text)
    if m:
        precision, scale = (int(m[1]), int(m[2])) if m[1] else (10, 0)

        def exact(d: decimal.Decimal) -> decimal.Decimal:
            q = d.quantize(decimal.Decimal(1).scaleb(-scale))
            if q != d or len(q.as_tuple().digits) > precision:  # (Spark would round, or refuse it)
                raise _Decline(type_text)
            return q
        return (pa.decimal128(precision, scale), lambda s: exact(decimal.Decimal(_match(_DECIMAL, s))),
                lambda v: exact(decimal.Decimal(_of(v, int, decimal.Decimal))))
    return None


def _match(pattern: re.Pattern, s: str) -> str:
    if not pattern.match(s):
        raise _Decline(s)
    return s


def _of(value, *types):
    """``value`` if it is one of ``types`` (a JSON boolean is not a number here)."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise _Decline(repr(value))
    return value


def _csv(path: str) -> tuple[list[str], list[list[str | None]]]:
    """A CSV's header and rows, each field as text or None (an empty field: Spark's NULL)."""
    raw = Path(path).read_bytes()
    if b"\\" in raw or b'""' in raw or raw.startswith((b"\xef\xbb\xbf", b"\n", b"\r")):
        raise _Decline("escapes")
    # strict: a quote must close a quoted value right before a comma or the line's end; a quote left
    # inside a value (`ab"`, ` "a"`) is read differently by Spark's CSV parser, so it is declined too
    rows = [r for r in csv.reader(io.StringIO(raw.decode("utf-8"), newline=""), strict=True) if r]
    if not rows:
        return [], []
    header, body = rows[0], rows[1:]
    if len(set(header)) != len(header) or any(len(r) != len(header) for r in body) \
            or any(ch in f for r in rows for f in r for ch in '"\n\r'):
        raise _Decline("shape")
    return header, [[f if f != "" else None for f in r] for r in body]


def _unique_keys(pairs: list[tuple]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Decline("a repeated key")
    return dict(pairs)


def _no_constant(name: str):
    raise _Decline(name)


def _json_lines(path: str, skip: tuple[str, ...] = ("",)) -> tuple[list[str], list[dict]]:
    """JSON lines as objects (lines of spaces skipped, as Spark's reader does, and of ``skip``); the keys
    any line names."""
    text = Path(path).read_bytes().decode("utf-8")
    objects = [json.loads(line, parse_float=decimal.Decimal, parse_constant=_no_constant,
                          object_pairs_hook=_unique_keys)
               for line in re.split(r"\r\n|\r|\n", text) if line.strip(" ") not in skip]
    if not all(isinstance(o, dict) for o in objects):
        raise _Decline("not an object")
    return _keys(objects), objects


def _keys(objects: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for o in objects for k in o))


#: a Debezium op's rows: (change type, image; None: the row's columns are NULL)
_OPS = {"c": [("insert", "after")], "r": [("insert", "after")], "d": [("delete", "before")],
        "u": [("update_preimage", "before"), ("update_postimage", "after")], "t": [(TRUNCATE, None)]}


def _debezium(table: TableConfig, path: str, optional: Collection[str]) -> tuple[list[str], list[dict]]:
    """Debezium change events (ivm.changes.reader.read_debezium) as rows of the table's columns with
    their change type and commit version (``source.lsn``, else ``ts_ms``, else ``source.ts_ms``);
    tombstones skipped. Each image's keys are checked as Spark checks them, so no names are returned."""
    rows, images = [], {"before": [], "after": []}
    for event in _json_lines(path, skip=("", "null"))[1]:
        if "payload" in event:  # (the Kafka Connect wrapper)
            event = event["payload"]
            if event is None:
                continue  # a tombstone
            if not isinstance(event, dict):
                raise _Decline("payload")
        for image, found in images.items():
            if event.get(image) is not None:
                found.append(_of(event[image], dict))
        op = event.get("op")
        source = event.get("source")
        source = {} if source is None else _of(source, dict)
        versions = [v for v in (source.get("lsn"), event.get("ts_ms"), source.get("ts_ms")) if v is not None]
        if not isinstance(op, str) or op not in _OPS or not versions \
                or any(not isinstance(v, int) or isinstance(v, bool) for v in versions):
            raise _Decline("op or version")
        for kind, image in _OPS[op]:
            values = {} if image is None else _of(event.get(image), dict)
            rows.append({**values, CHANGE_TYPE: kind, COMMIT_VERSION: versions[0]})
    for found in images.values():
        names = _keys(found)
        if names:  # (Spark checks an image's keys where some event has that image; no extra column)
            _check_names(table, names, optional, extra=set())
    return [], rows


def _build(table: TableConfig, records: tuple[list[str], list], optional: Collection[str],
           columns: dict, fmt: str, changes: bool = True) -> pa.Table:
    """The rows of a CSV (lists of text) or JSON lines (objects) converted column by column; of a change
    file (with ``_change_type``, ``_commit_version``) or, not ``changes``, of a snapshot."""
    names, rows = records
    if fmt == "csv" or names or not changes:
        # (Spark checks a change file's JSON keys when some line has one; `_debezium` its own)
        _check_names(table, names, optional, change_type=changes and fmt == "csv",
                     extra=(CHANGE_TYPE, COMMIT_VERSION) if changes else ())
    if fmt == "csv":
        at = {n: i for i, n in enumerate(names)}
        rows = [{n: r[i] for n, i in at.items()} for r in rows]
    out = {}
    for c, (arrow_type, from_text, from_json) in columns.items():
        convert = from_text if fmt == "csv" else from_json
        values = [None if r.get(c) is None else convert(r[c]) for r in rows]
        if c in (table.key or []) and any(v is None and r.get(CHANGE_TYPE) != TRUNCATE
                                          for v, r in zip(values, rows, strict=True)):
            raise _Decline(f"a NULL key {c}")
        out[c] = pa.array(values, arrow_type)
    if changes:
        change = [_change_type(r.get(CHANGE_TYPE), fmt == "debezium") for r in rows]
        versions = [_version(r.get(COMMIT_VERSION)) for r in rows]
        if len({v is None for v in versions}) > 1:
            raise _Decline("some rows without a commit version")
        out[CHANGE_TYPE] = pa.array(change, pa.string())
        out[COMMIT_VERSION] = pa.array(versions, pa.int64())
    out[SEQ] = pa.array(range(len(rows)), pa.int64())
    return pa.table(out)


def _check_names(table: TableConfig, names: list[str], optional: Collection[str], change_type: bool = False,
                 extra: Collection[str] = (CHANGE_TYPE, COMMIT_VERSION)) -> None:
    """Spark's reader's own check of a file's columns (`ivm.changes.reader.check_file_columns`: an unknown or a
    missing one raises), and a missing change type declined; Spark names them."""
    check_file_columns("", table, names, set(extra), "", optional)
    if change_type and CHANGE_TYPE not in names:
        raise _Decline("columns")


def _change_type(value, debezium: bool = False) -> str:
    """A native file's change type as Spark's reader reads it, or the type `_debezium` gave a row."""
    kind = _of(value, str).strip(" ").lower()  # (Spark's trim takes spaces only)
    if kind not in CHANGE_TYPES and not (debezium and kind == TRUNCATE):
        raise _Decline(kind)
    return kind


def _version(value) -> int | None:
    if value is None:
        return None
    v = int(_match(_WHOLE, value)) if isinstance(value, str) else _of(value, int)
    if not -(2 ** 63) <= v < 2 ** 63:
        raise _Decline("a commit version out of range")
    return v


def _parquet(table: TableConfig, path: str, optional: Collection[str], columns: dict,
             changes: bool = True) -> pa.Table:
    """A Parquet file whose columns have the table's types already (timestamps in UTC, any unit)."""
    data = pq.read_table(path)
    names = data.column_names
    if len(set(names)) != len(names):
        raise _Decline("repeated columns")
    _check_names(table, names, optional, change_type=changes, extra=(CHANGE_TYPE, COMMIT_VERSION) if changes else ())
    n = data.num_rows
    out = {}
    for c, (arrow_type, _, _) in columns.items():
        if c not in names:
            out[c] = pa.nulls(n, arrow_type)
            continue
        col = data.column(c)
        if pa.types.is_timestamp(col.type) and pa.types.is_timestamp(arrow_type) and \
                (col.type.tz is None or col.type.tz in _UTC_NAMES):
            col = col.cast(arrow_type)  # (safe: a nanosecond Spark would cut off stops it)
        elif col.type != arrow_type:
            raise _Decline(f"{c}: {col.type}")
        if c in (table.key or []) and col.null_count:
            raise _Decline(f"a NULL key {c}")
        out[c] = col
    if not changes:
        out[SEQ] = pa.array(range(n), pa.int64())
        return pa.table(out)
    if not pa.types.is_string(data.column(CHANGE_TYPE).type):
        raise _Decline(CHANGE_TYPE)
    out[CHANGE_TYPE] = pa.array([_change_type(v) for v in data.column(CHANGE_TYPE).to_pylist()], pa.string())
    if COMMIT_VERSION in names:
        versions = data.column(COMMIT_VERSION)
        if not pa.types.is_integer(versions.type) or 0 < versions.null_count < n:
            raise _Decline(COMMIT_VERSION)
        out[COMMIT_VERSION] = versions.cast(pa.int64())
    else:
        out[COMMIT_VERSION] = pa.nulls(n, pa.int64())
    out[SEQ] = pa.array(range(n), pa.int64())
    return pa.table(out)
