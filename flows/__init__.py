"""Prefect flows: they only wire the tasks of `tasks/`."""
