"""layers.multi_head_attention against torch.nn.MultiheadAttention(batch_first=True), float64.

torch stacks the in-projections as ``in_proj_weight [3D, D]`` with y = x W^T;
ours are ``w_q/w_k/w_v [D, D]`` with y = x w + b, so they are copied
transposed (``out_proj.weight`` too). torch's bool ``attn_mask`` and
``key_padding_mask`` mean True = *masked*; ours True = attend. Every test runs
on each backend of the ``backend`` fixture and compares values and the
gradients of a loss mixing the output with fixed weights, with respect to the
inputs and all eight parameters.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

N, L, S, D, HEADS = 3, 5, 4, 8, 2
PARAMS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _random_params(seed=0):
    r = np.random.default_rng(seed)
    return {p: r.standard_normal((D, D) if p.startswith("w") else (D,)) * 0.4 for p in PARAMS}


def _torch_module(params):
    module = torch.nn.MultiheadAttention(D, HEADS, batch_first=True, dtype=torch.float64)
    tp = {p: torch.tensor(v, requires_grad=True) for p, v in params.items()}
    weights = {"in_proj_weight": torch.cat([tp["w_q"].T, tp["w_k"].T, tp["w_v"].T]),
               "in_proj_bias": torch.cat([tp["b_q"], tp["b_k"], tp["b_v"]]),
               "out_proj.weight": tp["w_o"].T, "out_proj.bias": tp["b_o"]}
    return module, weights, tp


def _ours(backend, inputs: dict, params, **kwargs):
    """(output, gradients wrt the inputs then PARAMS) of the layer on fed float64 inputs."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = {n: rg.data(n, [-1, -1, D] if n != "mask" else a.shape, a.dtype.name, stop_gradient=False)
                 for n, a in inputs.items()}
        seq = [vars_[n] for n in ("q", "k", "v") if n in vars_]
        out = rg.layers.multi_head_attention(*seq, num_heads=HEADS, mask=vars_.get("mask"), name="att", **kwargs)
        weight = rg.data("weight", [-1, -1, D], "float64")
        param_vars = [main.global_block().var(f"att.{p}") for p in PARAMS]
        grads = rg.gradients(rg.sum(out * weight), seq + param_vars)
    exe = backend.executor()
    exe.run(startup)
    for p, value in params.items():
        exe.scope.set(f"att.{p}", value)
    weight = np.random.default_rng(5).standard_normal((inputs["q"].shape[0], inputs["q"].shape[1], D))
    got = exe.run(main, feed={**inputs, "weight": weight}, fetch_list=[out] + grads)
    return got[0], got[1:], weight


def _compare(got, grads, want, tensors):
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-9, atol=1e-11)
    for g, t in zip(grads, tensors):
        np.testing.assert_allclose(g, t.numpy(), rtol=1e-9, atol=1e-11)


def _run_torch(params, q, k, v, weight, seq_names, **kwargs):
    module, weights, tp = _torch_module(params)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out, _ = torch.func.functional_call(module, weights, (tq, tk, tv), {"need_weights": False, **kwargs})
    leaves = {"q": tq, "k": tk, "v": tv}
    wrt = [leaves[n] for n in seq_names] + [tp[p] for p in PARAMS]
    grads = torch.autograd.grad((out * torch.tensor(weight)).sum(), wrt, allow_unused=True)
    return out, grads


def _inputs(seed=1, cross=False, separate_v=False):
    r = np.random.default_rng(seed)
    q = r.standard_normal((N, L, D))
    if not cross:
        return {"q": q}
    k = r.standard_normal((N, S, D))
    return {"q": q, "k": k, **({"v": r.standard_normal((N, S, D))} if separate_v else {})}


def test_self_attention_matches_torch(backend):
    params = _random_params()
    inputs = _inputs()
    got, grads, weight = _ours(backend, inputs, params)
    q = inputs["q"]
    module, weights, tp = _torch_module(params)
    tq = torch.tensor(q, requires_grad=True)
    out, _ = torch.func.functional_call(module, weights, (tq, tq, tq), {"need_weights": False})
    want = torch.autograd.grad((out * torch.tensor(weight)).sum(), [tq] + [tp[p] for p in PARAMS])
    _compare(got, grads, out, want)


def test_causal_self_attention_matches_torch(backend):
    params = _random_params(2)
    inputs = _inputs(3)
    got, grads, weight = _ours(backend, inputs, params, causal=True)
    module, weights, tp = _torch_module(params)
    tq = torch.tensor(inputs["q"], requires_grad=True)
    hidden = ~torch.ones(L, L, dtype=torch.bool).tril()
    out, _ = torch.func.functional_call(module, weights, (tq, tq, tq), {"need_weights": False, "attn_mask": hidden})
    want = torch.autograd.grad((out * torch.tensor(weight)).sum(), [tq] + [tp[p] for p in PARAMS])
    _compare(got, grads, out, want)


