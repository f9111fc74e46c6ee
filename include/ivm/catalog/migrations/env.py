"""Alembic environment for the ivm catalog. ivm runs it programmatically (`Catalog.upgrade`), passing
an open connection in ``config.attributes["connection"]``; the `alembic` CLI works too with
``-x url=...``."""

from alembic import context
from sqlalchemy import create_engine

from ivm.catalog.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
        with create_engine(url).connect() as conn:
            _run(conn)
            conn.commit()
    else:
        _run(connection)


def _run(connection) -> None:
    # batch mode lets later migrations alter tables on SQLite too
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
