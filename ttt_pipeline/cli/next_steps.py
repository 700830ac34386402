"""What `ttt-pipeline run` and `evaluate` print last: the model they registered, and the commands that use it next
(classify a file, serve it, the nightly check), spelled as the shell that ran the command would type them.

`next_commands` is pure (the summary's registry decision and the words to repeat in); `next_lines` is its terminal
form; the summary's `next_commands` (`--json`) holds the same strings.
"""

from __future__ import annotations

import shlex

CHAMPION = "champion"


def next_commands(registry: dict | None, again: list[str], tracking: list[str] | None = None,
                  program: str = "ttt-pipeline") -> list[str]:
    """The predict, serve and reevaluate commands for the registered model of `registry` (the run summary's
    registry decision); [] when nothing was registered.

    again: the arguments that name the model's task to `reevaluate` (the run's --model, --config and --set);
    tracking: `--tracking-uri URI` where the run's MLflow store is not the one the commands open by default;
    program: the command's path as this environment has it (.venv/bin/ttt-pipeline)."""
    if not registry or not registry.get("version"):
        return []
    name, tracking = registry["model_name"], tracking or []
    promoted = registry.get("champion_after") == registry["version"]
    model = f"models:/{name}@{CHAMPION}" if promoted else f"models:/{name}/{registry['version']}"
    return [shlex.join([program, "predict", "--model", model, "--input", "reviews.csv", "--output",
                        "predictions.jsonl", *tracking]),
            shlex.join([program, "serve", "--model", name, *tracking]),
            shlex.join([program, "reevaluate", *again])]


def registered_line(registry: dict | None) -> str:
    """One line: the name and version the model was registered as, and who holds the champion alias."""
    if not registry:
        return "registry: off (registry.enabled=false): nothing registered"
    if not registry.get("version"):
        return f"registry: nothing registered ({registry.get('reason')})"
    name, version, after = registry["model_name"], registry["version"], registry.get("champion_after")
    if after == version:
        return f"registered model: {name} v{version}, now the {CHAMPION} ({registry.get('reason')})"
    return (f"registered model: {name} v{version}; the {CHAMPION} stays v{after} ({registry.get('reason')})")


def next_lines(registry: dict | None, commands: list[str]) -> str:
    """The registered line, then the next commands, one a line."""
    lines = [registered_line(registry)]
    if commands:
        lines.append("next: classify a file, serve the champion, re-check it as the nightly flow does:")
        lines += [f"  {c}" for c in commands]
    return "\n".join(lines)


def rerun_arguments(model: str | None, config: str | None, settings: list[str]) -> list[str]:
    """The words of a `reevaluate` that judges the same task (and the same brought model) as this run."""
    words = ["--model", model] if model else []
    words += ["--config", config] if config else []
    for setting in settings:
        words += ["--set", setting]
    return words


def overlap_note(data_cfg, test_from: str | None, test_reviews: int | None) -> str | None:
    """`evaluate --model`'s one line when the test reviews were split off the data here (`test_from`, the download
    step's record; for a store entry made before it was recorded: no data.test_path means split here or the source's
    own): a model trained elsewhere on the same reviews may have trained on them. None otherwise."""
    if data_cfg.test_path or test_from in ("test_path", "source"):
        return None
    n = f"{test_reviews} " if test_reviews else ""
    unless = "" if test_from == "split" else " (unless the source holds a test split of its own)"
    return (f"the {n}test reviews are {data_cfg.test_fraction:.0%} of {data_cfg.path}, split off by the preset (seed "
            f"{data_cfg.split_seed}){unless}: a model trained elsewhere on these reviews may have trained on some of "
            "them and score too well here; give reviews it never saw with --set data.test_path=FILE")
