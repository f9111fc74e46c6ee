"""Compaction: merge a relation's base layer and delta layers into a new base layer (docs/design.md §3).

A relation is compacted when it has more delta layers than ``storage.compact_max_layers``, or when its
delta layers hold at least ``storage.compact_min_delta_mb`` and more than ``storage.compact_delta_ratio``
of its base layer's bytes. Compaction is its own
run: it takes the relation's lease, writes the consolidated Z-set clustered by key, and publishes the
one-layer version in one catalog transaction; readers see the old version until then. Its cost is
amortized over the refreshes that appended the layers. The new version holds the same state as the one
it replaces, as its stage record says (``compacted``): a view that fell behind still finds its pointer
in it (`Catalog.same_states`, `ivm.refresh.plan.catch_up`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ivm.catalog.store import PublishChange, RelationState, StageRecord, new_id
from ivm.config import StorageSettings
from ivm.vocabulary import StageName

if TYPE_CHECKING:
    from ivm.context import RunContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compaction:
    relation: str
    layers_before: int
    rows: int | None
    seconds: float


def needs_compaction(state: RelationState, settings: StorageSettings) -> bool:
    deltas = state.deltas
    if not deltas:
        return False
    if len(deltas) > settings.compact_max_layers:
        return True
    base_bytes = state.base.bytes if state.base and state.base.bytes else 0
    delta_bytes = sum(d.bytes or 0 for d in deltas)
    # the size rule waits for a few MiB of deltas: below that, extra layers cost less than rewriting
    return (delta_bytes >= settings.compact_min_delta_mb * 2**20
            and delta_bytes > settings.compact_delta_ratio * base_bytes)


def compact(ctx: RunContext, relations: Iterable[str], force: bool = False,
            progress: Callable[[str], None] = lambda _: None) -> list[Compaction]:
    """Compact the given relations that passed the threshold (all with layers if ``force``)."""
    catalog, settings = ctx.catalog, ctx.config.storage
    states = [catalog.state(r) for r in relations]
    todo = [s for s in states if (force and len(s.layers) > 1) or needs_compaction(s, settings)]
    if not todo:
        return []
    run_id = new_id("compact-")
    names = [s.name for s in todo]
    done: list[Compaction] = []
    with catalog.run(run_id, "compact", relations=names, leases=names, lease_timeout=ctx.lease_timeout):
        changes, stages = [], []
        for state in todo:
            started = time.perf_counter()
            schema = ctx.schema(state.name)
            zset = ctx.warehouse.read_consolidated(ctx.spark, state.layers, schema, ctx.cluster_columns(state.name))
            size = sum(x.bytes or 0 for x in state.layers)
            written = ctx.warehouse.write_layer(
                zset, state.name, "base", cluster_by=ctx.cluster_columns(state.name),
                files=ctx.warehouse.files_for(size, settings.target_file_mb), run_id=run_id)
            changes.append(PublishChange(state.name, state.version_id, [written], replace=True))
            seconds = time.perf_counter() - started
            stages.append(StageRecord(StageName.COMPACT, state.name, rows_in=sum(x.rows or 0 for x in state.layers),
                                      rows_out=written.rows, seconds=round(seconds, 3),
                                      detail={"layers_before": len(state.layers),
                                              # (the version it replaces, whose state its new one holds)
                                              "compacted": state.version_id}))
            done.append(Compaction(state.name, len(state.layers), written.rows, seconds))
        catalog.publish(run_id, changes, {}, stages)
    for c in done:
        progress(f"compact: {c.relation}: {c.layers_before} layers -> 1 base layer of {c.rows} rows "
                 f"({c.seconds:.2f} s)")
    return done
