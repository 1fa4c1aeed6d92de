"""Training quality in mixed precision: the char LSTM LM and the char transformer trained in bf16 and
fp16 reach a held-out loss within 2% of float32's at the same step (short runs, the same seed,
batches and initial weights; the held-out loss is evaluated by the float32 forward).

Measured (30 steps, batch 8, hidden 64, torch backend): LSTM fp32 3.2045, bf16 3.2045, fp16 3.2045;
transformer fp32 3.0129, bf16 3.0133, fp16 3.0127. The recurrence and the norms, softmax and loss
run in float32 (rg.amp.FLOAT32, ops with sub-blocks), so only the products round."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.models import charlm
from retrograd.models.charlm import (ModelConfig, batch_at, build_loss, build_training,
                                     held_out_batches, split_corpus)

pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 is ml_dtypes' (pip install ml_dtypes)")

STEPS, SEQ_LEN, BATCH = 30, 32, 8


def _held_out_after_training(cfg: ModelConfig, precision: str, backend: str) -> float:
    ids = charlm.builtin_corpus().ids
    train, held_out = split_corpus(ids)
    t = build_training(cfg, SEQ_LEN, "adam", 3e-3, 5.0, seed=0, precision=precision)
    val, val_loss = build_loss(cfg, SEQ_LEN)
    exe = rg.Executor(backend=backend)
    exe.run(t.startup)
    for step in range(STEPS):
        x, y = batch_at(train, step, SEQ_LEN, BATCH, seed=0)
        exe.run(t.main, feed={"chars": x, "next_chars": y})
    losses = [exe.run(val, feed={"chars": x, "next_chars": y}, fetch_list=[val_loss])[0]
              for x, y in held_out_batches(held_out, SEQ_LEN, BATCH)]
    return float(np.mean(losses))


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_bf16_and_fp16_reach_float32s_held_out_loss(model):
    backend = "torch" if _has_torch() else "numpy"
    cfg = ModelConfig(model=model, hidden=64, layers=1)
    fp32 = _held_out_after_training(cfg, "fp32", backend)
    for precision in ("bf16", "fp16"):
        low = _held_out_after_training(cfg, precision, backend)
        print(f"{model} {precision}: held-out {low:.4f}, fp32 {fp32:.4f} ({(low - fp32) / fp32:+.2%})")
        assert abs(low - fp32) <= 0.02 * fp32, f"{model} {precision}: held-out {low:.4f} vs fp32 {fp32:.4f}"
    assert fp32 < np.log(len(charlm.BUILTIN_VOCAB)) - 0.5     # it did learn something


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
