"""Alembic environment for the job store: runs on the connection :func:`rlft.service.store.migrate` passes."""

from alembic import context

from rlft.service.store import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
