"""The files of a Hugging Face model folder, checked before its weights load: each broken file named, with its fix.

Cheap checks up front: config.json and the tokenizer's JSON files parse (with `json`; tokenizer.json also with
the tokenizers library, which reads it the way transformers will), the weights file's tensor shapes are read
without their data (`safe_open` for safetensors; `torch.load(weights_only=True)` onto the meta device for a
pickled pytorch_model.bin, which also refuses a pickle that holds more than tensors), and the classification
head's out-features are compared with the config's labels. What transformers still raises at the load call is
mapped by `load_errors` (a hub model's files are not checked up front).

Why not just let transformers raise: its errors name neither the file nor the fix (`JSONDecodeError: Expecting
property name ...`, `RuntimeError: You set ignore_mismatched_sizes to False ...`, `SafetensorError: Error while
deserializing header ...`), and a head that does not match the labels is only reported after a full load.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path
from typing import Iterator

from ttt_pipeline.errors import ConfigError

CONFIG = "config.json"
# transformers' order of preference: a safetensors file over a pickle, one file over shards
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
# The classification head's last linear layer, by family: RoBERTa/ELECTRA, BART, BERT/DistilBERT/ALBERT/DeBERTa,
# decoder models (GPT-2, Llama), XLNet.
HEAD_WEIGHTS = ("classifier.out_proj.weight", "classification_head.out_proj.weight", "classifier.weight",
                "score.weight", "logits_proj.weight")
SAVE_AGAIN = "save the model again with model.save_pretrained(FOLDER), or copy the file again from its source"


def read_json(path: Path, where: str, fix: str) -> dict:
    """The JSON object in `path`; a ConfigError naming the file (and the line and column) when it is not one."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: {path} cannot be read ({exc.strerror or exc})", fix) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path} is not valid JSON (not UTF-8 text: a binary or damaged file)",
                          fix) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: {path} is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}; "
                          "the file is damaged, cut short or was edited by hand)", fix) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {path} holds a JSON {type(value).__name__}, not an object", fix)
    return value


def check_config(folder: Path, where: str) -> dict:
    """config.json of `folder`: a JSON object that names its model_type, with labels transformers can read."""
    path = Path(folder) / CONFIG
    config = read_json(path, where, "write it again with model.config.save_pretrained(FOLDER), or copy config.json "
                                    "again from where the model was saved")
    if not config.get("model_type"):
        raise ConfigError(f"{where}: {path} has no model_type, so which architecture the weights belong to is not "
                          "written in the folder", 'add the family to config.json (e.g. "model_type": "bert"), '
                          "or save the config again with model.config.save_pretrained(FOLDER)")
    id2label = config.get("id2label")
    if id2label is not None and not isinstance(id2label, dict):
        raise ConfigError(f"{where}: id2label in {path} is a {type(id2label).__name__}, not a mapping of output "
                          "index to label name", 'write it as {"0": "negative", "1": "positive"}, one entry per '
                          "output of the classification head")
    return config


def config_labels(config: dict) -> int:
    """How many labels transformers builds the head for: id2label's entries, else num_labels (default 2)."""
    return len(config["id2label"]) if config.get("id2label") else int(config.get("num_labels", 2))


def check_tokenizer_files(folder: Path, where: str) -> None:
    """The tokenizer's JSON files in `folder` parse; tokenizer.json is one the tokenizers library reads."""
    fix = ("save the tokenizer again with tokenizer.save_pretrained(FOLDER) (the one the model was fine-tuned "
           "with), or copy the file again from its source")
    for name in TOKENIZER_JSON:
        path = Path(folder) / name
        if path.exists() or path.is_symlink():  # a broken link is a file that cannot be read
            read_json(path, where, fix)
    path = Path(folder) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception for a file it cannot use
            raise ConfigError(f"{where}: {path} is not a tokenizer the tokenizers library reads ("
                              f"{str(exc).splitlines()[0]})", fix) from None


def weights_file(folder: Path) -> Path | None:
    """The weights file transformers loads from `folder` (an index for sharded weights); None when there is none."""
    return next((Path(folder) / n for n in WEIGHTS if (Path(folder) / n).is_file()), None)


