"""The `ttt-pipeline` command: the entry point above flows, tasks and the library."""
