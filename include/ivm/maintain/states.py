"""A run's view of the stored relations, and what the maintenance algorithms that counting calls
(ivm.maintain.nested, ivm.maintain.references, ivm.maintain.dred) read of it: `DeltaContext`, the
protocol `ivm.maintain.counting.Counting` implements, so those modules need not import counting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Protocol

from pyspark.sql import DataFrame

from ivm.ir import Atom, BodyItem, GroupBy, Literal, Program, SetOf
from ivm.storage import Scratch
from ivm.zset import BROADCAST_BYTES, one_partition, small_change

if TYPE_CHECKING:
    from ivm.maintain.recompute import Evaluator


@dataclasses.dataclass
class RunStates:
    """Relations as one refresh sees them: the published layers (the old state), and what this run
    wrote: a delta layer (Pᵛ = P ⊎ Δ(P)) or, for a full recompute, a new base layer."""

    read: Callable[[str, list[str]], DataFrame]                      # (relation, layer paths) -> Z-set
    write_delta: Callable[[str, DataFrame], tuple[str, int, int] | None]  # (relation, Δ) -> (path, bytes, rows)
    #: the run's intermediate results (set changes, fixpoint rounds)
    scratch: Scratch
    old_paths: dict[str, list[str]] = field(default_factory=dict)
    #: rows of each relation's published layers (as the catalog records them; None: some layer's unknown)
    old_rows: dict[str, int | None] = field(default_factory=dict)
    delta_paths: dict[str, str] = field(default_factory=dict)
    #: bytes of each delta layer: small ones are broadcast into the joins of the delta rules
    delta_bytes: dict[str, int] = field(default_factory=dict)
    #: rows of each delta layer, and the most a run's deltas may hold to be planned in one partition
    #: (`spark.single_partition_rows`; 0: never)
    delta_rows: dict[str, int] = field(default_factory=dict)
    single_partition_rows: int = 0
    replaced: dict[str, str] = field(default_factory=dict)

    def broadcastable(self, pred: str) -> bool:
        """Whether this run's written delta of ``pred`` is small enough to broadcast into the joins that
        read it (`zset.BROADCAST_BYTES`); False when it has none."""
        return self.delta_bytes.get(pred, BROADCAST_BYTES + 1) <= BROADCAST_BYTES

    @property
    def small(self) -> bool:
        """Whether the run's deltas so far (its tables', then each one it derives and writes) are
        together a small change: read in one partition, and the stored relations restricted to their
        keys gathered in one (`zset.one_partition`). A derived delta that grows past the limit (a
        join's fan-out) turns the rest of the run to the distributed plan."""
        return small_change(sum(self.delta_rows.values()), self.single_partition_rows)

    def fits_one_partition(self, name: str) -> bool:
        """Whether the run is small and ``name``'s published layers are too (`spark.single_partition_rows`):
        read whole into the run's one partition, they need no restriction to the keys in play."""
        rows = self.old_rows.get(name)
        return self.small and rows is not None and small_change(rows, self.single_partition_rows)

    def old(self, name: str) -> DataFrame:
        return self.read(name, self.old_paths.get(name, []))

    def new(self, name: str) -> DataFrame:
        if name in self.replaced:
            return self.read(name, [self.replaced[name]])
        return self.read(name, self.old_paths.get(name, []) + ([self.delta_paths[name]]
                                                                if name in self.delta_paths else []))

    def delta(self, name: str) -> DataFrame | None:
        if name not in self.delta_paths:
            return None
        return self.read_written(name, [self.delta_paths[name]])

    def read_written(self, name: str, paths: list[str]) -> DataFrame:
        """What this run wrote of ``name`` (a delta layer, a set change), read back: in one partition
        when the run is small."""
        df = self.read(name, paths)
        return one_partition(df) if self.small else df

    def delta_values(self, name: str, column: str) -> list | None:
        """The sorted distinct non-NULL values of ``column`` in this run's delta layer of ``name``, read
        by pyarrow on the driver (`Warehouse.distinct_values`: no Spark job) in a small run; None in a
        large one, or when the driver does not read them."""
        if not self.small or name not in self.delta_paths or name in self.replaced:
            return None
        found = self.scratch.warehouse.distinct_values([self.delta_paths[name]], column)
        return None if found is None else found[0]

    def note(self, name: str, path: str, size: int, rows: int) -> None:
        """A delta layer of ``name`` this run reads: a table's net delta, a view's from an earlier stage."""
        self.delta_paths[name], self.delta_bytes[name], self.delta_rows[name] = path, size, rows

    def behind(self, at: dict[str, tuple[list[str], int | None]],
               since: dict[str, tuple[str, int, int]]) -> RunStates:
        """The run's states as a view that fell behind reads them (a catch-up, `ivm.refresh.maintenance`): each
        relation of ``at`` at the layers it names there (their paths and rows), its change since as its
        delta where ``since`` has one (a written layer's path, bytes and rows), the others as the run has
        them. A new value: the run's own states stay as they are."""
        def kept(held: dict) -> dict:
            return {name: x for name, x in held.items() if name not in at}

        return dataclasses.replace(
            self, old_paths={**self.old_paths, **{r: paths for r, (paths, _) in at.items()}},
            old_rows={**self.old_rows, **{r: rows for r, (_, rows) in at.items()}},
            delta_paths=kept(self.delta_paths) | {r: x[0] for r, x in since.items()},
            delta_bytes=kept(self.delta_bytes) | {r: x[1] for r, x in since.items()},
            delta_rows=kept(self.delta_rows) | {r: x[2] for r, x in since.items()},
            replaced=kept(self.replaced))

    def put_delta(self, name: str, df: DataFrame) -> DataFrame | None:
        """Write Δ(name) as a delta layer and read it back (a materialized, reusable plan)."""
        written = self.write_delta(name, df)
        if written is None:
            return None
        self.note(name, *written)
        return self.delta(name)


class DeltaContext(Protocol):
    """What a delta rule's evaluation reads in one run (000 Algorithm 4.1 over `RunStates`): the modules
    that evaluate a kind of subgoal (ivm.maintain.subgoals, nested, references) read it and return what
    they computed; the counting algorithm records it (the run's deltas, its statistics)."""

    program: Program
    ev: Evaluator
    states: RunStates
    #: Δ of every predicate as the predicates above it use it; absent: unchanged in this run
    used_delta: dict[str, DataFrame]
    #: the keys each shortcut (ivm.maintain.references) reads from storage in this run, found once whichever
    #: rule asks first (a memo of the run's, the one thing those modules keep here)
    shortcut_keys: dict
    #: keys of a keyed table's net delta that are updates (both images), as its trim observed them
    updated_keys: dict[str, int]
    schemas: Callable[[str], object]

    def changed(self, pred: str) -> bool: ...

    def used(self, pred: str, state: str) -> DataFrame: ...

    def joined(self, pred: str, state: str) -> DataFrame: ...

    def subgoal(self, pred: str, r: int, j: int, item: BodyItem, state: str,
                broadcast: bool = True) -> DataFrame | None: ...

    def absent(self, item: Literal, df: DataFrame, state: str) -> DataFrame: ...

    def negation_delta(self, atom: Atom) -> DataFrame: ...

    def groupby_delta(self, name: str, g: GroupBy) -> DataFrame: ...

    def groupby_unchanged(self, name: str, g: GroupBy) -> bool: ...

    def setof_delta(self, pred: str, r: int | str, j: int, s: SetOf) -> DataFrame: ...

    def source(self, atom: Atom, state: str, groups: DataFrame | None = None,
               group_vars: list[str] | None = None) -> DataFrame: ...
