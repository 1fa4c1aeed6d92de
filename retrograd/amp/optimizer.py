"""``decorate``: an optimizer whose ``minimize`` rewrites the forward to low precision first.

``minimize(loss)`` is, in order:

1. ``rg.passes.fuse_linear_bias`` (``fc``'s product and bias add as one
   ``SeqLinear``, whose bias joins the low-precision product as in torch's
   ``linear`` under autocast), then
   ``rg.passes.cast_to_low_precision`` over the forward built so far (the
   lists ``LOW`` and ``FLOAT32`` plus the decorator's ``custom_low`` /
   ``custom_float32``): parameters stay float32, each is cast once per step
   where a low-precision op reads it;
2. with loss scaling, ``loss * amp.loss_scale`` (``ScaleLoss``) is what the
   backward differentiates; every gradient is divided by the scale;
3. the backward (``rg.append_backward``): a parameter's gradient flows back
   through its cast, so it reaches the update in float32;
4. the wrapped optimizer's updates; with loss scaling they write aside and
   ``SelectUpdates`` keeps them only when every gradient is finite, and
   ``UpdateLossScale`` halves or grows the scale (``retrograd/amp/ops.py``).
"""
from __future__ import annotations

import math
import numbers

from ..errors import ProgramError
from ..ir.builder import default_startup_program, program_guard
from ..ir.dtypes import canonical, is_low_float
from ..ir.program import Op, Program, Var
from ..ops.core.registry import append_op
from ..ops.array.tensor import cast, reshape
from ..optim import Optimizer, create_state
from ..passes.fuse_bias import fuse_linear_bias
from ..passes.mixed_precision import cast_to_low_precision
from . import ops

INITIAL_SCALE = 2.0 ** 16          # torch.amp.GradScaler's init_scale
SCALE_NAME, GOOD_STEPS_NAME = "amp.loss_scale", "amp.good_steps"


class MixedPrecisionOptimizer:
    """What ``rg.amp.decorate`` returns: ``minimize`` as the wrapped optimizer's, in mixed precision.

    After ``minimize``: ``loss_scale`` is the persistable ``amp.loss_scale``
    Var (None without dynamic scaling), ``finite`` the bool ``[1]`` Var that
    says whether the step's gradients were finite (None without scaling).
    """

    def __init__(self, optimizer: Optimizer, dtype: str, loss_scale, growth_interval: int,
                 low: tuple[str, ...], float32: tuple[str, ...]):
        self.optimizer, self.dtype = optimizer, dtype
        self.scaling, self.initial_scale = loss_scale
        self.growth_interval = growth_interval
        self.low, self.float32 = low, float32
        self.loss_scale: Var | None = None
        self.finite: Var | None = None

    def __getattr__(self, name):        # lr, step_count, grad_norm, ... of the wrapped optimizer
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def minimize(self, loss: Var, parameter_list=None, no_grad_set=None, checkpoints=None, *,
                 startup_program: Program | None = None, **backward_options) -> list[tuple[Var, Var]]:
        """Rewrite, differentiate and update as the module says; return ``[(param, float32 grad)]``.

        Example::

            params_grads = rg.amp.decorate(rg.optim.Adam(1e-3), "bfloat16").minimize(loss)
        """
        if not isinstance(loss, Var):
            raise ProgramError(f"minimize needs the loss Var, got {type(loss).__name__}")
        main = loss.block.program
        startup = startup_program if startup_program is not None else default_startup_program()
        fuse_linear_bias(main)      # fc's product and bias as one SeqLinear, as torch's linear under autocast
        cast_to_low_precision(main, self.dtype, self.low, self.float32)
        with program_guard(main, startup):
            if loss.dtype != "float32":
                loss = cast(loss, "float32")
            target = loss
            if self.scaling is not None:
                self.loss_scale = self._scale_var(main, startup)
                target = ops.scale_loss(loss, self.loss_scale)
            params_grads = self.optimizer.backward(target, parameter_list, no_grad_set, checkpoints,
                                                   startup_program=startup, **backward_options)
            scale = reshape(self.loss_scale, []) if self.loss_scale is not None else None
            params_grads = [(p, _float32_grad(p, g, scale)) for p, g in params_grads]
            if self.scaling is None:
                self.optimizer.apply_gradients(params_grads, main_program=main, startup_program=startup)
                return params_grads
            self.finite = ops.all_finite([g for _, g in params_grads])
            first = len(main.global_block().ops)
            self.optimizer.apply_gradients(params_grads, main_program=main, startup_program=startup)
            new, old = _write_aside(main.global_block(), first)
            ops.select_updates(self.finite, new, old)
            if self.scaling == "dynamic":
                good = create_state(GOOD_STEPS_NAME, [1], "int64", main=main, startup=startup)
                ops.update_loss_scale(self.finite, self.loss_scale, good, self.growth_interval)
        return params_grads

    def _scale_var(self, main: Program, startup: Program) -> Var:
        return create_state(SCALE_NAME, [1], "float32", self.initial_scale, main=main, startup=startup)



