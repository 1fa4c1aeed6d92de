"""SGD, Momentum, Adam, AdamW, RMSProp, Adagrad: ``minimize`` appends the backward pass and the updates.

Example::

    with rg.program_guard(main, startup):
        ...
        loss = rg.mean(rg.square(pred - y))
        params_grads = rg.optim.Adam(1e-3, clip_norm=5.0).minimize(loss)
    exe.run(startup)                       # parameters and optimizer state
    for xb, yb in batches:
        exe.run(main, feed={"x": xb, "y": yb})   # one training step
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np

from ..autodiff import append_backward
from ..errors import ProgramError
from ..ir.builder import default_startup_program, program_guard
from ..ir.program import Program, Var
from ..ops.array.tensor import cast
from ..ops.optim import updates as ops
from .clip import clip_by_global_norm
from .lr import Schedule
from .state import create_state, state_name


class Optimizer:
    """The shared part: backward, optional clipping, one update op per parameter.

    Subclasses implement ``_update(param, grad)``, which appends the update
    op(s) and creates whatever state they need with ``self._state``.
    ``clip_norm`` (global-norm clipping, like ``torch.nn.utils.clip_grad_norm_``)
    and ``weight_decay`` (L2 added to the gradient, as in ``torch.optim``) are
    available to every optimizer. After ``minimize``, ``grad_norm`` is the Var
    holding the global gradient norm before clipping (when ``clip_norm`` is set).

    ``lr`` is a float or a schedule (``rg.optim.lr``): then the rate is computed
    in the program from the persistable step count ``lr_schedule.step`` (the
    updates done so far), which the step increments after the updates.
    """

    def __init__(self, lr, *, clip_norm: float | None = None, weight_decay: float = 0.0):
        self.schedule = lr if isinstance(lr, Schedule) else None
        if self.schedule is not None:
            lr = self.schedule.base
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
            raise ProgramError(f"learning rate must be positive (or an rg.optim.lr schedule), got {lr!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ProgramError(f"clip_norm must be positive, got {clip_norm}")
        if not weight_decay >= 0:
            raise ProgramError(f"weight_decay must be >= 0, got {weight_decay}")
        self.lr = float(lr)
        self.step_count: Var | None = None      # the schedule's step count, after minimize
        self._rate: float | Var = self.lr
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.weight_decay = float(weight_decay)
        self.grad_norm: Var | None = None
        self._main: Program | None = None
        self._startup: Program | None = None

    def minimize(self, loss: Var, parameter_list=None, no_grad_set=None, checkpoints=None, *,
                 startup_program: Program | None = None, **backward_options) -> list[tuple[Var, Var]]:
        """Append the backward pass of ``loss`` and the updates; return ``[(param, grad)]``.

        The gradients returned are the raw ones (before clipping). The update
        ops and the optimizer state go into ``loss``'s program; the state's
        initialisers into ``startup_program`` (default: the current startup
        program, as set by ``rg.program_guard``). ``minimize`` is ``backward``
        then ``apply_gradients``; wrappers (``rg.distributed.DataParallel``)
        put their ops between the two. Other keywords (``memory_budget``,
        ``feed_shapes``) go to ``rg.append_backward``.

        Example::

            params_grads = rg.optim.SGD(0.1).minimize(loss)
        """
        startup = startup_program if startup_program is not None else default_startup_program()
        params_grads = self.backward(loss, parameter_list, no_grad_set, checkpoints,
                                     startup_program=startup, **backward_options)
        self.apply_gradients(params_grads, main_program=loss.block.program, startup_program=startup)
        return params_grads

    def backward(self, loss: Var, parameter_list=None, no_grad_set=None, checkpoints=None, *,
                 startup_program: Program | None = None, **backward_options) -> list[tuple[Var, Var]]:
        """The first half of ``minimize``: append the backward pass only; return ``[(param, grad)]``.

        Example::

            params_grads = opt.backward(loss)
            opt.apply_gradients(params_grads)
        """
        startup = startup_program if startup_program is not None else default_startup_program()
        if not isinstance(loss, Var):
            raise ProgramError(f"minimize needs the loss Var, got {type(loss).__name__}")
        _check_startup(startup, loss.block.program.all_parameters())   # before changing the program
        if checkpoints is not None:
            backward_options["checkpoints"] = checkpoints
        if backward_options.get("memory_budget") is not None:   # the updates run within it too
            backward_options.setdefault("memory_reserve", self._update_bytes(loss, parameter_list))
        return append_backward(loss, parameter_list, no_grad_set, **backward_options)

    STATE_SLOTS = 0        # parameter-sized state tensors per parameter (velocity, moments)

    def _update_bytes(self, loss: Var, parameter_list) -> int:
        """Bytes the updates add after the backward: the state, and while one parameter is updated
        its new value and new state (plus clipped copies of every gradient with ``clip_norm``)."""
        params = [p if isinstance(p, Var) else loss.block.var(p) for p in parameter_list] \
            if parameter_list is not None else [v for v in loss.block.program.all_parameters() if v.trainable]
        sizes = [math.prod(max(d, 1) for d in p.shape) * np.dtype(p.dtype).itemsize for p in params]
        clipped = sum(sizes) if self.clip_norm is not None else 0
        return self.STATE_SLOTS * sum(sizes) + (self.STATE_SLOTS + 2) * max(sizes, default=0) + clipped + 64

    def apply_gradients(self, params_grads: Sequence[tuple[Var, Var]], *,
                        main_program: Program | None = None,
                        startup_program: Program | None = None) -> None:
        """Append clipping (if asked) and one update per ``(param, grad)`` pair.

        Example::

            params_grads = rg.append_backward(loss)
            rg.optim.Momentum(0.1, 0.9).apply_gradients(params_grads)
        """
        if not params_grads:
            raise ProgramError("nothing to optimize: the loss depends on no trainable parameter")
        main = main_program if main_program is not None else params_grads[0][0].block.program
        self._main = main
        self._startup = startup_program if startup_program is not None else default_startup_program()
        _check_startup(self._startup, [p for p, _ in params_grads])
        with program_guard(main, self._startup):
            grads = [g for _, g in params_grads]
            if self.clip_norm is not None:
                grads, self.grad_norm = clip_by_global_norm(grads, self.clip_norm)
            if self.schedule is not None:
                self._rate = self._scheduled_rate()
            for (param, _), grad in zip(params_grads, grads):
                self._update(param, grad)
            if self.schedule is not None:
                ops.increment(self.step_count)

    def _scheduled_rate(self) -> Var:
        """The schedule's ops: the rate (float64 ``[1]``) from the step count before this update."""
        name = "lr_schedule.step"
        name = self._main.unique_name(name) if self._main.has_name(name) else name
        self.step_count = create_state(name, [1], ops.STEP_DTYPE, main=self._main, startup=self._startup)
        return self.schedule.rate(cast(self.step_count, "float64"))

    def _state(self, param: Var, slot: str, shape=None, dtype: str | None = None) -> Var:
        """A zero-initialised persistable Var ``<param>.<slot>`` (velocity, moment, step count)."""
        name = state_name(self._main, param, slot)
        return create_state(name, param.shape if shape is None else shape, dtype or param.dtype,
                            main=self._main, startup=self._startup)

    def _update(self, param: Var, grad: Var) -> None:
        raise NotImplementedError