def weight_shapes(path: Path, where: str, config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a weights file (the shards of an index), read without the tensors' data."""
    if path.name.endswith(".index.json"):
        index = read_json(path, where, SAVE_AGAIN)
        shards = sorted(set((index.get("weight_map") or {}).values()))
        gone = [s for s in shards if not (path.parent / s).is_file()]
        if gone:
            raise ConfigError(f"{where}: {path} names {len(gone)} weight shards that are not in the folder "
                              f"(e.g. {gone[0]})", "copy every shard the index names into the folder, or "
                              + SAVE_AGAIN)
        return {k: v for shard in shards for k, v in weight_shapes(path.parent / shard, where, config).items()}
    if path.suffix == ".safetensors":
        return _safetensors_shapes(path, where)
    return _pickle_shapes(path, where, config)


def _safetensors_shapes(path: Path, where: str) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise _bad_safetensors(path, where, exc) from None


def _pickle_shapes(path: Path, where: str, config: dict) -> dict[str, tuple[int, ...]]:
    import torch

    try:
        state = torch.load(str(path), map_location="meta", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _unsafe_pickle(path, where, config, exc) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise ConfigError(f"{where}: {path} cannot be read as PyTorch weights ({str(exc).splitlines()[0]}; the "
                          "file is cut short or damaged)", SAVE_AGAIN) from None
    if not isinstance(state, dict):
        raise ConfigError(f"{where}: {path} holds a {type(state).__name__}, not a state dict (tensor names to "
                          "tensors)", SAVE_AGAIN)
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def head_weight(shapes: dict[str, tuple[int, ...]]) -> tuple[str, tuple[int, ...]] | None:
    """(name, shape) of the classification head's last linear layer, found by its family's name; None if none."""
    for suffix in HEAD_WEIGHTS:
        for name, shape in shapes.items():
            if (name == suffix or name.endswith(f".{suffix}")) and len(shape) == 2:
                return name, shape
    return None


def check_weights(folder: Path, config: dict, where: str) -> None:
    """The weights file reads (header, or a pickle of tensors only) and its head has one output per label."""
    path = weights_file(folder)
    if path is None:
        return  # transformers names the files it looked for
    head = head_weight(weight_shapes(path, where, config))
    labels = config_labels(config)
    if head is None or head[1][0] == labels:
        return
    name, shape = head
    given = (f"id2label with {len(config['id2label'])} labels ({', '.join(map(str, config['id2label'].values()))})"
             if config.get("id2label") else f"num_labels {labels}")
    raise ConfigError(f"{where}: {Path(folder) / CONFIG} gives {given}, but the classification head in "
                      f"{path.name} ({name}, shape {list(shape)}) has {shape[0]} outputs",
                      "config.json and the weights are from different models: save them together with "
                      f"model.save_pretrained(FOLDER), or give config.json the head's {shape[0]} labels (id2label "
                      f"with {shape[0]} entries, num_labels {shape[0]})")


def convert_snippet(folder: Path, config: dict) -> str:
    """Python (three statements) that rewrites a trusted pickled pytorch_model.bin as model.safetensors."""
    heads = [a for a in config.get("architectures") or [] if a.endswith("ForSequenceClassification")]
    cls = heads[0] if heads else "AutoModelForSequenceClassification"
    f = str(Path(folder))
    return (f"import torch, transformers as t; c = t.AutoConfig.from_pretrained({f!r}); "
            f"sd = torch.load({f + '/pytorch_model.bin'!r}, weights_only=False); "
            f"t.{cls}.from_pretrained(None, config=c, state_dict=sd).save_pretrained({f!r}, "
            "safe_serialization=True)")


def _unsafe_pickle(path: Path, where: str, config: dict, exc) -> ConfigError:
    why = str(exc).split("WeightsUnpickler error: ")[-1].splitlines()[0].split(". ")[0].strip()
    return ConfigError(f"{where}: {path} was refused for safety: it is a pickle that holds more than tensors, and "
                       f"unpickling it could run code ({why[:200]})",
                       "only if you trust the file, convert it to safetensors once, in Python: "
                       f"{convert_snippet(path.parent, config)}; then give the folder again")


def _bad_safetensors(path: Path, where: str, exc: Exception) -> ConfigError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    short = any(w in reason for w in ("incomplete", "not fully covered", "too small", "too large", "EOF"))
    what = "is cut short" if short else "has a header that is not valid"
    return ConfigError(f"{where}: {path} {what} ({reason}), so its tensors cannot be read",
                       "download or copy it again (compare its size with the source's), or save the model "
                       "again with model.save_pretrained(FOLDER)")


@contextlib.contextmanager
def load_errors(where: str, folder: Path | None, config: dict | None = None) -> Iterator[None]:
    """Around a transformers load: its errors about broken files as ConfigErrors naming the file and the fix
    (`folder`: where the files are; None for a hub model, whose files are named alone). Anything else passes
    through."""
    from safetensors import SafetensorError

    def file(name: str) -> Path:
        return Path(folder) / name if folder is not None else Path(name)

    try:
        yield
    except SafetensorError as exc:
        raise _bad_safetensors(file("model.safetensors"), where, exc) from None
    except pickle.UnpicklingError as exc:
        raise _unsafe_pickle(file("pytorch_model.bin"), where, config or {}, exc) from None
    except RuntimeError as exc:
        if "ignore_mismatched_sizes" not in str(exc) and "size mismatch" not in str(exc):
            raise
        raise ConfigError(f"{where}: the weights' shapes do not match {file(CONFIG)} (e.g. the classification "
                          "head's outputs and num_labels / id2label)", "config.json and the weights are from "
                          "different models: save them together with model.save_pretrained(FOLDER)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: a JSON file in {folder or 'the model'} is not valid ("
                          f"{str(exc).splitlines()[0]})", "save the model and its tokenizer again with "
                          "save_pretrained(FOLDER), or copy the files again from their source") from None
