"""Garbage collection: files no retained version needs (docs/design.md §3).

After ``storage.retention_hours``, a replaced version is forgotten and the layers no remaining version
references are deleted; so are layer folders no catalog row knows (left by a run that crashed before
publishing), old staging folders, and log segments that every consumer's watermark has passed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ivm.catalog.models import utcnow
from ivm.catalog.store import aware
from ivm.changes import delta

if TYPE_CHECKING:
    from ivm.context import RunContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    versions: int
    layers: int
    orphans: int
    segments: int

    def describe(self) -> str:
        return (f"gc: dropped {self.versions} old versions, {self.layers} layers, {self.orphans} unreferenced "
                f"folders and {self.segments} absorbed log segments")


def collect(ctx: RunContext, now: datetime | None = None) -> GcResult:
    catalog, warehouse = ctx.catalog, ctx.warehouse
    cutoff = (now or utcnow()) - timedelta(hours=ctx.config.storage.retention_hours)
    versions = catalog.expired_versions(cutoff)
    layers = catalog.drop_versions(versions)
    for layer in layers:
        if layer.kind != delta.SOURCE:  # (a Delta source's version is the user's table: never deleted)
            warehouse.delete(layer.path)
    known = catalog.known_layer_paths()
    orphans = 0
    for rel_dir, _ in warehouse.list_dirs("data"):
        for path, mtime in warehouse.list_dirs(*rel_dir[len(warehouse.uri) + 1:].split("/")):
            if path not in known and mtime is not None and aware(mtime) < cutoff:
                warehouse.delete(path)
                orphans += 1
    for path, mtime in warehouse.list_dirs("staging"):
        if mtime is not None and aware(mtime) < cutoff:
            warehouse.delete(path)
    # a segment can go once every relation that reads the table has absorbed it
    watermarks = catalog.watermarks()
    absorbed: dict[str, int] = {}
    for (_, source), version in watermarks.items():
        absorbed[source] = min(version, absorbed.get(source, version))
    dropped = [seg for seg in catalog.all_segments()
               if seg.table in absorbed and seg.max_commit_version <= absorbed[seg.table]
               and aware(seg.appended_at) < cutoff]
    for seg in dropped:
        warehouse.delete(seg.path)
    catalog.drop_segments([s.id for s in dropped])
    result = GcResult(len(versions), len(layers), orphans, len(dropped))
    log.info(result.describe())
    return result

