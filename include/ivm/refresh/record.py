"""A run's record: what the plan decided and what each stage staged, as dataclasses with one way to and
from the JSON the catalog keeps (``ivm_run_stages.detail``), so a stage in another process (an Airflow
task) goes on from where the stages before it left the run.

>>> t = TableDelta("orders", 3, 5, 12)
>>> TableDelta.from_json(t.to_json()) == t
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ivm.catalog.store import LayerRef, QuarantineRef, StageRecord, WrittenLayer
from ivm.maintain.dred import RuleChange
from ivm.modes import Mode
from ivm.vocabulary import RunStatus, StageName, StrategyName


def layer_json(layer: WrittenLayer | LayerRef, relation: str | None = None) -> dict[str, Any]:
    """A layer as a run's record keeps it (a catalog LayerRef names no relation: ``relation`` does)."""
    return {"id": layer.id, "relation": relation or layer.relation, "kind": layer.kind, "path": layer.path,
            "rows": layer.rows, "bytes": layer.bytes}


def layer_from_json(d: dict[str, Any]) -> WrittenLayer:
    return WrittenLayer(d["id"], d["relation"], d["kind"], d["path"], d["rows"], d["bytes"])


@dataclass(frozen=True)
class TableDelta:
    """What a refresh does to one base table: planned (the version range, its log rows), then as the trim
    stage staged it (`trimmed_as`, or a trim's `dataclasses.replace`): a value, never changed in place."""

    table: str
    from_version: int
    to_version: int
    log_rows: int
    delta_rows: int = 0
    seconds: float = 0.0
    layer: WrittenLayer | None = None
    #: the trim stage has staged this table's delta
    trimmed: bool = False
    #: keys of a keyed table whose net delta updates them (both images), as the trim observed; None:
    #: not known (a bag table, a replay of published deltas)
    updated_keys: int | None = None
    #: commits of the range the trim set aside (``on_bad_change: quarantine``), published with the run
    quarantined: tuple[QuarantineRef, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As the plan records it."""
        return {"table": self.table, "from_version": self.from_version, "to_version": self.to_version,
                "log_rows": self.log_rows}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableDelta:
        return cls(d["table"], d["from_version"], d["to_version"], d["log_rows"])

    def trim_record(self) -> StageRecord:
        """What the trim stage records of the table."""
        return StageRecord(StageName.TRIM, self.table, mode=Mode.INCREMENTAL, rows_in=self.log_rows,
                           delta_rows=self.delta_rows, seconds=round(self.seconds, 3), status=RunStatus.STAGED,
                           detail={"from_version": self.from_version, "to_version": self.to_version,
                                   "layer": layer_json(self.layer) if self.layer else None,
                                   "updated_keys": self.updated_keys,
                                   "quarantined": [{"version": q.commit_version, "reason": q.reason}
                                                   for q in self.quarantined]})

    def trimmed_as(self, r: StageRecord) -> TableDelta:
        """The table as the trim stage's record ``r`` left it."""
        return dataclasses.replace(
            self, delta_rows=r.delta_rows or 0, seconds=r.seconds or 0.0, trimmed=True,
            layer=layer_from_json(r.detail["layer"]) if r.detail.get("layer") else None,
            updated_keys=r.detail.get("updated_keys"),
            quarantined=tuple(QuarantineRef(self.table, q["version"], q["reason"], "policy")
                              for q in r.detail.get("quarantined", [])))


@dataclass
class ViewWork:
    """What a refresh does to one view: its mode, why, and the layers it wrote."""

    view: str
    stratum: int
    mode: Mode  # incremental | full | noop
    reason: str
    upstream: list[str]
    #: the upstream tables whose logs changed in this run
    changed_inputs: list[str] = field(default_factory=list)
    #: rows of the input deltas the view's delta rules read (incremental), or of its inputs' deltas
    delta_in: int = 0
    #: rows of the view's own delta layer (incremental): tuples whose count changed
    rows_changed: int | None = None
    #: rows written: the delta layer (incremental) or the new base layer (full)
    rows: int | None = None
    seconds: float = 0.0
    #: rules removed from and added to the view since its stored state was computed (DRed follows them)
    rule_change: RuleChange | None = None
    #: what the algorithm did beyond the delta (DRed: tuples over-deleted, rederived, inserted)
    detail: dict[str, int] = field(default_factory=dict)
    #: every relation the view stores (itself, auxiliary predicates, GROUPBY states) -> its new layer
    layers: dict[str, WrittenLayer] = field(default_factory=dict)
    #: a maintain stage has staged this view's layers
    maintained: bool = False
    #: (mode, reason) as planned, before a maintain stage found it a noop (a retry starts from these)
    planned: tuple[Mode, str] | None = None
    #: counting, keyed (003) or reduce (004): the strategy of ivm.maintain.strategy.REGISTRY that
    #: maintains it, and the cost model's candidates
    strategy: StrategyName = StrategyName.COUNTING
    choice: dict | None = None
    #: a view that catches up from its own pointer into the logs (#48, item 1: changes an earlier run
    #: applied without it): the run that published its state, and the layers, in that run's published
    #: state, of each relation it reads that moved since (ivm.refresh.plan.catch_up)
    catch_up: CatchUp | None = None

    def to_json(self) -> dict[str, Any]:
        """As the plan records it (a rule change as whether there is one: the load compares it anew)."""
        return {"view": self.view, "stratum": self.stratum, "mode": self.mode, "reason": self.reason,
                "upstream": self.upstream, "changed_inputs": self.changed_inputs,
                "rule_change": self.rule_change is not None, "strategy": self.strategy, "choice": self.choice,
                "catch_up": self.catch_up.to_json() if self.catch_up else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ViewWork:
        mode = Mode(d["mode"])
        return cls(d["view"], d["stratum"], mode, d["reason"], d["upstream"], d["changed_inputs"],
                   planned=(mode, d["reason"]), strategy=StrategyName(d.get("strategy", StrategyName.COUNTING)),
                   choice=d.get("choice"),
                   catch_up=CatchUp(**d["catch_up"]) if d.get("catch_up") else None)

    def as_planned(self) -> ViewWork:
        """The view's work as the plan left it, nothing maintained: a retried maintain stage starts from
        it, not from its own attempt."""
        mode, reason = self.planned or (self.mode, self.reason)
        return dataclasses.replace(self, mode=mode, reason=reason, maintained=False, layers={}, detail={})

    def maintain_record(self) -> StageRecord:
        """What the maintain stage records of the view."""
        return StageRecord(StageName.MAINTAIN, self.view, mode=self.mode, rows_in=self.delta_in, rows_out=self.rows,
                           delta_rows=self.rows_changed, seconds=round(self.seconds, 3), status=RunStatus.STAGED,
                           detail={"stratum": self.stratum, "reason": self.reason, "relations": sorted(self.layers),
                                   "strategy": self.strategy, "choice": self.choice,
                                   "layers": {n: layer_json(x) for n, x in self.layers.items()},
                                   "algorithm": self.detail, **self.detail})

    def maintained_as(self, r: StageRecord) -> ViewWork:
        """The view as the maintain stage's record ``r`` left it (a new value)."""
        return dataclasses.replace(
            self, mode=Mode(r.mode) if r.mode else self.mode, reason=r.detail.get("reason", self.reason),
            delta_in=r.rows_in or 0, rows=r.rows_out, rows_changed=r.delta_rows, seconds=r.seconds or 0.0,
            detail=dict(r.detail.get("algorithm", {})),
            layers={name: layer_from_json(x) for name, x in r.detail.get("layers", {}).items()}, maintained=True)


@dataclass
class CatchUp:
    """Where a view that fell behind catches up from (`ViewWork.catch_up`)."""

    #: the run that published the view's state (its snapshot is the view's pointers into the logs)
    run_id: str
    #: relation the view reads -> its layers in that run's state (json, as `layer_json`)
    layers: dict[str, list[dict]]

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "layers": self.layers}


@dataclass
class Replay:
    """The state a replay starts from: every relation the views need as a published run left it."""

    from_version: int
    #: the run whose published state is restored, and its snapshot
    run_id: str
    snapshot: dict[str, int]
    #: relation -> its layers in that state (json, as `layer_json`)
    layers: dict[str, list[dict]]

    def paths(self, name: str) -> list[str]:
        return [x["path"] for x in self.layers[name]]

    def to_json(self) -> dict[str, Any]:
        return {"from_version": self.from_version, "run_id": self.run_id, "snapshot": self.snapshot,
                "layers": self.layers}


@dataclass
class Plan:
    run_id: str
    snapshot: dict[str, int]
    tables: list[TableDelta] = field(default_factory=list)
    views: list[ViewWork] = field(default_factory=list)
    mode: Mode = Mode.AUTO
    #: a replay (``ivm backfill --from-version N``): where it starts; see `ivm.refresh.plan.plan_replay`
    replay: Replay | None = None
    #: the tables left out because their changes cancel out ("t (commit versions 5..6)"; not recorded)
    cancelled: list[str] = field(default_factory=list)
    #: the Delta sources created anew at their locations since their published state: table -> how
    #: it shows (the views that read them are recomputed; not recorded: the views' modes are)
    replaced: dict[str, str] = field(default_factory=dict)

    def record(self, versions: dict[str, int | None]) -> StageRecord:
        """The plan stage's record: the plan and the relation versions it read (publish checks that
        nothing moved since)."""
        return StageRecord(StageName.PLAN, detail={
            "snapshot": self.snapshot, "mode": self.mode, "versions": versions,
            "replay": self.replay.to_json() if self.replay else None,
            "tables": [t.to_json() for t in self.tables], "views": [v.to_json() for v in self.views]})

    @classmethod
    def from_records(cls, run_id: str, records: list[StageRecord]
                     ) -> tuple[Plan, dict[str, int | None], list[dict[str, Any]]]:
        """The plan a run's records hold, with its tables and views as their stages staged them so far;
        the versions it read; the planned views as recorded (the caller resolves their rule changes).
        The records must hold a plan."""
        d = next(r.detail for r in reversed(records) if r.stage == StageName.PLAN)
        p = cls(run_id, d["snapshot"], mode=Mode(d["mode"]), replay=Replay(**d["replay"]) if d.get("replay") else None)
        trimmed = {r.relation: r for r in records if r.stage == StageName.TRIM}
        maintained = {r.relation: r for r in records if r.stage == StageName.MAINTAIN}
        for t in d["tables"]:
            item = TableDelta.from_json(t)
            p.tables.append(item.trimmed_as(trimmed[item.table]) if item.table in trimmed else item)
        for v in d["views"]:
            work = ViewWork.from_json(v)
            if work.view in maintained:
                work = work.maintained_as(maintained[work.view])
            p.views.append(work)
        return p, d["versions"], d["views"]


@dataclass
class RefreshResult:
    run_id: str | None
    status: str  # succeeded | noop
    snapshot: dict[str, int]
    tables: list[TableDelta]
    seconds: float
    views: list[ViewWork] = field(default_factory=list)
    compacted: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """As `ivm refresh --format json` prints it."""
        return {"run": self.run_id, "status": self.status, "seconds": round(self.seconds, 3), "snapshot": self.snapshot,
                "tables": [{"table": t.table, "from_version": t.from_version, "to_version": t.to_version,
                            "log_rows": t.log_rows, "delta_rows": t.delta_rows, "seconds": round(t.seconds, 3),
                            "quarantined": [q.commit_version for q in t.quarantined]} for t in self.tables],
                "views": [{"view": v.view, "mode": str(v.mode), "reason": v.reason, "strategy": v.strategy,
                           "delta_in": v.delta_in, "rows_changed": v.rows_changed, "rows": v.rows,
                           "seconds": round(v.seconds, 3)} for v in self.views],
                "compacted": self.compacted}

    SUMMARY_HEADERS = ["relation", "mode", "commit versions", "rows in the delta", "rows changed", "rows written",
                       "seconds"]

    def summary_rows(self) -> list[list[object]]:
        """Tables: log rows in, net delta rows out. Views: input delta rows in, changed tuples out."""
        rows: list[list[object]] = [
            [t.table, "trim", f"{t.from_version + 1}..{t.to_version}", t.log_rows, t.delta_rows, t.delta_rows,
             f"{t.seconds:.2f}"] for t in self.tables]
        rows += [[v.view, v.mode, "", v.delta_in, "" if v.rows_changed is None else v.rows_changed,
                  "" if v.rows is None else v.rows, f"{v.seconds:.2f}"] for v in self.views]
        return rows
