"""Starting Spark for in-process use (`ivm` commands, the demo, tests).

spark-submit jobs get their session from spark-submit's configuration instead; both end up in
`session()`, which reuses an active session when there is one.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ivm.config import SparkSettings

log = logging.getLogger(__name__)

#: Spark's own logging: warnings and errors only, on stderr
LOG4J2 = Path(__file__).with_name("log4j2.properties")

#: Defaults sized for small incremental work on a laptop-class machine (DESIGN.md §11): few shuffle
#: partitions (deltas are small), no UI, no console progress bars, UTC so timestamps read back as written.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2}",
}


def session(settings: SparkSettings | None = None, app_name: str = "ivm"):
    """The active SparkSession, or a new one built from the project's `spark:` settings."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = settings or SparkSettings()
    # the driver and the Python workers must run the same interpreter (the venv's)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(settings.master)
    for k, v in {**DEFAULT_CONF, **settings.conf}.items():
        builder = builder.config(k, v)
    log.info("starting Spark (%s)", settings.master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def ship_package(spark) -> None:
    """Make the ``ivm`` package importable on the executors of a cluster (its Python UDFs, registered
    aggregates, run there): zip it and add it to the SparkContext. Local masters share the driver's."""
    master = spark.sparkContext.master
    if master.startswith("local"):
        return
    import shutil
    import tempfile

    package = Path(__file__).resolve().parent
    target = Path(tempfile.mkdtemp(prefix="ivm-package-")) / "ivm"
    archive = shutil.make_archive(str(target), "zip", root_dir=package.parent, base_dir=package.name)
    spark.sparkContext.addPyFile(archive)
    log.info("shipped the ivm package to the executors of %s (%s)", master, archive)
