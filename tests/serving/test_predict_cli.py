"""`ttt-pipeline predict`: every input format, bad rows named by line, error/hint with no partial output,
atomic output, --method / --set as in `run`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from serving_helpers import LABELS, TEXTS, same_predictions

from ttt_pipeline.cli.main import main


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from ttt_pipeline.io.mlflow_model import load_classifier

    return load_classifier(tiny_model_dir, device="cpu")


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def write_inputs(folder: Path) -> dict[str, Path]:
    rows = [{"id": i, "text": t, "stars": 5 - i} for i, t in enumerate(TEXTS)]
    paths = {s: folder / f"in.{s}" for s in ("csv", "tsv", "jsonl", "json", "parquet", "txt")}
    pd.DataFrame(rows).to_csv(paths["csv"], index=False)
    pd.DataFrame(rows).to_csv(paths["tsv"], index=False, sep="\t")
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    paths["json"].write_text(json.dumps(rows), encoding="utf-8")
    pd.DataFrame(rows).to_parquet(paths["parquet"], index=False)
    paths["txt"].write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return paths


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet", "txt"])
def test_every_input_format_gives_the_rows_plus_the_prediction(fmt, tiny_model_dir, reference, tmp_path, capsys):
    src = write_inputs(tmp_path)[fmt]
    out = tmp_path / "out.jsonl"
    rc, stdout, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out, "--json")
    assert rc == 0, err
    got = read_jsonl(out)
    assert [r["text"] for r in got] == TEXTS
    if fmt != "txt":  # the input's other fields come through, as they were read
        assert [str(r["id"]) for r in got] == [str(i) for i in range(len(TEXTS))]
        assert [str(r["stars"]) for r in got] == [str(5 - i) for i in range(len(TEXTS))]
    preds = [{k: r[k] for k in ("label", "probability", "probabilities")} for r in got]
    assert preds == reference.predict(TEXTS, "none")  # same batches: the same numbers
    assert all(list(p["probabilities"]) == LABELS for p in preds)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["n"] == len(TEXTS) and summary["method"] == "none" and summary["skipped"] == []
    assert summary["reviews_per_s"] > 0 and sum(summary["labels"].values()) == len(TEXTS)
    assert "reviews/s" in err and leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json", "parquet"])
def test_every_output_format(fmt, tiny_model_dir, reference, tmp_path, capsys):
    src = write_inputs(tmp_path)["jsonl"]
    out = tmp_path / f"out.{fmt}"
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert rc == 0, err
    if fmt == "parquet":
        frame = pd.read_parquet(out)
        probs = [dict(p) for p in frame["probabilities"]]
    elif fmt == "json":
        frame = pd.DataFrame(json.loads(out.read_text()))
        probs = list(frame["probabilities"])
    else:
        with open(out, newline="", encoding="utf-8") as f:
            frame = pd.DataFrame(list(csv.DictReader(f, delimiter="\t" if fmt == "tsv" else ",")))
        probs = [json.loads(p) for p in frame["probabilities"]]
    assert list(frame.columns) == ["id", "text", "stars", "label", "probability", "probabilities"]
    want = reference.predict(TEXTS, "none")
    assert list(frame["label"]) == [w["label"] for w in want]
    assert [float(p) for p in frame["probability"]] == pytest.approx([w["probability"] for w in want])
    assert probs == [w["probabilities"] for w in want]


def test_malformed_rows_are_named_and_nothing_is_written(tiny_model_dir, tmp_path, capsys):
    src = tmp_path / "reviews.jsonl"
    src.write_text("\n".join([json.dumps({"text": TEXTS[0]}), "{not json", json.dumps({"body": "no text field"}),
                              "", json.dumps({"text": "   "}), json.dumps(["a list"]),
                              json.dumps({"text": TEXTS[1]})]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"error: {src}: 4 bad row(s): line 2: invalid JSON")
    for expected in ("line 3: no 'text' field", "line 5: 'text' is blank", "line 6: a JSON list, not an object"):
        assert expected in lines[0]
    assert lines[1].startswith("hint:") and "--skip-bad-rows" in lines[1]
    assert "Traceback" not in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_skip_bad_rows_classifies_the_rest_and_lists_them(tiny_model_dir, reference, tmp_path, capsys):
    src = tmp_path / "reviews.csv"
    src.write_text(f'text,stars\n"{TEXTS[0]}",5\n,3\n"{TEXTS[1]}",1,extra\n"{TEXTS[2]}",4\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc, stdout, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out, "--skip-bad-rows",
                          "--json")
    assert rc == 0, err
    assert "skipped reviews.csv line 3: 'text' is blank" in err
    assert "skipped reviews.csv line 4: 3 fields, the header has 2" in err
    assert json.loads(stdout.strip().splitlines()[-1])["skipped"] == ["line 3", "line 4"]
    got = read_jsonl(out)
    assert [r["text"] for r in got] == [TEXTS[0], TEXTS[2]] and [r["stars"] for r in got] == ["5", "4"]
    assert same_predictions([{k: r[k] for k in ("label", "probability", "probabilities")} for r in got],
                            reference.predict([TEXTS[0], TEXTS[2]], "none"))


def test_a_failed_run_keeps_the_previous_output(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    src = tmp_path / "bad.csv"
    src.write_text('text\n"unterminated quote\n', encoding="utf-8")
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert rc == 2 and "error:" in err and "hint:" in err
    assert out.read_text() == "previous results\n" and leftovers(tmp_path) == []


@pytest.mark.parametrize("argv,message", [
    (["--set", "finetune.epochs=2"], "predict takes only ttt.* settings"),
    (["--set", "ttt.bogus=1"], "ttt.bogus: not an inference setting"),
    (["--set", "ttt.steps=0"], "ttt.steps: Input should be greater than or equal to 1"),
    (["--set", "ttt.spell.max_edit_distance=9"], "ttt.spell.max_edit_distance: Input should be less than or equal"),
    (["--set", "ttt.spell_max_edit_distance=1"], "ttt.spell_max_edit_distance: moved"),
    (["--method", "nope"], "unknown method 'nope'"),
    (["--text-column", "review"], "no column 'review'"),
])
def test_bad_settings_are_user_errors(argv, message, tiny_model_dir, tmp_path, capsys):
    src = write_inputs(tmp_path)["csv"]
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out, *argv)
    assert rc == 2 and message in err and "hint:" in err, err
    assert not out.exists()


def test_bad_paths_are_user_errors(tiny_model_dir, tmp_path, capsys):
    src = write_inputs(tmp_path)["csv"]
    for argv, message in (
            (["--model", tmp_path / "missing", "--input", src, "--output", tmp_path / "o.jsonl"], "no such folder"),
            (["--model", tiny_model_dir, "--input", tmp_path / "x.csv", "--output", tmp_path / "o.jsonl"],
             "no such file"),
            (["--model", tiny_model_dir, "--input", src, "--output", tmp_path / "o.xlsx"], "unsupported type"),
            (["--model", tiny_model_dir, "--input", src, "--output", src], "is the input file")):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and message in err and "hint:" in err, err


def test_method_and_settings_as_in_run(tiny_model_dir, reference, tmp_path, capsys):
    src = write_inputs(tmp_path)["txt"]
    out = tmp_path / "out.jsonl"
    rc, stdout, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out, "--method",
                          "masked_ttt", "--set", "ttt.steps=2", "--set", "ttt.lr=1e-2", "--set", "ttt.batch_size=2",
                          "--json")
    assert rc == 0, err
    got = [{k: r[k] for k in ("label", "probability", "probabilities")} for r in read_jsonl(out)]
    assert got == reference.predict(TEXTS, "masked_ttt", steps=2, lr=1e-2, batch_size=2)
    assert got != reference.predict(TEXTS, "none", batch_size=2)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["method"] == "masked_ttt" and summary["settings"] == {"steps": 2, "lr": 0.01, "batch_size": 2}


def test_clashing_input_fields_are_kept_under_another_name(tiny_model_dir, tmp_path, capsys):
    src = tmp_path / "labelled.jsonl"
    src.write_text("".join(json.dumps({"text": t, "label": "gold"}) + "\n" for t in TEXTS[:2]), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert rc == 0, err
    got = read_jsonl(out)
    assert [r["input_label"] for r in got] == ["gold", "gold"] and all(r["label"] in LABELS for r in got)


def test_long_inputs_show_a_progress_bar(tiny_model_dir, tmp_path, capsys):
    src = tmp_path / "many.txt"
    src.write_text("\n".join(TEXTS[i % 5] for i in range(250)) + "\n", encoding="utf-8")
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", tmp_path / "o.jsonl")
    assert rc == 0 and "250/250" in err and "reviews/s" in err
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", tmp_path / "o.jsonl", "--quiet")
    assert rc == 0 and "250/250" not in err


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_spreadsheets_unicode_export_is_read_as_the_pipeline_reads_it(encoding, tiny_model_dir, reference,
                                                                         tmp_path, capsys):
    """Excel's "Unicode text" (UTF-16 with a byte-order mark) and "CSV UTF-8" (UTF-8 with one) both classify;
    UTF-16 whose mark was stripped is refused with the iconv command, as `run` refuses it."""
    src = tmp_path / "reviews.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(src, index=False, encoding=encoding)
    out = tmp_path / "out.jsonl"
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out)
    assert rc == 0, err
    got = read_jsonl(out)
    assert [r["text"] for r in got] == TEXTS
    assert [{k: r[k] for k in ("label", "probability", "probabilities")} for r in got] == reference.predict(TEXTS)
    bare = tmp_path / "bare.csv"
    bare.write_bytes(src.read_text(encoding=encoding).encode("utf-16-le"))
    rc, _, err = run(capsys, "--model", tiny_model_dir, "--input", bare, "--output", tmp_path / "bare.jsonl")
    assert rc != 0 and "UTF-16 text without a byte-order mark" in err and "iconv -f UTF-16LE" in err, err


def test_a_defenses_own_setting_by_its_flat_name(tiny_model_dir, reference, tmp_path, capsys):
    """`--set ttt.tent.lr=...` (a defense's own section) reaches the engine and the summary names it flat."""
    src = write_inputs(tmp_path)["txt"]
    out = tmp_path / "out.jsonl"
    rc, stdout, err = run(capsys, "--model", tiny_model_dir, "--input", src, "--output", out, "--method", "tent",
                          "--set", "ttt.tent.lr=0.1", "--set", "ttt.tent.steps=3", "--json")
    assert rc == 0, err
    got = [{k: r[k] for k in ("label", "probability", "probabilities")} for r in read_jsonl(out)]
    assert got == reference.predict(TEXTS, "tent", **{"tent.lr": 0.1, "tent.steps": 3})
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["settings"] == {"tent.lr": 0.1, "tent.steps": 3}
