"""The `misspelling` family (real human misspellings from codespell's list) and the external generators (`ext:`
families, nlpaug): what they change, at which rate, the same text in every process, and the error without nlpaug."""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttt_pipeline.cli import corrupt as corruption_cli
from ttt_pipeline.corruption import FAMILIES, SEVERITY_RATES, corrupt_texts, external, list_families
from ttt_pipeline.corruption.misspellings import misspelling_table
from ttt_pipeline.corruption.samples import synthetic_reviews

REPO = Path(__file__).resolve().parents[2]
TEXTS = synthetic_reviews(40, seed=11) + ["I will recieve it because I believe it is definitely separate."]
EXTERNAL = ["ext:keyboard", "ext:ocr", "ext:random_char", "ext:spelling"]


def test_table_holds_real_misspellings_in_a_fixed_order():
    table = misspelling_table()
    assert len(table) > 10_000
    assert "recieve" in table["receive"] and "definately" in table["definitely"] and "seperate" in table["separate"]
    assert all(list(v) == sorted(v) and word not in v for word, v in table.items())


def test_listed_and_split_into_own_suite_and_external():
    assert "misspelling" in list_families() and set(EXTERNAL) <= set(list_families())
    own = list_families(external_ones=False)
    assert "misspelling" in own and not any(f.startswith("ext:") for f in own)
    assert all(FAMILIES[f].external for f in EXTERNAL) and not FAMILIES["misspelling"].external


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_misspelling_changes_an_exact_share_of_the_listed_words(severity):
    cs = corrupt_texts(TEXTS, "misspelling", severity, seed=3)
    table = misspelling_table()
    rate = SEVERITY_RATES[severity]
    assert abs(cs.realised_edit_rate - rate) < 0.2 * rate + 0.005
    wrong = {w: c for c, ws in table.items() for w in ws}
    for before, after in zip(TEXTS, cs.texts):
        a, b = before.split(), after.split()
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if x != y:  # a listed correction became one of its misspellings, punctuation and case kept
                core_x, core_y = x.strip(".,!?"), y.strip(".,!?")
                assert wrong[core_y.lower()] == core_x.lower()
                assert core_x[0].isupper() == core_y[0].isupper()


def test_misspelling_keeps_whitespace_and_unlisted_words():
    text = "Zyzzyva  qwxz,\tdefinitely!"
    new, edits, eligible = FAMILIES["misspelling"].apply(text, 1.0, __import__("random").Random(0))
    assert eligible == 1 and edits == 1
    assert new.startswith("Zyzzyva  qwxz,\t") and new.endswith("!") and new != text


@pytest.mark.parametrize("family", EXTERNAL)
def test_external_families_change_about_the_share_of_words_asked(family):
    cs = corrupt_texts(TEXTS[:20], family, 4, seed=1)
    assert 0.1 <= cs.realised_edit_rate <= 0.3  # severity 4 asks 20% (nlpaug rounds counts up; OCR has fewer targets)
    for before, after in zip(TEXTS, cs.texts):
        assert len(before.split()) == len(after.split())
    assert corrupt_texts(TEXTS[:20], family, 4, seed=1).texts == cs.texts
    assert corrupt_texts(TEXTS[:20], family, 4, seed=2).texts != cs.texts


def test_external_call_leaves_the_global_random_streams_alone():
    import random

    import numpy as np

    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    corrupt_texts(TEXTS[:3], "ext:keyboard", 3, seed=0)
    assert (random.random(), np.random.random()) == expected


_CHILD = r"""
import json, sys
from ttt_pipeline.corruption import corrupt_texts
texts = json.loads(sys.stdin.read())
print(json.dumps({f: corrupt_texts(texts, f, 5, 9).texts for f in ["misspelling", "ext:keyboard", "ext:ocr",
                  "ext:random_char", "ext:spelling"]}))
"""


def test_same_seed_same_text_in_two_processes():
    def child(hashseed):
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(REPO)}
        return json.loads(subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(TEXTS[:8]), text=True,
                                         capture_output=True, env=env, cwd=REPO, timeout=120, check=True).stdout)
    a, b = child("1"), child("777")
    assert a == b
    assert a["ext:spelling"] != TEXTS[:8] and a["misspelling"] != TEXTS[:8]


def test_missing_library_says_error_and_hint_naming_the_extra(monkeypatch, tmp_path, capsys):
    real = builtins.__import__

    def no_nlpaug(name, *args, **kwargs):
        if name == "nlpaug" or name.startswith("nlpaug."):
            raise ImportError("No module named 'nlpaug'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nlpaug)
    external._augmenter.cache_clear()
    src = tmp_path / "in.txt"
    src.write_text("the battery died\n", encoding="utf-8")
    rc = corruption_cli.main(["--family", "ext:ocr", "--severity", "3", "--input", str(src),
                              "--output", str(tmp_path / "out.txt")])
    err = capsys.readouterr().err.splitlines()
    external._augmenter.cache_clear()
    assert rc == 2
    assert err[0].startswith("error: corruption family 'ext:ocr' needs the optional library nlpaug")
    assert err[1].startswith('hint: pip install "ttt-pipeline[external]"')
    from ttt_pipeline.config import CorruptionConfig

    with pytest.raises(ValueError, match=r"ttt-pipeline\[external\]"):
        CorruptionConfig(families=["ext:keyboard"])


def test_corrupt_list_shows_the_new_families(capsys):
    assert corruption_cli.main(["--list"]) == 0
    names = [ln.split("\t")[0] for ln in capsys.readouterr().out.splitlines()]
    assert "misspelling" in names and set(EXTERNAL) <= set(names)
