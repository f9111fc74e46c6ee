"""spark-submit entry point: one stage of one ivm run (DESIGN.md §9).

    spark-submit jobs/ivm_stage.py STAGE --run-id ID [--project ivm.yaml] [--views a,b] [--mode auto] [--kind refresh]
                                 [--from-version N] [--sample N]

Spark comes from spark-submit (master, conf) and starts when the stage first needs it (plan, publish and
report never do); the stage itself is ivm.refresh.stages.run_stage.
Exit code 0 on success, the error's code with a one-line reason otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ivm.cli import configure_logging
from ivm.errors import IvmError
from ivm.modes import Mode
from ivm.refresh.stages import STAGE_NAMES, StageArgs, run_stage


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, StageArgs]:
    """The command line (as the DAG's tasks render it) and the `StageArgs` it gives the stage."""
    ap = argparse.ArgumentParser(prog="ivm_stage.py", description="Run one stage of an ivm run.")
    ap.add_argument("stage", choices=STAGE_NAMES)
    ap.add_argument("--run-id", required=True, help="the ivm run (the same for every stage of it)")
    ap.add_argument("--project", help="the project file (default: $IVM_PROJECT, else ./ivm.yaml)")
    ap.add_argument("--views", default="", help="comma-separated views: what plan refreshes, what maintain maintains")
    ap.add_argument("--mode", default=Mode.AUTO, choices=[str(m) for m in Mode.asked()])
    ap.add_argument("--kind", default="refresh", choices=["refresh", "backfill"])
    ap.add_argument("--from-version", default="", help="plan a replay from this commit version (empty: none)")
    ap.add_argument("--sample", default="", help="validate: keys per view to recompute (empty: each view's own)")
    args = ap.parse_args(argv)
    return args, StageArgs(args.run_id, tuple(v for v in args.views.split(",") if v), Mode(args.mode), args.kind,
                           int(args.from_version) if args.from_version.strip() else None,
                           int(args.sample) if args.sample.strip() else None)


def main(argv: list[str] | None = None) -> int:
    args, stage_args = parse_args(argv)
    configure_logging(logging.INFO)

    from pyspark.sql import SparkSession

    from ivm.project import Project
    from ivm.spark import ship_package

    def start_spark() -> SparkSession:
        """spark-submit's master and conf. Started when the stage first needs Spark: plan, publish,
        report (and compact with nothing to compact) read and write the catalog alone, and take no
        executors from the cluster."""
        started = time.perf_counter()
        spark = SparkSession.builder.appName(f"ivm-{args.stage}").getOrCreate()
        ship_package(spark)
        logging.getLogger("ivm.stage").info("spark: started on %s (%.2f s)", spark.sparkContext.master,
                                            time.perf_counter() - started)
        return spark

    project = Project.open(args.project, start_spark=start_spark)
    try:
        run_stage(project.ctx, args.stage, stage_args)
    except IvmError as e:
        print(f"ivm_stage: error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        project.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
