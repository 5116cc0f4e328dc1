"""Alembic environment: runs on the connection the store hands over (never on an ini file's URL)."""

from alembic import context

from memory.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
