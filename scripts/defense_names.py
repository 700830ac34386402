"""Fails when a module that reports on every defense names one: scoring, robustness, the MLM signal and the plots
read labels, styles and headline keys from the defense registry (`ttt_pipeline/defenses/registry.py`), so adding or
renaming a defense is one registry line, never an edit of the reports.

A plain AST walk over string constants (docstrings and comments may name defenses; code may not), because
import-linter's contracts are about imports, not values:

    python scripts/defense_names.py [FILE ...]   (default: the reporting modules below)
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTING = ["ttt_pipeline/evaluation/scoring.py", "ttt_pipeline/evaluation/robustness.py",
             "ttt_pipeline/evaluation/signal.py", "ttt_pipeline/evaluation/grid.py", "ttt_pipeline/io/plots.py",
             "ttt_pipeline/reports/run.py", "ttt_pipeline/cli/console.py"]
ALLOWED = {"none"}  # no defense: the baseline every report compares against


def defense_names() -> set[str]:
    sys.path.insert(0, str(REPO))  # a script run from a checkout: the library beside it
    from ttt_pipeline.defenses.registry import ENGINES, REPAIRS

    return (set(ENGINES) | set(REPAIRS)) - ALLOWED


def named_defenses(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string constant outside a docstring that is a defense's name or joins them."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in names or (set(node.value.split("+")) <= names and "+" in node.value):
                found.append((node.lineno, node.value))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    args = p.parse_args(argv)
    names = defense_names()
    bad = [(f, line, name) for f in (args.files or [REPO / r for r in REPORTING])
           for line, name in named_defenses(Path(f), names)]
    for f, line, name in bad:
        print(f"{f}:{line}: names the defense {name!r}: read it from the registry (label, style, headline)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
