"""Property test: random small DAGs of differentiable ops get PyTorch's gradients.

Hypothesis draws a plain description of a program (leaf shapes, then 3-8
ops, each reading earlier nodes: fan-out and broadcasting happen by chance);
the same description is built in retrograd and in torch, and the gradients of
one scalar loss with respect to every leaf must agree (float64, rtol 1e-7).
"""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import retrograd as rg

# Each entry: (arity, retrograd builder, torch builder). Singular ops see safe arguments
# (log/sqrt/pow of x*x + 1, division by y*y + 1) so that every drawn program is smooth.
UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "exp": (rg.exp, torch.exp),
    "tanh": (rg.tanh, torch.tanh),
    "sigmoid": (rg.sigmoid, torch.sigmoid),
    "square": (rg.square, torch.square),
    "relu": (rg.relu, torch.relu),
    "abs": (rg.abs, torch.abs),
    "log": (lambda x: rg.log(x * x + 1.0), lambda x: torch.log(x * x + 1.0)),
    "sqrt": (lambda x: rg.sqrt(x * x + 1.0), lambda x: torch.sqrt(x * x + 1.0)),
    "scale": (lambda x: x * 0.5 + 1.0, lambda x: x * 0.5 + 1.0),
    "clip": (lambda x: rg.clip(x, -0.7, 0.9), lambda x: torch.clamp(x, -0.7, 0.9)),
}
BINARY = {
    "add": (rg.add, torch.add),
    "sub": (rg.sub, torch.sub),
    "mul": (rg.mul, torch.mul),
    "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0)),
    "pow": (lambda a, b: rg.pow(a * a + 1.0, rg.tanh(b)), lambda a, b: torch.pow(a * a + 1.0, torch.tanh(b))),
    "maximum": (rg.maximum, torch.maximum),
    "minimum": (rg.minimum, torch.minimum),
    "where": (lambda a, b: rg.where(a > b, a * b, b), lambda a, b: torch.where(a > b, a * b, b)),
}
# Shape-changing ops: (retrograd, torch); ``_shape_after`` says where each applies and what it gives.
SHAPED = {
    "sum0": (lambda x: rg.sum(x, axis=0), lambda x: x.sum(0)),
    "mean1k": (lambda x: rg.mean(x, axis=1, keepdims=True), lambda x: x.mean(1, keepdim=True)),
    "sum_all": (lambda x: rg.sum(x), lambda x: x.sum()),
    "mean_all": (lambda x: rg.mean(x), lambda x: x.mean()),
    "transpose": (lambda x: rg.transpose(x, [1, 0]), lambda x: x.transpose(0, 1)),
    "flatten": (lambda x: rg.reshape(x, [-1]), lambda x: x.reshape(-1)),
    "softmax": (lambda x: rg.softmax(x, axis=-1), lambda x: torch.softmax(x, -1)),
    "log_softmax0": (lambda x: rg.log_softmax(x, axis=0), lambda x: torch.log_softmax(x, 0)),
    "first_row": (lambda x: rg.slice(x, [0], [0], [1]), lambda x: x[0:1]),
    "stack_tanh": (lambda x: rg.concat([x, rg.tanh(x)], axis=0), lambda x: torch.cat([x, torch.tanh(x)], 0)),
    "matmul": None,                       # x @ W with a leaf W [cols, cols]
}


def _shape_after(kind: str, shape: tuple) -> tuple | None:
    """The result shape, or None when ``kind`` does not apply to ``shape``."""
    ndim = len(shape)
    if kind in ("sum0", "flatten"):
        return None if ndim == 0 else (shape[1:] if kind == "sum0" else (int(np.prod(shape)),))
    if kind == "mean1k" or kind == "transpose" or kind == "matmul":
        if ndim != 2:
            return None
        return {"mean1k": (shape[0], 1), "transpose": shape[::-1], "matmul": shape}[kind]
    if kind in ("sum_all", "mean_all"):
        return ()
    if kind in ("softmax", "log_softmax0", "first_row"):
        if ndim == 0:
            return None
        return (1,) + shape[1:] if kind == "first_row" else shape
    if kind == "stack_tanh":
        return None if ndim == 0 else (2 * shape[0],) + shape[1:]
    raise AssertionError(kind)


def _broadcast(a: tuple, b: tuple) -> tuple | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


