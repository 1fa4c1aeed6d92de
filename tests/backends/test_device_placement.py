"""Every array a program makes lives on the executor's device, checked without a GPU.

PyTorch's "meta" device holds shapes and dtypes but no data, and refuses to mix
with CPU tensors: run on it, any kernel (or random draw, or transfer) that made
a host array instead of one on the executor's device fails at once. This is how
CI without a GPU checks that the CUDA backend keeps everything on the GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends.base import Namespace

torch = pytest.importorskip("torch")
from retrograd.backends.torch_backend import TorchBackend  # noqa: E402


class MetaTorchBackend(TorchBackend):
    """The torch backend on the meta device (values are not computed; shapes are)."""

    def __init__(self):
        super().__init__("cpu")
        import array_api_compat.torch as compat
        meta = torch.device("meta")
        self.torch_device, self.device = meta, "meta"
        self.xp = Namespace(compat, meta, matmul=torch.matmul)


def test_training_step_of_an_lstm_with_dropout_stays_on_the_device():
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8])
        target = rg.data("target", [-1, -1, 11])
        h_all, _, _, _ = rg.layers.lstm(x, 12, name="lstm")
        logits = rg.layers.fc(rg.dropout(h_all, 0.3), 11, name="out")
        loss = rg.mean(rg.log_softmax(logits) * target)
        w = rg.create_parameter("extra", [11], init=("normal", 0.0, 1.0))
        loss = loss + rg.mean(w * w)
        rg.optim.SGD(0.1, clip_norm=1.0).minimize(loss)
    exe = rg.Executor(backend=MetaTorchBackend())
    exe.run(startup)
    assert {exe.scope.get(v.name).device.type for v in main.all_parameters()} == {"meta"}
    feed = {"x": np.zeros((5, 3, 8), "float32"), "target": np.zeros((5, 3, 11), "float32")}
    loss_v, = exe.run(main, feed=feed, fetch_list=[loss], return_numpy=False)
    assert loss_v.device.type == "meta" and tuple(loss_v.shape) == ()
    assert exe.last_stats.peak_bytes > 0
