"""ivm: incremental view maintenance for Apache Spark."""

from ivm.errors import IvmError
from ivm.project import Project

__all__ = ["IvmError", "Project"]
__version__ = "0.1.0"
