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
* AdamW:     Adam after ``p *= 1 - lr * wd`` (decoupled decay, ``torch.optim.AdamW``)
* RMSProp:   ``s = a s + (1-a) g^2`` (centered: minus the squared mean ``ga``);
  ``p -= lr g / (sqrt(s) + eps)``, or through a momentum buffer (``torch.optim.RMSprop``)
* Adagrad:   ``s += g^2; p -= lr / (1 + (t-1) lr_decay) * g / (sqrt(s) + eps)``
* Increment: ``n += 1`` (a step counter)

``weight_decay`` adds ``wd * p`` to the gradient first (PyTorch's L2 form),
except for AdamW (``decoupled``). Every update takes an optional last input
``lr``: a float ``[1]`` or 0-d Var holding the learning rate (a schedule's
ops compute it from the step count, ``retrograd/optim/lr.py``); without it
the rate is the ``lr`` attribute.
"""
from __future__ import annotations


from ...errors import ShapeError
from ...ir.program import Var
from ..core.registry import append_op, defop
from ..core.lowering import lowers
from ..core.shapes import require_float, shapes_compatible

STEP_DTYPE = "int64"


def _state_rule(n_outputs: int):
    """Outputs are the param (input 0) and the state inputs 2.. as they are; grad must match.

    An input past those is the learning rate Var (a schedule's)."""
    def rule(ins: list[Var], attrs: dict):
        param, grad, *state = ins
        require_float(param, "parameter")
        state, extra = state[:n_outputs - 1], state[n_outputs - 1:]
        for var in [grad] + state:
            if var.dtype != param.dtype or not shapes_compatible(var.shape, param.shape):
                raise ShapeError(f"'{var.name}' is {var.type_str()}, but parameter '{param.name}' "
                                 f"is {param.type_str()}")
        check_rate(extra)
        return [(v.shape, v.dtype) for v in [param] + state]
    return rule


def check_rate(extra: list[Var]) -> None:
    if len(extra) > 1:
        raise ShapeError(f"an update takes one learning-rate input, got {len(extra)} extra inputs")
    for lr in extra:
        require_float(lr, "learning rate")
        if lr.shape not in ((), (1,)):
            raise ShapeError(f"learning rate '{lr.name}' must be 0-d or [1], got {lr.type_str()}")


def _decayed(k, param, grad):
    wd = k.attrs.get("weight_decay", 0.0)
    return grad + wd * param if wd else grad


def rate(k, rate_input, dtype):
    """The learning rate: the ``lr`` input as a 0-d array of ``dtype``, else the attribute."""
    if rate_input is None:
        return k.attrs["lr"]
    xp = k.xp
    return xp.astype(xp.reshape(rate_input, ()), dtype)


def rate_onnx(g, n_inputs: int, dtype: str) -> str:
    """The ONNX form of ``rate``: the op's input ``n_inputs`` (if any) as a 0-d ``dtype`` value."""
    if len(g.ins) <= n_inputs:
        return g.const(g.attrs["lr"], dtype)
    return g.cast(g.node("Reshape", [g.ins[n_inputs], g.const([], "int64")]), dtype)


def _with_rate(inputs: list, lr) -> list:
    """``inputs`` plus the learning-rate Var when ``lr`` is one (a schedule's)."""
    return inputs + [lr] if isinstance(lr, Var) else inputs


def _rate_attr(lr) -> float:
    """The ``lr`` attribute: the rate, or 0.0 when a Var input carries it."""
    return 0.0 if isinstance(lr, Var) else float(lr)


# --- SGD --------------------------------------------------------------------------------

@defop("SGDUpdate", inputs=("param", "grad"), outputs=("param_out",), infer=_state_rule(1),
       updates=(0,))
def _sgd_update(k, param, grad, lr=None):
    """``param - lr * grad`` written back to ``param``."""
    return param - rate(k, lr, param.dtype) * _decayed(k, param, grad)


@lowers("SGDUpdate")
def _sgd_update_onnx(g):
    param = g.ins[0]
    grad = _decayed_onnx(g, param, g.ins[1])
    return [g.node("Sub", [param, g.node("Mul", [rate_onnx(g, 2, g.in_vars[0].dtype), grad])])]


def _decayed_onnx(g, param: str, grad: str) -> str:
    wd = g.attrs.get("weight_decay", 0.0)
    if not wd:
        return grad
    return g.node("Add", [grad, g.node("Mul", [g.const(wd, g.in_vars[0].dtype), param])])


def sgd_update(param: Var, grad: Var, lr, weight_decay: float = 0.0) -> Var:
    """Append ``param -= lr * grad`` (in place: the op's output is ``param``).

    ``lr`` is a float, or a float ``[1]`` Var (a learning-rate schedule's).

    Example::

        sgd_update(w, w_grad, lr=0.1)
    """
    return append_op("SGDUpdate", _with_rate([param, grad], lr),
                     {"lr": _rate_attr(lr), "weight_decay": float(weight_decay)}, outputs=[param])[0]


# --- Momentum ---------------------------------------------------------------------------

@defop("MomentumUpdate", inputs=("param", "grad", "velocity"), outputs=("param_out", "velocity_out"),
       infer=_state_rule(2), updates=(0, 2))
def _momentum_update(k, param, grad, velocity, lr=None):
    """``v = mu * v + g; p -= lr * v`` (PyTorch's heavy-ball form, dampening 0)."""
    a = k.attrs
    grad = _decayed(k, param, grad)
    velocity = a["momentum"] * velocity + grad
    step = grad + a["momentum"] * velocity if a["nesterov"] else velocity
    return param - rate(k, lr, param.dtype) * step, velocity


@lowers("MomentumUpdate")
def _momentum_update_onnx(g):
    a, dtype = g.attrs, g.in_vars[0].dtype
    param, velocity = g.ins[0], g.ins[2]
    grad = _decayed_onnx(g, param, g.ins[1])
    mu = g.const(a["momentum"], dtype)
    velocity = g.node("Add", [g.node("Mul", [mu, velocity]), grad])
    step = g.node("Add", [grad, g.node("Mul", [mu, velocity])]) if a["nesterov"] else velocity
    return [g.node("Sub", [param, g.node("Mul", [rate_onnx(g, 3, dtype), step])]), velocity]


def momentum_update(param: Var, grad: Var, velocity: Var, lr, momentum: float,
                    nesterov: bool = False, weight_decay: float = 0.0) -> Var:
    """Append the momentum update of ``param`` and its ``velocity`` (both in place).

    Example::

        momentum_update(w, w_grad, w_velocity, lr=0.1, momentum=0.9)
    """
    attrs = {"lr": _rate_attr(lr), "momentum": float(momentum), "nesterov": bool(nesterov),
             "weight_decay": float(weight_decay)}
    return append_op("MomentumUpdate", _with_rate([param, grad, velocity], lr), attrs,
                     outputs=[param, velocity])[0]


# --- Adam --------------------------------------------------------------------------------

def _adam_rule(ins: list[Var], attrs: dict):
    specs = _state_rule(3)(ins[:4], attrs)
    step = ins[4]
    if step.dtype != STEP_DTYPE or step.shape != (1,):
        raise ShapeError(f"Adam step count '{step.name}' must be {STEP_DTYPE}[1], got {step.type_str()}")
    check_rate(ins[5:])
    return specs + [(step.shape, step.dtype)]


@defop("AdamUpdate", inputs=("param", "grad", "moment1", "moment2", "step"),
       outputs=("param_out", "moment1_out", "moment2_out", "step_out"), infer=_adam_rule,
       updates=(0, 2, 3, 4))
def _adam_update(k, param, grad, m, v, step, lr=None):
    """PyTorch's bias-corrected Adam (AdamW's with ``decoupled``); ``step`` counts this parameter's
    updates."""
    return adam_math(k, param, grad, m, v, step, lr)


def adam_math(k, param, grad, m, v, step, lr=None) -> tuple:
    """One Adam update as arrays: (param, m, v, step) after it. Shared with ``FusedAdamUpdate``."""
    a = k.attrs
    b1, b2 = a["beta1"], a["beta2"]
    xp = k.xp
    # The rate in float64 (a Python float, or the schedule's value on the device).
    lr = a["lr"] if lr is None else xp.reshape(xp.astype(lr, xp.float64), ())
    if a.get("decoupled"):      # AdamW: p *= 1 - lr * wd, the gradient undecayed
        factor = 1.0 - lr * a.get("weight_decay", 0.0)
        param = param * (factor if isinstance(factor, float) else xp.astype(factor, param.dtype))
    else:
        grad = _decayed(k, param, grad)
    step = step + 1
    # The bias corrections in float64 on the device, rounded once to the parameter's dtype (as a
    # Python float would be): reading the step on the host would stop a device graph's capture.
    t = xp.reshape(xp.astype(step, xp.float64), ())
    m = b1 * m + (1.0 - b1) * grad
    v = b2 * v + (1.0 - b2) * (grad * grad)
    step_size = xp.astype(lr / (1.0 - b1 ** t), param.dtype)
    denom = xp.sqrt(v) / xp.astype(xp.sqrt(1.0 - b2 ** t), v.dtype) + a["eps"]
    return param - step_size * (m / denom), m, v, step


@lowers("AdamUpdate")
def _adam_update_onnx(g):
    """As the kernel: the bias corrections in float64 from the step count, rounded once to the
    parameter's dtype."""
    a, dtype = g.attrs, g.in_vars[0].dtype
    param, _, m, v, step = g.ins[:5]
    b1, b2 = a["beta1"], a["beta2"]
    lr = rate_onnx(g, 5, "float64")
    if a.get("decoupled"):
        grad = g.ins[1]
        if a.get("weight_decay"):
            param = g.node("Mul", [param, decay_factor_onnx(g, lr, a["weight_decay"], dtype)])
    else:
        grad = _decayed_onnx(g, param, g.ins[1])
    step = g.node("Add", [step, g.const([1], "int64")])
    t = g.node("Reshape", [g.cast(step, "float64"), g.const([], "int64")])

    def one_minus_power(beta):
        return g.node("Sub", [g.const(1.0, "float64"), g.node("Pow", [g.const(beta, "float64"), t])])

    def scaled(c, x):
        return g.node("Mul", [g.const(c, dtype), x])
    m = g.node("Add", [scaled(b1, m), scaled(1.0 - b1, grad)])
    v = g.node("Add", [scaled(b2, v), scaled(1.0 - b2, g.node("Mul", [grad, grad]))])
    step_size = g.cast(g.node("Div", [lr, one_minus_power(b1)]), dtype)
    root = g.cast(g.node("Sqrt", [one_minus_power(b2)]), dtype)
    denom = g.node("Add", [g.node("Div", [g.node("Sqrt", [v]), root]), g.const(a["eps"], dtype)])
    update = g.node("Mul", [step_size, g.node("Div", [m, denom])])
    return [g.node("Sub", [param, update]), m, v, step]


def decay_factor_onnx(g, lr: str, weight_decay: float, dtype: str) -> str:
    """AdamW's ``1 - lr * wd`` from the float64 rate ``lr``, rounded once to ``dtype``."""
    return g.cast(g.node("Sub", [g.const(1.0, "float64"),
                                 g.node("Mul", [lr, g.const(weight_decay, "float64")])]), dtype)


def adam_update(param: Var, grad: Var, moment1: Var, moment2: Var, step: Var, lr,
                beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 0.0, decoupled: bool = False) -> Var:
    """Append one Adam update of ``param``, its moments and its step count (all in place).

    ``decoupled=True`` is AdamW: the decay multiplies the parameter by ``1 - lr * wd``
    instead of adding ``wd * p`` to the gradient.

    Example::

        adam_update(w, w_grad, m, v, t, lr=1e-3)
    """
    attrs = {"lr": _rate_attr(lr), "beta1": float(beta1), "beta2": float(beta2), "eps": float(eps),
             "weight_decay": float(weight_decay)}
    if decoupled:
        attrs["decoupled"] = True
    return append_op("AdamUpdate", _with_rate([param, grad, moment1, moment2, step], lr), attrs,
                     outputs=[param, moment1, moment2, step])[0]


# --- RMSProp -----------------------------------------------------------------------------

def _rmsprop_slots(attrs: dict) -> int:
    """State inputs after ``square_avg``: the momentum buffer, the centered mean, as configured."""
    return int(attrs["momentum"] > 0) + int(bool(attrs["centered"]))


def _rmsprop_rule(ins: list[Var], attrs: dict):
    return _state_rule(2 + _rmsprop_slots(attrs))(ins, attrs)


@defop("RMSPropUpdate", inputs=("param", "grad", "square_avg", "state*"), outputs=("param_out", "state_out*"),
       infer=_rmsprop_rule)
def _rmsprop_update(k, param, grad, square_avg, *rest):
    """``torch.optim.RMSprop``: inputs param, grad, square_avg [, momentum_buf] [, grad_avg] [, lr]."""
    a, n = k.attrs, _rmsprop_slots(k.attrs)
    state, lr = list(rest[:n]), (rest[n] if len(rest) > n else None)
    grad = _decayed(k, param, grad)
    alpha = a["alpha"]
    square_avg = alpha * square_avg + (1.0 - alpha) * (grad * grad)
    outs = [square_avg]
    avg = square_avg
    if a["centered"]:
        grad_avg = alpha * state[-1] + (1.0 - alpha) * grad
        avg = square_avg - grad_avg * grad_avg
    scaled = grad / (k.xp.sqrt(avg) + a["eps"])
    lr = rate(k, lr, param.dtype)
    if a["momentum"] > 0:
        buf = a["momentum"] * state[0] + scaled
        outs.append(buf)
        param = param - lr * buf
    else:
        param = param - lr * scaled
    if a["centered"]:
        outs.append(grad_avg)
    return (param, *outs)


@lowers("RMSPropUpdate")
def _rmsprop_update_onnx(g):
    a, dtype, n = g.attrs, g.in_vars[0].dtype, _rmsprop_slots(g.attrs)
    param, square_avg = g.ins[0], g.ins[2]
    state = g.ins[3:3 + n]
    grad = _decayed_onnx(g, param, g.ins[1])

    def scaled(c, x):
        return g.node("Mul", [g.const(c, dtype), x])
    alpha = a["alpha"]
    square_avg = g.node("Add", [scaled(alpha, square_avg), scaled(1.0 - alpha, g.node("Mul", [grad, grad]))])
    outs, avg = [square_avg], square_avg
    if a["centered"]:
        grad_avg = g.node("Add", [scaled(alpha, state[-1]), scaled(1.0 - alpha, grad)])
        avg = g.node("Sub", [square_avg, g.node("Mul", [grad_avg, grad_avg])])
    step = g.node("Div", [grad, g.node("Add", [g.node("Sqrt", [avg]), g.const(a["eps"], dtype)])])
    if a["momentum"] > 0:
        step = g.node("Add", [scaled(a["momentum"], state[0]), step])
        outs.append(step)
    if a["centered"]:
        outs.append(grad_avg)
    lr = rate_onnx(g, 3 + n, dtype)
    return [g.node("Sub", [param, g.node("Mul", [lr, step])]), *outs]


def rmsprop_update(param: Var, grad: Var, square_avg: Var, lr, alpha: float = 0.99, eps: float = 1e-8,
                   momentum: float = 0.0, centered: bool = False, momentum_buf: Var | None = None,
                   grad_avg: Var | None = None, weight_decay: float = 0.0) -> Var:
    """Append one RMSProp update (``torch.optim.RMSprop``) of ``param`` and its state (in place).

    ``momentum_buf`` is needed when ``momentum > 0``, ``grad_avg`` when ``centered``.

    Example::

        rmsprop_update(w, w_grad, w_square_avg, lr=1e-2)
    """
    state = [square_avg] + ([momentum_buf] if momentum > 0 else []) + ([grad_avg] if centered else [])
    if any(s is None for s in state):
        raise ShapeError("rmsprop_update: momentum > 0 needs momentum_buf, centered needs grad_avg")
    attrs = {"lr": _rate_attr(lr), "alpha": float(alpha), "eps": float(eps), "momentum": float(momentum),
             "centered": bool(centered), "weight_decay": float(weight_decay)}
    return append_op("RMSPropUpdate", _with_rate([param, grad, *state], lr), attrs,
                     outputs=[param, *state])[0]


# --- Adagrad -----------------------------------------------------------------------------

def _adagrad_rule(ins: list[Var], attrs: dict):
    specs = _state_rule(2)(ins[:3], attrs)
    step = ins[3]
    if step.dtype != STEP_DTYPE or step.shape != (1,):
        raise ShapeError(f"Adagrad step count '{step.name}' must be {STEP_DTYPE}[1], got {step.type_str()}")
    check_rate(ins[4:])
    return specs + [(step.shape, step.dtype)]


@defop("AdagradUpdate", inputs=("param", "grad", "sum", "step"), outputs=("param_out", "sum_out", "step_out"),
       infer=_adagrad_rule, updates=(0, 2, 3))
def _adagrad_update(k, param, grad, total, step, lr=None):
    """``torch.optim.Adagrad``: ``s += g^2; p -= lr / (1 + (t-1) lr_decay) * g / (sqrt(s) + eps)``."""
    a, xp = k.attrs, k.xp
    grad = _decayed(k, param, grad)
    step = step + 1
    lr = a["lr"] if lr is None else xp.reshape(xp.astype(lr, xp.float64), ())
    t = xp.reshape(xp.astype(step, xp.float64), ())
    clr = xp.astype(lr / (1.0 + (t - 1.0) * a["lr_decay"]), param.dtype)
    total = total + grad * grad
    return param - clr * (grad / (xp.sqrt(total) + a["eps"])), total, step


@lowers("AdagradUpdate")
def _adagrad_update_onnx(g):
    a, dtype = g.attrs, g.in_vars[0].dtype
    param, _, total, step = g.ins[:4]
    grad = _decayed_onnx(g, param, g.ins[1])
    step = g.node("Add", [step, g.const([1], "int64")])
    t = g.node("Reshape", [g.cast(step, "float64"), g.const([], "int64")])
    decay = g.node("Add", [g.const(1.0, "float64"), g.node("Mul", [g.node("Sub", [t, g.const(1.0, "float64")]),
                                                                   g.const(a["lr_decay"], "float64")])])
    clr = g.cast(g.node("Div", [rate_onnx(g, 4, "float64"), decay]), dtype)
    total = g.node("Add", [total, g.node("Mul", [grad, grad])])
    denom = g.node("Add", [g.node("Sqrt", [total]), g.const(a["eps"], dtype)])
    return [g.node("Sub", [param, g.node("Mul", [clr, g.node("Div", [grad, denom])])]), total, step]


def adagrad_update(param: Var, grad: Var, total: Var, step: Var, lr, eps: float = 1e-10,
                   lr_decay: float = 0.0, weight_decay: float = 0.0) -> Var:
    """Append one Adagrad update (``torch.optim.Adagrad``) of ``param``, its sum of squares and step.

    Example::

        adagrad_update(w, w_grad, w_sum, w_step, lr=1e-2)
    """
    attrs = {"lr": _rate_attr(lr), "eps": float(eps), "lr_decay": float(lr_decay),
             "weight_decay": float(weight_decay)}
    return append_op("AdagradUpdate", _with_rate([param, grad, total, step], lr), attrs,
                     outputs=[param, total, step])[0]


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
