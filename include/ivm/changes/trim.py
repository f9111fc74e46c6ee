"""Trimming a change log into one net delta per table (002 §3, "Extracting Relevant Changes from Logs").

002 §3 hashes the log entries past a view's maintenance pointer by tuple id and collapses
insert-remove, replace-remove, replace-replace and insert-replace pairs into their net effect. Here the
"hash table" is a Spark shuffle by key: for a keyed table, every key's chain of changes in commit order
collapses to its first before-image against its last after-image (insert→update→delete vanishes; an
update that restores the old row is a no-op); for an unkeyed (bag) table the net effect of a tuple is
the sum of its signed counts. The result is a Z-set delta (docs/design.md §2).

A truncate (a Debezium ``op: t``) deletes every row the table holds at its position: a range that holds
one reads the table whole, and each key's (a bag tuple's) chain restarts empty after it — its changes
are numbered by the truncates before them (their era), checked within their era, and the net delta
keeps only what the last era added.

The changes are checked in order against the snapshot they apply to (restricted to the keys in
play) in the same Spark plan that computes the net delta: the check is observed (a Spark Observation)
while the delta is written, and the first bad change is reported with its table, commit version and
row — a delete or update of a row that is not there, an insert of a key that exists, an update image
without its partner — before anything is applied (the caller drops what it wrote).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F

from ivm.changes.delta import named_version, version_noun
from ivm.changes.reader import SEQ, TRUNCATE, describe_row
from ivm.config import CHANGE_TYPE, COMMIT_VERSION, COUNT_COLUMN, TableConfig
from ivm.errors import BadChange
from ivm.spark import observed
from ivm.zset import SKIP_MIN_ROWS, KeyBounds, at_values, consolidate, key_bounds, one_partition, restrict, row_struct

SIGN = "__sign"
ROW = "__row"
IS_OLD = "__old"
PROBLEM = "__problem"
PREV_SIGN, PREV_ROW, IS_LAST, FIRST_OLD, FIRST_ROW = "__prev_sign", "__prev_row", "__last", "__first_old", "__first_row"
ERA = "__era"
ORDER = [COMMIT_VERSION, SEQ]


def signed(ct: Column) -> Column:
    """insert and update_postimage add a tuple (+1); delete and update_preimage remove one (−1)."""
    return F.when(ct.isin("insert", "update_postimage"), F.lit(1)).otherwise(F.lit(-1)).cast("long")


def _events(log: DataFrame, columns: Sequence[str], keep: Sequence[str], update_images: bool = True) -> DataFrame:
    """The changes as signed events (``ROW``: the tuple of ``columns``; ``keep``: those of its columns
    the trim groups by, beside it), with the update-image pairing checked per commit.

    Within a commit, the k-th update_postimage pairs with the k-th update_preimage before it; so the
    running balance of preimages over postimages never goes negative and ends at zero. A log known to
    hold no update images (``update_images`` False: inserts and deletes only) has nothing to pair, and
    its plan no window over the commits (a shuffle of the log).
    """
    ct = F.col(CHANGE_TYPE)
    if update_images:
        step = F.when(ct == "update_preimage", 1).when(ct == "update_postimage", -1).otherwise(0)
        in_commit = Window.partitionBy(COMMIT_VERSION)
        balance = F.sum(step).over(in_commit.orderBy(SEQ).rowsBetween(Window.unboundedPreceding, Window.currentRow))
        open_at_end = F.sum(step).over(in_commit)
        pairing = (F.when((ct == "update_postimage") & (balance < 0), "update_postimage without its update_preimage")
                    .when((ct == "update_preimage") & (open_at_end > 0),
                          "update_preimage without its update_postimage"))
    else:
        pairing = F.lit(None).cast("string")
    return log.select(*[F.col(f"`{c}`") for c in keep], row_struct(columns).alias(ROW),
                      signed(ct).alias(SIGN), F.col(COMMIT_VERSION), F.col(SEQ), ct.alias(CHANGE_TYPE),
                      F.lit(False).alias(IS_OLD), pairing.alias("__pairing"))


def _old_events(old: DataFrame, columns: Sequence[str], keep: Sequence[str], sign: Column) -> DataFrame:
    """The snapshot's current tuples as events that come before every change."""
    return old.select(*[F.col(f"`{c}`") for c in keep], row_struct(columns).alias(ROW), sign.alias(SIGN),
                      F.lit(-1).cast("long").alias(COMMIT_VERSION), F.lit(-1).cast("long").alias(SEQ),
                      F.lit(None).cast("string").alias(CHANGE_TYPE), F.lit(True).alias(IS_OLD),
                      F.lit(None).cast("string").alias("__pairing"))


