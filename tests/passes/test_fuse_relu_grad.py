"""``fuse_relu_grad``: relu's where(x > 0, dy, 0) as one ReluGrad, with the same gradients.

The reference is the unfused program's gradient run on the same executor; the
torch backend applies the pass on its own copy (the user's program keeps its
Greater/Where, so second derivatives still work).
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ir.verify import verify_program


def _relu_net():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 5], stop_gradient=False)
        h = rg.relu(rg.layers.fc(x, 7, name="fc1"))
        loss = rg.sum(rg.layers.fc(h, 3, name="fc2") ** 2.0)
        dx, = rg.gradients(loss, [x])
    return main, startup, loss, dx


def _types(program) -> list[str]:
    return [op.type for op in program.global_block().ops]


def test_relu_gradient_becomes_one_op_with_the_same_values(backend):
    if backend.name == "onnxruntime":
        pytest.skip("the engine runs the exported program")
    main, startup, loss, dx = _relu_net()
    fused = main.clone()
    assert rg.passes.fuse_relu_grad(fused) == 1
    assert "ReluGrad" in _types(fused) and "Where" not in _types(fused) and "Greater" not in _types(fused)
    verify_program(fused)
    exe = backend.executor()
    exe.run(startup)
    feed = {"x": np.random.default_rng(0).standard_normal((4, 5)).astype("float32")}
    want, = exe.run(main, feed=feed, fetch_list=[dx.name])
    got, = exe.run(fused, feed=feed, fetch_list=[dx.name])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_mask_read_twice_is_left_alone():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4])
        dy = rg.data("dy", [4])
        mask = x > 0.0
        out = rg.where(mask, dy, 0.0)
        rg.cast(mask, "float32")                 # a second reader: the mask must stay
    assert rg.passes.fuse_relu_grad(main, keep=frozenset({out.name})) == 0


def test_a_where_with_a_nonzero_fill_is_left_alone():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4])
        dy = rg.data("dy", [4])
        rg.where(x > 0.0, dy, 1.0)
    assert rg.passes.fuse_relu_grad(main) == 0


def test_the_torch_backend_runs_the_fused_form_and_prints_the_program_unchanged():
    pytest.importorskip("torch")
    main, startup, loss, dx = _relu_net()
    text = str(main)
    exe = rg.Executor(backend="torch")
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((2, 5), "float32")}, fetch_list=[dx])
    plan, = [p for p in exe._plans.values() if p.block.program is not startup]
    assert "ReluGrad" in [s.op.type for s in plan.steps]
    assert str(main) == text
