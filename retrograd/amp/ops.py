"""The ops of dynamic loss scaling: ``AllFinite``, ``SelectUpdates``, ``UpdateLossScale``.

A float16 training step with dynamic scaling reads, in the printed program::

    loss.scaled = Mul(loss, amp.loss_scale)               the backward starts here
    ... backward ...
    w.grad.unscaled = Div(w.grad, amp.loss_scale)          every gradient, float32
    amp.finite = AllFinite(w.grad.unscaled, ...)
    AdamUpdate(w, ...) -> w.amp_new, w.moment1.amp_new ...  the updates write aside
    SelectUpdates(amp.finite, w.amp_new, ..., w, ...) -> w, ...        kept only when finite
    UpdateLossScale(amp.finite, amp.loss_scale, amp.good_steps) -> amp.loss_scale, amp.good_steps

``torch.amp.GradScaler``'s rule: a step with a non-finite gradient keeps every
parameter and optimizer state as it was and multiplies the scale by
``backoff`` (0.5); ``growth_interval`` finite steps in a row multiply it by
``growth`` (2) and start the count again.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ir.program import Var
from ..ops.core.lowering import lowers
from ..ops.core.registry import append_op, defop
from ..ops.array.tensor import reshape


def _all_finite_rule(ins: list[Var], attrs: dict):
    for var in ins:
        if var.dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise ShapeError(f"AllFinite reads floats, got '{var.name}' {var.type_str()}")
    return [((1,), "bool")]


@defop("AllFinite", inputs=("xs*",), infer=_all_finite_rule)
def _all_finite(k, *xs):
    """True (bool ``[1]``) when every element of every input is finite."""
    xp = k.xp
    ok = xp.ones((1,), dtype=k.backend.dtype_of("bool"))
    for x in xs:
        ok = xp.logical_and(ok, xp.all(xp.isfinite(x)))
    return ok


@lowers("AllFinite")
def _all_finite_onnx(g):
    """``x - x`` is 0 where x is finite and NaN elsewhere: one sum per input, then equal to 0."""
    ok = None
    for x, var in zip(g.ins, g.in_vars):
        x = g.cast(x, "float32") if var.dtype != "float32" else x
        total = g.node("ReduceSum", [g.node("Reshape", [g.node("Sub", [x, x]), g.const([-1], "int64")])],
                       keepdims=1)
        finite = g.node("Equal", [total, g.const([0.0], "float32")])
        ok = finite if ok is None else g.node("And", [ok, finite])
    return [ok if ok is not None else g.const([True], "bool")]


def _select_rule(ins: list[Var], attrs: dict):
    finite, rest = ins[0], ins[1:]
    if finite.dtype != "bool" or finite.shape not in ((), (1,)):
        raise ShapeError(f"SelectUpdates: '{finite.name}' must be a bool scalar, got {finite.type_str()}")
    n = len(rest) // 2
    if len(rest) != 2 * n:
        raise ShapeError(f"SelectUpdates needs as many new values as old ones, got {len(rest)} inputs")
    for new, old in zip(rest[:n], rest[n:]):
        if new.dtype != old.dtype or new.shape != old.shape:
            raise ShapeError(f"SelectUpdates: '{new.name}' is {new.type_str()} but '{old.name}' is "
                             f"{old.type_str()}")
    return [(v.shape, v.dtype) for v in rest[n:]]


@defop("SelectUpdates", inputs=("finite", "new_then_old*"), outputs=("old_out*",), infer=_select_rule)
def _select_updates(k, finite, *values):
    """The new values when ``finite`` holds, else the old ones unchanged (written back in place)."""
    n = len(values) // 2
    xp = k.xp
    pred = xp.reshape(finite, ())      # on the device: no host read stops a device graph
    return tuple(xp.where(pred, new, old) for new, old in zip(values[:n], values[n:]))


@lowers("SelectUpdates")
def _select_updates_onnx(g):
    n = (len(g.ins) - 1) // 2
    pred = g.node("Reshape", [g.ins[0], g.const([], "int64")])
    return [g.node("Where", [pred, new, old]) for new, old in zip(g.ins[1:1 + n], g.ins[1 + n:])]


def _loss_scale_rule(ins: list[Var], attrs: dict):
    finite, scale, good = ins
    if scale.dtype != "float32" or good.dtype != "int64":
        raise ShapeError(f"UpdateLossScale needs a float32 scale and an int64 count, got "
                         f"'{scale.name}' {scale.type_str()} and '{good.name}' {good.type_str()}")
    return [(scale.shape, scale.dtype), (good.shape, good.dtype)]


@defop("UpdateLossScale", inputs=("finite", "scale", "good_steps"), outputs=("scale_out", "good_steps_out"),
       infer=_loss_scale_rule)
def _update_loss_scale(k, finite, scale, good):
    """GradScaler's update: halve (``backoff``) after a non-finite step and restart the count;
    double (``growth``) after ``growth_interval`` finite steps in a row."""
    xp, a = k.xp, k.attrs
    good = xp.where(finite, good + 1, xp.zeros_like(good))
    grow = good >= a["growth_interval"]
    scale = xp.where(finite, xp.where(grow, scale * a["growth"], scale), scale * a["backoff"])
    return xp.astype(scale, scale.dtype), xp.where(grow, xp.zeros_like(good), good)


@lowers("UpdateLossScale")
def _update_loss_scale_onnx(g):
    a = g.attrs
    finite, scale, good = g.ins
    zero = g.const([0], "int64")
    good = g.node("Where", [finite, g.node("Add", [good, g.const([1], "int64")]), zero])
    grow = g.node("GreaterOrEqual", [good, g.const([a["growth_interval"]], "int64")])
    grown = g.node("Where", [grow, g.node("Mul", [scale, g.const([a["growth"]], "float32")]), scale])
    scale = g.node("Where", [finite, grown, g.node("Mul", [scale, g.const([a["backoff"]], "float32")])])
    return [scale, g.node("Where", [grow, zero, good])]


def _scale_loss_rule(ins: list[Var], attrs: dict):
    loss, scale = ins
    if loss.dtype != "float32" or scale.dtype != "float32" or scale.shape not in ((), (1,)):
        raise ShapeError(f"ScaleLoss needs a float32 loss and a float32 [1] scale, got '{loss.name}' "
                         f"{loss.type_str()} and '{scale.name}' {scale.type_str()}")
    return [(loss.shape, loss.dtype)]


def _scale_loss_grad(g):
    return [g.dy * reshape(g.x[1], []), None]


@defop("ScaleLoss", inputs=("loss", "scale"), infer=_scale_loss_rule, grad=_scale_loss_grad, nondiff=(1,),
       train_only=True)
def _scale_loss(k, loss, scale):
    """``loss * scale``: where the backward of a loss-scaled step starts (a training-only op, so
    ``clone(for_test=True)`` drops it)."""
    return loss * k.xp.reshape(scale, ())


@lowers("ScaleLoss")
def _scale_loss_onnx(g):
    return [g.node("Mul", [g.ins[0], g.node("Reshape", [g.ins[1], g.const([], "int64")])])]


def scale_loss(loss: Var, scale: Var) -> Var:
    """Append ``loss * scale`` (``scale`` a float32 ``[1]``, e.g. ``amp.loss_scale``).

    Example::

        scaled = scale_loss(loss, scale)
    """
    return append_op("ScaleLoss", [loss, scale], name=f"{loss.name}.scaled")[0]


def all_finite(xs: list[Var]) -> Var:
    """Append ``AllFinite(xs)``: a bool ``[1]``, true when every element of every input is finite."""
    return append_op("AllFinite", list(xs), name="amp.finite")[0]


def select_updates(finite: Var, new: list[Var], old: list[Var]) -> None:
    """Append ``old = new if finite else old`` for every pair (in place)."""
    append_op("SelectUpdates", [finite, *new, *old], outputs=old)


def update_loss_scale(finite: Var, scale: Var, good_steps: Var, growth_interval: int,
                      growth: float = 2.0, backoff: float = 0.5) -> None:
    """Append GradScaler's update of ``scale`` and ``good_steps`` (in place)."""
    append_op("UpdateLossScale", [finite, scale, good_steps],
              {"growth_interval": int(growth_interval), "growth": float(growth), "backoff": float(backoff)},
              outputs=[scale, good_steps])
