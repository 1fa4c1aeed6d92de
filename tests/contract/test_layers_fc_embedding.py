"""Contract: layers.fc (2-D and 3-D input) and layers.embedding, values and gradients vs torch."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg


def test_fc_3d_input_over_last_axis_vs_torch():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 5], dtype="float64", stop_gradient=False)
        y = rg.layers.fc(x, 3, act="sigmoid", name="proj")
        loss = rg.sum(y * y)
        pg = rg.append_backward(loss)
        gx, = rg.gradients([loss], [x])
    sv = startup.global_block().vars
    assert tuple(sv["proj.w"].shape) == (5, 3) and tuple(sv["proj.b"].shape) == (3,)
    assert y.shape[-1] == 3 and len(y.shape) == 3
    exe = rg.Executor()
    exe.run(startup)
    xv = np.random.default_rng(0).standard_normal((4, 2, 5))
    yv, *gs = exe.run(main, feed={"x": xv}, fetch_list=[y] + [g for _, g in pg] + [gx])
    w = torch.tensor(np.asarray(exe.scope.get("proj.w")), requires_grad=True)
    b = torch.tensor(np.asarray(exe.scope.get("proj.b")), requires_grad=True)
    xt = torch.tensor(xv, requires_grad=True)
    yt = torch.sigmoid(xt @ w + b)
    (yt * yt).sum().backward()
    np.testing.assert_allclose(yv, yt.detach().numpy(), rtol=1e-12)
    for v, ref in zip(gs, (w, b, xt)):
        np.testing.assert_allclose(v, ref.grad.numpy(), rtol=1e-10)


def test_embedding_repeated_ids_vs_torch():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        e = rg.layers.embedding(ids, 10, 4, name="emb")
        wgt = rg.data("wgt", [-1, -1, 4])
        loss = rg.sum(e * wgt)
        (p, g), = rg.append_backward(loss)
    assert p.name == "emb.w" and tuple(p.shape) == (10, 4)
    assert tuple(startup.global_block().vars["emb.w"].shape) == (10, 4)
    exe = rg.Executor()
    exe.run(startup)
    idv = np.array([[1, 1, 3], [9, 1, 0]], "int64")
    wv = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    ev, gv = exe.run(main, feed={"ids": idv, "wgt": wv}, fetch_list=[e, g])
    table = np.asarray(exe.scope.get("emb.w"))
    np.testing.assert_array_equal(ev, table[idv])
    tt = torch.tensor(table, requires_grad=True)
    (torch.nn.functional.embedding(torch.tensor(idv), tt) * torch.tensor(wv)).sum().backward()
    np.testing.assert_allclose(gv, tt.grad.numpy(), rtol=1e-6, atol=1e-6)
    assert np.all(gv[[2, 4, 5, 6, 7, 8]] == 0)
