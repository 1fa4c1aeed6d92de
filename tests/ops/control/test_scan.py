"""scan / fori_loop / map (ops/scan.py) against PyTorch Python loops (float64): values, gradients
and second derivatives, with run-time lengths and bounds, on NumPy, torch-CPU and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.array.tensor import dim
from retrograd.testing import build_program as build

torch = pytest.importorskip("torch", reason="the references are PyTorch Python loops")

pytestmark = pytest.mark.engine

R = np.random.RandomState(7)
XS = R.randn(4, 2, 3) * 0.5
H0 = R.randn(2, 3) * 0.5
W = R.randn(3, 3) * 0.5


def _run(backend, model, feed):
    main, startup, fetch = build(model)
    exe = backend.executor()
    exe.run(startup)
    return exe.run(main, feed=feed, fetch_list=fetch)


def _inputs():
    return (rg.data("xs", [-1, 2, 3], dtype="float64", stop_gradient=False),
            rg.data("h0", [2, 3], dtype="float64", stop_gradient=False),
            rg.data("w", [3, 3], dtype="float64", stop_gradient=False))


def _torch_inputs(t):
    return [torch.tensor(a, requires_grad=True) for a in (XS[:t], H0, W)]


def _with_grads(outs, loss, inputs):
    firsts = rg.gradients(loss, inputs, unconnected="zero")
    return outs + list(firsts) + rg.gradients(rg.add_n([rg.sum(g * g) for g in firsts]), inputs,
                                              unconnected="zero")


def _torch_with_grads(outs, loss, inputs):
    firsts = torch.autograd.grad(loss, inputs, create_graph=True, allow_unused=True, materialize_grads=True)
    norm = sum((g * g).sum() for g in firsts)
    seconds = torch.autograd.grad(norm, inputs, allow_unused=True, materialize_grads=True) \
        if norm.requires_grad else [torch.zeros_like(x) for x in inputs]
    return outs + list(firsts) + list(seconds)


def _close(got, want):
    assert len(got) == len(want)
    for ours, ref in zip(got, want):
        ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
        assert np.shape(ours) == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


# --- the table: (name, retrograd model, torch reference over the first t rows) -------------------

def _rnn(reverse):
    def model():
        xs, h0, w = _inputs()
        h, hs = rg.scan(lambda h, x: (rg.tanh(h @ w + x),) * 2, h0, xs, reverse=reverse)
        loss = rg.sum(hs * hs) + rg.sum(rg.sin(h))
        return _with_grads([h, hs], loss, [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        h, hs = h0, [None] * t
        for s in (reversed(range(t)) if reverse else range(t)):
            h = torch.tanh(h @ w + xs[s])
            hs[s] = h
        hs = torch.stack(hs) if t else torch.zeros(0, 2, 3, dtype=torch.float64)
        return _torch_with_grads([h, hs], (hs * hs).sum() + torch.sin(h).sum(), ins)
    return model, ref


def _list_carries():
    """Two carries, two sliced inputs, two outputs per step (one of them an int)."""
    def model():
        xs, h0, w = _inputs()
        ys = rg.sin(xs)

        def step(carry, rows):
            h, acc = carry
            x, y = rows
            h = rg.tanh(h @ w) * y + x
            return [h, acc + rg.sum(h * x)], [h * h, rg.cast(rg.sum(h) > 0.0, "int64")]
        (h, acc), (sq, flags) = rg.scan(step, [h0, rg.constant(0.0, "float64")], [xs, ys])
        loss = acc + rg.sum(sq) * 0.5 + rg.sum(h)
        return _with_grads([h, acc, sq, flags], loss, [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        ys = torch.sin(xs)
        h, acc, sq, flags = h0, torch.zeros((), dtype=torch.float64), [], []
        for s in range(t):
            h = torch.tanh(h @ w) * ys[s] + xs[s]
            acc = acc + (h * xs[s]).sum()
            sq.append(h * h)
            flags.append(np.int64(h.sum().item() > 0))
        sq = torch.stack(sq) if t else torch.zeros(0, 2, 3, dtype=torch.float64)
        loss = acc + sq.sum() * 0.5 + h.sum()
        return _torch_with_grads([h, acc, sq, np.array(flags, dtype=np.int64)], loss, ins)
    return model, ref


def _no_outputs():
    def model():
        xs, h0, w = _inputs()
        total, none = rg.scan(lambda c, x: (c * rg.cos(x @ w) + x, None), h0, xs)
        assert none is None
        return _with_grads([total], rg.sum(total * total), [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        c = h0
        for s in range(t):
            c = c * torch.cos(xs[s] @ w) + xs[s]
        return _torch_with_grads([c], (c * c).sum(), ins)
    return model, ref


def _fori(lower, upper):
    """fori_loop with int bounds, or 0-d Var bounds fed at run time (lower=None: a Var)."""
    def model():
        xs, h0, w = _inputs()
        lo = rg.data("lo", [], dtype="int64") if lower is None else lower
        hi = dim(xs, 0) if upper is None else upper
        v = rg.fori_loop(lo, hi, lambda i, v: rg.tanh(v @ w) * rg.cast(i, "float64") + rg.sin(v), h0)
        return _with_grads([v], rg.sum(v * v), [h0, w])

    def ref(t, lo=1):
        _, h0, w = ins = _torch_inputs(t)
        lo = lo if lower is None else lower
        hi = t if upper is None else upper
        v = h0
        for i in range(lo, hi):
            v = torch.tanh(v @ w) * i + torch.sin(v)
        return _torch_with_grads([v], (v * v).sum(), ins[1:])
    return model, ref


def _map():
    def model():
        xs, h0, w = _inputs()
        norms, rows = rg.map(lambda r: [rg.sqrt(rg.sum(r[0] * r[0], axis=1)), rg.tanh(r[0] @ w) * h0], [xs])
        single = rg.map(lambda x: rg.exp(x) * 0.5, xs)
        loss = rg.sum(norms * norms * norms) + rg.sum(rows * rows) + rg.sum(single)
        return _with_grads([norms, rows, single], loss, [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        norms = torch.sqrt((xs * xs).sum(2))
        rows = torch.tanh(xs @ w) * h0
        single = torch.exp(xs) * 0.5
        loss = (norms ** 3).sum() + (rows * rows).sum() + single.sum()
        return _torch_with_grads([norms, rows, single], loss, ins)
    return model, ref


TABLE = {
    "scan": _rnn(False),
    "scan-reverse": _rnn(True),
    "scan-lists": _list_carries(),
    "scan-no-outputs": _no_outputs(),
    "fori-int-bounds": _fori(1, 4),
    "fori-empty-range": _fori(3, 1),
    "fori-var-bounds": _fori(None, None),
    "map": _map(),
}


@pytest.mark.parametrize("name", sorted(TABLE))
@pytest.mark.parametrize("t", [0, 1, 4])
def test_functional_loop_matches_torch_to_second_order(backend, name, t):
    model, ref = TABLE[name]
    feed = {"xs": XS[:t], "h0": H0, "w": W, **({"lo": np.array(1)} if name == "fori-var-bounds" else {})}
    _close(_run(backend, model, feed), ref(t))


def test_fori_loop_var_bounds_may_start_anywhere(backend):
    model, ref = TABLE["fori-var-bounds"]
    _close(_run(backend, model, {"xs": XS, "h0": H0, "w": W, "lo": np.array(-2)}), ref(4, lo=-2))


def test_scan_inside_a_while_loop_with_a_run_time_trip_count(backend):
    """scan nested in while_loop: outer n from a feed, gradients and second order."""
    def model():
        xs, h0, w = _inputs()
        n = rg.data("n", [], dtype="int64")

        def body(i, h):
            h, _ = rg.scan(lambda c, x: (rg.tanh(c @ w + x), None), h, xs)
            return i + 1, h
        _, h = rg.while_loop(lambda i, h: i < n, body, [rg.constant(0), h0])
        return _with_grads([h], rg.sum(h * h), [xs, h0, w])

    def ref(n):
        xs, h0, w = ins = _torch_inputs(4)
        h = h0
        for _ in range(n):
            for s in range(4):
                h = torch.tanh(h @ w + xs[s])
        return _torch_with_grads([h], (h * h).sum(), ins)
    for n in (0, 2):
        _close(_run(backend, model, {"xs": XS, "h0": H0, "w": W, "n": np.array(n)}), ref(n))


def test_scan_over_a_tensor_array_built_in_the_step(backend):
    """A TensorArray written in each step of a scan, its stack the step's output."""
    def model():
        xs, h0, w = _inputs()

        def step(h, x):
            arr = rg.TensorArray(dtype="float64", element_shape=[2, 3])
            arr = arr.write(0, h).write(1, rg.tanh(x @ w))
            return arr.read(1) + h * 0.5, arr.stack()
        h, both = rg.scan(step, h0, xs)
        return _with_grads([h, both], rg.sum(both * both) + rg.sum(h), [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        h, both = h0, []
        for s in range(t):
            a = torch.tanh(xs[s] @ w)
            both.append(torch.stack([h, a]))
            h = a + h * 0.5
        both = torch.stack(both)
        return _torch_with_grads([h, both], (both * both).sum() + h.sum(), ins)
    _close(_run(backend, model, {"xs": XS, "h0": H0, "w": W}), ref(4))


def test_a_carry_that_changes_shape_is_a_program_error():
    def model():
        xs, h0, _ = _inputs()
        rg.scan(lambda h, x: (rg.sum(h, axis=0), x), h0, xs)
    with pytest.raises(rg.ProgramError, match="carry 0"):
        build(model)


@pytest.mark.parametrize("bad", [2.5, "3", True])
def test_fori_loop_bounds_must_be_ints(bad):
    with pytest.raises(rg.ProgramError, match="fori_loop"):
        build(lambda: rg.fori_loop(0, bad, lambda i, v: v, rg.constant(1.0)))


def test_a_tensor_array_carried_through_a_scan_matches_torch(backend):
    """An array as a scan carry grows by one row per step (a ragged Scan): values, gradients and
    second derivatives."""
    def model():
        xs, h0, w = _inputs()

        def step(carry, x):
            h, arr = carry
            h = rg.tanh(h @ w + x)
            return [h, arr.write(arr.size(), h * x)], None
        (h, arr), _ = rg.scan(step, [h0, rg.TensorArray(dtype="float64", element_shape=[2, 3])], xs)
        rows = arr.stack()
        return _with_grads([rows, arr.size()], rg.sum(rows * rows) + rg.sum(h), [xs, h0, w])

    def ref(t):
        xs, h0, w = ins = _torch_inputs(t)
        h, rows = h0, []
        for s in range(t):
            h = torch.tanh(h @ w + xs[s])
            rows.append(h * xs[s])
        rows = torch.stack(rows) if rows else torch.zeros(0, 2, 3, dtype=torch.float64)
        return _torch_with_grads([rows, np.array(t)], (rows * rows).sum() + h.sum(), ins)
    for t in (0, 3):
        _close(_run(backend, model, {"xs": XS[:t], "h0": H0, "w": W}), ref(t))


def _scan_of_linear_cross_entropy(steps: int):
    """A scan whose body reads h, w, b from outside and stacks their linear cross entropy."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        h = rg.data("h", [-1, 3], "float64", stop_gradient=False)
        w = rg.data("w", [3, 4], "float64", stop_gradient=False)
        b = rg.data("b", [4], "float64", stop_gradient=False)
        labels = rg.data("labels", [-1], "int64")
        _, ys = rg.scan(lambda c, _: (c, rg.linear_cross_entropy(h, w, b, labels)),
                        rg.fill([1], 0.0, "float64"), rg.data("steps", [-1, 1], "float64"))
        grads = rg.gradients(rg.sum(ys), [h, w, b])
    return main, (h, w, b), ys, grads


def test_second_order_through_a_scan_body_op_without_one_is_refused_not_zero(backend):
    """Regression (fuzzer, issue 32 item 15): the second derivative through a scan whose body
    holds an op with no gradient maker of its own gradient (LinearCrossEntropyGrad) came out as
    zeros on every backend; outside a loop the same program is refused. It is refused here too,
    naming the op, and the first derivative still runs and equals torch's."""
    rng = np.random.default_rng(0)
    feed = {"h": rng.normal(size=(2, 3)), "w": rng.normal(size=(3, 4)), "b": rng.normal(size=4),
            "labels": np.array([3, 0]), "steps": np.zeros((2, 1))}
    main, xs, ys, grads = _scan_of_linear_cross_entropy(2)
    with rg.program_guard(main, rg.Program()):
        with pytest.raises(rg.ProgramError, match="LinearCrossEntropyGrad.*has no gradient maker"):
            rg.gradients(rg.add_n([rg.sum(g * g) for g in grads]), list(xs))
    main, xs, ys, grads = _scan_of_linear_cross_entropy(2)
    got = backend.executor().run(main, feed=feed, fetch_list=[ys] + grads)
    th, tw, tb = (torch.tensor(feed[k], requires_grad=True) for k in ("h", "w", "b"))
    loss = torch.nn.functional.cross_entropy(th @ tw + tb, torch.tensor(feed["labels"]), reduction="none")
    want = [torch.stack([loss, loss]).detach().numpy()]
    want += [g.numpy() for g in torch.autograd.grad(2 * loss.sum(), [th, tw, tb])]
    for ours, theirs in zip(got, want):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
