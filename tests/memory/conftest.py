"""Model builders shared by the memory tests, offered as the ``mm`` fixture.

(Tests run with ``--import-mode=importlib``, so a fixture is how a helper
module is shared without ``__init__.py`` files.)"""
from __future__ import annotations

import types

import numpy as np
import pytest

import retrograd as rg
from retrograd import Program


def mlp(layers: int, width: int, *, dtype: str = "float64", dropout: float = 0.0,
        checkpoints=None, pick=None, residual: bool = False):
    """``layers`` tanh layers (optionally with dropout / residual adds), loss = mean(h*h).

    ``pick(hidden_list) -> checkpoints`` chooses checkpoints from the hidden
    values; ``checkpoints`` passes a value (e.g. ``"auto"``) through.
    Returns ``(main, startup, loss, params_grads, hidden)``.
    """
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, width], dtype=dtype)
        h, hidden = x, []
        for i in range(layers):
            w = rg.create_parameter(f"w{i}", [width, width], dtype=dtype)
            z = rg.tanh(rg.matmul(h, w))
            if dropout:
                z = rg.dropout(z, dropout)
            h = h + z if residual else z
            hidden.append(h)
        loss = rg.mean(h * h)
        if pick is not None:
            checkpoints = pick(hidden)
        params_grads = rg.append_backward(loss, checkpoints=checkpoints)
    return main, startup, loss, params_grads, hidden


def init_params(exe: rg.Executor, program: Program, seed: int = 0, scale: float = 0.3) -> None:
    """Set every parameter to reproducible random values (independent of the startup program)."""
    rng = np.random.RandomState(seed)
    for var in program.all_parameters():
        exe.scope.set(var.name, (rng.randn(*var.shape) * scale).astype(var.dtype))


def run_grads(built, xb: np.ndarray, seed: int = 0, extra_fetch=()):
    """Run a built model once; return (loss, {param: grad}, extra values, peak_bytes)."""
    main, startup, loss, params_grads, _ = built
    exe = rg.Executor()
    init_params(exe, main, seed)
    fetch = [loss] + [g for _, g in params_grads] + list(extra_fetch)
    out = exe.run(main, feed={"x": xb}, fetch_list=fetch)
    grads = {p.name: g for (p, _), g in zip(params_grads, out[1:])}
    return out[0], grads, out[1 + len(params_grads):], exe.last_stats.peak_bytes


def run_step(built, feed: dict, backend=None):
    """Run ``built = (main, startup, fetch)`` once on ``backend`` (a ``backend`` fixture value; None:
    the default executor): (the fetched values as arrays, the executor)."""
    main, startup, fetch = built
    exe = rg.Executor() if backend is None else rg.Executor(backend=backend.name, device=backend.device)
    exe.run(startup)
    out = exe.run(main, feed=feed, fetch_list=fetch)
    return [np.asarray(v) for v in out], exe


def recompute_ops(program: Program):
    return [op for op in program.global_block().ops if "recompute_of" in op.attrs]


@pytest.fixture
def mm():
    """The helpers above: ``mm.mlp``, ``mm.run_grads``, ``mm.init_params``, ``mm.recompute_ops``,
    ``mm.run_step``."""
    return types.SimpleNamespace(mlp=mlp, init_params=init_params, run_grads=run_grads,
                                 recompute_ops=recompute_ops, run_step=run_step)
