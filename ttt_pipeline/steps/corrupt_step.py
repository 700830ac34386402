"""corrupt: the corruption suite, each (family, severity) set generated once and cached on its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import corrupt_inputs, version
from ttt_pipeline.storage import StepOutput, StepStore


def corrupt(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    """The suite for this config: an index over (family, severity) sets, each generated once and cached on
    its own, so adding a family or a severity only generates the new sets."""
    from ttt_pipeline.data.prepare import load_prepared

    inputs = corrupt_inputs(cfg, data)

    def build(tmp: Path) -> dict:
        loaded: list[list[str]] = []

        def test_texts() -> list[str]:  # read once, and only if some set must be generated
            if not loaded:
                loaded.append(load_prepared(data.path)[0]["test"]["text"])
            return loaded[0]

        sets = {}
        for family in cfg.corruption.families:
            sevs = [cfg.corruption.severities[0]] if family == "tutorial" else cfg.corruption.severities
            for sev in sevs:
                set_inputs = {"data": data.digest, "family": family, "severity": sev, "seed": cfg.corruption.seed}
                one = store.run("corrupt-set", set_inputs,
                                lambda t, f=family, s=sev: _write_set(t, test_texts(), f, s, cfg.corruption.seed),
                                version("corrupt-set"))
                sets[f"{family}-{sev}"] = {**one.meta, "path": one.path, "set_digest": one.digest}
        (tmp / "index.json").write_text(json.dumps(sets, indent=1))
        return {"sets": sets}

    return store.run("corrupt", inputs, guarded(cfg, "corrupt", build), version("corrupt"))


def _write_set(tmp: Path, texts: list[str], family: str, severity: int, seed: int) -> dict:
    from ttt_pipeline.corruption import corrupt_texts

    t0 = time.perf_counter()
    cs = corrupt_texts(texts, family, severity, seed)
    with open(tmp / "texts.jsonl", "w", encoding="utf-8") as f:
        for t in cs.texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return {"family": family, "severity": severity, "seed": seed, "n": len(cs.texts),
            "realised_edit_rate": cs.realised_edit_rate, "digest": cs.digest(), "wall_s": time.perf_counter() - t0,
            "examples": [[a, b] for a, b in list(zip(texts, cs.texts))[:5]]}