def _with_era(events: DataFrame, truncates: Sequence[tuple[int, int]]) -> DataFrame:
    """The changes but the truncates, each with its era: how many of the range's ``truncates`` (commit
    version, ``_seq``) come before it."""
    era = F.lit(0)
    for version, seq in truncates:
        after = (F.col(COMMIT_VERSION) > version) | ((F.col(COMMIT_VERSION) == version) & (F.col(SEQ) > seq))
        era = era + F.when(after, 1).otherwise(0)
    return events.where(F.col(CHANGE_TYPE) != TRUNCATE).withColumn(ERA, era)


def skip_column(table: TableConfig) -> str:
    """The column a large table's trim restricts the stored rows by first: the key's first (a bag's
    first column); base layers are sorted by it."""
    return (table.key or list(table.columns))[0]


def segment_bounds(table: TableConfig, changes: DataFrame | pa.Table) -> dict | None:
    """Where a log segment's keys fall in `skip_column` (`zset.key_bounds`: one small query; or, for a
    small file read without Spark, `KeyBounds.of` its keys), as the catalog keeps them with the segment:
    with the column's name and declared type, so a segment recorded under another definition of the
    table is not taken for this one. None for keys cut in equal runs (strings)."""
    column = skip_column(table)
    if isinstance(changes, pa.Table):
        keys = changes.column(column)
        found = KeyBounds.of(pc.drop_null(keys).to_pylist(), keys.null_count > 0)
    else:
        found = key_bounds(changes, column)
    bounds = None if found is None else found.as_json()
    return None if bounds is None else {**bounds, "column": column, "column_type": table.columns[column]}


def log_bounds(table: TableConfig, recorded: Sequence[dict | None]) -> KeyBounds | None:
    """A log range's bounds from its segments' (`segment_bounds`), merged; None unless every segment
    recorded them for the table's `skip_column` as it is declared now."""
    column = skip_column(table)
    if not recorded or not all(b is not None and b.get("column") == column
                               and b.get("column_type") == table.columns[column] for b in recorded):
        return None
    return KeyBounds.merged([KeyBounds.from_json(b) for b in recorded])


def _skip_bounds(touched: DataFrame, column: str, stored_rows: int, bounds: KeyBounds | None) -> KeyBounds | None:
    """Where the touched keys fall in ``column``, for a large table's skipping filter: ``bounds`` (the
    log segments' own, `ivm.changes.ingest`), or else the touched keys' (one small query); None below
    SKIP_MIN_ROWS stored rows (the table is read whole)."""
    if stored_rows < SKIP_MIN_ROWS:
        return None
    return bounds if bounds is not None else key_bounds(touched, column)


def _stored_at(snapshot: DataFrame, touched: DataFrame, columns: list[str], stored_rows: int,
               small: bool, skip: KeyBounds | None, merge: bool = False,
               keys: tuple[list, bool] | None = None) -> DataFrame:
    """The snapshot's rows at the touched keys (or whole tuples, for a bag). The base layers are sorted
    by ``columns``, so on a large table a range filter on the first column skips the row groups no
    change falls in (``skip``: `_skip_bounds`). ``merge``: ``touched`` is a keyed table's, hashed by
    its key; the rows are found by a sort-merge semi-join that keeps it (`zset.restrict` otherwise).
    ``keys``: a small change's values of the first column, held by the driver (`ivm.changes.ingest.log_keys`):
    the rows are found by an IN filter on it (`zset.at_values`, ranges included), with no job for the
    keys' broadcast. Where the key has more columns than the first, rows of other keys come too; each
    is a chain of its stored row alone, which the net delta drops (no change) and the check passes."""
    if keys is not None:
        found = at_values(snapshot, columns[0], *keys)
        return found.repartition(1) if stored_rows >= SKIP_MIN_ROWS else one_partition(found)
    rows = snapshot if skip is None else snapshot.where(skip.filter(columns[0]))
    if merge:  # a merge join on the key as ``touched`` is hashed (plain equality: a key is never NULL)
        return rows.join(touched.hint("merge"), list(columns), "left_semi")
    return restrict(rows, touched, columns, small, stored_rows)


