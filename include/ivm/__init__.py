"""ivm: incremental view maintenance for Apache Spark."""

from ivm.errors import IvmError

__all__ = ["IvmError", "Project", "session_for"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``ivm.Project`` on first use (PEP 562): a command that reads only the catalog (`ivm runs`) or a
    DAG file imports ivm without importing Spark and the maintenance modules."""
    if name == "Project":
        from ivm.project import Project

        return Project
    if name == "session_for":  # the project's Spark session, for a notebook: ivm.session_for("ivm.yaml")
        from ivm.server import session_for

        return session_for
    raise AttributeError(f"module 'ivm' has no attribute {name!r}")
