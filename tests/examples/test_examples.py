"""Smoke tests: each example runs a few training steps and actually learns something."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_char_lm_learns_and_samples(capsys):
    char_lm = _load("char_lm")
    vocab = len(char_lm.Vocab(char_lm.load_corpus()))
    loss = char_lm.main(steps=30, hidden=32, embed=8, seq_len=16, batch=8, lr=1e-2,
                        sample_length=20, log_every=10)
    # below the loss of a uniform guess over the vocabulary: it learned character frequencies
    assert math.isfinite(loss) and loss < math.log(vocab) - 0.5
    printed = capsys.readouterr().out
    sample = printed.split("--- sample ---\n", 1)[1].rstrip("\n")
    assert sample.startswith("def ") and len(sample) == len("def ") + 20


def test_char_lm_runs_with_gru_and_milstm():
    char_lm = _load("char_lm")
    for cell in ("gru", "milstm"):
        loss = char_lm.main(steps=2, hidden=8, embed=4, seq_len=6, batch=3, cell=cell,
                            sample_length=3, log_every=1)
        assert math.isfinite(loss)


def test_seq2seq_attention_trains_and_decodes():
    seq2seq = _load("seq2seq_attention")
    result = seq2seq.main(steps=60, length=4, batch=32, embed=8, hidden=32, lr=2e-2, eval_every=30)
    assert result["steps"] == 60 or result["sequence_accuracy"] >= 0.99
    # chance is 10% per token; a few dozen steps on length-4 reversal already beat it clearly
    assert result["token_accuracy"] > 0.3
    src, dec_in, target = seq2seq.make_batch(np.random.default_rng(0), 5, 3)
    np.testing.assert_array_equal(target, src[::-1])
    np.testing.assert_array_equal(dec_in[1:], target[:-1])
    assert (dec_in[0] == seq2seq.BOS).all()