def _keyed(events: DataFrame, snapshot: DataFrame | None, table: TableConfig, stored_rows: int, small: bool,
           bounds: KeyBounds | None, keys: tuple[list, bool] | None, added: Collection[str] = (),
           truncated: bool = False) -> DataFrame:
    """The events of a table with a primary key, after its stored rows, each with its problem (no
    ``snapshot``: a trusted feed, `_trusted_keyed`). ``truncated``: the range holds truncates (the events
    carry their `ERA`): every stored row is in play, and a key's chain restarts empty in each era."""
    if snapshot is None:
        return _trusted_keyed(events, table, small)
    columns, key = list(table.columns), list(table.key or [])
    by_key = [F.col(f"`{c}`") for c in key]
    touched = events.select(*by_key)  # (a semi-join needs no distinct keys)
    # (a query reads the changes as they come; none where the driver holds the keys)
    skip = None if keys is not None or truncated else _skip_bounds(touched, key[0], stored_rows, bounds)
    if not small:
        # the changes hashed by their key once (002 §3's hash table): the semi-join finding the stored
        # rows at their keys then shuffles only the stored side, and their consolidation, the union and
        # the window keep that partitioning (the stored rows were shuffled twice, for a null-safe join
        # and again by key: lineitem at SF 10, 600k changes, 2.2-2.3 s against 2.6-2.7)
        events = events.repartition(*by_key)
        touched = events.select(*by_key)
    stored = snapshot if truncated else _stored_at(snapshot, touched, key, stored_rows, small, skip, merge=not small,
                                                   keys=keys)
    old = _old_events(consolidate(stored, columns), columns, key, F.lit(1).cast("long"))
    timeline = events.unionByName(old.withColumn(ERA, F.lit(0)) if truncated else old)
    # each key's chain in commit order, in one window: the step before each change (what it applies
    # to), whether it is the chain's last, and the chain's first step (the stored row, if the key has
    # one: it comes before every change); after a truncate, a change applies to no row (its era's first)
    w = Window.partitionBy(*by_key).orderBy(*ORDER)
    in_era = Window.partitionBy(*by_key, F.col(ERA)).orderBy(*ORDER) if truncated else w
    since_first = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    timeline = timeline.select("*", F.lag(SIGN).over(in_era).alias(PREV_SIGN), F.lag(ROW).over(in_era).alias(PREV_ROW),
                               F.lead(SIGN).over(w).isNull().alias(IS_LAST),
                               F.first(IS_OLD).over(since_first).alias(FIRST_OLD),
                               F.first(ROW).over(since_first).alias(FIRST_ROW))
    prev_row = F.col(PREV_ROW)
    present = F.coalesce(F.col(PREV_SIGN) == 1, F.lit(False))
    sign = F.col(SIGN)
    # a removal that names the key alone (its other columns NULL: a Debezium delete under PostgreSQL's
    # default replica identity, MySQL's minimal row image, an update without a before image) removes the
    # row the key holds, whatever it is; one that carries values must match the row (the net delta's
    # before-image is the stored row either way: `_keyed_delta` takes the chain's first)
    key_only = _key_only(columns, key)
    problem = (F.when(F.col(IS_OLD), None)
                .when(F.col("__pairing").isNotNull(), F.col("__pairing"))
                .when((sign < 0) & ~present, F.concat(F.col(CHANGE_TYPE), F.lit(" of a row that is not there")))
                .when((sign < 0) & ~key_only & ~_matches(columns, added),
                      F.concat(F.col(CHANGE_TYPE), F.lit(" does not match the stored row "), F.to_json(prev_row)))
                .when((sign > 0) & present,
                      F.concat(F.col(CHANGE_TYPE), F.lit(" of a key that exists (stored row "), F.to_json(prev_row),
                               F.lit(")"))))
    return timeline.withColumn(PROBLEM, problem)


