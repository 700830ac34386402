"""Speed and effect of the `spell` input repair on real MDSD electronics reviews.

Speed: reviews/s of a fresh SpellRepair (empty word cache; loading the counts and building the index timed apart) on
clean and tutorial-corrupted reviews; `_warm`: after repairing other reviews first; `_repeat`: the same reviews
again. Effect: each corrupted review aligned word by word with its clean text (difflib; deleted words counted
apart): `restored` (altered words turned back into the clean word), `intact_changed` (unaltered words the repair
changes), `clean_changed` (clean reviews' words it changes), `miscorrected` (altered words turned into a third word)
and the agreement with the clean words before and after; without a vocabulary and with the unscored reviews' one.

    .venv/bin/python -m bench.spell_repair [--n 400] [--severity 3] [--seed 42]
    .venv/bin/python -m bench.spell_repair --pool train [--variants ...]      # the check that chooses changes
    .venv/bin/python -m bench.spell_repair --pool external [--variants ...]   # the ext: families, reported after

`--pool train` never sees a review bench/defenses.py tests or validates on: the first 700 reviews of its training
pool, corrupted with seed 1000 at severity 3 by the tutorial composite and the own keyboard, misspelling and ocr
families, with the next 700 reviews' vocabulary; `--variants` scores candidate repairs side by side on it.

Rules, each fixed before its candidates were measured; the `ext:` sets never enter them. A change, against the
current repair with vocabulary, must raise `restored` by at least 2 points on the family it aims at (the tutorial
composite; `misspelling`; `ocr` for digits typed for letters), lower it on the other families by at most 0.5 point,
raise no intact-changed share nor `clean_changed` by more than 0.2 point, and keep the corrupted speed (fresh cache,
with vocabulary) at 200 reviews/s or more; one aimed at wrong-word repairs must instead lower `pooled_miscorrected` by
a quarter, giving up at most 0.5 point of `pooled_restored` per point removed and 2 of `restored` on any family.
Whether the repaired model wins back the drop is bench/defenses.py's question. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from bench import REPO
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.data.readers import read_mdsd_folder
from ttt_pipeline.defenses.spell import DEFAULT_FIXES, SpellRepair, _base_index, _counts

DEFAULT_DATA = REPO.parent / "shared" / "data" / "mdsd"


def aligned(clean: str, corrupted: str):
    """(altered pairs, intact positions in the corrupted text, deleted count): words of `clean` matched
    to words of `corrupted`; unequal replace blocks are paired position by position."""
    a, b = clean.split(), corrupted.split()
    altered, intact, deleted = [], [], 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            intact.extend(range(j1, j2))
        elif op == "replace":
            n = min(i2 - i1, j2 - j1)
            altered.extend((a[i1 + k], j1 + k) for k in range(n))
            deleted += (i2 - i1) - n
        elif op == "delete":
            deleted += i2 - i1
    return altered, intact, deleted


def effect(repair: SpellRepair, clean: list[str], corrupted: list[str]) -> dict:
    fixed = repair.repair_all(corrupted)
    restored = miscorrected = n_altered = intact_changed = n_intact = deleted = 0
    misses: Counter = Counter()
    for c, x, y in zip(clean, corrupted, fixed):
        xs, ys = x.split(), y.split()
        assert len(xs) == len(ys)
        altered, intact, d = aligned(c, x)
        deleted += d
        for word, j in altered:
            n_altered += 1
            restored += ys[j] == word
            miscorrected += ys[j] != word and ys[j] != xs[j]
        n_intact += len(intact)
        for j in intact:
            if ys[j] != xs[j]:
                intact_changed += 1
                misses[(xs[j], ys[j])] += 1
    clean_fixed = repair.repair_all(clean)
    cw = [w for t in clean for w in t.split()]
    fw = [w for t in clean_fixed for w in t.split()]
    changes = Counter((a, b) for a, b in zip(cw, fw) if a != b)
    n_clean = n_altered + n_intact + deleted
    return {"agreement_before": n_intact / n_clean, "agreement_after": (n_intact - intact_changed + restored) / n_clean,
            "altered_words": n_altered, "deleted_words": deleted, "restored": restored / n_altered,
            "miscorrected": miscorrected / n_altered,
            "intact_changed": intact_changed / n_intact, "clean_changed": sum(changes.values()) / len(cw),
            "clean_words": len(cw), "top_clean_changes": [f"{a}->{b} x{n}" for (a, b), n in changes.most_common(12)]}


def speed(repair_factory, texts: list[str], warm: list[str] | None = None, repeat: bool = False) -> float:
    """reviews/s of repairing `texts` with a new repair, after it repaired `warm` (and `texts`, when `repeat`)."""
    repair = repair_factory()
    repair.repair_all((warm or []) + (texts if repeat else []))
    t = time.perf_counter()
    repair.repair_all(texts)
    return len(texts) / (time.perf_counter() - t)


def training_pool() -> tuple[list[str], list[str]]:
    """(the check's 700 evaluated reviews, the next 700 as its vocabulary): the first of bench/defenses.py's training
    pool (MDSD electronics, its shuffle), never a review it scores or validates on."""
    from bench.common import load_domain

    texts, _ = load_domain("electronics")
    pool = texts[:int(0.8 * len(texts))]
    return pool[:700], pool[700:1400]


def variant_fixes(variant: str):
    """`base` (no fixes), `default` (DEFAULT_FIXES) or fixes joined by `+`."""
    return [] if variant == "base" else DEFAULT_FIXES if variant == "default" else variant.split("+")


def pooled(effects: dict[str, dict]) -> dict:
    """Each family's `miscorrected` share, and `pooled_restored` / `pooled_miscorrected` over the families
    together, weighted by their altered words (the wrong-word rule, module docstring)."""
    altered = sum(e["altered_words"] for e in effects.values())
    out = {f"{family}_miscorrected": e["miscorrected"] for family, e in effects.items()}
    for key in ("restored", "miscorrected"):
        out[f"pooled_{key}"] = sum(e[key] * e["altered_words"] for e in effects.values()) / altered
    return out


def pool_check(variants: list[str], severity: int) -> dict:
    """The `--pool train` check (module docstring): each variant (`base`, or fixes joined by `+`) on 700
    training-pool reviews, tutorial composite, keyboard, misspelling and ocr, seed 1000, vocabulary of the next
    700 reviews."""
    evaluated, vocabulary = training_pool()
    corrupted = {fam: corrupt_texts(evaluated, fam, severity, 1000).texts
                 for fam in ("tutorial", "keyboard", "misspelling", "ocr")}
    _counts()
    out = {}
    for variant in variants:
        fixes = variant_fixes(variant)

        def make(fixes=fixes):
            return SpellRepair(extra_vocabulary=vocabulary, fixes=fixes)
        tutorial = effect(make(), evaluated, corrupted["tutorial"])
        keyboard = effect(make(), evaluated, corrupted["keyboard"])
        misspelled = effect(make(), evaluated, corrupted["misspelling"])
        ocr = effect(make(), evaluated, corrupted["ocr"])
        out[variant] = {"restored": tutorial["restored"], "intact_changed": tutorial["intact_changed"],
                        "clean_changed": tutorial["clean_changed"], "agreement_after": tutorial["agreement_after"],
                        "altered_words": tutorial["altered_words"], "keyboard_restored": keyboard["restored"],
                        "keyboard_intact_changed": keyboard["intact_changed"],
                        "ocr_restored": ocr["restored"], "ocr_intact_changed": ocr["intact_changed"],
                        "misspelling_restored": misspelled["restored"],
                        "misspelling_intact_changed": misspelled["intact_changed"],
                        **pooled({"tutorial": tutorial, "keyboard": keyboard, "misspelling": misspelled, "ocr": ocr}),
                        "reviews_per_s_corrupted_vocab": speed(make, corrupted["tutorial"]),
                        "top_clean_changes": tutorial["top_clean_changes"][:6]}
        print(variant, json.dumps(out[variant]), file=sys.stderr)
    return {"pool": "train", "reviews": len(evaluated), "seed": 1000, "variants": out}


def external_report(variants: list[str], severity: int) -> dict:
    """`--pool external`: after a change is adopted, the same 700 training-pool reviews and vocabulary as the check,
    corrupted by the held-out `ext:` families (seed 1000): each variant's restored, intact-changed and agreement
    shares. A report, never a rule's input (module docstring)."""
    evaluated, vocabulary = training_pool()
    out: dict = {}
    for family in ("ext:ocr", "ext:keyboard", "ext:random_char", "ext:spelling"):
        corrupted = corrupt_texts(evaluated, family, severity, 1000).texts
        for variant in variants:
            found = effect(SpellRepair(extra_vocabulary=vocabulary, fixes=variant_fixes(variant)), evaluated, corrupted)
            out.setdefault(family, {})[variant] = {k: found[k] for k in ("restored", "intact_changed",
                                                                          "agreement_before", "agreement_after")}
            print(family, variant, json.dumps(out[family][variant]), file=sys.stderr)
    return {"pool": "external", "reviews": len(evaluated), "seed": 1000, "families": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--severity", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--pool", choices=["test", "train", "external"], default="test",
                    help="train: the check that chooses changes to spell (module docstring); external: the held-out "
                         "ext: families on the same reviews, reported after a change is adopted")
    ap.add_argument("--variants", nargs="+", default=["base"], help="with --pool train: `base` (no fixes), `default`, or fixes joined by +")
    args = ap.parse_args()
    if args.pool != "test":
        check = pool_check if args.pool == "train" else external_report
        print(json.dumps(check(args.variants, args.severity)))
        return

    texts = [" ".join(t.split()) for t in read_mdsd_folder(args.data_dir / "electronics")["text"] if t.strip()]
    random.Random(0).shuffle(texts)
    test, train = texts[:args.n], texts[args.n:]
    corrupted = corrupt_texts(test, "tutorial", args.severity, args.seed).texts
    words = sum(len(t.split()) for t in test) / len(test)

    t = time.perf_counter()
    _counts()
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    _base_index(2)
    index_s = time.perf_counter() - t
    t = time.perf_counter()
    SpellRepair(extra_vocabulary=train)
    vocab_s = time.perf_counter() - t

    out = {"reviews": len(test), "words_per_review": round(words, 1), "counts_load_s": round(load_s, 2),
           "index_build_s": round(index_s, 2), "vocabulary_build_s": round(vocab_s, 2), "train_reviews": len(train)}
    out["reviews_per_s_clean"] = round(speed(SpellRepair, test), 1)
    out["reviews_per_s_corrupted"] = round(speed(SpellRepair, corrupted), 1)
    out["reviews_per_s_corrupted_vocab"] = round(speed(lambda: SpellRepair(extra_vocabulary=train), corrupted), 1)
    others = corrupt_texts(train[:800], "tutorial", args.severity, args.seed + 1).texts
    out["reviews_per_s_clean_warm"] = round(speed(SpellRepair, test, warm=train), 1)
    out["reviews_per_s_corrupted_warm"] = round(speed(SpellRepair, corrupted, warm=others), 1)
    out["reviews_per_s_corrupted_repeat"] = round(speed(SpellRepair, corrupted, repeat=True), 1)
    out["no_vocabulary"] = effect(SpellRepair(), test, corrupted)
    out["train_vocabulary"] = effect(SpellRepair(extra_vocabulary=train), test, corrupted)
    for key in ("no_vocabulary", "train_vocabulary"):
        print(key, json.dumps(out[key], indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
