"""``FusedAdamUpdate``: the Adam updates of many parameters as one op.

Built only by the pass ``retrograd.passes.fuse_optimizer_updates``, which
replaces a program's ``AdamUpdate`` ops that share their hyper-parameters by
one of these. Layout (``n`` parameters, attr ``n``)::

    inputs   param_0..n-1, grad_0..n-1, moment1_0..n-1, moment2_0..n-1, step_0..n-1 [, lr]
    outputs  param_0..n-1, moment1_0..n-1, moment2_0..n-1, step_0..n-1   (the same Vars: in place)

``lr``, when present, is the learning-rate Var (a schedule's) that every fused
update read. A backend with a multi-tensor Adam routine runs it
(``Backend.multi_adam``; torch on the CPU: ``aten::_fused_adam_`` /
``_fused_adamw_`` on fresh copies, one call for all parameters, the numbers of the separate ops
to rounding); elsewhere the kernel runs ``adam_math`` per parameter (bit for bit
the separate ops' numbers; what it saves is per-op dispatch). The ONNX lowering works on
one flat buffer instead: every parameter, gradient and moment is flattened
and concatenated, the update runs once over all elements, and the results
are split back, so the graph holds about 7n + 25 nodes instead of ~20 per
parameter. Per-parameter step counts stay separate: the bias corrections are
computed per parameter (float64, as the kernel) and spread over each
parameter's elements (``Expand`` + ``Concat``), so the numbers are those of
the separate ops too.
"""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir.program import Var
from ..core.lowering import lowers
from ..core.registry import defop
from .updates import STEP_DTYPE, adam_math, check_rate, decay_factor_onnx, rate_onnx

GROUPS = ("param", "grad", "moment1", "moment2", "step")
HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay", "decoupled")   # the attributes multi_adam takes


def split_inputs(items, n: int) -> list[list]:
    """The five groups (params, grads, moment1s, moment2s, steps) of a FusedAdamUpdate's inputs."""
    return [list(items[i * n:(i + 1) * n]) for i in range(len(GROUPS))]


def _fused_adam_rule(ins: list[Var], attrs: dict):
    n = attrs["n"]
    if len(ins) not in (len(GROUPS) * n, len(GROUPS) * n + 1):
        raise ShapeError(f"FusedAdamUpdate with n={n} needs {len(GROUPS) * n} inputs (and optionally a "
                         f"learning rate), got {len(ins)}")
    check_rate(ins[len(GROUPS) * n:])
    params, grads, m1s, m2s, steps = split_inputs(ins, n)
    for param, grad, m1, m2, step in zip(params, grads, m1s, m2s, steps):
        for var in (grad, m1, m2):
            if var.dtype != param.dtype or var.shape != param.shape:
                raise ShapeError(f"'{var.name}' is {var.type_str()}, but parameter '{param.name}' "
                                 f"is {param.type_str()}")
        if step.dtype != STEP_DTYPE or step.shape != (1,):
            raise ShapeError(f"Adam step count '{step.name}' must be {STEP_DTYPE}[1], got {step.type_str()}")
    return [(v.shape, v.dtype) for v in params + m1s + m2s + steps]


# Inside a compiled region (Executor(compile=True)) the torch CPU backend's multi_adam is one opaque
# custom op around ATen's multi-tensor Adam (Inductor's per-parameter code was slower: the char-LSTM
# step 0.82x eager when this op was traced), so the updates join the forward and backward's region.
@defop("FusedAdamUpdate", inputs=("params_grads_moments_steps*",), outputs=("params_moments_steps*",),
       infer=_fused_adam_rule)
def _fused_adam_update(k, *arrays):
    """Adam for every parameter: the backend's multi-tensor routine where it has one, else
    ``AdamUpdate``'s math one parameter after the other."""
    n = k.attrs["n"]
    lr = arrays[len(GROUPS) * n] if len(arrays) > len(GROUPS) * n else None
    groups = split_inputs(arrays, n)
    outs = k.backend.multi_adam(*groups, lr, **{a: k.attrs.get(a, 0.0) for a in HYPER})
    if outs is None:
        outs = [[], [], [], []]
        for group in zip(*groups):
            for out, value in zip(outs, adam_math(k, *group, lr)):
                out.append(value)
    return tuple(outs[0]) + tuple(outs[1]) + tuple(outs[2]) + tuple(outs[3])


