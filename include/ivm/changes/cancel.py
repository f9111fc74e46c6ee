"""Whether a small log range changes nothing, decided on the driver with pyarrow: a refresh whose ranges
all cancel out (an insert and its delete, an update undone, a late commit that takes back an earlier
one) starts no Spark (#68 item 4).

Spark's trim (ivm.changes.trim) stays the reference; this follows the same rules (002 §3: a key's
chain collapses to its first before-image against its last after-image; a bag tuple's net effect is the
sum of its signs; every change checked, in commit order, against the row it applies to) and answers
True only where it is sure: every change in the range applies to the stored rows, and the net delta is
empty. Anything else — a change that does not apply (Spark names it), a net change, a truncate, a
range of more than CANCEL_MAX_ROWS rows, a NaN, a column pyarrow cannot compare as Spark does,
files it cannot read — answers False, and the refresh trims the range with Spark as always. The log is
read first and alone: most ranges show a net change there (an insert, a delete, an update to other
values), and the stored rows are read only for a range that may cancel, of a table of at most
CANCEL_MAX_STORED_ROWS rows (a range of updates whose before images carry the key alone shows nothing
in the log: a larger table's stored rows are Spark's to look up).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ivm.catalog.store import SegmentRef
from ivm.changes.ingest import log_range
from ivm.changes.reader import SEQ
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, COUNT_COLUMN, TableConfig
from ivm.storage import Warehouse

log = logging.getLogger(__name__)

#: a log range of more rows than this is Spark's to trim (read here, it costs the driver ~1 s per 100k)
CANCEL_MAX_ROWS = 10_000
#: the stored rows of a table larger than this are not read on the driver (Spark's trim looks them up)
CANCEL_MAX_STORED_ROWS = 1_000_000
_SIGNS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


class _Unsure(Exception):
    """Not plainly an empty, applying range: Spark trims it."""


def cancels(warehouse: Warehouse, table: TableConfig, segments: Sequence[SegmentRef], layers: Sequence[str],
            after: int, upto: int, skip: Collection[int] = (), added: Collection[str] = (),
            stored_rows: int = 0) -> bool:
    """Whether the changes of ``segments`` with commit versions in (after, upto] but ``skip`` (the
    quarantined) all apply to the table's stored rows (the files of its ``layers``, ``stored_rows`` of
    them) and cancel out. ``added``: columns gained since the table held data (a removal that leaves one
    NULL matches on the others, as in `ivm.changes.trim`)."""
    try:
        changes = _changes(warehouse, segments, after, upto, skip)
        if changes is None:
            return False
        chains = _chains(changes, table)
        # the log alone shows most net changes: the stored rows are read only for a range that may cancel
        check = _KeyedChains(table, added) if table.keyed else None
        (check.cancel if check else _bag_cancel)(chains, None)
        if stored_rows > CANCEL_MAX_STORED_ROWS:
            raise _Unsure(f"{stored_rows} stored rows to look the changes up in")
        (check.cancel if check else _bag_cancel)(chains, _stored(warehouse, table, layers, changes))
        return True
    except _Unsure as e:
        log.debug("the range (%s, %s] is trimmed by Spark: %s", after, upto, e)
    except (OSError, KeyError, TypeError, ValueError, pa.ArrowException) as e:
        log.info("the range (%s, %s] is trimmed by Spark: %s", after, upto, e)
    return False


def _changes(warehouse: Warehouse, segments: Sequence[SegmentRef], after: int, upto: int,
             skip: Collection[int]) -> pa.Table | None:
    """The range's changes in commit order (None: too many, or a truncate among them)."""
    if sum(s.rows for s in segments) > CANCEL_MAX_ROWS or any(s.truncates_in(after, upto, skip) for s in segments):
        return None
    data = warehouse.read_arrow([s.path for s in segments], log_range(after, upto, skip))
    if data is None:
        return None
    data = data.sort_by([(COMMIT_VERSION, "ascending"), (SEQ, "ascending")])
    _check_pairing(data)
    return data


def _check_pairing(changes: pa.Table) -> None:
    """Within a commit, each update_postimage pairs with an update_preimage before it, and none is left
    open (`ivm.changes.trim._events`)."""
    open_: dict[int, int] = defaultdict(int)
    for version, kind in zip(changes.column(COMMIT_VERSION).to_pylist(), changes.column(CHANGE_TYPE).to_pylist(),
                             strict=True):
        open_[version] += {"update_preimage": 1, "update_postimage": -1}.get(kind, 0)
        if open_[version] < 0:
            raise _Unsure("an update_postimage without its preimage")
    if any(open_.values()):
        raise _Unsure("an update_preimage without its postimage")


