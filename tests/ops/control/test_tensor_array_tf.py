"""TensorArray's TF API (issue 32, item 13): ``element_shape=None`` (the first write sets it),
``unstack``, ``scatter``, ``gather``, ``concat`` and ``split``, against TF's TensorArray semantics
written in NumPy, with float64 gradients against torch autograd of the same computation, on every
backend (numpy, torch, the onnxruntime engine) and in the exported model."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ops: the shared ONNX reference
from onnx_reference import exported  # noqa: E402

torch = pytest.importorskip("torch", reason="the reference gradients come from PyTorch")

pytestmark = pytest.mark.engine

X = np.arange(12.0).reshape(4, 3) / 7.0 - 0.5


def run(backend, build, feed, wrt="x"):
    """``build(*data Vars)`` -> outputs, then the gradient of ``sum(out * sin(out))`` over the
    float outputs with respect to ``wrt``."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = {n: rg.data(n, list(v.shape), v.dtype.name, stop_gradient=False) for n, v in feed.items()}
        outs = build(*xs.values())
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        loss = rg.add_n([rg.sum(o * rg.sin(o)) for o in outs if o.dtype == "float64"])
        grads = rg.gradients(loss, [xs[wrt]], unconnected="zero") if wrt else []
    return backend.executor().run(main, feed=feed, fetch_list=outs + grads)


def torch_grad(fn, x0):
    t = torch.tensor(x0, requires_grad=True)
    outs = fn(t)
    loss = sum((o * torch.sin(o)).sum() for o in outs)
    return torch.autograd.grad(loss, t)[0].numpy()


# TF's TensorArray, written in NumPy: a list of elements; unwritten elements read as zeros.
def tf_scatter(elements, ids, x, element_shape):
    elements = list(elements)
    for j, i in enumerate(ids):
        while len(elements) <= i:
            elements.append(np.zeros(element_shape))
        elements[i] = x[j]
    return elements


def test_unstack_scatter_gather_concat_split_follow_tf_semantics(backend):
    def build(x):
        arr = rg.TensorArray(dtype="float64")                       # element_shape from the first write
        rows = arr.unstack(x)                                       # 4 elements [3]
        scattered = rg.TensorArray(dtype="float64").scatter([5, 1, 2], x[1:] * 2.0)
        pieces = rg.TensorArray(dtype="float64").split(x, [2, 2])   # 2 elements [2, 3]
        return [rows.stack(), rows.read(2), rows.size(), scattered.stack(), scattered.size(),
                scattered.gather([5, 0]), pieces.stack(), pieces.concat(), pieces.read(1),
                rows.write(4, x[0] + 1.0).stack()]
    got = run(backend, build, {"x": X})
    s = tf_scatter([], [5, 1, 2], X[1:] * 2.0, (3,))
    want = [X, X[2], 4, np.stack(s), 6, np.stack([s[5], s[0]]), X.reshape(2, 2, 3), X, X[2:],
            np.concatenate([X, X[:1] + 1.0])]
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(ours, ref, rtol=1e-15)

    def peer(t):            # the same computation in torch, for the gradient
        s = [torch.zeros(3, dtype=t.dtype)] * 6
        for j, i in enumerate([5, 1, 2]):
            s[i] = t[1 + j] * 2.0
        s = torch.stack(s)
        return [t, t[2], s, s[[5, 0]], t.reshape(2, 2, 3), t, t[2:], torch.cat([t, t[:1] + 1.0])]
    np.testing.assert_allclose(got[-1], torch_grad(peer, X), rtol=1e-12)
    ours = exported(lambda x: build(x)[:-1], {"x": X})
    for e, g in zip(ours, got):
        np.testing.assert_allclose(e, g, rtol=1e-15)


def test_scatter_into_a_written_array_grows_it_and_repeated_ids_keep_the_last_row(backend):
    def build(x):
        arr = rg.TensorArray(dtype="float64", element_shape=[3]).unstack(x[:2])
        return [arr.scatter([1, 3, 1], x[1:] * x[1:]).stack(), arr.scatter([0], x[:1]).stack()]
    got = run(backend, build, {"x": X})
    grown = tf_scatter([X[0], X[1]], [1, 3, 1], X[1:] ** 2, (3,))
    np.testing.assert_allclose(got[0], np.stack(grown), rtol=1e-15)
    np.testing.assert_allclose(got[1], np.stack([X[0], X[1]]), rtol=1e-15)

    def peer(t):
        a = [t[0], (t[3] * t[3]), torch.zeros(3, dtype=t.dtype), t[2] * t[2]]       # row 1: the last id wins
        return [torch.stack(a), torch.stack([t[0], t[1]])]
    np.testing.assert_allclose(got[2], torch_grad(peer, X), rtol=1e-12)


