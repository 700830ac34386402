"""The `corrupt` CLI contract: --list, a line-preserving round trip whose last
stdout line is JSON, and one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttt_pipeline.cli import corrupt as cli
from ttt_pipeline.corruption import FAMILIES, corrupt_texts
from ttt_pipeline.corruption.samples import synthetic_reviews

REPO = Path(__file__).resolve().parents[2]
LINES = synthetic_reviews(5, seed=1) + ["", "naïve café 😀 日本語", "  leading and trailing  ", "", "x"]


def _cli(*argv, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "ttt_pipeline.cli.corrupt", *argv], input=stdin,
                          capture_output=True, text=True, encoding="utf-8", env=env, cwd=REPO, timeout=120)


def _inproc(capsys, *argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    rc = cli.run(parser.parse_args(list(argv)))
    out, err = capsys.readouterr()
    return rc, out, err


def test_list_prints_one_family_per_line():
    proc = _cli("--list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == list(FAMILIES)
    assert all(ln.count("\t") == 1 and ln.split("\t")[1] for ln in lines)


def test_round_trip_with_json_summary(tmp_path):
    src, dst = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    proc = _cli("--family", "keyboard", "--severity", "3", "--seed", "7",
                "--input", str(src), "--output", str(dst), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = corrupt_texts(LINES, "keyboard", 3, 7)
    written = dst.read_text(encoding="utf-8").split("\n")
    assert written[-1] == "" and written[:-1] == expected.texts
    assert written[5] == "" and written[8] == ""  # empty lines stay empty, in place
    assert summary["family"] == "keyboard" and summary["severity"] == 3 and summary["seed"] == 7
    assert summary["n"] == len(LINES)
    assert summary["n_edits"] == expected.n_edits and summary["n_eligible"] == expected.n_eligible
    assert summary["realised_edit_rate"] == pytest.approx(expected.realised_edit_rate, abs=1e-6)
    assert abs(summary["realised_edit_rate"] / 0.10 - 1) <= 0.2
    assert summary["digest"] == expected.digest()
    assert summary["wall_s"] >= 0


def test_line_handling_in_process(tmp_path, capsys):
    src, dst = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes("first\r\n\r\nthird line\n\nfifth".encode("utf-8"))  # CRLF, no final newline
    rc, out, err = _inproc(capsys, "--family", "case", "--severity", "1", "--input", str(src),
                           "--output", str(dst), "--json")
    assert rc == 0 and err == ""
    assert json.loads(out.strip().splitlines()[-1])["n"] == 5
    assert dst.read_text(encoding="utf-8").split("\n")[:-1][1] == ""
    assert len(dst.read_text(encoding="utf-8").split("\n")) == 6
    # a text holding a newline is written on one line
    cli.write_texts(str(dst), ["a\nb", "c\r\nd"])
    assert dst.read_text(encoding="utf-8") == "a b\nc d\n"


def test_stdout_output_still_ends_with_json(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hello there world\nsecond line here\n", encoding="utf-8")
    rc, out, _ = _inproc(capsys, "--family", "tutorial", "--severity", "2", "--input", str(src),
                         "--output", "-", "--json")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 3
    assert json.loads(lines[-1])["n"] == 2


@pytest.mark.parametrize("argv, needle", [
    (["--family", "nope", "--severity", "1"], "valid families"),
    (["--family", "ocr", "--severity", "0"], "severity"),
    (["--family", "ocr", "--severity", "6"], "severity"),
    (["--family", "ocr", "--severity", "abc"], "severity"),
    (["--family", "ocr", "--severity", "2", "--seed", "x"], "seed"),
    (["--severity", "2"], "--family"),
])
def test_bad_arguments_exit_2_in_process(tmp_path, capsys, argv, needle):
    src = tmp_path / "in.txt"
    src.write_text("some text\n", encoding="utf-8")
    rc, out, err = _inproc(capsys, *argv, "--input", str(src), "--output", str(tmp_path / "o.txt"))
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and needle in err
    assert not (tmp_path / "o.txt").exists()


def test_bad_input_exit_2_subprocess(tmp_path):
    out = tmp_path / "o.txt"
    cases = [
        ["--family", "nope", "--severity", "1", "--input", str(tmp_path), "--output", str(out)],
        ["--family", "ocr", "--severity", "9", "--input", str(tmp_path), "--output", str(out)],
        ["--family", "ocr", "--severity", "1", "--input", str(tmp_path / "missing.txt"), "--output", str(out)],
    ]
    bad_utf8 = tmp_path / "latin1.txt"
    bad_utf8.write_bytes("caf\xe9\n".encode("latin-1"))
    cases.append(["--family", "ocr", "--severity", "1", "--input", str(bad_utf8), "--output", str(out)])
    for argv in cases:
        proc = _cli(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error:")
    assert not out.exists()
