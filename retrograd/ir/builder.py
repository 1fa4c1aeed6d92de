"""Where new ops go: the current main/startup programs and the current block.

Front-end functions (``rg.add``, ``rg.layers.fc``, ...) append ops to the
current block of the current main program; ``program_guard`` switches
programs, ``block_guard`` switches to a sub-block while its body is built,
and ``capture_ops`` collects ops instead of placing them (gradient makers use
it so a pass can decide where the ops go).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from .program import Block, Op, Program, provides


class _BuildState:
    def __init__(self):
        self.main = Program()
        self.startup = Program()
        self.block_stack: list[Block] = []
        self.sinks: list[list[Op]] = []


_state = _BuildState()


def default_main_program() -> Program:
    """The program ops are being added to: ``program_guard``'s main, else a global one.

    Returns:
        The current main Program.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            assert rg.default_main_program() is main
        ```
    """
    return _state.main


def default_startup_program() -> Program:
    """The program parameter initialisers go to: ``program_guard``'s startup, else a global one.

    Returns:
        The current startup Program.

    Example:
        ```python
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            assert rg.default_startup_program() is startup
            rg.create_parameter("w", [2])              # its initialiser goes to startup
        assert len(startup.global_block().ops) == 1
        ```
    """
    return _state.startup


@contextmanager
def program_guard(main: Program, startup: Program | None = None) -> Iterator[None]:
    """Build into ``main`` (and put parameter initialisers into ``startup``) inside the ``with`` body.

    Args:
        main: The program the builders append ops to.
        startup: The program ``create_parameter`` (and layers) put initialisers
            into; when None, the current startup program stays.

    Returns:
        A context manager; the previous programs come back when it exits.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 8])
            h = rg.layers.fc(x, 16, act="tanh", name="fc1")
            loss = rg.mean(h * h)
            params_grads = rg.append_backward(loss)
        exe = rg.Executor()
        exe.run(startup)
        (loss_v,) = exe.run(main, feed={"x": np.ones((4, 8), "float32")}, fetch_list=[loss])
        assert loss_v >= 0.0
        ```
    """
    saved = (_state.main, _state.startup, _state.block_stack)
    _state.main = main
    _state.startup = startup if startup is not None else _state.startup
    _state.block_stack = []
    try:
        yield
    finally:
        _state.main, _state.startup, _state.block_stack = saved


@contextmanager
def block_guard(block: Block) -> Iterator[Block]:
    """Make ``block`` the current block while the ``with`` body runs (build a sub-block by hand).

    Args:
        block: The block new ops go to.

    Returns:
        A context manager yielding ``block``.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2])
            body = main.create_block()
            with rg.block_guard(body):
                y = rg.tanh(x)                         # an op of ``body``
        assert body.ops[0].type == "Tanh" and not main.global_block().ops
        ```
    """
    _state.block_stack.append(block)
    try:
        yield block
    finally:
        _state.block_stack.pop()


@provides
def current_block() -> Block:
    if _state.block_stack:
        return _state.block_stack[-1]
    return _state.main.global_block()


@contextmanager
def capture_ops() -> Iterator[list[Op]]:
    """Collect the ops built inside the ``with`` instead of appending them."""
    sink: list[Op] = []
    _state.sinks.append(sink)
    try:
        yield sink
    finally:
        _state.sinks.pop()


def emit(op: Op, block: Block) -> Op:
    """Place a freshly built op: into the innermost capture, else at the end of ``block``."""
    if _state.sinks:
        op.block = block
        _state.sinks[-1].append(op)
        return op
    return block.append_op(op)
