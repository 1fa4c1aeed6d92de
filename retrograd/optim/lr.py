"""Learning-rate schedules: ops in the program that compute the rate from the step count.

A schedule passed as an optimizer's ``lr`` becomes a few ordinary ops: they
read the optimizer's persistable step count ``t`` (the number of updates done
before this one: 0 at the first step; saved and resumed with the parameters),
compute the rate in float64, and feed it to every update op; an ``Increment``
then counts the step. So a resumed run continues its schedule exactly, and the
schedule is exported to ONNX with the training step. Each matches
``torch.optim.lr_scheduler.LambdaLR`` with the same formula, step for step.

Example::

    sched = rg.optim.lr.cosine(3e-3, total_steps=1000, warmup_steps=100, min_lr=1e-5)
    rg.optim.Adam(sched).minimize(loss)

Your own schedule: ``rg.optim.lr.Schedule(base, fn)`` where ``fn(t)`` builds
the multiplier of ``base`` from ``t`` (a float64 ``[1]`` Var) with rg ops::

    inverse_sqrt = rg.optim.lr.Schedule(1e-3, lambda t: 1.0 / rg.sqrt(t + 1.0))
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

from ..errors import ProgramError
from ..ir.program import Var
from ..ops.array.creation import constant
from ..ops.math.elementwise import minimum, pow, where
from ..ops.math.trig import cos


class Schedule:
    """``base * fn(t)``: ``fn`` builds the multiplier from the step count ``t`` (float64 ``[1]`` Var).

    Example::

        halve_every_100 = rg.optim.lr.Schedule(0.1, lambda t: 0.5 ** rg.floor_divide(t, 100.0))
    """

    def __init__(self, base: float, fn: Callable[[Var], Var] | None = None):
        _require(isinstance(base, numbers.Real) and not isinstance(base, bool) and base > 0,
                 f"the base learning rate must be positive, got {base!r}")
        self.base = float(base)
        self._fn = fn

    def factor(self, t: Var) -> Var:
        """The multiplier of ``base`` at step ``t`` (float64 ``[1]``), built with rg ops."""
        if self._fn is None:
            raise ProgramError(f"{type(self).__name__} defines no multiplier: pass fn= or override factor")
        return self._fn(t)

    def rate(self, t: Var) -> Var:
        """The learning rate at step ``t``: ``base * factor(t)`` (float64)."""
        out = self.factor(t) * self.base
        if not isinstance(out, Var) or out.dtype != "float64":
            raise ProgramError(f"a learning-rate schedule must build a float64 Var from t, got {out!r}")
        return out


class _Cosine(Schedule):
    def __init__(self, base, total_steps, warmup_steps, min_lr):
        super().__init__(base)
        _require(_count(total_steps) and total_steps > 0, f"total_steps must be a positive int, got {total_steps!r}")
        _require(_count(warmup_steps), f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        _require(warmup_steps < total_steps,
                 f"warmup_steps ({warmup_steps}) must be less than total_steps ({total_steps})")
        _require(0.0 <= min_lr <= base, f"min_lr must be in [0, base={base}], got {min_lr!r}")
        self.total, self.warmup, self.min_lr = int(total_steps), int(warmup_steps), float(min_lr)

    def rate(self, t: Var) -> Var:
        progress = minimum((t - float(self.warmup)) / float(self.total - self.warmup), 1.0)
        decayed = (cos(progress * math.pi) + 1.0) * (0.5 * (self.base - self.min_lr)) + self.min_lr
        if not self.warmup:
            return decayed
        return where(t < float(self.warmup), t * (self.base / self.warmup), decayed)


class _StepDecay(Schedule):
    def __init__(self, base, step_size, gamma):
        super().__init__(base)
        _require(_count(step_size) and step_size > 0, f"step_size must be a positive int, got {step_size!r}")
        _require(isinstance(gamma, numbers.Real) and gamma > 0, f"gamma must be positive, got {gamma!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)

    def factor(self, t: Var) -> Var:
        return pow(constant(self.gamma, "float64"), t // float(self.step_size))


class _LinearWarmup(Schedule):
    def __init__(self, base, warmup_steps):
        super().__init__(base)
        _require(_count(warmup_steps) and warmup_steps > 0,
                 f"warmup_steps must be a positive int, got {warmup_steps!r}")
        self.warmup = int(warmup_steps)

    def factor(self, t: Var) -> Var:
        return minimum(t / float(self.warmup), 1.0)


def cosine(base: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0) -> Schedule:
    """Linear warmup to ``base``, then a cosine down to ``min_lr`` at ``total_steps`` (held after).

    ``base * t / warmup_steps`` for ``t < warmup_steps``, then
    ``min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * p))``, ``p = (t - warmup) / (total - warmup)``
    clamped to 1 (Hugging Face's ``get_cosine_schedule_with_warmup`` plus ``min_lr``).

    Example::

        rg.optim.AdamW(rg.optim.lr.cosine(3e-3, total_steps=1000, warmup_steps=100)).minimize(loss)
    """
    return _Cosine(base, total_steps, warmup_steps, min_lr)


def step_decay(base: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``base * gamma ** (t // step_size)`` (``torch.optim.lr_scheduler.StepLR``).

    Example::

        rg.optim.SGD(rg.optim.lr.step_decay(0.1, step_size=30)).minimize(loss)
    """
    return _StepDecay(base, step_size, gamma)


def linear_warmup(base: float, warmup_steps: int) -> Schedule:
    """``base * min(1, t / warmup_steps)``.

    Example::

        rg.optim.Adam(rg.optim.lr.linear_warmup(1e-3, warmup_steps=200)).minimize(loss)
    """
    return _LinearWarmup(base, warmup_steps)


def _count(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ProgramError(message)
