"""Fails when a function or method in the given folders is longer than the limit (default 80 lines).

ruff has no rule on a function's length in lines (its PLR0915 counts statements, which a long chain of
arguments or a table-shaped literal slips under), so this is a plain AST walk: one screen per function.

    python scripts/function_length.py ttt_pipeline [--max 80]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def long_functions(roots: list[Path], limit: int) -> list[tuple[str, int, str, int]]:
    """(file, line, name, length) of every function longer than `limit` lines, decorators excluded."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > limit:
                        found.append((str(path), node.lineno, node.name, length))
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="+", type=Path)
    p.add_argument("--max", type=int, default=80)
    args = p.parse_args(argv)
    found = long_functions(args.roots, args.max)
    for path, line, name, length in found:
        print(f"{path}:{line}: {name} is {length} lines (limit {args.max}): split it into its phases")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
