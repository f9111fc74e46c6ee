"""spark-submit entry point: one stage of one ivm run (docs/design.md §9).

    spark-submit jobs/ivm_stage.py STAGE --run-id ID [--project ivm.yaml] [--views a,b] [--mode auto] [--kind refresh]
                                 [--from-version N] [--sample N]

Spark comes from spark-submit (master, conf) and starts when the stage first needs it; the command line
is ivm.orchestration.stages.parse_stage_args, the stage itself ivm.refresh.stages.run_stage. (The DAG
runs the catalog-only stages — plan, publish, report — as Python tasks instead, with the same command
line: ivm.orchestration.operators.)
Exit code 0 on success, the error's code with a one-line reason otherwise.
"""

from __future__ import annotations

import logging
import sys
import time

from ivm.cli import configure_logging
from ivm.errors import IvmError
from ivm.orchestration.stages import parse_stage_args
from ivm.refresh.stages import run_stage


def main(argv: list[str] | None = None) -> int:
    stage, project_file, stage_args = parse_stage_args(sys.argv[1:] if argv is None else argv)
    configure_logging(logging.INFO)

    from pyspark.sql import SparkSession

    from ivm.project import Project
    from ivm.spark import ship_package

    def start_spark() -> SparkSession:
        """spark-submit's master and conf. Started when the stage first needs Spark: plan, publish,
        report (and compact with nothing to compact) read and write the catalog alone, and take no
        executors from the cluster."""
        started = time.perf_counter()
        spark = SparkSession.builder.appName(f"ivm-{stage}").getOrCreate()
        ship_package(spark)
        logging.getLogger("ivm.stage").info("spark: started on %s (%.2f s)", spark.conf.get("spark.master"),
                                            time.perf_counter() - started)
        return spark

    project = Project.open(project_file, start_spark=start_spark)
    try:
        run_stage(project.ctx, stage, stage_args)
    except IvmError as e:
        print(f"ivm_stage: error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        project.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
