"""TensorArray (ops/tensor_array.py): writes, reads, stacks and sizes in while_loop, cond and
recurrent steps, their gradients and second derivatives against PyTorch Python loops (float64),
on NumPy, torch-CPU and the onnxruntime engine; errors naming the op; O(1) amortised appends."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.testing import build_program as build

torch = pytest.importorskip("torch", reason="the references are PyTorch Python loops")

pytestmark = pytest.mark.engine

W0 = np.array([[0.6, -0.4, 0.2], [0.3, 0.9, -0.5], [-0.2, 0.4, 0.7]])
H0 = np.array([0.5, -1.0, 0.25])


def _run(backend, model, feed):
    main, startup, fetch = build(model)
    exe = backend.executor()
    exe.run(startup)
    return exe.run(main, feed=feed, fetch_list=fetch)


def _close(got, want):
    for ours, ref in zip(got, want):
        ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
        assert np.shape(ours) == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


def _grads(loss, inputs):
    """First derivatives of ``loss`` and the derivative of their squared norm (second order)."""
    if not loss.requires_grad:       # a zero-trip loop: nothing depends on the inputs
        return [torch.zeros_like(x) for x in inputs] * 2
    firsts = torch.autograd.grad(loss, inputs, create_graph=True, allow_unused=True, materialize_grads=True)
    seconds = torch.autograd.grad(sum((g * g).sum() for g in firsts), inputs, allow_unused=True,
                                  materialize_grads=True)
    return list(firsts) + list(seconds)


def _rg_grads(loss, inputs):
    firsts = rg.gradients(loss, inputs)
    return list(firsts) + list(rg.gradients(rg.add_n([rg.sum(g * g) for g in firsts]), inputs))


# --- while_loop: one write per iteration, a run-time trip count ---------------------------------

def _writer():
    w = rg.data("w", [3, 3], dtype="float64", stop_gradient=False)
    h0 = rg.data("h0", [3], dtype="float64", stop_gradient=False)
    n = rg.data("n", [], dtype="int64")

    def body(i, h, arr):
        h = rg.tanh(rg.reshape(rg.reshape(h, [1, 3]) @ w, [3]) + 0.1)
        return i + 1, h, arr.write(i, h * h + h)
    _, h, arr = rg.while_loop(lambda i, h, arr: i < n, body,
                              [rg.constant(0), h0, rg.TensorArray(dtype="float64", element_shape=[3])])
    hs = arr.stack()
    rows = rg.sum(hs, axis=1)
    loss = rg.sum(rg.sin(rows) * rows) + rg.sum(h)
    return [hs, arr.size(), loss] + _rg_grads(loss, [w, h0])


def _torch_writer(n):
    w, h = torch.tensor(W0, requires_grad=True), torch.tensor(H0, requires_grad=True)
    h0, rows = h, []
    for _ in range(n):
        h = torch.tanh(h @ w + 0.1)
        rows.append(h * h + h)
    hs = torch.stack(rows) if rows else torch.zeros(0, 3, dtype=torch.float64)
    r = hs.sum(1)
    loss = (torch.sin(r) * r).sum() + h.sum()
    return [hs, np.array(n), loss] + _grads(loss, [w, h0])


@pytest.mark.parametrize("n", [0, 1, 5])
def test_writes_in_a_while_loop_and_their_second_derivatives_match_torch(backend, n):
    got = _run(backend, _writer, {"w": W0, "h0": H0, "n": np.array(n)})
    _close(got, _torch_writer(n))


# --- reads inside a loop of an array written outside, and overwrites ---------------------------

def _reader():
    x = rg.data("x", [4, 3], dtype="float64", stop_gradient=False)
    n = rg.data("n", [], dtype="int64")
    arr = rg.TensorArray(dtype="float64", element_shape=[3])
    for t in range(4):
        arr = arr.write(t, rg.reshape(rg.slice(x, [0], [t], [t + 1]), [3]) * float(t + 1))
    arr = arr.write(rg.constant(2), rg.reshape(rg.exp(rg.slice(x, [0], [0], [1])), [3]))   # overwrite
    arr = rg.TensorArray.of(rg.reshape(arr.stack(), [-1, 3]))

    def body(i, acc):
        return i + 1, acc * rg.sin(arr.read(i % 4)) + arr.read(rg.constant(1))
    _, acc = rg.while_loop(lambda i, acc: i < n, body, [rg.constant(0), rg.fill([3], 1.0, "float64")])
    loss = rg.sum(acc * acc) + rg.sum(rg.sin(arr.stack()))
    return [acc] + _rg_grads(loss, [x])


def _torch_reader(n):
    x = torch.tensor(np.arange(12.0).reshape(4, 3) / 10.0 - 0.4, requires_grad=True)
    rows = [x[t] * float(t + 1) for t in range(4)]
    rows[2] = torch.exp(x[0])
    acc = torch.ones(3, dtype=torch.float64)
    for i in range(n):
        acc = acc * torch.sin(rows[i % 4]) + rows[1]
    loss = (acc * acc).sum() + torch.sin(torch.stack(rows)).sum()
    return [acc] + _grads(loss, [x])


@pytest.mark.parametrize("n", [0, 3, 6])
def test_reads_in_a_loop_and_an_overwrite_match_torch(backend, n):
    x = np.arange(12.0).reshape(4, 3) / 10.0 - 0.4
    _close(_run(backend, _reader, {"x": x, "n": np.array(n)}), _torch_reader(n))


# --- cond inside the loop: the branches write different things ---------------------------------

def _branching(second_order=True):
    x = rg.data("x", [2], dtype="float64", stop_gradient=False)
    n = rg.data("n", [], dtype="int64")

    def body(i, arr):
        return i + 1, rg.cond(rg.equal(i % 2, 0), lambda: arr.write(i, rg.sin(x) * rg.cast(i + 1, "float64")),
                              lambda: arr.write(i, x * x))
    _, arr = rg.while_loop(lambda i, arr: i < n, body,
                           [rg.constant(0), rg.TensorArray(dtype="float64", element_shape=[2])])
    last = rg.cond(arr.size() > 0, lambda: arr.read(arr.size() - 1), lambda: rg.fill([2], 0.0, "float64"))
    loss = rg.sum(rg.tanh(arr.stack())) + rg.sum(last * last * last)
    return [arr.stack(), loss] + (_rg_grads(loss, [x]) if second_order else rg.gradients(loss, [x]))


def _torch_branching(n):
    x = torch.tensor([0.3, -0.8], dtype=torch.float64, requires_grad=True)
    rows = [torch.sin(x) * (i + 1) if i % 2 == 0 else x * x for i in range(n)]
    hs = torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)
    last = rows[-1] if rows else torch.zeros(2, dtype=torch.float64)
    loss = torch.tanh(hs).sum() + (last ** 3).sum()
    return [hs, loss] + _grads(loss, [x])


@pytest.mark.parametrize("n", [0, 1, 4])
def test_arrays_through_cond_branches_match_torch(backend, n):
    """Second order included on the engine too: the If gradient's zeros for the branch that did not
    run read the grown array for its shape, a value of changing shape the loop's backward keeps,
    which the ONNX Loop carries as a sequence and pads after the loop (loop_stacks.RaggedStacks)."""
    feed = {"x": np.array([0.3, -0.8]), "n": np.array(n)}
    _close(_run(backend, _branching, feed), _torch_branching(n))


# --- an array local to each step of rg.recurrent, unknown element sizes ---------------------------

def _in_recurrent_steps():
    x = rg.data("x", [3, 2, 4], dtype="float64", stop_gradient=False)      # [T, N, D]
    h0 = rg.data("h0", [2, 4], dtype="float64", stop_gradient=False)

    def step(xs, hs):
        arr = rg.TensorArray(dtype="float64", element_shape=[-1, 4])
        arr = arr.write(0, rg.tanh(xs[0] + hs[0])).write(1, hs[0] * xs[0])
        both = arr.stack()                                  # [2, N, 4]
        return [rg.sum(both, axis=0) * 0.5 + arr.read(rg.constant(0))]
    (h_all,), _ = rg.recurrent(step, [x], [h0])
    loss = rg.sum(h_all * h_all)
    return [h_all] + _rg_grads(loss, [x, h0])


def _torch_in_recurrent_steps(x, h0):
    x, h = torch.tensor(x, requires_grad=True), torch.tensor(h0, requires_grad=True)
    h0, outs = h, []
    for t in range(3):
        a = torch.tanh(x[t] + h)
        h = (a + h * x[t]) * 0.5 + a
        outs.append(h)
    h_all = torch.stack(outs)
    return [h_all] + _grads((h_all * h_all).sum(), [x, h0])


def test_arrays_inside_recurrent_steps_match_torch(backend):
    rng = np.random.RandomState(3)
    x, h0 = rng.randn(3, 2, 4) * 0.5, rng.randn(2, 4) * 0.5
    _close(_run(backend, _in_recurrent_steps, {"x": x, "h0": h0}), _torch_in_recurrent_steps(x, h0))


# --- errors -------------------------------------------------------------------------------------

def test_read_past_the_end_is_an_execution_error_naming_the_op(backend):
    def model():
        n = rg.data("n", [], dtype="int64")
        arr = rg.TensorArray(dtype="float64", element_shape=[2]).write(0, rg.fill([2], 1.0, "float64"))
        return [arr.read(n)]
    assert _run(backend, model, {"n": np.array(0)})[0].tolist() == [1.0, 1.0]
    with pytest.raises(rg.ExecutionError, match="TensorArrayRead"):
        _run(backend, model, {"n": np.array(1)})


def test_write_past_the_end_is_an_execution_error_naming_the_op(backend):
    def model():
        n = rg.data("n", [], dtype="int64")
        arr = rg.TensorArray(dtype="float64", element_shape=[2]).write(0, rg.fill([2], 1.0, "float64"))
        return [arr.write(n, rg.fill([2], 2.0, "float64")).stack()]
    assert _run(backend, model, {"n": np.array(1)})[0].tolist() == [[1.0, 1.0], [2.0, 2.0]]
    with pytest.raises(rg.ExecutionError, match="TensorArrayWrite"):
        _run(backend, model, {"n": np.array(2)})


def test_writing_an_element_of_the_wrong_shape_is_a_shape_error():
    def model():
        rg.TensorArray(dtype="float64", element_shape=[2]).write(0, rg.fill([3], 1.0, "float64"))
    with pytest.raises(rg.ShapeError, match="TensorArrayWrite"):
        build(model)


@pytest.mark.parametrize("bad", [None, [2.5], "x", [-2]])
def test_element_shape_must_be_a_list_of_sizes(bad):
    with pytest.raises(rg.ProgramError, match="element_shape"):
        build(lambda: rg.TensorArray(dtype="float64", element_shape=bad))


# --- cost and sharing ---------------------------------------------------------------------------

def _appender():
    n = rg.data("n", [], dtype="int64")
    _, arr = rg.while_loop(lambda i, arr: i < n,
                           lambda i, arr: (i + 1, arr.write(i, rg.fill([2], 1.0, "float64") * rg.cast(i, "float64"))),
                           [rg.constant(0), rg.TensorArray(dtype="float64", element_shape=[2])])
    return [arr.stack()]


@pytest.mark.engine_skip("checks how the NumPy executor holds the appended rows")
def test_appends_write_into_a_capacity_doubling_backing_not_a_growing_concat(backend):
    if backend.name != "numpy":
        pytest.skip("the check reads NumPy array bases")
    stacked, = _run(backend, _appender, {"n": np.array(1000)})
    np.testing.assert_array_equal(stacked[:, 0], np.arange(1000.0))
    assert stacked.base is not None and 1000 < stacked.base.shape[0] <= 2 * 1000 + 8


def test_an_append_to_an_older_array_does_not_change_a_newer_one(backend):
    """Two writes at the same size of one array: the second must not land in the first's row."""
    def model():
        one = rg.TensorArray(dtype="float64", element_shape=[1]).write(0, rg.fill([1], 1.0, "float64"))
        a = one.write(1, rg.fill([1], 2.0, "float64"))
        b = one.write(1, rg.fill([1], 3.0, "float64"))
        return [a.stack(), b.stack(), one.stack()]
    a, b, one = _run(backend, model, {})
    assert a.tolist() == [[1.0], [2.0]] and b.tolist() == [[1.0], [3.0]] and one.tolist() == [[1.0]]


