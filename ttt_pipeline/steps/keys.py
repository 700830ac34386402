"""Each step's cache key: the hash of its code version, its config section and its inputs' digests, so an unchanged
re-run returns the stored output without work, and any change upstream rebuilds downstream."""

from __future__ import annotations

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.machine import runtime
from ttt_pipeline.storage import StepOutput, StepStore
from ttt_pipeline.version import __version__

VERSIONS = {"download": "1", "tokenise": "1", "finetune": "3", "corrupt": "2", "corrupt-set": "1", "evaluate": "5",
            "import-model": "1", "attribute": "1", "new-reviews": "1", "calibrate": "1"}
# finetune 3: AdamW fused on a CPU too (the same update up to float rounding); evaluate 5: a plain forward pass
# (`none`, the repairs) autocasts by ttt.precision, as the engines do
# Settings that do not change a CPU run's results. `precision` is not one: it is keyed by what `auto` resolves
# to on this machine (bf16 where the CPU runs it natively, fp32 elsewhere), so each machine caches what it ran.
# activation_checkpointing recomputes the same forward with the same dropout draws (tests/test_train.py).
DEVICE_ONLY = {"device", "num_workers", "compile", "activation_checkpointing"}
# Fine-tune settings added later whose null is what ran before they existed: left out of the key when null, so
# models cached earlier keep their keys.
OPTIONAL_KEYS = {"augment", "attention_dropout", "hidden_dropout"}


def version(step: str) -> str:
    return f"{__version__}-{VERSIONS[step]}"


def stored(step: str, inputs: dict, store: StepStore) -> StepOutput | None:
    """The verified stored output for these inputs, if any (what a cache policy may serve)."""
    return store.load(step, StepStore.key(step, inputs, version(step)))


def download_inputs(cfg: PipelineConfig) -> dict:
    """A source is keyed by what it holds (a local file's digest, a remote address), never by how its path is
    spelled: `data/demo/...`, its resolved link target and an absolute path share one cached download."""
    from ttt_pipeline.data.sources import source_fingerprint

    d = cfg.data
    settings = d.model_dump(mode="json", exclude={"path", "test_path", "shift"})
    return {"data": settings, "source": source_fingerprint(d.path),
            "test_source": source_fingerprint(d.test_path, "data.test_path") if d.test_path else None,
            "shift": {k: source_fingerprint(v, f"data.shift.{k}") for k, v in sorted(d.shift.items())}}


def tokenise_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    from ttt_pipeline.modeling.tokenize import tokenizer_fingerprint

    return {"data": data.digest, "tokenizer": tokenizer_fingerprint(cfg.model.name),
            "max_length": cfg.model.max_length}


def finetune_inputs(cfg: PipelineConfig, tokens: StepOutput, data: StepOutput) -> dict:
    ft = {k: v for k, v in cfg.finetune.model_dump(mode="json").items()
          if k not in DEVICE_ONLY and not (k in OPTIONAL_KEYS and v is None)}
    ft["precision"] = runtime(cfg).train.name
    attention = runtime(cfg).attention.name  # keyed only where it changes the checkpoint's own (old keys hold)
    del ft["attention"]
    if attention is not None:
        ft["attention"] = attention
    out = {"tokens": tokens.digest, "data": data.digest, "model": cfg.model.model_dump(mode="json"), "finetune": ft}
    if cfg.finetune.unlabeled_path:  # the texts' content, not only their path, keys the model
        from ttt_pipeline.data.sources import source_fingerprint

        out["unlabeled"] = source_fingerprint(cfg.finetune.unlabeled_path, "finetune.unlabeled_path")
    return out


def wants_mlm(cfg: PipelineConfig) -> bool:
    """Whether a method in ttt.methods adapts on an MLM head (masked TTT and its recipes)."""
    from ttt_pipeline.defenses.registry import needs_mlm

    return any(needs_mlm(m) for m in cfg.ttt.methods)


def import_inputs(cfg: PipelineConfig, data: StepOutput, source) -> dict:
    from ttt_pipeline.modeling.hf_classifier import source_fingerprint

    return {"data_labels": data.meta["label_names"], "source": source_fingerprint(source),
            "label_map": cfg.model.label_map, "max_length": cfg.model.max_length,
            "mlm_from": cfg.ttt.mlm_from if wants_mlm(cfg) else None, "mlm": wants_mlm(cfg),
            "trust_remote_code": cfg.model.trust_remote_code}


def corrupt_inputs(cfg: PipelineConfig, data: StepOutput) -> dict:
    return {"data": data.digest, "corruption": cfg.corruption.model_dump(mode="json")}


def evaluate_inputs(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
                    families: list[str] | None = None) -> dict:
    sets_meta = corrupt_out.meta["sets"]
    chosen = [n for n, m in sets_meta.items() if families is None or m["family"] in families]
    return {"data": data.digest, "model": model_out.digest, "corrupt": corrupt_out.digest, "sets": chosen,
            "clean": families is None or "clean" in families, "ttt": _ttt_key(cfg),
            "evaluation": cfg.evaluation.model_dump(mode="json", exclude={"reference", "default_defense"}),
            "max_length": cfg.model.max_length}


def _ttt_key(cfg: PipelineConfig) -> dict:
    ttt = cfg.ttt.model_dump(mode="json")
    ttt["precision"] = runtime(cfg).score.name
    return ttt


def attribute_inputs(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
                     eval_outs: list[StepOutput]) -> dict:
    return {"data": data.digest, "model": model_out.digest, "corrupt": corrupt_out.digest,
            "evaluate": sorted(o.digest for o in eval_outs), "max_length": cfg.model.max_length,
            "attribution": cfg.attribution.model_dump(mode="json", exclude={"enabled"}),
            "device": runtime(cfg).device.type}  # the GPU projector draws other random matrices


def calibrate_inputs(cfg: PipelineConfig, data: StepOutput, model_out: StepOutput, corrupt_out: StepOutput,
                     eval_outs: list[StepOutput]) -> dict:
    """The evaluated predictions by digest, and what describes the sets anew: the default defense and its repairs'
    own settings (`ttt.<repair>`), which the descriptors' repaired_words_share reads."""
    from ttt_pipeline.defenses.registry import own_settings, parse

    defense = cfg.evaluation.default_defense
    repairs = {}
    for r in parse(defense).repairs if defense else ():
        own = own_settings(r, cfg.ttt)
        repairs[r] = None if own is None else own.model_dump(mode="json")
    return {"data": data.digest, "model": model_out.digest, "corrupt": corrupt_out.digest,
            "evaluate": sorted(o.digest for o in eval_outs), "defense": defense, "repairs": repairs}


def new_reviews_inputs(cfg: PipelineConfig, data: StepOutput, model: StepOutput, defense: str) -> dict:
    """The new reviews by content (the newest file of a drop folder), the model and data by digest, and what scores
    them."""
    from ttt_pipeline.data.newdata import resolve
    from ttt_pipeline.data.sources import source_fingerprint

    source = resolve(cfg.nightly.data_path)
    return {"data": data.digest, "model": model.digest, "source": source_fingerprint(source, "nightly.data_path"),
            "data_settings": cfg.data.model_dump(mode="json", exclude={"path", "test_path", "shift"}),
            "defense": defense, "ttt": _ttt_key(cfg), "confidence": cfg.evaluation.confidence}
