"""The exceptions ivm raises. The CLI turns each into a one-line message and a non-zero exit."""

import re


class IvmError(Exception):
    """Base class: a problem the user can act on. ``str(e)`` is the one-line message."""

    exit_code = 1


class ConfigError(IvmError):
    """The project file is malformed or names something that does not exist."""

    exit_code = 2


class NotFoundError(IvmError):
    """A table, view, run or file named on the command line does not exist."""

    exit_code = 2


class ChangeDataError(IvmError):
    """Change data or snapshot data is invalid: nothing was stored or applied."""

    exit_code = 3


class BadChange(ChangeDataError):
    """A change of a table's log that does not apply to the table as stored (a refresh's trim): the
    commit it belongs to is named, so it can be set aside (`ivm log quarantine`)."""

    def __init__(self, message: str, table: str, version: int, reason: str):
        super().__init__(message)
        #: the table, the commit version in ivm's numbering, and what is wrong (the row and the problem)
        self.table, self.version, self.reason = table, version, reason


class LeaseError(IvmError):
    """Another run holds the refresh lease on a relation this run must write."""

    exit_code = 4


class CatalogError(IvmError):
    """The catalog database is unreachable or inconsistent."""

    exit_code = 5


class RunError(IvmError):
    """A stage was asked for out of order, or for a run that cannot go on (published, unplanned)."""

    exit_code = 6


class ValidationError(IvmError):
    """A maintained view failed its checks under policy ``fail``: nothing was published."""

    exit_code = 7


class SparkUnavailableError(IvmError):
    """Spark cannot be reached or started: a Spark Connect server that does not answer, or one that
    `ivm server start` could not start (retried by the DAG: a server may come back)."""

    exit_code = 8


#: a JVM exception's class before its message (``org.apache.spark.SparkException: ``)
_JVM_CLASS = re.compile(r"(?:[\w$]+\.)+[\w$]*(?:Exception|Error): ")


def one_line(error: BaseException) -> str:
    """The first line of an error's message (what the catalog records for a failed run). A JVM error that
    py4j passes as it is ("An error occurred while calling o230.collectToPython." over the Java one) is
    named by its innermost cause on its first line: a failed task's error, past "Job aborted due to stage
    failure: ... (executor driver):" — ``[UNABLE_TO_ACQUIRE_MEMORY] Unable to acquire 262144 bytes...``."""
    lines = [line.strip(" :") for line in str(error).splitlines() if line.strip(" :")]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("An error occurred while calling") and len(lines) > 1:
        causes = [c for c in _JVM_CLASS.split(lines[1]) if c.strip()]
        return causes[-1].strip() if causes else lines[1]
    return lines[0]


def out_of_memory(error: BaseException) -> bool:
    """Whether a Spark failure is the JVM's heap or Spark's memory manager running out."""
    return any(s in str(error) for s in ("UNABLE_TO_ACQUIRE_MEMORY", "OutOfMemoryError"))
