"""``ttt-pipeline corrupt``: corrupt a one-text-per-line file.

Arguments are validated here rather than by argparse types so that every bad
input ends the same scriptable way: one ``error: ...`` line on stderr and exit
code 2, never a traceback or a usage dump.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ttt_pipeline.corruption.corrupt import corrupt_texts
from ttt_pipeline.corruption.registry import FAMILIES, SEVERITY_RATES, get_family
from ttt_pipeline.errors import PipelineError

__all__ = ["add_arguments", "run", "main", "read_texts", "write_texts"]

EXIT_USAGE = 2


class _Usage(Exception):
    """Bad input the user can fix; reported as one line, exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--list", action="store_true",
                        help="print the families (name<TAB>description), one per line, and exit")
    parser.add_argument("--family", help="corruption family (see --list)")
    parser.add_argument("--severity", help="1-5: exact edit rate %s" %
                        ", ".join(f"{k}={v:g}" for k, v in SEVERITY_RATES.items()))
    parser.add_argument("--seed", default="0", help="integer seed (default 0)")
    parser.add_argument("--input", help="UTF-8 file, one text per line ('-' for stdin)")
    parser.add_argument("--output", help="file to write, one corrupted text per line ('-' for stdout)")
    parser.add_argument("--json", action="store_true",
                        help="end stdout with one JSON line of summary numbers")


def read_texts(path: str) -> list[str]:
    """One text per line; empty lines stay (as empty texts) so line numbers
    keep matching the labels that travel beside the file."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise _Usage(f"input file not found: {path}") from None
    except IsADirectoryError:
        raise _Usage(f"input is a directory, not a file: {path}") from None
    except OSError as exc:
        raise _Usage(f"cannot read input {path}: {exc.strerror or exc}") from None
    try:
        data = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Usage(f"input {path} is not valid UTF-8 (byte {exc.start})") from None
    if data.startswith("\ufeff"):
        data = data[1:]
    if not data:
        return []
    lines = data.split("\n")  # not splitlines(): it also breaks on \x0b, \x1c, \u2028 ...
    if lines[-1] == "":
        lines.pop()  # the file's final newline terminates the last text, it is not a new one
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _one_line(text: str) -> str:
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def write_texts(path: str, texts: Sequence[str]) -> None:
    body = "".join(_one_line(t) + "\n" for t in texts)
    if path == "-":
        sys.stdout.write(body)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(body, encoding="utf-8", errors="surrogatepass", newline="\n")
    except OSError as exc:
        raise _Usage(f"cannot write output {path}: {exc.strerror or exc}") from None


def _int_arg(value: object, flag: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise _Usage(f"{flag} must be an integer, got {value!r}") from None


def run(args: argparse.Namespace) -> int:
    if getattr(args, "list", False):
        for fam in FAMILIES.values():
            print(f"{fam.name}\t{fam.description}")
        return 0
    try:
        missing = [flag for flag in ("family", "severity", "input", "output")
                   if getattr(args, flag, None) in (None, "")]
        if missing:
            raise _Usage("missing " + ", ".join("--" + m for m in missing) + " (or use --list)")
        try:
            family = get_family(args.family).name
        except ValueError as exc:
            raise _Usage(str(exc)) from None
        severity = _int_arg(args.severity, "--severity")
        if severity not in SEVERITY_RATES:
            raise _Usage(f"--severity must be one of {', '.join(map(str, SEVERITY_RATES))}, got {severity}")
        seed = _int_arg(getattr(args, "seed", 0), "--seed")
        texts = read_texts(args.input)
        t0 = time.perf_counter()
        cs = corrupt_texts(texts, family, severity, seed)
        wall = time.perf_counter() - t0
        write_texts(args.output, cs.texts)
    except _Usage as exc:
        print("error: " + _one_line(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except PipelineError as exc:  # an `ext:` family without its optional library
        print("error: " + _one_line(exc.message), file=sys.stderr)
        print("hint: " + _one_line(exc.hint or ""), file=sys.stderr)
        return EXIT_USAGE

    summary = {
        "family": cs.family, "severity": cs.severity, "seed": cs.seed, "n": len(cs.texts),
        "n_edits": cs.n_edits, "n_eligible": cs.n_eligible,
        "realised_edit_rate": round(cs.realised_edit_rate, 6),
        "target_edit_rate": None if not FAMILIES[family].uses_severity else SEVERITY_RATES[severity],
        "digest": cs.digest(), "wall_s": round(wall, 4),
        "input": args.input, "output": args.output,
    }
    if getattr(args, "json", False):
        print(json.dumps(summary, ensure_ascii=False))
    elif args.output != "-":
        print(f"wrote {summary['n']} texts to {args.output}: family={family} severity={severity} "
              f"seed={seed} realised_edit_rate={summary['realised_edit_rate']:.4f}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ttt-pipeline corrupt",
                                     description="Corrupt one-text-per-line files with a seeded family.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
