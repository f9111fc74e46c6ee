"""The names ivm's records and relations are spelled with, one spelling each (docs/design.md §2, §6).

`StrEnum`s: each member *is* the string the catalog, the project file, the run records and Airflow hold,
so a member compares equal to what was stored (``record.stage == Stage.TRIM``) and is written as itself.
`ivm.modes.Mode` (how a run or a view is refreshed) is its own module, for the same reason.
"""

from __future__ import annotations

from enum import StrEnum


class StageName(StrEnum):
    """A refresh's stages (`ivm.refresh.stages.STAGES` orders them and says what each does) and `ivm
    load`'s record."""

    PLAN = "plan"
    TRIM = "trim"
    MAINTAIN = "maintain"
    VALIDATE = "validate"
    PUBLISH = "publish"
    SINK = "sink"
    COMPACT = "compact"
    REPORT = "report"
    LOAD = "load"


class RunStatus(StrEnum):
    """A run's status in the catalog (``staged``: a stage's output written, not yet published)."""

    RUNNING = "running"
    STAGED = "staged"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: a refresh that found nothing to do (`ivm.refresh.stages.refresh`)
    NOOP = "noop"


class RunKind(StrEnum):
    """What started a run."""

    REFRESH = "refresh"
    BACKFILL = "backfill"
    VALIDATE = "validate"


class Outcome(StrEnum):
    """A view's validation outcome (`ivm.validate`)."""

    PASSED = "passed"
    WARNED = "warned"
    FAILED = "failed"


class Kind(StrEnum):
    """A predicate of the compiled program: a base table, a view, or an auxiliary relation ivm keeps
    for a view (a GROUP BY state, an auxiliary view, an owner index)."""

    BASE = "base"
    VIEW = "view"
    AUX = "aux"
    #: the rows of a nested collection extracted from a table's column (002 §2.2, ivm.lang.nested)
    EXTRACTION = "extraction"


class RelationKind(StrEnum):
    """A relation the catalog records: a table or a view (an auxiliary relation is recorded as its view's)."""

    TABLE = "table"
    VIEW = "view"


class LayerKind(StrEnum):
    """A relation's stored layer: its base (a whole state) or a delta on top of it."""

    BASE = "base"
    DELTA = "delta"