def _matches(columns: list[str], added: Collection[str]) -> Column:
    """Whether a removal's row is the row before it in its key's chain: equal column by column, NULL-safe —
    but a column the table gained since it held data (``added``, ivm.evolution) that the removal leaves
    NULL is not given (a producer still writing the older schema's columns), and matches any value."""
    if not added:
        return F.col(PREV_ROW).eqNullSafe(F.col(ROW))
    found = F.lit(True)
    for c in columns:
        mine, stored = F.col(ROW).getField(c), F.col(PREV_ROW).getField(c)
        same = stored.eqNullSafe(mine)
        found = found & ((same | mine.isNull()) if c in added else same)
    return found


def _key_only(columns: list[str], key: list[str]) -> Column:
    """Whether an event's row names its key alone: every other column NULL (a table of key columns only
    has no such row apart from its whole one)."""
    rest = [c for c in columns if c not in key]
    if not rest:
        return F.lit(False)
    found = F.col(ROW).getField(rest[0]).isNull()
    for c in rest[1:]:
        found = found & F.col(ROW).getField(c).isNull()
    return found


def _trusted_keyed(events: DataFrame, table: TableConfig, small: bool) -> DataFrame:
    """A keyed table's events from a feed trusted to apply (a Delta source's change data feed: Delta
    wrote each change from the table it changed), with no stored row looked up: a key's chain starts
    from the row its first change removes (a delete or an update's preimage), or from none when that
    change adds one (an insert). `_keyed_delta` takes the chains as it takes checked ones. The problems
    found without the table are the update images' pairing and a chain that contradicts itself: two
    additions of the key with no removal between (Delta declares no key: an append of a key the range
    inserted already), or two removals. (An insert of a key the table held before the range is not seen
    here: ``verify_changes: true`` looks it up.)"""
    by_key = [F.col(f"`{c}`") for c in table.key or []]
    if not small:
        events = events.repartition(*by_key)
    w = Window.partitionBy(*by_key).orderBy(*ORDER)
    since_first = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    sign, prev = F.col(SIGN), F.lag(SIGN).over(w)
    problem = (F.when(F.col("__pairing").isNotNull(), F.col("__pairing"))
                .when((sign > 0) & (prev > 0), F.concat(F.col(CHANGE_TYPE), F.lit(" of a key that exists")))
                .when((sign < 0) & (prev < 0), F.concat(F.col(CHANGE_TYPE), F.lit(" of a row that is not there"))))
    return events.select("*", F.lead(SIGN).over(w).isNull().alias(IS_LAST),
                         (F.first(SIGN).over(since_first) < 0).alias(FIRST_OLD),
                         F.first(ROW).over(since_first).alias(FIRST_ROW), problem.alias(PROBLEM))


def _keyed_delta(annotated: DataFrame, table: TableConfig, updates: Observation, truncates: int = 0) -> DataFrame:
    """002 §3: the net effect of a key's chain is its first before-image against its last after-image
    (after ``truncates`` truncates, an after-image of the last era only).
    ``updates`` observes how many keys keep a row with a new value (both images: updated)."""
    columns = list(table.columns)
    # (the chain's last step carries its first: a filter, where grouping by key took a second pass
    # over the sorted chains with min_by/max_by of structs)
    chains = annotated.where(F.col(IS_LAST))
    before = F.when(F.col(FIRST_OLD), F.col(FIRST_ROW))
    added = F.col(SIGN) > 0
    after = F.when(added & (F.col(ERA) == truncates) if truncates else added, F.col(ROW))
    noop = before.eqNullSafe(after)
    # (array_compact, not F.filter with a Python lambda: PySpark names a lambda's variable afresh each
    # time (x_7, x_9, ...) and the name is part of the generated code, which then compiles again)
    images = F.array_compact(F.array(
        F.when(before.isNotNull() & ~noop, F.struct(before.alias("row"), F.lit(-1).cast("long").alias("n"))),
        F.when(after.isNotNull() & ~noop, F.struct(after.alias("row"), F.lit(1).cast("long").alias("n")))))
    updated = before.isNotNull() & after.isNotNull() & ~noop
    chains = chains.observe(updates, F.count(F.when(updated, 1)).alias("updated"))
    return (chains.select(F.explode(images).alias("i"))
                  .select(*[F.col("i.row").getField(c).alias(c) for c in columns], F.col("i.n").alias(COUNT_COLUMN)))