def _float32_grad(param: Var, grad: Var, scale: Var | None) -> Var:
    """The gradient in the parameter's dtype, divided by the loss scale (if any)."""
    if grad.dtype != param.dtype:
        grad = cast(grad, param.dtype)
    if scale is None:
        return grad
    return append_op("Div", [grad, scale], name=f"{grad.name}.unscaled")[0]


def _write_aside(block, first: int) -> tuple[list[Var], list[Var]]:
    """The ops from ``first`` on write persistables in place (the updates): make each write a
    fresh ``<name>.amp_new`` instead, read by the later ones in its stead; return (new, old)."""
    renamed: dict[str, str] = {}
    for op in block.ops[first:]:
        op.inputs[:] = [renamed.get(n, n) for n in op.inputs]
        for i, name in enumerate(op.outputs):
            var = block.var(name)
            if var.persistable:
                fresh = block.program.unique_name(f"{name}.amp_new")
                block.create_var(fresh, var.shape, var.dtype)
                renamed[name] = fresh
                op.outputs[i] = fresh
    return [block.var(n) for n in renamed.values()], [block.var(n) for n in renamed]


def decorate(optimizer: Optimizer, dtype: str = "bfloat16", loss_scale="default",
             growth_interval: int = 2000, custom_low=(), custom_float32=()) -> MixedPrecisionOptimizer:
    """``optimizer`` training in mixed precision: ``minimize`` rewrites the forward first.

    ``dtype`` is ``"bfloat16"`` or ``"float16"``. ``loss_scale``: ``"dynamic"``
    (float16's default; ``amp.loss_scale`` starts at 2**16, halves after a
    step with a non-finite gradient, which is skipped, and doubles after
    ``growth_interval`` finite steps in a row), a float (a fixed scale; steps
    with non-finite gradients are still skipped), or ``None`` (no scaling:
    bfloat16's default). ``custom_low`` / ``custom_float32`` add op types to
    ``rg.amp.LOW`` / ``rg.amp.FLOAT32`` for this optimizer (a type named in
    ``custom_float32`` leaves ``LOW``).

    Example::

        opt = rg.amp.decorate(rg.optim.AdamW(1e-3), dtype="bfloat16")
        params_grads = opt.minimize(loss)
    """
    from . import FLOAT32, LOW
    if not isinstance(optimizer, Optimizer):
        raise ProgramError(f"rg.amp.decorate wraps an rg.optim optimizer, got {type(optimizer).__name__}")
    dtype = canonical(dtype)
    if not is_low_float(dtype):
        raise ProgramError(f"rg.amp.decorate: dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral) \
            or growth_interval < 1:
        raise ProgramError(f"rg.amp.decorate: growth_interval must be a positive int, got {growth_interval!r}")
    for what, types in (("custom_low", custom_low), ("custom_float32", custom_float32)):
        if isinstance(types, str) or not all(isinstance(t, str) for t in types):
            raise ProgramError(f"rg.amp.decorate: {what} must be a list of op type names, got {types!r}")
    float32 = tuple(dict.fromkeys((*FLOAT32, *custom_float32)))
    low = tuple(t for t in dict.fromkeys((*LOW, *custom_low)) if t not in custom_float32)
    float32 = tuple(t for t in float32 if t not in custom_low)
    return MixedPrecisionOptimizer(optimizer, dtype, _scaling(loss_scale, dtype), int(growth_interval),
                                   low, float32)


def _scaling(loss_scale, dtype: str) -> tuple[str | None, float]:
    """(kind, initial scale): kind "dynamic", "static" or None."""
    if isinstance(loss_scale, str) and loss_scale == "default":
        loss_scale = "dynamic" if dtype == "float16" else None
    if loss_scale is None:
        return None, 1.0
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ProgramError(f"rg.amp.decorate: loss_scale is 'dynamic', a positive float or None, "
                               f"got {loss_scale!r}")
        return "dynamic", INITIAL_SCALE
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real) \
            or not math.isfinite(loss_scale) or not loss_scale > 0:
        raise ProgramError(f"rg.amp.decorate: loss_scale must be 'dynamic', a positive finite float "
                           f"or None, got {loss_scale!r}")
    return "static", float(loss_scale)
