"""The benches' smoke runs (`slow`) train and score a tiny random BERT (TTT_BENCH_MODEL, see bench/common.py):
seconds instead of minutes on MiniLM, and the JSON contract is the same. Their figures say nothing about accuracy;
the few checks that need the real encoder run it under the `bench` marker (`make test-bench`)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_bench_model(tiny_bert_dir, tmp_path_factory) -> Path:
    """tests/conftest.py's tiny BERT saved without its MLM head, as MiniLM ships (a BertModel): the benches' MLM-head
    warm-ups run as they do on MiniLM. Built the same every session, so bench/ttt_engine.py's cache keeps fitting."""
    from transformers import AutoTokenizer, BertForMaskedLM

    out = tmp_path_factory.mktemp("tiny-bert-encoder")
    BertForMaskedLM.from_pretrained(tiny_bert_dir).bert.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_bench_env(tiny_bench_model) -> dict:
    """The environment of a bench subprocess that runs on the tiny BERT."""
    return {**os.environ, "TTT_BENCH_MODEL": str(tiny_bench_model)}


@pytest.fixture(scope="session")
def minilm_bench_env() -> dict:
    """The environment of a bench subprocess on its default encoder, MiniLM (a TTT_BENCH_MODEL of the shell is
    dropped)."""
    return {k: v for k, v in os.environ.items() if k != "TTT_BENCH_MODEL"}


def _bench_module(name: str):
    """bench/<name>.py, imported as the module `bench.<name>` (the repository root is on pytest's pythonpath)."""
    return importlib.import_module(f"bench.{name}")


@pytest.fixture(scope="session")
def defenses_bench():
    """bench/defenses.py: its selection rule and kept scores."""
    return _bench_module("defenses")


@pytest.fixture(scope="session")
def speed_bench():
    """bench/speed.py: its roofline arithmetic."""
    return _bench_module("speed")