def _unkeyed(events: DataFrame, snapshot: DataFrame | None, table: TableConfig, stored_rows: int, small: bool,
             bounds: KeyBounds | None, keys: tuple[list, bool] | None, truncated: bool = False) -> DataFrame:
    """The events of a bag table, after its stored tuples, each with its problem (no ``snapshot``: a
    trusted feed, whose problems are the update images' pairing alone: a bag's net delta is the sum of
    its changes' signs, which needs no stored tuple). ``truncated``: as `_keyed`'s, a tuple's copies
    counted afresh in each era."""
    if snapshot is None:
        return events.withColumn(PROBLEM, F.col("__pairing"))
    columns = list(table.columns)
    touched = events.select(*[F.col(f"`{c}`") for c in columns])
    skip = None if keys is not None or truncated else _skip_bounds(touched, columns[0], stored_rows, bounds)
    stored = snapshot if truncated else _stored_at(snapshot, touched, columns, stored_rows, small, skip, keys=keys)
    old = _old_events(consolidate(stored, columns), columns, columns, F.col(COUNT_COLUMN))
    timeline = events.unionByName(old.withColumn(ERA, F.lit(0)) if truncated else old)
    by = [F.col(ROW), F.col(ERA)] if truncated else [F.col(ROW)]
    w = Window.partitionBy(*by).orderBy(*ORDER).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    copies = F.sum(SIGN).over(w)
    problem = (F.when(F.col(IS_OLD), None)
                .when(F.col("__pairing").isNotNull(), F.col("__pairing"))
                .when(copies < 0, F.concat(F.col(CHANGE_TYPE), F.lit(" of a row that is not there"))))
    return timeline.withColumn(PROBLEM, problem)


def _unkeyed_delta(annotated: DataFrame, table: TableConfig, truncates: int = 0) -> DataFrame:
    """A bag tuple's net effect is the sum of its changes' counts; after ``truncates`` truncates, the sum
    of the last era's, less the copies stored."""
    columns = list(table.columns)
    if truncates:
        n = F.when(F.col(IS_OLD), -F.col(SIGN)).when(F.col(ERA) == truncates, F.col(SIGN)).otherwise(0)
        return consolidate(annotated.select(*[F.col(f"`{c}`") for c in columns], n.alias(COUNT_COLUMN)), columns)
    changes = annotated.where(~F.col(IS_OLD))
    return consolidate(changes.select(*[F.col(f"`{c}`") for c in columns], F.col(SIGN).alias(COUNT_COLUMN)), columns)


@dataclass
class NetDelta:
    """A table's net delta (a Z-set) and the check of its changes, observed while the delta is computed.

    ``check()`` after the one action that consumes ``delta`` (its write) raises `BadChange` for the
    first change, in commit order, that does not apply, naming its commit as the user counts them (a
    Delta source's by its Delta version) and the command that sets it aside."""

    name: str
    table: TableConfig
    delta: DataFrame
    _observed: Observation
    #: a keyed table's observation of its updated keys
    _updates: Observation | None = None

    def check(self) -> None:
        found = _observed(self._observed)
        if found is None:  # (an empty plan: nothing to check)
            return
        if found["problems"]:
            bad = found["first"]
            version = int(bad[COMMIT_VERSION])
            named = named_version(self.table, version)
            reason = f"row {describe_row(bad, self.table.columns)}: {bad[PROBLEM]}"
            raise BadChange(f"table {self.name}: {version_noun(self.table)} {named}, {reason}; nothing was applied "
                            f"(to go on without it: `ivm log quarantine {self.name} --version {named}`)",
                            self.name, version, reason)

    def updated_keys(self) -> int | None:
        """After the delta's write: the keys of a keyed table whose net delta holds both images (an
        update: −1 old row, +1 new row), counted while the delta was written; None for a bag."""
        if self._updates is None:
            return None
        found = _observed(self._updates)
        return 0 if found is None else found["updated"]


