"""A refresh run (docs/design.md §6), as stages that each read what the stages before them recorded in the
catalog, so one process can run them all (`ivm refresh`) or an Airflow task can run each
(ivm.orchestration). The stages, listed once in `ivm.refresh.stages.STAGES`:

    plan      fix the snapshot (the newest commit version of every base table's log); pick the tables
              with changes past their watermark and the views to refresh, and how (`plan`: the rules
              `RULES`); record the run, its plan and the versions it read, and take the leases (`record`)
    trim      per table, the net delta between its watermark and the snapshot, checked (002 §3; `trim`;
              a Delta source's change data feed trusted unless `verify_changes`)
    maintain  per view, stratum by stratum: counting (000 §4-6), DRed for recursive components (000 §7),
              a count-free strategy (003, 004), or a full recompute (`maintenance`)
    validate  check the staged new states before anything is visible (`validation`)
    publish   one catalog transaction: new layers, watermarks, the run's outcome (the commit point)
    sink      each changed view's Delta table: its changed rows, one Delta commit per view (ivm.sinks)
    compact   relations whose layers passed the threshold, as their own atomic step (`publish`)
    report    the run as its record tells it (the DAG's last task; `ivm refresh` prints it itself)

Every stage is idempotent: it stages its output under names fixed by the run (a retry overwrites its
own files and replaces its own record) and never touches published data; publish is the only stage that
changes what readers see. A refresh with nothing to do launches no Spark job. A failure anywhere before
publish leaves every relation as it was.
"""

from ivm.refresh.maintenance import maintain_stage
from ivm.refresh.plan import RULES, begin, load_plan, plan, plan_replay
from ivm.refresh.publish import compact_stage, publish_stage, report
from ivm.refresh.record import Plan, RefreshResult, TableDelta, ViewWork
from ivm.refresh.stages import STAGES, StageArgs, refresh, run_stage
from ivm.refresh.trim import trim_stage
from ivm.refresh.validation import validate_stage

__all__ = ["RULES", "STAGES", "Plan", "RefreshResult", "StageArgs", "TableDelta", "ViewWork", "begin",
           "compact_stage", "load_plan", "maintain_stage", "plan", "plan_replay", "publish_stage", "refresh",
           "report", "run_stage", "trim_stage", "validate_stage"]
