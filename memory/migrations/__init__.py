"""Alembic migrations of the SQL store, applied programmatically when a store is opened."""
