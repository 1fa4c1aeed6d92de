"""fuse_linear_bias: MatMul (or SeqLinear) + bias Add as one SeqLinear with the bias (issue 22)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ir.verify import verify_program
from retrograd.passes import fuse_linear_bias


def _model():
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6])
        seq = rg.data("seq", [-1, 3, 6])
        h = rg.layers.fc(x, 5, act="tanh", name="fc1")           # MatMul + Add (+ Tanh)
        s = rg.layers.fc(seq, 5, name="fc2")                      # SeqLinear + Add
        loss = rg.mean(rg.square(h)) + rg.mean(s * s)
        rg.optim.Adam(0.05).minimize(loss)
    return main, startup, loss, h


def _feed(rng):
    return {"x": rng.standard_normal((4, 6)).astype("float32"),
            "seq": rng.standard_normal((2, 3, 6)).astype("float32")}


def _train(backend, main, startup, fetch, steps=3):
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    rng = np.random.default_rng(0)
    return [[np.asarray(v) for v in exe.run(main, feed=_feed(rng), fetch_list=fetch)] for _ in range(steps)], exe


def test_fc_products_take_their_bias_bit_for_bit():
    main, startup, loss, _ = _model()
    fused = main.clone()
    assert fuse_linear_bias(fused) == 2
    ops = fused.global_block().ops
    assert [len(op.inputs) for op in ops if op.type == "SeqLinear"][:2] == [3, 3]
    assert not any(op.type == "Add" and op.inputs[1] in ("fc1.b", "fc2.b") for op in ops)
    verify_program(fused)
    want, _ = _train("numpy", main, startup, [loss])
    got, _ = _train("numpy", fused, startup, [loss])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a[0], b[0])


def test_a_fetched_or_shared_product_is_left_alone():
    main, _, _, _ = _model()
    product = next(op.outputs[0] for op in main.global_block().ops if op.type == "MatMul")
    assert fuse_linear_bias(main.clone(), keep=frozenset([product])) == 1      # fc2's still fuses
    with rg.program_guard(main, rg.Program()):
        rg.sum(main.global_block().var(product))                              # a second reader
    assert fuse_linear_bias(main.clone()) == 1


def test_torch_backend_runs_the_fused_product_and_still_fetches_the_product():
    pytest.importorskip("torch")
    main, startup, loss, h = _model()
    want, _ = _train("numpy", main, startup, [loss, h])
    got, exe = _train("torch", main, startup, [loss, h])
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    ran = [step for plan in exe._plans.values() for step in plan.steps]
    assert any(s.op.type == "SeqLinear" and len(s.op.inputs) == 3 for s in ran)
    product = next(op.outputs[0] for op in main.global_block().ops if op.type == "MatMul")
    value, = exe.run(main, feed=_feed(np.random.default_rng(1)), fetch_list=[product])
    assert value.shape == (4, 5)