def test_exported_loop_runs_in_onnxruntime_alone():
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    main, startup, fetch = build(_appender)
    sess = ort.InferenceSession(rg.onnx.export(main, None, fetch).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for n in (0, 3):
        got, = sess.run([fetch[0].name], {"n": np.array(n)})
        np.testing.assert_array_equal(got, np.arange(float(n))[:, None] * np.ones(2))


def test_a_read_past_the_end_inside_a_loop_names_the_op_on_every_backend(backend):
    def model():
        n = rg.data("n", [], dtype="int64")
        arr = rg.TensorArray(dtype="float64", element_shape=[2]).write(0, rg.fill([2], 1.0, "float64"))
        _, acc = rg.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, acc + arr.read(i)),
                               [rg.constant(0), rg.fill([2], 0.0, "float64")])
        return [acc]
    assert _run(backend, model, {"n": np.array(1)})[0].tolist() == [1.0, 1.0]
    with pytest.raises(rg.ExecutionError, match="TensorArrayRead"):
        _run(backend, model, {"n": np.array(2)})


def test_programs_with_arrays_print_and_clone():
    main, _, fetch = build(_writer)
    text = str(main)
    assert "TensorArrayWrite" in text and "TensorArrayWriteGrad" in text
    got = rg.Executor().run(main.clone(), feed={"w": W0, "h0": H0, "n": np.array(3)}, fetch_list=fetch)
    _close(got, _torch_writer(3))
