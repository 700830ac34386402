"""Prefect flows: they only wire the tasks of `ttt_pipeline/tasks/`."""