@st.composite
def programs(draw):
    """(leaf shapes, ops): each op is (kind, name, input node indices)."""
    m, n = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    family = [(m, n), (n,), (m, 1), (1, n), ()]
    leaves = [(m, n)] + [draw(st.sampled_from(family)) for _ in range(draw(st.integers(1, 3)))]
    shapes = list(leaves)
    ops = []
    for _ in range(draw(st.integers(3, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "shaped"]))
        if kind == "unary":
            i = draw(st.integers(0, len(shapes) - 1))
            ops.append(("unary", draw(st.sampled_from(sorted(UNARY))), (i,)))
            shapes.append(shapes[i])
        elif kind == "binary":
            i = draw(st.integers(0, len(shapes) - 1))
            partners = [j for j in range(len(shapes)) if _broadcast(shapes[i], shapes[j]) is not None]
            j = draw(st.sampled_from(partners))          # may be i itself: fan-out into one op
            ops.append(("binary", draw(st.sampled_from(sorted(BINARY))), (i, j)))
            shapes.append(_broadcast(shapes[i], shapes[j]))
        else:
            i = draw(st.integers(0, len(shapes) - 1))
            name = draw(st.sampled_from(sorted(SHAPED)))
            after = _shape_after(name, shapes[i])
            if after is None:
                ops.append(("unary", "tanh", (i,)))
                shapes.append(shapes[i])
            else:
                ops.append(("shaped", name, (i,)))
                shapes.append(after)
    return leaves, ops, shapes


def _build(leaves_vals, ops, shapes, leaf_nodes, fw: str, weights):
    """Evaluate the description with retrograd builders (fw='rg') or torch (fw='torch')."""
    nodes = list(leaf_nodes)
    pick = 0 if fw == "rg" else 1
    for kind, name, args in ops:
        xs = [nodes[i] for i in args]
        if kind == "unary":
            nodes.append(UNARY[name][pick](xs[0]))
        elif kind == "binary":
            nodes.append(BINARY[name][pick](xs[0], xs[1]))
        elif name == "matmul":
            cols = shapes[args[0]][1]
            nodes.append(xs[0] @ weights[cols])
        else:
            nodes.append(SHAPED[name][pick](xs[0]))
    return nodes


def _loss_terms(nodes, ops, n_leaves):
    """Every node nothing reads (and the last one) enters the loss, each projected."""
    read = {i for _, _, args in ops for i in args}
    return [i for i in range(n_leaves, len(nodes)) if i not in read or i == len(nodes) - 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**31 - 1))
def test_random_programs_match_torch_gradients(description, seed):
    leaves, ops, shapes = description
    r = np.random.default_rng(seed)
    leaf_vals = [r.uniform(-1.5, 1.5, s) for s in leaves]
    weight_vals = {c: r.uniform(-1.0, 1.0, (c, c)) for c in range(1, 4)}
    projections = [r.standard_normal(s) for s in shapes]

    # torch
    t_leaves = [torch.tensor(v, requires_grad=True) for v in leaf_vals]
    t_weights = {c: torch.tensor(v, requires_grad=True) for c, v in weight_vals.items()}
    t_nodes = _build(leaf_vals, ops, shapes, t_leaves, "torch", t_weights)
    terms = _loss_terms(t_nodes, ops, len(leaves))
    t_loss = sum((t_nodes[i] * torch.tensor(projections[i])).sum() for i in terms)
    assume(bool(torch.isfinite(t_loss)))
    wanted = t_leaves + list(t_weights.values())
    t_grads = torch.autograd.grad(t_loss, wanted, allow_unused=True)

    # retrograd, from the same description
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        leaf_vars = [rg.data(f"leaf{i}", list(s), dtype="float64") for i, s in enumerate(leaves)]
        weights = {c: rg.data(f"w{c}", [c, c], dtype="float64") for c in weight_vals}
        nodes = _build(leaf_vals, ops, shapes, leaf_vars, "rg", weights)
        loss = rg.add_n([rg.sum(nodes[i] * rg.constant(projections[i], dtype="float64")) for i in terms])
        grads = rg.gradients(loss, leaf_vars + list(weights.values()))
    feed = {f"leaf{i}": v for i, v in enumerate(leaf_vals)}
    feed.update({f"w{c}": v for c, v in weight_vals.items()})
    fetch = [g for g in grads if g is not None]
    values = iter(rg.Executor().run(main, feed=feed, fetch_list=[loss] + fetch))
    np.testing.assert_allclose(next(values), t_loss.detach().numpy(), rtol=1e-10)
    for var, g, ref, base in zip(leaf_vars + list(weights.values()), grads, t_grads, leaf_vals + list(weight_vals.values())):
        expected = np.zeros_like(base) if ref is None else ref.numpy()
        if g is None:
            assert ref is None or not np.any(expected), f"retrograd found no path to {var.name}"
            continue
        got = next(values)
        assert np.shape(got) == np.shape(base), f"gradient of {var.name} has shape {np.shape(got)}"
        scale = 1.0 + float(np.max(np.abs(expected), initial=0.0))
        np.testing.assert_allclose(got, expected, rtol=1e-7, atol=1e-9 * scale,
                                   err_msg=f"d loss / d {var.name}; program: {ops}")
