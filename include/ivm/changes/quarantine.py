"""Setting a bad commit aside, and putting it back: the way out of a change that does not apply.

A refresh refuses a commit whose change does not apply to the table as stored (a delete of a row that
is not there, an insert of a key that exists, an update image without its partner: ivm.changes.trim),
and with it every later refresh of the table, until the commit goes. `ivm log quarantine TABLE
--version N` (or the table's ``on_bad_change: quarantine``, which does it during the refresh) sets it
aside, in the manner of Kafka Connect's dead-letter queue: the commit stays in its segment (a Delta
source's in its table), listed with its reason by `ivm log list` and in `ivm runs`, and every trim
skips it (`Catalog.quarantined`), so later refreshes go on.

`ivm log restore TABLE --version N` puts it back. While no relation has absorbed a commit at or past
it, in its place: the next refresh reads it where it was (with the late commit that made it apply, if
one came). Once refreshes have gone past it, a commit of a log appended to ivm is appended again as
the log's next commit (its changes, in their order, under a new version), and the original stays
skipped: the changes apply after everything absorbed since, which is what putting back an
out-of-order change means. A Delta source's versions are its table's, so there the restore is refused
and the table itself is to be corrected.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ivm.catalog import Catalog
from ivm.catalog.store import QuarantineRef, SegmentRef
from ivm.changes import delta
from ivm.changes.ingest import read_log, write_segment
from ivm.config import COMMIT_VERSION, ProjectConfig
from ivm.errors import ChangeDataError, NotFoundError
from ivm.storage import Warehouse
from ivm.vocabulary import RunStatus


@dataclass(frozen=True)
class LogListing:
    """`ivm log list TABLE`: the table's segments (none for a Delta source) and its quarantined commits,
    their versions as users name them (`delta.named_version`)."""

    table: str
    segments: list[SegmentRef]
    quarantined: list[QuarantineRef]
    absorbed: int
    delta_source: bool


def _named(config: ProjectConfig, name: str, version: int) -> int:
    return delta.named_version(config.tables[name], version)


def listing(catalog: Catalog, config: ProjectConfig, name: str) -> LogListing:
    table = config.tables[name]
    segments = [] if delta.is_delta(table) else catalog.segments(name, -1, 2**62)
    return LogListing(name, segments, catalog.quarantined(name), catalog.absorbed(name), delta.is_delta(table))


def _refusal(catalog: Catalog, name: str, what: str, named: int) -> str | None:
    """The one-line error of the newest failed run that refused this commit, if one did."""
    pattern = re.compile(rf"\btable {re.escape(name)}: {what} {named}, ")
    for run in catalog.runs(50):
        if run.status == RunStatus.FAILED and run.error and pattern.search(run.error):
            return run.error.split("; nothing was applied")[0]
    return None


def set_aside(catalog: Catalog, config: ProjectConfig, name: str, named: int, reason: str | None = None) -> str:
    """`ivm log quarantine`: set commit ``named`` (a Delta source's Delta version) aside; its reason is
    ``reason``, else the error of the refresh that refused it, else "set aside by hand"."""
    table = config.tables[name]
    version = delta.from_named_version(table, named)
    what = delta.version_noun(table)
    if delta.is_delta(table):
        newest = delta.current_version(delta.location(config, name), name) if table.source.delta else None
        if named < 0 or (newest is not None and named > newest):
            raise NotFoundError(f"table {name}: no Delta version {named} (the table's newest is {newest})")
    elif not catalog.segments(name, version - 1, version):  # (the segments whose range holds it)
        raise NotFoundError(f"table {name}: no commit version {named} in its log (see `ivm log list {name}`)")
    reason = reason or _refusal(catalog, name, what, named) or "set aside by hand"
    catalog.quarantine(name, version, reason)
    return (f"{name}: {what} {named} is set aside; refreshes go on without it "
            f"(`ivm log restore {name} --version {named}` puts it back)")


def restore(spark: SparkSession, catalog: Catalog, warehouse: Warehouse, config: ProjectConfig, name: str,
            named: int) -> str:
    """`ivm log restore`: put quarantined commit ``named`` back (see the module's docstring)."""
    table = config.tables[name]
    version = delta.from_named_version(table, named)
    what = delta.version_noun(table)
    record = next((q for q in catalog.quarantined(name) if q.commit_version == version), None)
    if record is None or record.restored_as is not None:
        again = f" (restored as commit version {record.restored_as})" if record is not None else ""
        raise NotFoundError(f"table {name}: {what} {named} is not quarantined{again}")
    absorbed = catalog.absorbed(name)
    if version > absorbed:
        catalog.unquarantine(name, version, f"restored in place: {record.reason}")
        return f"{name}: {what} {named} is back in its place; the next refresh applies it"
    if delta.is_delta(table):
        raise ChangeDataError(f"table {name}: Delta version {named} lies below the version the views hold "
                              f"({_named(config, name, absorbed)}), and a Delta source's versions are its table's: "
                              "correct the Delta table itself (ivm reads the correcting commit)")
    segments = catalog.segments(name, version - 1, version)
    changes = read_log(spark, table, segments, version - 1, version)
    rows = changes.count()  # (a quarantined commit is one commit: small)
    new = catalog.last_commit_version(name) + 1
    source = f"quarantine of {name} commit version {version}"
    digest = hashlib.sha256(f"{source} as {new}".encode()).hexdigest()
    changes = changes.withColumn(COMMIT_VERSION, F.lit(new).cast("long"))
    truncates = [(new, i) for s in segments for _, i in s.truncates_in(version - 1, version)]
    segment = write_segment(catalog, warehouse, name, table, changes, new, new, rows, source, "cdf", digest,
                            restores=version, truncates=truncates)
    return (f"{name}: commit version {named} lies below what refreshes have absorbed since ({absorbed}); its {rows} "
            f"changes are appended again as commit version {new} (segment {segment.id}), the next refresh applies them")
