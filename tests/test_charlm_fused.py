"""The `retrograd train` model (retrograd/charlm.py): the fused LSTM on the torch backend."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd import charlm, cli

torch = pytest.importorskip("torch")

SMALL = dict(hidden=32, embed=16)
SEQ_LEN, BATCH = 12, 4


def _op_types(program) -> set[str]:
    return {op.type for block in program.blocks for op in block.ops}


@pytest.mark.parametrize("backend, device, fused", [
    ("torch", None, True), ("torch", "cpu", True), ("torch", "cuda", True), ("torch", "cuda:0", True),
    ("numpy", None, False), ("onnxruntime", None, False), ("cupy", None, False), ("cupy", "cuda", False)])
def test_for_backend_fuses_the_lstm_only_on_torch(backend, device, fused):
    """torch: oneDNN on the CPU, cuDNN on CUDA; other backends keep the general recurrence."""
    assert charlm.ModelConfig(**SMALL).for_backend(backend, device).fused is fused


@pytest.mark.parametrize("model", ["gru", "milstm"])
def test_for_backend_keeps_other_models_general(model):
    assert charlm.ModelConfig(model, **SMALL).for_backend("torch").fused is False


def _train_steps(cfg: charlm.ModelConfig, backend: str, steps: int = 2):
    """Losses of ``steps`` training steps and the parameters after them; the program's op types."""
    t = charlm.build_training(cfg, SEQ_LEN, "adam", 1e-2, 5.0, seed=0)
    exe = rg.Executor(backend=backend)
    exe.run(t.startup)
    corpus = np.arange(400) % len(charlm.VOCAB)
    losses = []
    for i in range(steps):
        xs, ys = charlm.batch_at(corpus, i, SEQ_LEN, BATCH, 0)
        loss, = exe.run(t.main, feed={"chars": xs, "next_chars": ys}, fetch_list=[t.loss])
        losses.append(float(loss))
    params = {name: rg.backends.to_numpy(exe.scope.get(name))
              for name in ("embed.w", "lstm0.w_ih", "lstm0.w_hh", "lstm0.b", "out.w")}
    return losses, params, _op_types(t.main)


def test_training_step_on_torch_runs_the_fused_lstm_with_numpys_numbers():
    cfg = charlm.ModelConfig(**SMALL)
    fused_losses, fused_params, fused_ops = _train_steps(cfg.for_backend("torch"), "torch")
    losses, params, ops = _train_steps(cfg.for_backend("numpy"), "numpy")
    assert {"LSTMSequence", "LSTMSequenceGrad"} <= fused_ops
    assert "LSTMSequence" not in ops and "RecurrentNetwork" in ops
    np.testing.assert_allclose(fused_losses, losses, rtol=1e-5)
    for name, value in params.items():
        np.testing.assert_allclose(fused_params[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_retrograd_train_builds_the_fused_lstm_for_backend_torch(tmp_path, monkeypatch):
    seen = []
    lstm = rg.layers.lstm

    def recording_lstm(*args, **kwargs):
        seen.append(kwargs.get("fused", False))
        return lstm(*args, **kwargs)

    monkeypatch.setattr(rg.layers, "lstm", recording_lstm)
    sizes = ["--hidden", "16", "--embed", "8", "--seq-len", "8", "--batch", "4", "--sample-len", "4",
             "--steps", "1", "--no-plot", "--save", str(tmp_path / "m.npz")]
    assert cli.main(["train", *sizes, "--backend", "torch"]) == 0
    assert seen and seen[0] is True                 # the training program's LSTM
    seen.clear()
    assert cli.main(["train", *sizes, "--backend", "numpy", "--save", str(tmp_path / "n.npz")]) == 0
    assert seen and not any(seen)