def test_an_unshaped_array_in_a_while_loop_after_its_first_write_and_its_second_order(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [4, 3], "float64", stop_gradient=False)
        n = rg.data("n", [], "int64")
        arr = rg.TensorArray(dtype="float64").unstack(x)

        def body(i, acc, arr):
            h = rg.tanh(arr.read(i) + acc)
            return i + 1, h, arr.write(i + 4, h)
        _, acc, arr = rg.while_loop(lambda i, acc, arr: i < n, body,
                                    [rg.constant(0), rg.fill([3], 0.1, "float64"), arr])
        loss = rg.sum(arr.stack()) + rg.sum(acc * acc)
        dx, = rg.gradients(loss, [x])
        ddx, = rg.gradients(rg.sum(dx * dx), [x])
    got = backend.executor().run(main, feed={"x": X, "n": np.array(3)}, fetch_list=[arr.stack(), dx, ddx])

    t = torch.tensor(X, requires_grad=True)
    rows, acc = list(t), torch.full((3,), 0.1, dtype=torch.float64)
    for i in range(3):
        acc = torch.tanh(rows[i] + acc)
        rows.append(acc)
    tloss = torch.stack(rows).sum() + (acc * acc).sum()
    tdx, = torch.autograd.grad(tloss, t, create_graph=True)
    tddx, = torch.autograd.grad((tdx * tdx).sum(), t)
    np.testing.assert_allclose(got[0], torch.stack(rows).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[1], tdx.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(got[2], tddx.numpy(), rtol=1e-9)


def test_an_unshaped_array_used_before_its_first_write_is_a_clear_program_error():
    with rg.program_guard(rg.Program(), rg.Program()):
        arr = rg.TensorArray(dtype="float32")
        with pytest.raises(rg.ProgramError, match="no value until its first write"):
            rg.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a), [rg.constant(0), arr])
        with pytest.raises(rg.ProgramError, match="no value until its first write"):
            arr.stack()
        with pytest.raises(rg.ProgramError, match="different lengths"):
            arr.split(rg.data("x", [5, 2]), [2, 3]).stack()
        with pytest.raises(rg.ShapeError, match="sum to 4"):
            arr.split(rg.data("x4", [5, 2]), [2, 2])
        with pytest.raises(rg.ShapeError, match="cannot write"):
            arr.unstack(rg.data("d", [5, 2], "float64"))
        shaped = rg.TensorArray(dtype="float32", element_shape=[2])
        with pytest.raises(rg.ShapeError, match="cannot write"):
            shaped.scatter([0], rg.data("y", [1, 3]))
        assert arr.size().dtype == "int64"


def test_split_with_unequal_lengths_reads_and_concats_as_tf(backend):
    x5 = np.arange(10.0).reshape(5, 2) / 3.0

    def build(x):
        pieces = rg.TensorArray(dtype="float64").split(x * x, [2, 0, 3])
        return [pieces.read(0), pieces.read(1), pieces.read(-1), pieces.concat(), pieces.size()]
    got = run(backend, build, {"x": x5})
    sq = x5 * x5
    for ours, ref in zip(got, [sq[:2], sq[2:2], sq[2:], sq, 3]):       # tf.split's pieces, in NumPy
        np.testing.assert_allclose(ours, ref, rtol=1e-15)
    np.testing.assert_allclose(got[-1], torch_grad(lambda t: [(t * t)[:2], (t * t)[2:], t * t], x5), rtol=1e-12)
    for e, g in zip(exported(build, {"x": x5}), got):
        np.testing.assert_allclose(e, g, rtol=1e-15)


def test_scatter_into_a_new_array_whose_element_sizes_are_known_only_at_run_time(backend):
    """Regression (fuzzer, issue 32 item 15): ``TensorArray().scatter(ids, x)`` with ``x``
    declared ``[-1, -1]`` grew the new array with 0 for the unknown element sizes (its empty
    value says nothing else), so the scatter failed on every backend and in export."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1], "float64", stop_gradient=False)
        ids = rg.data("ids", [-1], "int64")
        arr = rg.TensorArray(dtype="float64").scatter(ids, x * x)
        fresh = rg.TensorArray(dtype="float64", element_shape=[-1]).scatter(ids, x)
        outs = [arr.stack(), fresh.stack()]
        (dx,) = rg.gradients(rg.add_n([rg.sum(o * rg.sin(o)) for o in outs]), [x])
    ids_v = np.array([4, 0, 2, 0])
    feed = {"x": X, "ids": ids_v}
    got = backend.executor().run(main, feed=feed, fetch_list=outs + [dx])
    want = [np.stack(tf_scatter([], ids_v, X * X, (3,))), np.stack(tf_scatter([], ids_v, X, (3,)))]
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(ours, ref, rtol=1e-15)

    def peer(t):
        def scattered(rows):
            s = [torch.zeros(3, dtype=t.dtype)] * 5
            for j, i in enumerate(ids_v):
                s[i] = rows[j]
            return torch.stack(s)
        return [scattered(t * t), scattered(t)]
    np.testing.assert_allclose(got[2], torch_grad(peer, X), rtol=1e-12)
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    sess = ort.InferenceSession(rg.onnx.export(main, None, outs).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for ours, ref in zip(sess.run([o.name for o in outs], feed), want):
        np.testing.assert_allclose(ours, ref, rtol=1e-15)
