"""Update ops: they write the parameters and optimizer state they read.

These are the "optimizer updates" exception to SSA (DESIGN.md, IR): each
op's outputs name Vars it also reads, and ``updates`` (one input index per
output) records which. The kernels return fresh arrays instead of mutating
their inputs, so values fetched earlier never change under the user; the
executor writes the new values back to the scope after the run.

Formulas follow PyTorch (``torch.optim``), so results agree step by step:

* SGD:       ``p -= lr * g``
* Momentum:  ``v = mu * v + g; p -= lr * v`` (Nesterov: ``p -= lr * (g + mu * v)``)
* Adam:      ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``
* Increment: ``n += 1`` (a step counter)

``weight_decay`` adds ``wd * p`` to the gradient first (PyTorch's L2 form).
"""
from __future__ import annotations


from ..errors import ShapeError
from ..ir.program import Var
from ..ops.registry import append_op, defop
from ..ops.lowering import lowers
from ..ops.shapes import require_float, shapes_compatible

STEP_DTYPE = "int64"


def _state_rule(n_outputs: int):
    """Outputs are the param (input 0) and the state inputs 2.. as they are; grad must match."""
    def rule(ins: list[Var], attrs: dict):
        param, grad, *state = ins
        require_float(param, "parameter")
        for var in [grad] + state[:n_outputs - 1]:
            if var.dtype != param.dtype or not shapes_compatible(var.shape, param.shape):
                raise ShapeError(f"'{var.name}' is {var.type_str()}, but parameter '{param.name}' "
                                 f"is {param.type_str()}")
        return [(v.shape, v.dtype) for v in [param] + state]
    return rule


def _decayed(k, param, grad):
    wd = k.attrs.get("weight_decay", 0.0)
    return grad + wd * param if wd else grad


# --- SGD --------------------------------------------------------------------------------

@defop("SGDUpdate", inputs=("param", "grad"), outputs=("param_out",), infer=_state_rule(1),
       updates=(0,))
def _sgd_update(k, param, grad):
    """``param - lr * grad`` written back to ``param``."""
    return param - k.attrs["lr"] * _decayed(k, param, grad)


@lowers("SGDUpdate")
def _sgd_update_onnx(g):
    param = g.ins[0]
    grad = _decayed_onnx(g, param, g.ins[1])
    return [g.node("Sub", [param, g.node("Mul", [g.const(g.attrs["lr"], g.in_vars[0].dtype), grad])])]


def _decayed_onnx(g, param: str, grad: str) -> str:
    wd = g.attrs.get("weight_decay", 0.0)
    if not wd:
        return grad
    return g.node("Add", [grad, g.node("Mul", [g.const(wd, g.in_vars[0].dtype), param])])


def sgd_update(param: Var, grad: Var, lr: float, weight_decay: float = 0.0) -> Var:
    """Append ``param -= lr * grad`` (in place: the op's output is ``param``).

    Example::

        sgd_update(w, w_grad, lr=0.1)
    """
    return append_op("SGDUpdate", [param, grad], {"lr": float(lr), "weight_decay": float(weight_decay)},
                     outputs=[param])[0]


# --- Momentum ---------------------------------------------------------------------------

@defop("MomentumUpdate", inputs=("param", "grad", "velocity"), outputs=("param_out", "velocity_out"),
       infer=_state_rule(2), updates=(0, 2))
def _momentum_update(k, param, grad, velocity):
    """``v = mu * v + g; p -= lr * v`` (PyTorch's heavy-ball form, dampening 0)."""
    a = k.attrs
    grad = _decayed(k, param, grad)
    velocity = a["momentum"] * velocity + grad
    step = grad + a["momentum"] * velocity if a["nesterov"] else velocity
    return param - a["lr"] * step, velocity


@lowers("MomentumUpdate")
def _momentum_update_onnx(g):
    a, dtype = g.attrs, g.in_vars[0].dtype
    param, velocity = g.ins[0], g.ins[2]
    grad = _decayed_onnx(g, param, g.ins[1])
    mu = g.const(a["momentum"], dtype)
    velocity = g.node("Add", [g.node("Mul", [mu, velocity]), grad])
    step = g.node("Add", [grad, g.node("Mul", [mu, velocity])]) if a["nesterov"] else velocity
    return [g.node("Sub", [param, g.node("Mul", [g.const(a["lr"], dtype), step])]), velocity]


def momentum_update(param: Var, grad: Var, velocity: Var, lr: float, momentum: float,
                    nesterov: bool = False, weight_decay: float = 0.0) -> Var:
    """Append the momentum update of ``param`` and its ``velocity`` (both in place).

    Example::

        momentum_update(w, w_grad, w_velocity, lr=0.1, momentum=0.9)
    """
    attrs = {"lr": float(lr), "momentum": float(momentum), "nesterov": bool(nesterov),
             "weight_decay": float(weight_decay)}
    return append_op("MomentumUpdate", [param, grad, velocity], attrs, outputs=[param, velocity])[0]


