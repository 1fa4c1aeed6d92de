"""rg.linear_cross_entropy against torch's cross_entropy(h @ w + b) (float64), on every backend:
values, gradients of h, w and b, any chunk size, empty batches, a bad label; its peak memory
against the materialised loss; its exported Loop in a plain onnxruntime session."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

H, V = 6, 9


def _program(n_weights, chunk_rows, bias=True, dtype="float64"):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        h = rg.data("h", [-1, H], dtype, stop_gradient=False)
        w = rg.data("w", [H, V], dtype, stop_gradient=False)
        b = rg.data("b", [V], dtype, stop_gradient=False) if bias else None
        labels = rg.data("labels", [-1], "int64")
        weights = rg.data("weights", [-1], dtype)
        loss = rg.linear_cross_entropy(h, w, b, labels, chunk_rows=chunk_rows)
        grads = rg.gradients(rg.sum(loss * weights), [h, w] + ([b] if bias else []))
    return main, startup, [loss] + grads


def _torch(hv, wv, bv, labels, weights):
    th, tw = torch.tensor(hv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    tb = torch.tensor(bv, requires_grad=True) if bv is not None else None
    logits = th @ tw + (tb if tb is not None else 0.0)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels), reduction="none")
    inputs = [th, tw] + ([tb] if tb is not None else [])
    grads = torch.autograd.grad((loss * torch.tensor(weights)).sum(), inputs) if len(labels) else \
        [torch.zeros_like(t) for t in inputs]
    return [loss.detach().numpy()] + [g.numpy() for g in grads]


@pytest.mark.parametrize("n,chunk_rows,bias", [(7, 3, True), (7, 7, False), (7, 100, True), (12, None, True),
                                              (1, 1, True), (0, 4, True)])
def test_matches_torch_cross_entropy_of_the_logits(n, chunk_rows, bias, backend):
    r = np.random.default_rng(n)
    hv, wv, bv = r.standard_normal((n, H)), r.standard_normal((H, V)), r.standard_normal(V) if bias else None
    labels, weights = r.integers(0, V, n), r.standard_normal(n)
    main, startup, fetch = _program(3, chunk_rows, bias)
    exe = backend.executor()
    exe.run(startup)
    feed = {"h": hv, "w": wv, "labels": labels, "weights": weights, **({"b": bv} if bias else {})}
    ours = exe.run(main, feed=feed, fetch_list=fetch)
    for name, a, b in zip(["loss", "dh", "dw", "db"], ours, _torch(hv, wv, bv, labels, weights)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


def test_float32_large_logits_are_stable(backend):
    r = np.random.default_rng(1)
    hv = (r.standard_normal((5, H)) * 30).astype("float32")
    wv, bv = (r.standard_normal((H, V)) * 10).astype("float32"), r.standard_normal(V).astype("float32")
    labels, weights = r.integers(0, V, 5), np.ones(5, dtype="float32")
    main, startup, fetch = _program(3, 2, dtype="float32")
    exe = backend.executor()
    exe.run(startup)
    ours = exe.run(main, feed={"h": hv, "w": wv, "b": bv, "labels": labels, "weights": weights}, fetch_list=fetch)
    want = _torch(hv.astype("float64"), wv.astype("float64"), bv.astype("float64"), labels, weights)
    assert all(np.isfinite(a).all() for a in ours)
    np.testing.assert_allclose(ours[0], want[0], rtol=1e-4, atol=1e-3)


def test_a_label_out_of_range_fails_the_run_naming_the_op(backend):
    main, startup, fetch = _program(3, 2)
    exe = backend.executor()
    exe.run(startup)
    feed = {"h": np.zeros((3, H)), "w": np.zeros((H, V)), "b": np.zeros(V), "labels": np.array([0, V, 1]),
            "weights": np.ones(3)}
    with pytest.raises(rg.ExecutionError, match="LinearCrossEntropy"):
        exe.run(main, feed=feed, fetch_list=fetch[:1])


@pytest.mark.parametrize("bad", [
    lambda h, w, labels: rg.linear_cross_entropy(h, rg.data("w2", [H + 1, V]), None, labels),
    lambda h, w, labels: rg.linear_cross_entropy(h, w, rg.data("b2", [V + 1]), labels),
    lambda h, w, labels: rg.linear_cross_entropy(h, w, None, rg.data("l2", [-1], "float32")),
    lambda h, w, labels: rg.linear_cross_entropy(h, w, None, labels, chunk_rows=0),
])
def test_bad_operands_are_refused_when_built(bad):
    with rg.program_guard(rg.Program(), rg.Program()):
        h, w, labels = rg.data("h", [-1, H]), rg.data("w", [H, V]), rg.data("labels", [-1], "int64")
        with pytest.raises((rg.ShapeError, rg.ProgramError)):
            bad(h, w, labels)


def _peak(build, n, hidden, vocab):
    r = np.random.default_rng(0)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        h = rg.data("h", [-1, hidden], stop_gradient=False)
        w = rg.create_parameter("w", [hidden, vocab])
        labels = rg.data("labels", [-1], "int64")
        loss = rg.mean(build(h, w, labels))
        rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    exe.run(main, feed={"h": r.standard_normal((n, hidden)).astype("float32"),
                        "labels": r.integers(0, vocab, n)}, fetch_list=[loss])
    return exe.last_stats.peak_bytes


def test_peak_memory_is_a_fraction_of_the_materialised_loss():
    n, hidden, vocab = 2048, 64, 4096         # logits: 32 MB; one 256-row chunk: 4 MB
    chunked = _peak(lambda h, w, labels: rg.linear_cross_entropy(h, w, None, labels, chunk_rows=256),
                    n, hidden, vocab)
    whole = _peak(lambda h, w, labels: rg.softmax_cross_entropy(rg.matmul(h, w), labels), n, hidden, vocab)
    assert chunked < 0.25 * whole, (chunked, whole)


def test_exported_loop_runs_in_a_plain_session(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    r = np.random.default_rng(4)
    hv, wv, bv = r.standard_normal((10, H)), r.standard_normal((H, V)), r.standard_normal(V)
    labels, weights = r.integers(0, V, 10), r.standard_normal(10)
    main, startup, fetch = _program(3, 4)
    rg.onnx.export(main, str(tmp_path / "m.onnx"), fetch_list=fetch)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    outs = sess.run([v.name for v in fetch], {"h": hv, "w": wv, "b": bv, "labels": labels, "weights": weights})
    for a, b in zip(outs, _torch(hv, wv, bv, labels, weights)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert any(node.op_type == "Loop" for node in rg.onnx.export(main, str(tmp_path / "m.onnx"),
                                                                 fetch_list=fetch).graph.node)