def _check_startup(startup: Program, params: list[Var]) -> None:
    """The state's initialisers go where the parameters' are; refuse to guess otherwise."""
    inits = startup.global_block().vars
    if params and not any(p.name in inits for p in params):
        raise ProgramError(
            f"the startup program in use does not initialise parameter '{params[0].name}', so it "
            "cannot initialise the optimizer state either; call minimize inside "
            "rg.program_guard(main, startup) or pass startup_program=startup")


class SGD(Optimizer):
    """Plain gradient descent: ``p -= lr * g``.

    Example::

        rg.optim.SGD(0.1).minimize(loss)
    """

    def _update(self, param: Var, grad: Var) -> None:
        ops.sgd_update(param, grad, self._rate, self.weight_decay)


class Momentum(Optimizer):
    """SGD with momentum, PyTorch's convention: ``v = mu*v + g; p -= lr*v``.

    ``nesterov=True`` uses ``p -= lr * (g + mu*v)`` as ``torch.optim.SGD`` does.
    State: ``<param>.velocity``.

    Example::

        rg.optim.Momentum(0.05, momentum=0.9).minimize(loss)
    """

    def __init__(self, lr, momentum: float = 0.9, *, nesterov: bool = False,
                 clip_norm: float | None = None, weight_decay: float = 0.0):
        super().__init__(lr, clip_norm=clip_norm, weight_decay=weight_decay)
        if not 0.0 <= momentum < 1.0:
            raise ProgramError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    STATE_SLOTS = 1

    def _update(self, param: Var, grad: Var) -> None:
        velocity = self._state(param, "velocity")
        ops.momentum_update(param, grad, velocity, self._rate, self.momentum, self.nesterov,
                            self.weight_decay)