@lowers("FusedAdamUpdate")
def _fused_adam_onnx(g):
    """One flat buffer: flatten + concat, the update once, split + reshape back (module docstring)."""
    a, n = g.attrs, g.attrs["n"]
    params = g.in_vars[:n]
    dtype = params[0].dtype
    if any(p.dtype != dtype for p in params) or any(d < 0 for p in params for d in p.shape):
        g.fail("the fused update needs parameters of one dtype and known shapes")
    sizes = [int(np.prod(p.shape, dtype=np.int64)) for p in params]
    groups = split_inputs(g.ins, n)
    p, grad, m, v = (_flat(g, names) for names in groups[:4])
    steps = g.node("Concat", groups[4], axis=0) if n > 1 else groups[4][0]    # [n] int64
    lr = rate_onnx(g, len(GROUPS) * n, "float64")
    if a.get("weight_decay") and a.get("decoupled"):      # AdamW
        p = g.node("Mul", [p, decay_factor_onnx(g, lr, a["weight_decay"], dtype)])
    elif a.get("weight_decay"):
        grad = g.node("Add", [grad, g.node("Mul", [g.const(a["weight_decay"], dtype), p])])
    steps = g.node("Add", [steps, g.const([1], "int64")])
    t = g.cast(steps, "float64")
    b1, b2 = a["beta1"], a["beta2"]

    def one_minus_power(beta):
        return g.node("Sub", [g.const(1.0, "float64"), g.node("Pow", [g.const(beta, "float64"), t])])

    step_size = _spread(g, g.cast(g.node("Div", [lr, one_minus_power(b1)]), dtype),
                        sizes)
    root = _spread(g, g.cast(g.node("Sqrt", [one_minus_power(b2)]), dtype), sizes)

    def scaled(c, x):
        return g.node("Mul", [g.const(c, dtype), x])
    m = g.node("Add", [scaled(b1, m), scaled(1.0 - b1, grad)])
    v = g.node("Add", [scaled(b2, v), scaled(1.0 - b2, g.node("Mul", [grad, grad]))])
    denom = g.node("Add", [g.node("Div", [g.node("Sqrt", [v]), root]), g.const(a["eps"], dtype)])
    p = g.node("Sub", [p, g.node("Mul", [step_size, g.node("Div", [m, denom])])])
    outs = []
    for flat in (p, m, v):
        outs += _unflat(g, flat, params, sizes)
    outs += g.node("Split", [steps, g.const([1] * n, "int64")], n_out=n, axis=0) if n > 1 else [steps]
    return outs


def _spread(g, values: str, sizes: list[int]) -> str:
    """Per-parameter scalars ``values`` ([n]) repeated over each parameter's ``sizes`` elements.

    One ``Expand`` per parameter and a ``Concat`` (memory-speed copies); a ``Gather`` by an
    element -> parameter index ran at ~4 ns per element in onnxruntime (~0.5 ms per spread in
    the default training step). One parameter needs no spreading: ``[1]`` broadcasts.
    """
    if len(sizes) == 1:
        return values
    pieces = g.node("Split", [values, g.const([1] * len(sizes), "int64")], n_out=len(sizes), axis=0)
    return g.node("Concat", [g.node("Expand", [piece, g.const([size], "int64")])
                             for piece, size in zip(pieces, sizes)], axis=0)


def _flat(g, names: list[str]) -> str:
    flat = [g.node("Reshape", [name, g.const([-1], "int64")]) for name in names]
    return flat[0] if len(flat) == 1 else g.node("Concat", flat, axis=0)


def _unflat(g, flat: str, params: list[Var], sizes: list[int]) -> list[str]:
    pieces = g.node("Split", [flat, g.const(sizes, "int64")], n_out=len(sizes), axis=0) \
        if len(sizes) > 1 else [flat]
    return [g.node("Reshape", [piece, g.const(list(p.shape), "int64")]) for piece, p in zip(pieces, params)]
