"""bench/spell_repair.py --pool train: the check that chose spell's default fixes, re-run on real MDSD reviews."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BEFORE_GLYPHS = "undouble+case+real_word+jumble_late+context"  # the default fixes until `glyphs` was adopted


@pytest.mark.mdsd
def test_default_fixes_pass_the_adoption_rule(mdsd_dir):
    """The rule of the bench's docstring, against no fixes: restored +2 points or more, at most +0.2 point of
    changed intact and clean words, no more than 0.5 point lost on the keyboard family, 200 reviews/s; and the rule
    for glyph and digit typos for `glyphs` against the default before it."""
    proc = subprocess.run([sys.executable, "-m", "bench.spell_repair", "--pool", "train",
                           "--variants", "base", "default", BEFORE_GLYPHS], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    base, new = out["variants"]["base"], out["variants"]["default"]
    assert out["reviews"] == 700 and out["seed"] == 1000
    assert new["restored"] - base["restored"] >= 0.02
    assert new["intact_changed"] - base["intact_changed"] <= 0.002
    assert new["clean_changed"] - base["clean_changed"] <= 0.002
    assert base["keyboard_restored"] - new["keyboard_restored"] <= 0.005
    assert new["reviews_per_s_corrupted_vocab"] >= 100  # the rule says 200 on the idle machine; tests run loaded
    # `glyphs`, the last fix adopted, against the default before it by its own rule (glyph and digit typos)
    before = out["variants"][BEFORE_GLYPHS]
    assert new["ocr_restored"] - before["ocr_restored"] >= 0.02
    for family in ("restored", "keyboard_restored", "misspelling_restored"):
        assert before[family] - new[family] <= 0.005, family
    for changed in ("intact_changed", "keyboard_intact_changed", "misspelling_intact_changed", "ocr_intact_changed",
                    "clean_changed"):
        assert new[changed] - before[changed] <= 0.002, changed
    # the default's figures under the wrong-word rule (bench/spell_repair.py): deterministic, so pinned
    assert new["pooled_restored"] == pytest.approx(0.620, abs=5e-4)
    assert new["pooled_miscorrected"] == pytest.approx(0.153, abs=5e-4)
    assert new["keyboard_miscorrected"] == pytest.approx(0.120, abs=5e-4)


def test_pooled_weights_each_family_by_its_altered_words():
    from bench import spell_repair

    effects = {"a": {"altered_words": 100, "restored": 0.5, "miscorrected": 0.2},
               "b": {"altered_words": 300, "restored": 0.9, "miscorrected": 0.0}}
    out = spell_repair.pooled(effects)
    assert out == pytest.approx({"a_miscorrected": 0.2, "b_miscorrected": 0.0, "pooled_restored": 0.8,
                                 "pooled_miscorrected": 0.05})
