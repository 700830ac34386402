"""`ttt-pipeline --help` of every command: each argument says what it is, and --config names the presets."""

from __future__ import annotations

import argparse

import pytest

from ttt_pipeline.cli.main import build_parser
from ttt_pipeline.config import preset_names


def _commands(parser: argparse.ArgumentParser, path: str = "ttt-pipeline"):
    """(command path, its parser) for the program and every subcommand, however deep."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            missing += [f"command {c.dest}" for c in action._choices_actions if not (c.help or "").strip()]
            continue
        if action.help == argparse.SUPPRESS:  # hidden on purpose (the per-command copies of --debug)
            continue
        if not (action.help or "").strip():
            missing.append("/".join(action.option_strings) or action.dest)
    return missing


def test_every_argument_of_every_command_has_help():
    commands = dict(_commands(build_parser()))
    assert {"ttt-pipeline run", "ttt-pipeline evaluate", "ttt-pipeline config", "ttt-pipeline report",
            "ttt-pipeline compare", "ttt-pipeline explain", "ttt-pipeline predict", "ttt-pipeline corrupt"} <= set(
        commands)  # the commands other modules of ttt_pipeline/cli add are walked too
    missing = {path: gaps for path, parser in commands.items() if (gaps := _undocumented(parser))}
    assert not missing, missing


@pytest.mark.parametrize("command", ["run", "evaluate", "reevaluate", "config"])
def test_config_help_names_every_preset(command):
    parser = dict(_commands(build_parser()))[f"ttt-pipeline {command}"]
    text = "".join(parser.format_help().split())  # argparse wraps mdsd-electronics at its hyphen
    for name in preset_names():
        assert name in text, (command, name)


def test_hidden_debug_copies_leave_the_global_flag_alone():
    """`ttt-pipeline --debug CMD ...`: a subcommand's own (hidden) --debug must not reset it to False."""
    parser = build_parser()
    assert parser.parse_args(["--debug", "report", "RUN"]).debug is True
    assert parser.parse_args(["--debug", "run"]).debug is True
    assert parser.parse_args(["report", "RUN", "--debug"]).debug is True
