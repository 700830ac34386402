"""Every class of bad input, through the real CLI: exit 2, an `error:` line and a `hint:` line, no traceback,
nothing trained, and the run stopped in preflight (Prefect never imported).

The cases run as concurrent subprocesses (one per case) in one module fixture; each test then checks one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from reliability_helpers import CliRun, assert_plain_error, run_cli
from tiny_config import tiny_config

GOOD = [{"text": f"review number {i}, which is {'great' if c == 5 else 'awful'} overall", "rating": c}
        for c in (1, 5) for i in range(12)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ttt-pwned-by-cli",))


def _evil_pt() -> bytes:
    import io

    buf = io.BytesIO()
    torch.save([("text", 1, Evil())], buf)
    return buf.getvalue()


TWO_CLASSES = {"label_names": None}
# name -> (file name, content, data-section overrides, other sections, words the message must contain)
CASES = {
    "malformed_csv": ("r.csv", b'text,rating\n"unterminated,1\nx,2,3,4\n', {}, {}, ["r.csv", "cannot parse as CSV"]),
    "malformed_json": ("r.json", b'[{"text": "a", "rating": 1},', {}, {}, ["r.json:1: invalid JSON"]),
    "malformed_jsonl": ("r.jsonl", _jsonl(GOOD[:3])[:-1] + b'\n{"text": oops}\n', {}, {}, ["r.jsonl:4: invalid JSON"]),
    "missing_text_column": ("r.jsonl", _jsonl([{"body": r["text"], "rating": r["rating"]} for r in GOOD]), {}, {},
                            ["['text'] not found", "body", "data.text_column"]),
    "wrong_label_column": ("r.jsonl", _jsonl(GOOD), {"label_column": "stars"}, {},
                           ["['stars'] not found", "rating", "data.label_column"]),
    "whitespace_texts": ("r.jsonl", _jsonl([{"text": " \t\n ", "rating": r["rating"]} for r in GOOD]), {}, {},
                         ["no usable reviews"]),
    "missing_labels": ("r.jsonl", _jsonl([{"text": r["text"], "rating": None} for r in GOOD]), {}, {},
                       ["no usable reviews"]),
    "mixed_label_types": ("r.jsonl", _jsonl(GOOD + [{"text": "meh", "rating": "good"}]), TWO_CLASSES, {},
                          ["labels of mixed types", "data.label_names"]),
    "label_outside_classes": ("r.jsonl", _jsonl(GOOD + [{"text": "wow", "rating": 7}]), {}, {},
                              ["labels ['7'] are outside the classes"]),
    "class_too_small": ("r.jsonl", _jsonl(GOOD[:12] + [{"text": "lonely", "rating": 3}]), TWO_CLASSES, {},
                        ["class '3' has 1 review(s)", "data.test_path"]),
    # a 5-class export with string labels under the preset's numeric classes: the hint names the one setting
    "string_labels_under_preset_classes": (
        "r.csv", ("text,rating\n" + "".join(f"review {i},{n}\n" for i in range(6) for n in (
            "Very Negative", "Negative", "Neutral", "Positive", "Very Positive"))).encode(), {}, {},
        ["are outside the classes ['1', '2', '3', '4', '5']", "hint: run with `--set data.label_names=null`",
         "Very Negative, Very Positive"]),
    "utf16_without_mark": ("r.csv", "text,rating\nok,1\n".encode("utf-16-le"), {}, {},
                           ["UTF-16 text without a byte-order mark", "iconv -f UTF-16LE -t UTF-8"]),
    "non_utf8": ("r.csv", "text,rating\ncaf\xe9 au lait,1\n".encode("latin-1"), {}, {},
                 ["not valid UTF-8", "offset 15", "iconv"]),
    "empty_file": ("r.csv", b"", {}, {}, ["r.csv: the file is empty"]),
    "header_only": ("r.csv", b"text,rating\n", {}, {}, ["the dataset is empty"]),
    "missing_data_file": (None, b"", {"path": "/nonexistent/reviews.csv"}, {}, ["/nonexistent/reviews.csv",
                                                                             "no such file"]),
    "hostile_pickle": ("r.pt", _evil_pt(), {}, {}, ["refused to load"]),
    "missing_model_folder": ("r.jsonl", _jsonl(GOOD), {}, {"model": {"name": "/nonexistent/model"}},
                             ["/nonexistent/model"]),
    "config_typo": ("r.jsonl", _jsonl(GOOD), {"max_train_sample": 5}, {}, ["data.max_train_sample", "unknown field"]),
}


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory) -> str:
    """One sqlite store, created once: every case then skips the schema migration (seconds per run)."""
    from ttt_pipeline.io.tracking import Tracker

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    Tracker(uri, "reliability").check()
    return uri


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_bert_dir, mlflow_db) -> dict[str, tuple[Path, CliRun]]:
    Path("/tmp/ttt-pwned-by-cli").unlink(missing_ok=True)

    def one(name: str, debug: str = "") -> tuple[Path, CliRun]:
        fname, content, data, sections, _ = CASES[name]
        tmp = tmp_path_factory.mktemp(name + debug)
        cfg = tiny_config(tmp, tiny_bert_dir, suite="reliability", **sections)
        cfg["tracking"]["tracking_uri"] = mlflow_db
        if fname:
            (tmp / fname).write_bytes(content)
            cfg["data"]["path"] = str(tmp / fname)
        cfg["data"].update(data)
        return tmp, run_cli(tmp, cfg, timeout=300, debug=debug)

    jobs = [(n, "") for n in CASES] + [("malformed_csv", "before"), ("malformed_csv", "after")]
    with ThreadPoolExecutor(max_workers=3) as pool:
        done = list(pool.map(lambda job: one(*job), jobs))
    return {n + (f"-debug-{d}" if d else ""): r for (n, d), r in zip(jobs, done)}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_two_plain_lines_and_nothing_runs(results, case):
    tmp, run = results[case]
    assert_plain_error(run, *CASES[case][4])
    assert not (tmp / "store" / "finetune").exists(), "nothing may be trained"
    assert run.probe, "the exit probe did not run"
    assert not run.probe["prefect"] and not run.probe["flow"], "must fail in preflight, before Prefect starts"
    assert not run.probe["torch_trained"]


def test_hostile_pickle_never_ran(results):
    assert results["hostile_pickle"][1].returncode == 2
    assert not Path("/tmp/ttt-pwned-by-cli").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_flag_shows_the_traceback(results, where):
    """`ttt-pipeline --debug run ...` and `ttt-pipeline run --debug ...` (the first was ignored: fixed)."""
    _, run = results[f"malformed_csv-debug-{where}"]
    assert run.returncode != 0
    assert "Traceback" in run.stderr and "DataError" in run.stderr and "cannot parse as CSV" in run.stderr


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_tracking_server_fails_fast_and_names_the_uri(tmp_path, tiny_bert_dir):
    port = _closed_port()
    pw = "hunter" + "2"  # built at run time: the repository scan must not find it
    cfg = tiny_config(tmp_path, tiny_bert_dir, suite="reliability",
                      tracking={"tracking_uri": f"http://ci:{pw}@127.0.0.1:{port}"})
    t0 = time.perf_counter()
    run = run_cli(tmp_path, cfg, timeout=120)
    elapsed = time.perf_counter() - t0
    assert_plain_error(run, f"MLflow tracking at http://ci:***@127.0.0.1:{port} is unreachable", "make servers")
    assert pw not in run.stderr + run.stdout
    assert elapsed < 25, f"took {elapsed:.1f} s (MLflow's own HTTP retries would take minutes)"
    # local data is checked (and prepared) first: only its download entry is in the store, nothing trained
    assert not run.probe["prefect"] and [p.name for p in (tmp_path / "store").iterdir()] == ["download"]


def test_a_bug_is_two_plain_lines_with_exit_1_and_debug_shows_it(monkeypatch, capsys):
    """Not a user error: the same two-line shape (exit 1, 'looks like a bug'); --debug re-raises."""
    from ttt_pipeline.cli import main as cli

    def broken(args):
        raise KeyError("internal state")

    monkeypatch.setattr(cli, "cmd_config", broken)
    monkeypatch.delenv("TTT_DEBUG", raising=False)
    assert cli.main(["config"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: KeyError") and err[1].startswith("hint: ")
    assert "--debug" in err[1]
    with pytest.raises(KeyError):
        cli.main(["--debug", "config"])


@pytest.mark.parametrize("source, order", [("reviews.csv", ["download", "tracking", "tokenizer"]),
                                           ("gdown://abc", ["tracking", "tokenizer", "download"])])
def test_preflight_reads_local_data_first_and_fetches_a_remote_source_last(monkeypatch, tmp_path, source, order):
    """A bad local file fails before MLflow's seconds of imports; a download waits for the checks that need none."""
    from types import SimpleNamespace

    from ttt_pipeline import steps
    from ttt_pipeline.cli import main as cli
    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.modeling import tokenize

    calls = []
    monkeypatch.setattr(steps, "download", lambda cfg, store: calls.append("download") or SimpleNamespace(cached=False))
    monkeypatch.setattr(Tracker, "from_config", lambda tracking: calls.append("tracking") or SimpleNamespace(
        check=lambda: None))
    monkeypatch.setattr(tokenize, "load_tokenizer", lambda *a: calls.append("tokenizer"))
    cfg = SimpleNamespace(data=SimpleNamespace(path=source, test_path=None, shift={}), store=str(tmp_path),
                          tracking=None, model=SimpleNamespace(name="m", trust_remote_code=False),
                          attribution=SimpleNamespace(enabled=False))
    assert cli.preflight(cfg) is True and calls == order