def _rows(data: pa.Table, columns: list[str]) -> list[tuple]:
    """The rows of ``columns`` as tuples; a NaN (Spark's equality and Python's differ on it) is unsure."""
    rows = list(zip(*[data.column(c).to_pylist() for c in columns], strict=True))
    if any(isinstance(v, float) and math.isnan(v) for r in rows for v in r):
        raise _Unsure("a NaN")
    return rows


def _chains(changes: pa.Table, table: TableConfig) -> dict[tuple, list[tuple[int, tuple]]]:
    """Each key's (a bag tuple's) changes in commit order, as (sign, row)."""
    columns = list(table.columns)
    at = [columns.index(c) for c in table.key or columns]
    chains: dict[tuple, list[tuple[int, tuple]]] = defaultdict(list)
    for kind, row in zip(changes.column(CHANGE_TYPE).to_pylist(), _rows(changes, columns), strict=True):
        if kind not in _SIGNS:  # (a truncate: `_changes` saw none)
            raise _Unsure(kind)
        chains[tuple(row[i] for i in at)].append((_SIGNS[kind], row))
    return chains


def _stored(warehouse: Warehouse, table: TableConfig, layers: Sequence[str], changes: pa.Table) -> Counter:
    """The stored rows at the changes' keys (found by the first key column), with their copies."""
    columns = list(table.columns)
    first = (table.key or columns)[0]
    found: Counter = Counter()
    data = warehouse.read_arrow(layers, pc.field(first).isin(pc.unique(changes.column(first))))
    if data is None:
        return found
    # (the stored columns read as the log's types: a timestamp's zone, a decimal's scale)
    rows = pa.table({c: data.column(c).cast(changes.schema.field(c).type) for c in columns})
    for row, n in zip(_rows(rows, columns), data.column(COUNT_COLUMN).to_pylist(), strict=True):
        found[row] += n
    return found


class _KeyedChains:
    """A keyed table's chains checked as `ivm.changes.trim._keyed` checks them."""

    def __init__(self, table: TableConfig, added: Collection[str]):
        columns = list(table.columns)
        self.columns, self.added = columns, set(added)
        self.key = [columns.index(c) for c in table.key or []]
        self.rest = [i for i in range(len(columns)) if i not in self.key]

    def key_only(self, row: tuple) -> bool:
        """A removal naming its key alone: every other column NULL (`ivm.changes.trim._key_only`)."""
        return bool(self.rest) and all(row[i] is None for i in self.rest)

    def matches(self, stored: tuple, change: tuple) -> bool:
        """A removal's row is the stored one, column by column — but a column gained since (``added``)
        that the removal leaves NULL matches any value (`ivm.changes.trim._matches`)."""
        return all(s == c or (c is None and name in self.added)
                   for s, c, name in zip(stored, change, self.columns, strict=True))

    def cancel(self, chains: dict[tuple, list[tuple[int, tuple]]], found: Counter | None) -> None:
        """Raise unless every key's chain applies to its stored row and ends where it began. Without
        ``found`` (the log alone): raise for a chain that cannot end where it began, whatever is stored —
        one that starts and ends by adding (or by removing), or one whose first removal carries a whole
        row that its last addition does not give back."""
        if found is None:
            for (first_sign, first), (last_sign, last) in ((c[0], c[-1]) for c in chains.values()):
                if first_sign == last_sign or (first_sign < 0 and not self.key_only(first)
                                               and not self.matches(last, first)):
                    raise _Unsure("a net change")
            return
        stored: dict[tuple, tuple] = {}
        for row, n in found.items():
            if n not in (0, 1):
                raise _Unsure("a keyed row stored with a count other than 1")
            if n:
                stored[tuple(row[i] for i in self.key)] = row
        for key, chain in chains.items():
            before = row = stored.get(key)
            for sign, change in chain:
                if sign > 0 and row is not None:
                    raise _Unsure("an insert of a key that exists")
                if sign < 0 and (row is None or not (self.key_only(change) or self.matches(row, change))):
                    raise _Unsure("a removal that does not apply")
                row = change if sign > 0 else None
            if row != before:
                raise _Unsure("a net change")


def _bag_cancel(chains: dict[tuple, list[tuple[int, tuple]]], stored: Counter | None) -> None:
    """Raise unless every tuple's signs sum to zero and (with ``stored``) its copies never go below none."""
    for row, chain in chains.items():
        if sum(sign for sign, _ in chain):
            raise _Unsure("a net change")
        copies = 0 if stored is None else stored.get(row, 0)
        for sign, _ in chain:
            copies += sign
            if stored is not None and copies < 0:
                raise _Unsure("a delete of a row that is not there")
