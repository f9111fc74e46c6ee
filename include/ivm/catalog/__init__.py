"""The catalog database: SQLAlchemy models, Alembic migrations, and the unit of work."""

from ivm.catalog.store import Catalog

__all__ = ["Catalog"]
