"""rg.scaled_dot_product_attention against PyTorch in float64: values, gradients, second order.

The reference is attention written with torch ops (``_torch_attention``), with
rows whose every key is masked set to zero (the contract); it is checked
against ``torch.nn.functional.scaled_dot_product_attention`` itself. Every
test runs on each backend of the ``backend`` fixture (NumPy, torch-CPU, the
onnxruntime engine).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg
from retrograd.testing import check_gradients

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.engine


# --- the reference -------------------------------------------------------------------------------

def _torch_attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(scale q k^T + mask) v with torch ops; a fully masked row gives zeros."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None and mask.dtype == torch.bool:
        s = s.masked_fill(~mask, -math.inf)
    elif mask is not None:
        s = s + mask
    if causal:
        tri = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        s = s.masked_fill(~tri, -math.inf)
    alive = (s > -math.inf).any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~alive, 0.0), -1) * alive
    return p @ v


def test_reference_is_torchs_attention():
    r = np.random.default_rng(0)
    q, k, v = (torch.tensor(r.standard_normal(s)) for s in ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7)))
    mask = torch.tensor(r.random((4, 6)) > 0.3)
    mask[:, 0] = True
    for kwargs, ours in (({}, {}), ({"attn_mask": mask}, {"mask": mask}), ({"is_causal": True}, {"causal": True}),
                         ({"scale": 0.3}, {"scale": 0.3})):
        torch.testing.assert_close(_torch_attention(q, k, v, **ours), F.scaled_dot_product_attention(q, k, v, **kwargs))


# --- running a case on a backend -------------------------------------------------------------------

class Case:
    """Attention over fed float64 arrays: retrograd's output and gradients vs torch's."""

    def __init__(self, q, k, v, mask=None, causal=False, scale=None, declared=None):
        self.arrays = {"q": q, "k": k, "v": v}
        if mask is not None:
            self.arrays["mask"] = mask
        self.causal, self.scale = causal, scale
        self.declared = declared or {}

    def build(self):
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            vars_ = {n: rg.data(n, self.declared.get(n, a.shape), a.dtype.name, stop_gradient=False)
                     for n, a in self.arrays.items()}
            out = rg.scaled_dot_product_attention(vars_["q"], vars_["k"], vars_["v"], vars_.get("mask"),
                                                  causal=self.causal, scale=self.scale)
            weight = rg.data("weight", out.shape, "float64")
            self.wrt = [n for n, a in self.arrays.items() if a.dtype.kind == "f"]
            grads = rg.gradients(rg.sum(out * weight), [vars_[n] for n in self.wrt])
        return main, out, grads

    def reference(self, weight):
        tensors = {n: torch.tensor(a, requires_grad=a.dtype.kind == "f") for n, a in self.arrays.items()}
        out = _torch_attention(tensors["q"], tensors["k"], tensors["v"], tensors.get("mask"), self.causal,
                               self.scale)
        grads = torch.autograd.grad((out * torch.tensor(weight)).sum(), [tensors[n] for n in self.wrt])
        return out.detach().numpy(), [g.numpy() for g in grads]

    def check(self, backend, rtol=1e-9, atol=1e-10):
        main, out, grads = self.build()
        out_shape = np.broadcast_shapes(self.arrays["q"].shape[:-2], self.arrays["k"].shape[:-2],
                                        self.arrays["v"].shape[:-2]) + (self.arrays["q"].shape[-2],
                                                                        self.arrays["v"].shape[-1])
        weight = np.random.default_rng(1).standard_normal(out_shape)
        got = backend.executor().run(main, feed={**self.arrays, "weight": weight}, fetch_list=[out] + grads)
        want_out, want_grads = self.reference(weight)
        np.testing.assert_allclose(got[0], want_out, rtol=rtol, atol=atol)
        for name, g, w in zip(self.wrt, got[1:], want_grads):
            assert np.all(np.isfinite(g)), name
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"gradient of {name}")
        return got


def _normal(*shape, seed=0):
    return np.random.default_rng([seed, *shape]).standard_normal(shape)


def _qkv(n=2, h=3, length=4, keys=6, e=5, ev=5):
    return _normal(n, h, length, e, seed=1), _normal(n, h, keys, e, seed=2), _normal(n, h, keys, ev, seed=3)


# --- forward and gradients --------------------------------------------------------------------------

def test_plain_attention(backend):
    Case(*_qkv()).check(backend)


def test_value_size_differs_from_key_size(backend):
    Case(*_qkv(ev=7)).check(backend)


@pytest.mark.parametrize("length,keys", [(5, 5), (4, 7), (7, 4)])
def test_causal_is_top_left_aligned(backend, length, keys):
    Case(*_qkv(length=length, keys=keys), causal=True).check(backend)


def test_scale(backend):
    Case(*_qkv(), scale=0.37).check(backend)


@pytest.mark.parametrize("shape", [(4, 6), (2, 1, 1, 6), (2, 3, 4, 6), (1, 6)])
def test_bool_mask_broadcasts(backend, shape):
    keep = np.random.default_rng(4).random(shape) > 0.4
    keep[..., 0] = True
    Case(*_qkv(), mask=keep).check(backend)


@pytest.mark.parametrize("shape", [(4, 6), (3, 4, 6), (2, 1, 4, 1)])
def test_float_mask_is_added_and_gets_its_gradient(backend, shape):
    Case(*_qkv(), mask=_normal(*shape, seed=5)).check(backend)


def test_float_mask_with_minus_infinity(backend):
    bias = _normal(4, 6, seed=6)
    bias[np.random.default_rng(7).random((4, 6)) > 0.6] = -np.inf
    bias[:, 2] = 0.0
    Case(*_qkv(), mask=bias).check(backend)


def test_causal_and_mask_combine(backend):
    keep = np.random.default_rng(8).random((2, 1, 4, 6)) > 0.5
    keep[..., 0] = True
    Case(*_qkv(), mask=keep, causal=True).check(backend)


def test_fully_masked_rows_give_zeros_not_nan(backend):
    keep = np.random.default_rng(9).random((2, 3, 4, 6)) > 0.3
    keep[0, 1, 2] = False                         # one row of one head
    keep[1, :, 0] = False                         # a row in every head of one example
    got = Case(*_qkv(), mask=keep).check(backend)
    np.testing.assert_array_equal(got[0][0, 1, 2], 0.0)
    np.testing.assert_array_equal(got[0][1, :, 0], 0.0)
    np.testing.assert_array_equal(got[1][0, 1, 2], 0.0)     # no gradient reaches q's masked row


def test_fully_masked_rows_of_a_float_mask_and_causal(backend):
    bias = _normal(4, 6, seed=10)
    bias[3] = -np.inf
    got = Case(*_qkv(), mask=bias, causal=True).check(backend)
    np.testing.assert_array_equal(got[0][:, :, 3], 0.0)


def test_every_key_masked(backend):
    got = Case(*_qkv(), mask=np.zeros((4, 6), bool)).check(backend)
    assert not got[0].any() and not any(g.any() for g in got[1:])


def test_batch_axes_broadcast(backend):
    """One key/value set shared by every head (multi-query), and 3-D inputs."""
    q, k, v = _normal(2, 3, 4, 5, seed=11), _normal(2, 1, 6, 5, seed=12), _normal(6, 5, seed=13)
    Case(q, k, v, causal=True).check(backend)
    Case(_normal(3, 4, 5, seed=14), _normal(3, 6, 5, seed=15), _normal(3, 6, 2, seed=16)).check(backend)


def test_unknown_dimensions(backend):
    """Declared -1 everywhere, E included: the scale 1/sqrt(E) is taken at run time."""
    q, k, v = _qkv()
    keep = np.random.default_rng(17).random((2, 1, 4, 6)) > 0.3
    declared = {n: [-1] * 4 for n in ("q", "k", "v", "mask")}
    Case(q, k, v, mask=keep, causal=True, declared=declared).check(backend)
    bias = _normal(2, 1, 4, 1, seed=18)                 # its gradient is summed over heads and keys
    Case(q, k[:1], v, mask=bias, declared=declared).check(backend)


def test_float32(backend):
    q, k, v = (a.astype(np.float32) for a in _qkv(n=2, h=2, length=16, keys=16, e=8, ev=8))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(n, a.shape, stop_gradient=False) for n, a in zip("qkv", (q, k, v))]
        out = rg.scaled_dot_product_attention(*vars_, causal=True)
        grads = rg.gradients(rg.sum(out * out), vars_)
    got = backend.executor().run(main, feed=dict(zip("qkv", (q, k, v))), fetch_list=[out] + grads)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    ref = _torch_attention(tq, tk, tv, causal=True)
    ref_grads = torch.autograd.grad((ref * ref).sum(), [tq, tk, tv])
    assert got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    for g, w in zip(got[1:], ref_grads):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)


# --- second order -----------------------------------------------------------------------------------

def _second_order(backend, causal, mask):
    """d/d(q, k, v, mask) of <grad of <out, w>, r>: the gradient op's gradient vs torch's."""
    q, k, v = _qkv(length=3, keys=4, e=3, ev=2)
    arrays = {"q": q, "k": k, "v": v, **({"mask": mask} if mask is not None else {})}
    floats = [n for n, a in arrays.items() if a.dtype.kind == "f"]
    r = np.random.default_rng(21)
    weight = r.standard_normal((2, 3, 3, 2))
    dirs = {n: r.standard_normal(arrays[n].shape) for n in floats}
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = {n: rg.data(n, a.shape, a.dtype.name, stop_gradient=False) for n, a in arrays.items()}
        out = rg.scaled_dot_product_attention(vars_["q"], vars_["k"], vars_["v"], vars_.get("mask"), causal=causal)
        first = rg.gradients(rg.sum(out * rg.constant(weight, "float64")), [vars_[n] for n in floats])
        mixed = rg.add_n([rg.sum(g * rg.constant(dirs[n], "float64")) for n, g in zip(floats, first)])
        second = rg.gradients(mixed, [vars_[n] for n in floats])
    got = backend.executor().run(main, feed=arrays, fetch_list=second)
    tensors = {n: torch.tensor(a, requires_grad=a.dtype.kind == "f") for n, a in arrays.items()}
    t_out = _torch_attention(tensors["q"], tensors["k"], tensors["v"], tensors.get("mask"), causal)
    t_first = torch.autograd.grad((t_out * torch.tensor(weight)).sum(), [tensors[n] for n in floats],
                                  create_graph=True)
    t_mixed = sum((g * torch.tensor(dirs[n])).sum() for n, g in zip(floats, t_first))
    want = torch.autograd.grad(t_mixed, [tensors[n] for n in floats])
    for name, g, w in zip(floats, got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"second order, {name}")


def test_second_order_plain(backend):
    _second_order(backend, False, None)


def test_second_order_causal_with_fully_masked_row(backend):
    keep = np.ones((3, 4), bool)
    keep[1] = False
    _second_order(backend, True, keep)


def test_second_order_float_mask(backend):
    _second_order(backend, False, _normal(3, 4, seed=22))


def test_third_order_matches_finite_differences(backend):
    """The ops-built gradient of the gradient op differentiates again."""
    def second(q, k, v):
        out = rg.scaled_dot_product_attention(q, k, v, causal=True)
        dq, dk, dv = rg.gradients(rg.sum(out * out), [q, k, v])
        return rg.gradients(rg.sum(dq * dq) + rg.sum(dv * dk), [q, k, v])
    r = np.random.default_rng(23)
    check_gradients(second, {"q": r.standard_normal((3, 2)), "k": r.standard_normal((2, 2)),
                             "v": r.standard_normal((2, 2))}, rtol=1e-4, **backend.kwargs)


# --- errors ------------------------------------------------------------------------------------------

def _build(q_shape, k_shape, v_shape, mask_shape=None, mask_dtype="bool"):
    with rg.program_guard(rg.Program(), rg.Program()):
        q, k, v = (rg.data(n, s) for n, s in zip("qkv", (q_shape, k_shape, v_shape)))
        mask = rg.data("mask", mask_shape, mask_dtype) if mask_shape is not None else None
        return rg.scaled_dot_product_attention(q, k, v, mask)


def test_mask_that_does_not_broadcast_is_a_shape_error_naming_op_shapes_and_line():
    with pytest.raises(rg.ShapeError) as info:
        _build([2, 3, 4, 5], [2, 3, 6, 5], [2, 3, 6, 5], mask_shape=[4, 5])
    message = str(info.value)
    assert "ScaledDotProductAttention" in message and "[4, 5]" in message and "[2, 3, 4, 6]" in message
    assert "test_attention.py" in message


@pytest.mark.parametrize("shapes,words", [
    (([2, 4, 5], [2, 6, 4], [2, 6, 5]), "feature sizes of q and k"),
    (([2, 4, 5], [2, 6, 5], [2, 7, 5]), "lengths of k and v"),
    (([2, 4, 5], [3, 6, 5], [3, 6, 5]), "do not broadcast"),
    (([5], [6, 5], [6, 5]), "at least 2 axes"),
])
def test_mismatched_operands_are_shape_errors(shapes, words):
    with pytest.raises(rg.ShapeError, match=words):
        _build(*shapes)


def test_mask_of_another_float_dtype_is_refused():
    with pytest.raises(rg.ShapeError, match="must be bool"):
        _build([4, 5], [6, 5], [6, 5], mask_shape=[4, 6], mask_dtype="float64")


def test_run_time_mismatch_is_an_execution_error(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        q, k, v = (rg.data(n, [-1, -1]) for n in "qkv")
        out = rg.scaled_dot_product_attention(q, k, v)
    feed = {"q": np.ones((2, 3), np.float32), "k": np.ones((4, 2), np.float32), "v": np.ones((4, 2), np.float32)}
    with pytest.raises(rg.ExecutionError):
        backend.executor().run(main, feed=feed, fetch_list=[out])


# --- the torch backend's fused kernel ---------------------------------------------------------------

def test_torch_runs_flash_attention_where_it_fits_and_agrees_with_the_general_path():
    from retrograd.backends.torch_backend import TorchBackend
    fused = TorchBackend("cpu")
    if fused.flash_attention is None:
        pytest.skip(f"torch {torch.__version__} lacks ATen's flash attention for CPU")
    q, k, v = (torch.tensor(a) for a in _qkv())
    keep = torch.tensor(np.random.default_rng(24).random((2, 1, 4, 6)) > 0.4)
    keep[0, 0, 1] = False
    out, lse = fused.fused_attention(q, k, v, keep, True, 0.4)
    want = _torch_attention(q, k, v, keep, True, 0.4)
    torch.testing.assert_close(out, want)
    s = (q @ k.transpose(-1, -2) * 0.4).masked_fill(~(keep & torch.ones(4, 6, dtype=torch.bool).tril()), -math.inf)
    want_lse = torch.logsumexp(s, -1)
    alive = torch.isfinite(want_lse)
    assert not alive[0, :, 1].any()
    torch.testing.assert_close(lse[alive], want_lse[alive])
    assert (lse[~alive] == 0).all()                       # fully masked rows: lse 0, as the NumPy kernel
    dout = torch.ones_like(out)
    dq, dk, dv = fused.fused_attention_grad(q, k, v, keep, out, lse, dout, True, 0.4)
    tq, tk, tv = (t.clone().requires_grad_() for t in (q, k, v))
    want_grads = torch.autograd.grad(_torch_attention(tq, tk, tv, keep, True, 0.4).sum(), [tq, tk, tv])
    for g, w in zip((dq, dk, dv), want_grads):
        torch.testing.assert_close(g, w)


def test_torch_takes_the_general_path_where_flash_cannot_follow():
    from retrograd.backends.torch_backend import TorchBackend
    backend = TorchBackend("cpu")
    q, k, v = (torch.tensor(a) for a in _qkv(ev=7))
    assert backend.fused_attention(q, k, v, None, False, 0.5) is None              # Ev != E
    q, k, v = (torch.tensor(a) for a in _qkv(keys=0))
    assert backend.fused_attention(q, k, v, None, False, 0.5) is None              # no keys at all
    q, k, v = (torch.tensor(a) for a in _qkv())
    assert backend.fused_attention(q, k[:1], v[:1], None, False, 0.5) is None      # broadcast batch


def test_no_keys_gives_zeros(backend):
    q, k, v = _qkv(keys=0)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(n, [-1, -1, -1, 5], "float64") for n in "qkv"]
        out = rg.scaled_dot_product_attention(*vars_)
    got, = backend.executor().run(main, feed=dict(zip("qkv", (q, k, v))), fetch_list=[out])
    assert got.shape == (2, 3, 4, 5) and not got.any()


def test_numpy_masks_become_constants(backend):
    q, k, v = _qkv()
    keep = np.random.default_rng(25).random((4, 6)) > 0.3
    bias = _normal(4, 6, seed=26)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(n, a.shape, "float64") for n, a in zip("qkv", (q, k, v))]
        outs = [rg.scaled_dot_product_attention(*vars_, mask=keep),
                rg.scaled_dot_product_attention(*vars_, mask=bias.tolist())]
    got = backend.executor().run(main, feed=dict(zip("qkv", (q, k, v))), fetch_list=outs)
    tq, tk, tv = (torch.tensor(a) for a in (q, k, v))
    np.testing.assert_allclose(got[0], _torch_attention(tq, tk, tv, torch.tensor(keep)).numpy(), rtol=1e-10)
    np.testing.assert_allclose(got[1], _torch_attention(tq, tk, tv, torch.tensor(bias)).numpy(), rtol=1e-10)


def test_second_order_with_head_size_0_known_when_built_on_every_backend_and_exported(backend):
    """Regression (fuzzer, issue 32 item 15): the second derivative of attention over q, k, v
    with a head size E of 0 (parameters, so E is known when built and onnxruntime folds it) scaled
    the scores by ``1 / sqrt(0) = inf``; onnxruntime fused that into a MatMul and refused to build
    the session (the engine and the exported model). The scale is 1 at E = 0, as in the kernels
    (every result is empty there); shapes against torch."""
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    shapes = {"q": (2, 3, 0), "k": (2, 4, 0), "v": (2, 4, 0)}
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        q, k, v = (rg.create_parameter(n, list(s), "float64", init=np.zeros(s)) for n, s in shapes.items())
        out = rg.scaled_dot_product_attention(q, k, v)
        grads = rg.gradients(rg.sum(out * out), [q, k, v])
        second = rg.gradients(rg.add_n([rg.sum(g * g) for g in grads]), [q, k, v], unconnected="zero")
    fetch = [out] + grads + second
    exe = backend.executor()
    exe.run(startup)
    got = exe.run(main, fetch_list=fetch)
    tq, tk, tv = (torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes.values())
    tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    want = [tuple(tout.shape)] + [s for s in shapes.values()] * 2
    assert [g.shape for g in got] == want
    scope = rg.Executor()
    scope.run(startup)
    model = rg.onnx.export(main, None, [v.name for v in fetch], scope=scope.scope)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [g.shape for g in sess.run([v.name for v in fetch], {})] == want
