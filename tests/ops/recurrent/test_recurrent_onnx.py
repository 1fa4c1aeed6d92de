"""The recurrent ONNX lowering: one Loop in exported models (the contract's form); for the
onnxruntime engine a Scan (T > 0) or a Loop (T = 0) behind an If, same numbers either way.

The Scan form writes each step's outputs into its stacks in place (the backward's in time order,
no flip); the Loop form runs only for zero steps. Both are checked against the NumPy executor's
gradients of an LSTM with sequence lengths, at T = 4 and T = 0.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

pytest.importorskip("onnxruntime")

from retrograd.onnx.model import build_model  # noqa: E402


def _lstm_program():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 3], "float64", stop_gradient=False)
        lengths = rg.data("lengths", [-1], "int64")
        h_all, h_last, _, c_last = rg.layers.lstm(x, 5, seq_lengths=lengths, name="l")
        loss = rg.sum(h_all * h_all) + rg.sum(h_last * c_last)
        grads = rg.gradients(loss, [x] + [main.global_block().var(f"l.{p}") for p in ("w_ih", "w_hh", "b")])
    return main, startup, loss, grads


def _graphs(graph):
    """Every (op type, attribute name, subgraph) below ``graph``."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.g.node:
                yield node.op_type, attr.name, attr.g
                yield from _graphs(attr.g)


def test_lstm_steps_run_as_a_reverse_scan_when_there_are_steps():
    main, _, loss, grads = _lstm_program()
    built = build_model(main, [loss.name] + [g.name for g in grads], feed_names=["x", "lengths"],
                        scan_loops=True)
    bodies = {(op, attr): [n.op_type for n in sub.node] for op, attr, sub in _graphs(built.model.graph)}
    scans = [n for op, attr, sub in _graphs(built.model.graph) if attr == "then_branch" for n in sub.node
             if n.op_type == "Scan"]
    assert len(scans) == 2          # the forward's and the backward's, each in an If's then-branch
    backward = {a.name: list(a.ints) for a in scans[1].attribute if a.ints}
    assert set(backward["scan_input_directions"]) == {1} and set(backward["scan_output_directions"]) == {1}
    assert "Loop" in bodies[("If", "else_branch")]       # zero steps: the Loop form
    assert not any(n.op_type == "Loop" for n in built.model.graph.node)


def test_exported_recurrent_ops_are_loops(tmp_path):
    main, startup, loss, grads = _lstm_program()
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, tmp_path / "m.onnx", fetch_list=[loss] + grads, scope=exe.scope)
    top = [n.op_type for n in model.graph.node]
    assert top.count("Loop") == 2 and "Scan" not in top        # the forward's and the backward's
    assert not any(n.op_type == "Scan" for _, _, sub in _graphs(model.graph) for n in sub.node)


@pytest.mark.parametrize("steps", [4, 0])
def test_scan_and_zero_step_loop_give_the_numpy_executors_gradients(steps):
    main, startup, loss, grads = _lstm_program()
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(steps, 3, 3)), "lengths": np.array([steps, max(steps - 2, 0), 0])}
    results = []
    for backend in ("numpy", "onnxruntime"):
        exe = rg.Executor(backend=backend)
        exe.run(startup)
        if results:       # the same parameters on both
            for name in ("l.w_ih", "l.w_hh", "l.b"):
                exe.scope.set(name, first_scope.get(name))
        else:
            first_scope = exe.scope
        results.append(exe.run(main, feed=feed, fetch_list=[loss] + grads))
    for ours, ref in zip(results[1], results[0]):
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


def test_a_big_recurrent_weight_is_transposed_once_and_multiplied_from_the_left():
    """w_hh [256, 1024] (BIG_WEIGHT elements): the forward step runs Gemm(w_hh^T, h, transB=1) and
    a Transpose, w_hh^T made before the Scan; the numbers are the NumPy executor's."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8], "float32", stop_gradient=False)
        h_all, _, _, _ = rg.layers.lstm(x, 256, name="big")
        loss = rg.sum(h_all * h_all)
        grads = rg.gradients(loss, [x, main.global_block().var("big.w_hh")])
    built = build_model(main, [loss.name] + [g.name for g in grads], feed_names=["x"], scan_loops=True)
    forward = next(sub for op, _, sub in _graphs(built.model.graph) if op == "Scan")
    assert [n.op_type for n in forward.node][:2] == ["Gemm", "Transpose"]
    assert "MatMul" not in [n.op_type for n in forward.node]
    feed = {"x": np.random.default_rng(1).normal(size=(3, 2, 8)).astype(np.float32)}
    exe = rg.Executor(backend="numpy")
    exe.run(startup)
    engine = rg.Executor(backend="onnxruntime", scope=exe.scope)
    ref = exe.run(main, feed=feed, fetch_list=[loss] + grads)
    for ours, want in zip(engine.run(main, feed=feed, fetch_list=[loss] + grads), ref):
        np.testing.assert_allclose(ours, want, rtol=2e-5, atol=1e-6)
