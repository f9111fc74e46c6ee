"""The vocabulary of a run, as one enum every module reads (dbt's ``full_refresh`` / incremental;
docs/design.md §5): what a user asks a run or a view for, and what a run did to a view.

A `StrEnum`: its members are the strings the project file, the command line and the catalog hold, so
``Mode("full") is Mode.FULL`` and a member is written to JSON as its value.

>>> Mode.parse("full") is Mode.FULL
True
>>> [str(m) for m in Mode.asked()]
['auto', 'incremental', 'full']
"""

from __future__ import annotations

from enum import StrEnum

from ivm.errors import ConfigError


class Mode(StrEnum):
    #: let the planner choose per view and run (incremental unless a recompute is needed or cheaper)
    AUTO = "auto"
    #: maintain from the deltas (refused where the run cannot)
    INCREMENTAL = "incremental"
    #: recompute from the snapshot
    FULL = "full"
    #: what a run did to a view whose inputs' net deltas were empty or cancelled out
    NOOP = "noop"
    #: a plan's mode for ``ivm backfill --from-version N`` (ivm.refresh.plan.plan_replay)
    REPLAY = "replay"

    @classmethod
    def asked(cls) -> tuple[Mode, ...]:
        """The modes a user may ask for (``--mode``, a view's ``mode:``)."""
        return cls.AUTO, cls.INCREMENTAL, cls.FULL

    @classmethod
    def parse(cls, value: str) -> Mode:
        """A mode a user asked for, or a one-line ConfigError naming the choices."""
        try:
            mode = cls(value)
        except ValueError:
            mode = None
        if mode not in cls.asked():
            raise ConfigError(f"unknown mode {value!r}; use one of {', '.join(cls.asked())}")
        return mode