# --- Adam --------------------------------------------------------------------------------

def _adam_rule(ins: list[Var], attrs: dict):
    specs = _state_rule(3)(ins[:4], attrs)
    step = ins[4]
    if step.dtype != STEP_DTYPE or step.shape != (1,):
        raise ShapeError(f"Adam step count '{step.name}' must be {STEP_DTYPE}[1], got {step.type_str()}")
    return specs + [(step.shape, step.dtype)]


@defop("AdamUpdate", inputs=("param", "grad", "moment1", "moment2", "step"),
       outputs=("param_out", "moment1_out", "moment2_out", "step_out"), infer=_adam_rule,
       updates=(0, 2, 3, 4))
def _adam_update(k, param, grad, m, v, step):
    """PyTorch's bias-corrected Adam; ``step`` counts this parameter's updates."""
    return adam_math(k, param, grad, m, v, step)


def adam_math(k, param, grad, m, v, step) -> tuple:
    """One Adam update as arrays: (param, m, v, step) after it. Shared with ``FusedAdamUpdate``."""
    a = k.attrs
    b1, b2 = a["beta1"], a["beta2"]
    grad = _decayed(k, param, grad)
    xp = k.xp
    step = step + 1
    # The bias corrections in float64 on the device, rounded once to the parameter's dtype (as a
    # Python float would be): reading the step on the host would stop a device graph's capture.
    t = xp.reshape(xp.astype(step, xp.float64), ())
    m = b1 * m + (1.0 - b1) * grad
    v = b2 * v + (1.0 - b2) * (grad * grad)
    step_size = xp.astype(a["lr"] / (1.0 - b1 ** t), param.dtype)
    denom = xp.sqrt(v) / xp.astype(xp.sqrt(1.0 - b2 ** t), v.dtype) + a["eps"]
    return param - step_size * (m / denom), m, v, step


@lowers("AdamUpdate")
def _adam_update_onnx(g):
    """As the kernel: the bias corrections in float64 from the step count, rounded once to the
    parameter's dtype."""
    a, dtype = g.attrs, g.in_vars[0].dtype
    param, _, m, v, step = g.ins
    b1, b2 = a["beta1"], a["beta2"]
    grad = _decayed_onnx(g, param, g.ins[1])
    step = g.node("Add", [step, g.const([1], "int64")])
    t = g.node("Reshape", [g.cast(step, "float64"), g.const([], "int64")])

    def one_minus_power(beta):
        return g.node("Sub", [g.const(1.0, "float64"), g.node("Pow", [g.const(beta, "float64"), t])])

    def scaled(c, x):
        return g.node("Mul", [g.const(c, dtype), x])
    m = g.node("Add", [scaled(b1, m), scaled(1.0 - b1, grad)])
    v = g.node("Add", [scaled(b2, v), scaled(1.0 - b2, g.node("Mul", [grad, grad]))])
    step_size = g.cast(g.node("Div", [g.const(a["lr"], "float64"), one_minus_power(b1)]), dtype)
    root = g.cast(g.node("Sqrt", [one_minus_power(b2)]), dtype)
    denom = g.node("Add", [g.node("Div", [g.node("Sqrt", [v]), root]), g.const(a["eps"], dtype)])
    update = g.node("Mul", [step_size, g.node("Div", [m, denom])])
    return [g.node("Sub", [param, update]), m, v, step]


def adam_update(param: Var, grad: Var, moment1: Var, moment2: Var, step: Var, lr: float,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 0.0) -> Var:
    """Append one Adam update of ``param``, its moments and its step count (all in place).

    Example::

        adam_update(w, w_grad, m, v, t, lr=1e-3)
    """
    attrs = {"lr": float(lr), "beta1": float(beta1), "beta2": float(beta2), "eps": float(eps),
             "weight_decay": float(weight_decay)}
    return append_op("AdamUpdate", [param, grad, moment1, moment2, step], attrs,
                     outputs=[param, moment1, moment2, step])[0]


# --- Increment ---------------------------------------------------------------------------

def _increment_rule(ins: list[Var], attrs: dict):
    counter = ins[0]
    if counter.dtype != STEP_DTYPE:
        raise ShapeError(f"counter '{counter.name}' must be {STEP_DTYPE}, got {counter.dtype}")
    return [(counter.shape, counter.dtype)]


@defop("Increment", inputs=("counter",), outputs=("counter_out",), infer=_increment_rule, updates=(0,))
def _increment(k, counter):
    """``counter + 1`` written back to ``counter`` (a persistable step count)."""
    return counter + 1


@lowers("Increment")
def _increment_onnx(g):
    return [g.node("Add", [g.ins[0], g.const(1, g.in_vars[0].dtype)])]


def increment(counter: Var) -> Var:
    """Append ``counter += 1`` (in place), e.g. to count training steps in the program.

    Example::

        steps = rg.optim.create_state("train.steps", [1], "int64")
        rg.optim.increment(steps)
    """
    return append_op("Increment", [counter], outputs=[counter])[0]
