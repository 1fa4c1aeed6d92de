"""examples/gpt_chars.py: a short run learns far more than character frequencies."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt_chars.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_gpt_chars", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpt():
    return _load()


def test_gpt_chars_beats_the_unigram_loss_on_held_out_text(gpt, capsys):
    cfg = gpt.Config(width=32, heads=2, layers=2, seq_len=32)
    result = gpt.main(steps=100, cfg=cfg, batch=16, lr=1e-2, log_every=25, sample_length=20)
    # the unigram loss (~3.16 nats) is what a model ignoring context gets; 100 steps reach ~2.6
    assert result["held_out_loss"] < result["unigram_loss"] - 0.35
    assert result["train_loss"] < result["unigram_loss"] - 0.35
    sample = capsys.readouterr().out.split("--- sample ---\n", 1)[1].rstrip("\n")
    assert sample.startswith("def ") and len(sample) == len("def ") + 20


def test_test_program_is_forward_only_and_dropout_free(gpt):
    model = gpt.build(gpt.Config(width=16, heads=2, layers=1, seq_len=8, dropout=0.5), lr=1e-3, steps=10)
    types = {op.type for op in model.test.global_block().ops}
    assert "Dropout" in {op.type for op in model.main.global_block().ops}
    assert not any("Grad" in t or "Update" in t for t in types)
    exe = rg.Executor()
    exe.run(model.startup)
    rng = np.random.default_rng(0)
    feed = {"ids": rng.integers(0, gpt.VOCAB, (2, 8)), "targets": rng.integers(0, gpt.VOCAB, (2, 8)),
            "positions": np.arange(8)}
    first, = exe.run(model.test, feed=feed, fetch_list=[model.loss])
    second, = exe.run(model.test, feed=feed, fetch_list=[model.loss])
    assert first == second                  # no dropout, no update between the runs


def test_unigram_loss_is_the_cross_entropy_of_frequencies(gpt):
    train = np.array([0, 0, 1, 1])
    held_out = np.array([0, 1])
    counts = np.bincount(train, minlength=gpt.VOCAB) + 1.0
    assert gpt.unigram_loss(train, held_out) == pytest.approx(-np.log(3.0 / counts.sum()))
