"""Alembic revisions, numbered 0001, 0002, ... so that a newer schema can be told from an unknown one."""