def _observed(o: Observation) -> dict | None:
    """An observation's metrics after the action, or None when Spark proved the observed rows empty and
    dropped the observation with the plan (`ivm.spark.observed`)."""
    return observed(o)


def trim(name: str, table: TableConfig, log: DataFrame, snapshot: DataFrame | None, stored_rows: int = 0,
         update_images: bool = True, small: bool = False, bounds: KeyBounds | None = None,
         keys: tuple[list, bool] | None = None, added: Collection[str] = (),
         truncates: Sequence[tuple[int, int]] = ()) -> NetDelta:
    """The net delta of ``log`` (the changes in the refresh's range, in any order) against ``snapshot``
    (the table's current layers, unconsolidated; ``stored_rows`` of them: a large table gets a skipping
    filter; None: ``log`` is a feed trusted to apply, a Delta source's without ``verify_changes``, and no
    change is looked up in the table). ``update_images`` False: the log is known to hold inserts and
    deletes only. ``small``: the log range is a small change, trimmed in one partition with the stored rows at its keys
    (`zset.one_partition`: the window and the chains need no shuffle). ``bounds``: where the log's
    keys fall in `skip_column`, as its segments recorded (None: found from the log by a query).
    ``keys``: for a small change, the log's values of `skip_column` and whether one is NULL, as the
    driver read them from its segments (`ivm.changes.ingest.log_keys`; None: found by the plan).
    ``added``: the columns a keyed table gained since it held data (ivm.evolution): a removal that
    leaves one NULL matches the stored row on the others (a file of the older schema). ``truncates``:
    the positions (commit version, ``_seq``) of the range's truncates, as the catalog recorded them
    (`ivm.catalog.store.SegmentRef.truncates`): the table is read whole.

    The check rides on the delta's plan (one action computes both; a check and a write apart took a
    second pass over a cached timeline): the caller writes ``delta``, then calls ``check()``, and drops
    what it wrote when that raises.
    """
    truncated = bool(truncates)
    if truncated and snapshot is None:  # (a trusted feed is a Delta table's change data feed: it has none)
        raise ValueError(f"table {name}: a trusted feed holds no truncates")
    if truncated:  # (every stored row is in play: not a small change)
        small, bounds = False, None
    keys = keys if small else None  # (a large change's stored rows are found by a join)
    # (a keyed table's events carry its key beside the row, not every column twice: half the shuffle)
    events = _events(one_partition(log) if small else log, list(table.columns), list(table.key or table.columns),
                     update_images)
    if truncated:
        events = _with_era(events, truncates)
    annotated = (_keyed(events, snapshot, table, stored_rows, small, bounds, keys, added, truncated) if table.keyed
                 else _unkeyed(events, snapshot, table, stored_rows, small, bounds, keys, truncated))
    bad = F.col(PROBLEM).isNotNull()
    first = F.struct(*[F.col(ROW).getField(c).alias(c) for c in table.columns], F.col(COMMIT_VERSION), F.col(PROBLEM))
    observed = Observation(f"trim {name}")
    annotated = annotated.observe(observed, F.count(F.when(bad, 1)).alias("problems"),
                                  F.min_by(F.when(bad, first), F.when(bad, F.struct(*ORDER))).alias("first"))
    if not table.keyed:
        return NetDelta(name, table, _unkeyed_delta(annotated, table, len(truncates)), observed)
    updates = Observation(f"trim {name} updates")
    return NetDelta(name, table, _keyed_delta(annotated, table, updates, len(truncates)), observed, updates)
