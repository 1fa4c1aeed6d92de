"""Learning-rate schedules: ops in the program that compute the rate from the step count.

A schedule passed as an optimizer's ``lr`` becomes a few ordinary ops: they
read the optimizer's persistable step count ``t`` (the number of updates done
before this one: 0 at the first step; saved and resumed with the parameters),
compute the rate in float64, and feed it to every update op; an ``Increment``
then counts the step. So a resumed run continues its schedule exactly, and the
schedule is exported to ONNX with the training step. Each matches
``torch.optim.lr_scheduler.LambdaLR`` with the same formula, step for step.

Your own schedule: ``rg.optim.lr.Schedule(base, fn)`` where ``fn(t)`` builds
the multiplier of ``base`` from ``t`` (a float64 ``[1]`` Var) with rg ops.

Example:
    ```python
    import retrograd as rg

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        loss = rg.mean(rg.layers.fc(rg.data("x", [-1, 3]), 1, name="fc"))
        sched = rg.optim.lr.cosine(3e-3, total_steps=1000, warmup_steps=100, min_lr=1e-5)
        rg.optim.Adam(sched).minimize(loss)
    inverse_sqrt = rg.optim.lr.Schedule(1e-3, lambda t: 1.0 / rg.sqrt(t + 1.0))
    ```
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
    """A learning rate ``base * fn(t)``, built as ops from the step count ``t``.

    ``fn`` builds the multiplier from ``t``, a float64 ``[1]`` Var holding the
    number of updates done before this one, with rg ops. Subclasses may
    override ``factor`` (or ``rate``) instead of passing ``fn``.

    Args:
        base: The base learning rate (positive).
        fn: ``fn(t) -> Var`` (float64), or None when a subclass overrides ``factor``.

    Raises:
        ProgramError: ``base`` is not a positive number.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            w = rg.create_parameter("w", [1], init=0.0)
            # dw = 1: each step moves w by the rate
            rg.optim.SGD(rg.optim.lr.Schedule(0.1, lambda t: 0.5 ** rg.floor_divide(t, 2.0))).minimize(rg.sum(w))
        exe = rg.Executor()
        exe.run(startup)
        rates = []
        for _ in range(4):
            before = exe.scope.get("w")[0]
            exe.run(main)
            rates.append(before - exe.scope.get("w")[0])
        assert np.allclose(rates, [0.1, 0.1, 0.05, 0.05], atol=1e-6)
        ```
    """

    def __init__(self, base: float, fn: Callable[[Var], Var] | None = None):
        _require(isinstance(base, numbers.Real) and not isinstance(base, bool) and base > 0,
                 f"the base learning rate must be positive, got {base!r}")
        self.base = float(base)
        self._fn = fn

    def factor(self, t: Var) -> Var:
        """The multiplier of ``base`` at step ``t`` (float64 ``[1]``), built with rg ops.

        Args:
            t: The step count, a float64 ``[1]`` Var.

        Returns:
            A float64 Var.

        Raises:
            ProgramError: The schedule has no ``fn`` and does not override ``factor``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            inverse_sqrt = rg.optim.lr.Schedule(1e-3, lambda t: 1.0 / rg.sqrt(t + 1.0))
            main = rg.Program()
            with rg.program_guard(main):
                t = rg.constant([3.0], dtype="float64")
                f = inverse_sqrt.factor(t)
            (out,) = rg.Executor().run(main, fetch_list=[f])
            assert np.allclose(out, [0.5])
            ```
        """
        if self._fn is None:
            raise ProgramError(f"{type(self).__name__} defines no multiplier: pass fn= or override factor")
        return self._fn(t)

    def rate(self, t: Var) -> Var:
        """The learning rate at step ``t``: ``base * factor(t)`` (float64).

        Args:
            t: The step count, a float64 ``[1]`` Var.

        Returns:
            A float64 Var.

        Raises:
            ProgramError: The result is not a float64 Var.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            sched = rg.optim.lr.step_decay(0.1, step_size=10)
            main = rg.Program()
            with rg.program_guard(main):
                rate = sched.rate(rg.constant([25.0], dtype="float64"))
            (out,) = rg.Executor().run(main, fetch_list=[rate])
            assert np.allclose(out, [0.001])
            ```
        """
        out = self.factor(t) * self.base
        if not isinstance(out, Var) or out.dtype != "float64":
            raise ProgramError(f"a learning-rate schedule must build a float64 Var from t, got {out!r}")
        return out


class _Cosine(Schedule):
    def __init__(self, base, total_steps, warmup_steps, min_lr, init_value):
        super().__init__(base)
        _require(isinstance(init_value, numbers.Real) and not isinstance(init_value, bool) and init_value >= 0,
                 f"init_value must be a number >= 0, got {init_value!r}")
        _require(_count(total_steps) and total_steps > 0, f"total_steps must be a positive int, got {total_steps!r}")
        _require(_count(warmup_steps), f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        _require(warmup_steps < total_steps,
                 f"warmup_steps ({warmup_steps}) must be less than total_steps ({total_steps})")
        _require(0.0 <= min_lr <= base, f"min_lr must be in [0, base={base}], got {min_lr!r}")
        self.total, self.warmup, self.min_lr = int(total_steps), int(warmup_steps), float(min_lr)
        self.init = float(init_value)

    def rate(self, t: Var) -> Var:
        progress = minimum((t - float(self.warmup)) / float(self.total - self.warmup), 1.0)
        decayed = (cos(progress * math.pi) + 1.0) * (0.5 * (self.base - self.min_lr)) + self.min_lr
        if not self.warmup:
            return decayed
        warming = t * ((self.base - self.init) / self.warmup) + self.init
        return where(t < float(self.warmup), warming, decayed)


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


def cosine(base: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0,
           init_value: float = 0.0) -> Schedule:
    """Linear warmup from ``init_value`` to ``base``, then a cosine down to ``min_lr`` at ``total_steps``.

    The rate holds ``min_lr`` after ``total_steps``.

    ``init_value + (base - init_value) * t / warmup_steps`` for ``t < warmup_steps``, then
    ``min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * p))``, ``p = (t - warmup) / (total - warmup)``
    clamped to 1 (Hugging Face's ``get_cosine_schedule_with_warmup`` plus ``min_lr``; with
    ``init_value``, optax's ``warmup_cosine_decay_schedule(init_value, base, warmup_steps,
    total_steps, min_lr)``); ``t`` counts the updates done before this one.

    Args:
        base: The peak learning rate (positive).
        total_steps: Where the cosine reaches ``min_lr`` (a positive int).
        warmup_steps: The warmup's length (an int >= 0, below ``total_steps``).
        min_lr: The final rate, in ``[0, base]``.
        init_value: The rate the warmup starts from (>= 0; optax's ``init_value``).

    Returns:
        A ``Schedule`` to pass as an optimizer's ``lr``.

    Raises:
        ProgramError: An argument out of range.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            w = rg.create_parameter("w", [1], init=0.0)
            # dw = 1: each step moves w by the rate
            rg.optim.SGD(rg.optim.lr.cosine(1.0, total_steps=4, warmup_steps=2)).minimize(rg.sum(w))
        exe = rg.Executor()
        exe.run(startup)
        rates = []
        for _ in range(5):
            before = exe.scope.get("w")[0]
            exe.run(main)
            rates.append(before - exe.scope.get("w")[0])
        assert np.allclose(rates, [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
        ```
    """
    return _Cosine(base, total_steps, warmup_steps, min_lr, init_value)


def step_decay(base: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``base * gamma ** (t // step_size)``, as ``torch.optim.lr_scheduler.StepLR``.

    Args:
        base: The initial learning rate (positive).
        step_size: Updates between decays (a positive int).
        gamma: The decay factor (positive).

    Returns:
        A ``Schedule`` to pass as an optimizer's ``lr``.

    Raises:
        ProgramError: An argument out of range.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            w = rg.create_parameter("w", [1], init=0.0)
            # dw = 1: each step moves w by the rate
            rg.optim.SGD(rg.optim.lr.step_decay(0.1, step_size=2, gamma=0.5)).minimize(rg.sum(w))
        exe = rg.Executor()
        exe.run(startup)
        rates = []
        for _ in range(5):
            before = exe.scope.get("w")[0]
            exe.run(main)
            rates.append(before - exe.scope.get("w")[0])
        assert np.allclose(rates, [0.1, 0.1, 0.05, 0.05, 0.025], atol=1e-6)
        ```
    """
    return _StepDecay(base, step_size, gamma)


def linear_warmup(base: float, warmup_steps: int) -> Schedule:
    """``base * min(1, t / warmup_steps)``: a linear ramp from 0, then constant.

    Args:
        base: The learning rate after the warmup (positive).
        warmup_steps: The ramp's length (a positive int).

    Returns:
        A ``Schedule`` to pass as an optimizer's ``lr``.

    Raises:
        ProgramError: An argument out of range.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            w = rg.create_parameter("w", [1], init=0.0)
            # dw = 1: each step moves w by the rate
            rg.optim.SGD(rg.optim.lr.linear_warmup(0.1, warmup_steps=4)).minimize(rg.sum(w))
        exe = rg.Executor()
        exe.run(startup)
        rates = []
        for _ in range(6):
            before = exe.scope.get("w")[0]
            exe.run(main)
            rates.append(before - exe.scope.get("w")[0])
        assert np.allclose(rates, [0.0, 0.025, 0.05, 0.075, 0.1, 0.1], atol=1e-6)
        ```
    """
    return _LinearWarmup(base, warmup_steps)


def _count(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ProgramError(message)