class Adam(Optimizer):
    """Adam with PyTorch's bias correction (``torch.optim.Adam``, ``amsgrad=False``).

    State: ``<param>.moment1``, ``<param>.moment2`` and ``<param>.step``
    (int64 count of updates, so bias correction resumes exactly).

    Example::

        rg.optim.Adam(2e-3, clip_norm=5.0).minimize(loss)
    """

    def __init__(self, lr=1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 *, clip_norm: float | None = None, weight_decay: float = 0.0):
        super().__init__(lr, clip_norm=clip_norm, weight_decay=weight_decay)
        for what, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ProgramError(f"{what} must be in [0, 1), got {beta}")
        if not eps > 0:
            raise ProgramError(f"eps must be positive, got {eps}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)

    STATE_SLOTS = 2

    def _update(self, param: Var, grad: Var) -> None:
        m = self._state(param, "moment1")
        v = self._state(param, "moment2")
        step = self._state(param, "step", shape=[1], dtype=ops.STEP_DTYPE)
        ops.adam_update(param, grad, m, v, step, self._rate, self.beta1, self.beta2, self.eps,
                        self.weight_decay, decoupled=self.DECOUPLED)

    DECOUPLED = False


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``): ``p *= 1 - lr * wd`` before the
    Adam step, whose gradient is not decayed. ``weight_decay`` defaults to 0.01 as in torch.

    Example::

        rg.optim.AdamW(1e-3, weight_decay=0.1).minimize(loss)
    """

    DECOUPLED = True

    def __init__(self, lr=1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.01, *, clip_norm: float | None = None):
        super().__init__(lr, beta1, beta2, eps, clip_norm=clip_norm, weight_decay=weight_decay)


class RMSProp(Optimizer):
    """RMSProp as ``torch.optim.RMSprop``: ``s = alpha s + (1-alpha) g^2``, ``p -= lr g / (sqrt(s) + eps)``.

    ``momentum > 0`` keeps a buffer ``b = momentum b + g / (sqrt(s) + eps)`` and steps by it;
    ``centered=True`` divides by the estimated variance (``s`` minus the squared mean gradient).
    State: ``<param>.square_avg`` (and ``.momentum_buf``, ``.grad_avg``).

    Example::

        rg.optim.RMSProp(1e-2, alpha=0.9, momentum=0.5).minimize(loss)
    """

    def __init__(self, lr=1e-2, alpha: float = 0.99, eps: float = 1e-8, momentum: float = 0.0,
                 centered: bool = False, *, clip_norm: float | None = None, weight_decay: float = 0.0):
        super().__init__(lr, clip_norm=clip_norm, weight_decay=weight_decay)
        if not 0.0 <= alpha <= 1.0:
            raise ProgramError(f"alpha must be in [0, 1], got {alpha}")
        if not eps > 0:
            raise ProgramError(f"eps must be positive, got {eps}")
        if not 0.0 <= momentum < 1.0:
            raise ProgramError(f"momentum must be in [0, 1), got {momentum}")
        self.alpha, self.eps, self.momentum, self.centered = float(alpha), float(eps), float(momentum), bool(centered)
        self.STATE_SLOTS = 1 + int(momentum > 0) + int(centered)

    def _update(self, param: Var, grad: Var) -> None:
        square_avg = self._state(param, "square_avg")
        buf = self._state(param, "momentum_buf") if self.momentum > 0 else None
        grad_avg = self._state(param, "grad_avg") if self.centered else None
        ops.rmsprop_update(param, grad, square_avg, self._rate, self.alpha, self.eps, self.momentum,
                           self.centered, buf, grad_avg, self.weight_decay)


class Adagrad(Optimizer):
    """Adagrad as ``torch.optim.Adagrad``: ``s += g^2``, ``p -= lr / (1 + (t-1) lr_decay) * g / (sqrt(s) + eps)``.

    State: ``<param>.sum`` (starting at ``initial_accumulator_value``) and ``<param>.step``.

    Example::

        rg.optim.Adagrad(1e-2).minimize(loss)
    """

    STATE_SLOTS = 1

    def __init__(self, lr=1e-2, eps: float = 1e-10, lr_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, *, clip_norm: float | None = None,
                 weight_decay: float = 0.0):
        super().__init__(lr, clip_norm=clip_norm, weight_decay=weight_decay)
        if not eps > 0:
            raise ProgramError(f"eps must be positive, got {eps}")
        if not lr_decay >= 0 or not initial_accumulator_value >= 0:
            raise ProgramError(f"lr_decay and initial_accumulator_value must be >= 0, got {lr_decay} "
                               f"and {initial_accumulator_value}")
        self.eps, self.lr_decay, self.initial = float(eps), float(lr_decay), float(initial_accumulator_value)

    def _update(self, param: Var, grad: Var) -> None:
        total = create_state(state_name(self._main, param, "sum"), param.shape, param.dtype, self.initial,
                             main=self._main, startup=self._startup)
        step = self._state(param, "step", shape=[1], dtype=ops.STEP_DTYPE)
        ops.adagrad_update(param, grad, total, step, self._rate, self.eps, self.lr_decay, self.weight_decay)
