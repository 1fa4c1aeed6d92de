"""``rg.onnx.export``: a program (inference or a whole training step) as a standard ONNX model.

This module imports onnx only when ``export`` is called, so ``rg.onnx`` is
importable without it.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import BackendError, ProgramError
from ..ir.program import Program, Var

INSTALL_HINT = 'pip install "retrograd[onnx]"'


def export(program: Program, path, fetch_list: Sequence, scope=None, opset: int | None = None):
    """Write ``program`` as an ONNX model to ``path`` and return it (an ``onnx.ModelProto``).

    Inputs are the values the program reads and does not compute (the feeds),
    named as in the program; outputs are ``fetch_list``, named by the fetch.
    Every persistable the program writes (a training step's parameters,
    optimizer moments, step counts) is also an output, named ``<name>.new``:
    feed it back as ``<name>`` to run the next step (export with
    ``scope=None`` for that, so parameters are inputs). ``If`` stays ``If``;
    ``While``, ``Scan``, ``RecurrentNetwork`` and their gradients become
    ``Loop``s; zero iterations and any batch size work.

    Args:
        program: The program to export (its global block).
        path: Where to write the ``.onnx`` file.
        fetch_list: The outputs: Vars or names.
        scope: With a Scope (e.g. ``exe.scope``), every persistable the program
            reads becomes an initializer holding its value; without one, a graph
            input of the same name.
        opset: The ONNX opset; by default the newest one the installed
            onnxruntime loads (at most 28).

    Returns:
        The ``onnx.ModelProto`` written.

    Raises:
        BackendError: onnx is missing (naming ``pip install "retrograd[onnx]"``),
            or an op or attribute has no ONNX form (naming the op and its
            block, before anything is written), or, for a program with
            bfloat16 or float16 values, an op onnxruntime (where installed) has
            no kernel for in its dtype.

    Example:
        ```python
        # requires: onnx, onnxruntime
        import os
        import tempfile

        import numpy as np
        import onnxruntime
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            logits = rg.layers.fc(x, 2, name="logits")
        exe = rg.Executor()
        exe.run(startup)
        path = os.path.join(tempfile.mkdtemp(), "model.onnx")
        model = rg.onnx.export(main, path, fetch_list=[logits], scope=exe.scope)
        xb = np.ones((4, 3), "float32")
        (ours,) = exe.run(main, feed={"x": xb}, fetch_list=[logits])
        sess = onnxruntime.InferenceSession(path)
        (theirs,) = sess.run(["logits"], {"x": xb})
        assert np.allclose(ours, theirs, atol=1e-6)
        ```
    """
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise BackendError(f"ONNX export needs the onnx package: {INSTALL_HINT}") from None
    from .model import build_model, check, check_runnable
    if not isinstance(program, Program):
        raise ProgramError(f"rg.onnx.export needs a Program, got {type(program).__name__}")
    if isinstance(fetch_list, (Var, str)):
        fetch_list = [fetch_list]
    fetch = [_fetch_name(item, program) for item in (fetch_list or [])]
    built = build_model(program, fetch, scope=scope, opset=opset)
    check(built.model)
    check_runnable(built.model, program)
    if path is not None:
        onnx.save(built.model, str(path))
    return built.model


def _fetch_name(item, program: Program) -> str:
    if isinstance(item, Var) and not program.owns(item):   # by name it would be another variable
        raise ProgramError(f"fetch Var '{item.name}' belongs to another program, not to the one "
                           "exported (nor to a program it was cloned from or a clone of it)")
    name = item.name if isinstance(item, Var) else item
    if not isinstance(name, str) or program.global_block().find_var(name) is None:
        raise ProgramError(f"fetch {item!r} is not a variable of block 0")
    return name
