"""The `retrograd train` model (retrograd/models/charlm.py): the fused LSTM on the torch backend."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.models import charlm
from retrograd.cli import main as retrograd_command

torch = pytest.importorskip("torch")

SMALL = dict(hidden=32, embed=16)
SEQ_LEN, BATCH = 12, 4


def _op_types(program) -> set[str]:
    return {op.type for block in program.blocks for op in block.ops}


@pytest.fixture
def onednn_calls(monkeypatch):
    """How many times oneDNN's fused LSTM forward ran."""
    from retrograd.backends import torch_fused_rnn
    calls = []
    forward = torch_fused_rnn.OneDNNLSTM.forward

    def counted(self, *args):
        calls.append(args[0].shape)
        return forward(self, *args)
    monkeypatch.setattr(torch_fused_rnn.OneDNNLSTM, "forward", counted)
    return calls


@pytest.mark.parametrize("backend, device", [("torch", None), ("numpy", None), ("torch", "cuda")])
def test_for_backend_leaves_the_config_to_the_executor(backend, device):
    cfg = charlm.ModelConfig(**SMALL)
    assert cfg.for_backend(backend, device) == cfg and cfg.fused is None


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


def test_training_step_on_torch_runs_the_fused_lstm_with_numpys_numbers(onednn_calls):
    cfg = charlm.ModelConfig(**SMALL)
    fused_losses, fused_params, fused_ops = _train_steps(cfg, "torch")
    assert len(onednn_calls) == 2                    # one layer, two steps: oneDNN on torch CPU
    losses, params, ops = _train_steps(cfg, "numpy")
    assert len(onednn_calls) == 2
    assert fused_ops == ops and "RecurrentNetwork" in ops and "LSTMSequence" not in ops
    np.testing.assert_allclose(fused_losses, losses, rtol=1e-5)
    for name, value in params.items():
        np.testing.assert_allclose(fused_params[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_retrograd_train_runs_the_fused_lstm_for_backend_torch(tmp_path, onednn_calls):
    sizes = ["--hidden", "16", "--embed", "8", "--seq-len", "8", "--batch", "4", "--sample-len", "4",
             "--steps", "1", "--no-plot", "--save", str(tmp_path / "m.npz")]
    assert retrograd_command(["train", *sizes, "--backend", "torch"]) == 0
    assert (8, 4, 8) in onednn_calls                 # the training step's LSTM: [T, N, embed]
    onednn_calls.clear()
    assert retrograd_command(["train", *sizes, "--backend", "numpy", "--save", str(tmp_path / "n.npz")]) == 0
    assert not onednn_calls