def test_cross_attention_matches_torch(backend):
    params = _random_params(4)
    inputs = _inputs(5, cross=True, separate_v=True)
    got, grads, weight = _ours(backend, inputs, params)
    out, want = _run_torch(params, inputs["q"], inputs["k"], inputs["v"], weight, ["q", "k", "v"])
    _compare(got, grads, out, want)


def test_value_defaults_to_key(backend):
    params = _random_params(6)
    inputs = _inputs(7, cross=True)
    got, grads, weight = _ours(backend, inputs, params)
    module, weights, tp = _torch_module(params)
    tq, tk = (torch.tensor(inputs[n], requires_grad=True) for n in "qk")
    out, _ = torch.func.functional_call(module, weights, (tq, tk, tk), {"need_weights": False})
    want = torch.autograd.grad((out * torch.tensor(weight)).sum(), [tq, tk] + [tp[p] for p in PARAMS])
    _compare(got, grads, out, want)


def test_padding_mask_matches_key_padding_mask(backend):
    params = _random_params(8)
    inputs = _inputs(9, cross=True, separate_v=True)
    keep = np.ones((N, S), bool)
    keep[0, 3:] = False
    keep[2, 1:] = False
    got, grads, weight = _ours(backend, {**inputs, "mask": keep[:, None, None, :]}, params)
    out, want = _run_torch(params, inputs["q"], inputs["k"], inputs["v"], weight, ["q", "k", "v"],
                           key_padding_mask=torch.tensor(~keep))
    _compare(got, grads, out, want)


def test_float_mask_per_head_matches_torch(backend):
    params = _random_params(10)
    inputs = _inputs(11, cross=True, separate_v=True)
    bias = np.random.default_rng(12).standard_normal((N, HEADS, L, S))
    got, grads, weight = _ours(backend, {**inputs, "mask": bias}, params)
    out, want = _run_torch(params, inputs["q"], inputs["k"], inputs["v"], weight, ["q", "k", "v"],
                           attn_mask=torch.tensor(bias.reshape(N * HEADS, L, S)))
    _compare(got, grads, out, want)


def test_parameters_and_their_initialisation():
    """Names, shapes and torch's init: xavier over [3D, D] for w_q/w_k/w_v, U(+-1/sqrt(D)) for w_o,
    zero biases."""
    width = 64
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, width])
        rg.layers.multi_head_attention(x, num_heads=8, name="mha")
    exe = rg.Executor()
    exe.run(startup)
    in_bound, out_bound = math.sqrt(6.0 / (4 * width)), 1.0 / math.sqrt(width)
    for p in PARAMS:
        value = np.asarray(exe.scope.get(f"mha.{p}"))
        assert main.global_block().var(f"mha.{p}").is_parameter
        if p.startswith("b"):
            assert value.shape == (width,) and not value.any()
            continue
        bound = out_bound if p == "w_o" else in_bound
        assert value.shape == (width, width) and np.abs(value).max() <= bound
        assert np.abs(value).max() > 0.9 * bound and abs(value.std() - bound / math.sqrt(3)) < 0.1 * bound
    module = torch.nn.MultiheadAttention(width, 8)
    assert abs(module.in_proj_weight.detach().abs().max().item() - in_bound) < 0.05 * in_bound
    assert abs(module.out_proj.weight.detach().abs().max().item() - out_bound) < 0.05 * out_bound


def _build(x_shape, heads=HEADS, mask_shape=None, k_shape=None):
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", x_shape)
        k = rg.data("k", k_shape) if k_shape else None
        mask = rg.data("m", mask_shape, "bool") if mask_shape else None
        return rg.layers.multi_head_attention(x, k, num_heads=heads, mask=mask, name="att")


def test_heads_not_dividing_the_width_is_a_program_error_at_the_users_line():
    with pytest.raises(rg.ProgramError) as info:
        _build([2, 5, 8], heads=3)
    message = str(info.value)
    assert "multi_head_attention 'att'" in message and "num_heads=3" in message and "D=8" in message
    assert "test_attention.py" in message


def test_mask_not_broadcasting_to_batch_heads_lengths_is_a_shape_error():
    with pytest.raises(rg.ShapeError) as info:
        _build([2, 5, 8], mask_shape=[2, 3, 5, 5])
    message = str(info.value)
    assert "multi_head_attention 'att'" in message and "[2, 2, 5, 5]" in message
    assert "test_attention.py" in message


@pytest.mark.parametrize("x_shape,k_shape,words", [([5, 8], None, "must be \\[N, L, D\\]"),
                                                   ([2, 5, 8], [2, 4, 6], "query's width")])
def test_bad_inputs(x_shape, k_shape, words):
    with pytest.raises(rg.RetrogradError, match=words):
        _build(x_shape, k_shape=k_shape)
