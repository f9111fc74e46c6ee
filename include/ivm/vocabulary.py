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


class SubgoalKind(StrEnum):
    """A subgoal of a rule as the counting algorithm reads it in a delta rule (000 Definition 4.1; one
    rule per kind in `ivm.maintain.subgoals.RULES`)."""

    #: a positive atom over a table, a view or an auxiliary predicate
    ATOM = "atom"
    #: a negated atom (000 §6.1)
    NEGATION = "negation"
    #: a GROUPBY subgoal (000 §6.2)
    GROUPBY = "groupby"
    #: a setof subgoal (001)
    SETOF = "setof"
    #: an atom over a nested collection's extraction function (002 §2.2)
    EXTRACTION = "extraction"
    #: an atom over a by-reference collection's owner index (002 §4.2)
    OWNER_INDEX = "owner index"


class ShortcutKind(StrEnum):
    """How a delta rule takes a positive subgoal from the run's deltas (ivm.maintain.references)."""

    #: a keyed table joined on its whole key, the key bound by the Δ subgoal
    LOOKUP = "lookup"
    #: a table whose foreign key references the Δ subgoal's key
    REFERENCE = "reference"


class RelationKind(StrEnum):
    """A relation the catalog records: a table, a view, or an auxiliary relation a view's maintenance
    stores (a GROUP BY state, an auxiliary view, an owner index)."""

    TABLE = "table"
    VIEW = "view"
    AUX = "aux"


class LayerKind(StrEnum):
    """A relation's stored layer: its base (a whole state) or a delta on top of it."""

    BASE = "base"
    DELTA = "delta"


class StrategyName(StrEnum):
    """How a view is maintained incrementally (`ivm.maintain.strategy.REGISTRY` holds each one's code; a
    view's ``strategy:`` names one)."""

    #: derivation counts (000 §4-6), DRed for recursive components (000 §7)
    COUNTING = "counting"
    #: 003's derived rules, the view stored without counts
    KEYED = "keyed"
    #: 004's reducing algorithms, the view stored without counts
    REDUCE = "reduce"


class Form(StrEnum):
    """How a view's tuples are stored (the catalog's ``RelationVersion.form``)."""

    #: with their derivation counts (000 §3)
    COUNTS = "counts"
    #: each tuple once, without counts (003, 004)
    PRESENCE = "presence"


class ReduceAlgorithm(StrEnum):
    """004's reducing algorithms (a view's ``reduce.algorithm``), in the paper's order: Algorithms 1-5."""

    NAIVE = "NAIVE"
    #: reduces the existing relations (V_E^i keeps the tuples agreeing with V_C^i on Y_i)
    RIE = "RIE"
    #: reduces the candidate relations (V_C^i drops the tuples agreeing with V_E^i on Z_i)
    RIC = "RIC"
    REDUCE = "REDUCE"
    #: REDUCE with selections and projections applied as early as possible
    REDUCE_PLUS = "REDUCE+"

    @property
    def number(self) -> int:
        """The paper's algorithm number."""
        return list(ReduceAlgorithm).index(self) + 1

    @property
    def reduces_existing(self) -> bool:
        return self in (ReduceAlgorithm.RIE, ReduceAlgorithm.REDUCE, ReduceAlgorithm.REDUCE_PLUS)

    @property
    def reduces_candidates(self) -> bool:
        return self in (ReduceAlgorithm.RIC, ReduceAlgorithm.REDUCE, ReduceAlgorithm.REDUCE_PLUS)

    @property
    def reduces_both(self) -> bool:
        """REDUCE and REDUCE+: the algorithms Theorems 3 and 4 and §5's insertions are stated for."""
        return self.reduces_existing and self.reduces_candidates


class MultipleUpdates(StrEnum):
    """004 §6's methods for several changed tuples at once (a view's ``reduce.multiple_updates``)."""

    #: Algorithm 6: the insertions' and the deletions' targets computed separately
    MU1 = "MU1"
    #: Algorithm 7: the inserted candidates count as existing tuples for the deletions
    MU2 = "MU2"

    @property
    def number(self) -> int:
        """The paper's algorithm number."""
        return 6 if self is MultipleUpdates.MU1 else 7
