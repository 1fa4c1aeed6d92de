"""Optimizer state: persistable Vars the startup program fills with a constant."""
from __future__ import annotations

from typing import Sequence

from ..errors import ProgramError
from ..ir.builder import default_main_program, default_startup_program
from ..ir.dtypes import canonical, is_float
from ..ir.program import Op, Program, Var


def create_state(name: str, shape: Sequence[int], dtype: str = "float32", value: float = 0.0, *,
                 main: Program | None = None, startup: Program | None = None) -> Var:
    """A persistable, non-trainable Var of ``main`` that ``startup`` sets to ``value``.

    Velocities, Adam moments and step counts live here: saved with the
    parameters (``rg.save_params``) so training resumes exactly.

    Args:
        name: Its name; a name already used in ``main`` raises ProgramError
            (state is never shared by accident).
        shape: Its shape (fully known).
        dtype: Its dtype.
        value: The initial value.
        main: The program it belongs to (the one being built by default).
        startup: The program that initialises it (the current startup by default).

    Returns:
        The state Var.

    Raises:
        ProgramError: The name is taken.

    Example:
        ```python
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            steps = rg.optim.create_state("train.steps", [1], "int64")
            rg.optim.increment(steps)
        exe = rg.Executor()
        exe.run(startup)
        for _ in range(3):
            exe.run(main)
        assert exe.scope.get("train.steps")[0] == 3
        ```
    """
    main = main if main is not None else default_main_program()
    startup = startup if startup is not None else default_startup_program()
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise ProgramError(f"optimizer state '{name}' needs a fully known shape, got {shape}")
    dtype = canonical(dtype)
    if main.has_name(name):
        raise ProgramError(f"cannot create optimizer state '{name}': the program already has a "
                           "variable of that name")
    var = main.global_block().create_var(name, shape, dtype, persistable=True)
    block = startup.global_block()
    if name not in block.vars:
        block.create_var(name, shape, dtype, persistable=True)
        fill = float(value) if is_float(dtype) else int(value)
        block.append_op(Op("Fill", [], [name], {"shape": shape, "value": fill, "dtype": dtype}))
    return var


def state_name(program: Program, param: Var, slot: str) -> str:
    """``<param>.<slot>`` (e.g. ``fc1.w.velocity``), made unique within ``program``."""
    name = f"{param.name}.{slot}"
    return program.unique_name(name) if program.has_name(name) else name
