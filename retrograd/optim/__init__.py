"""Optimizers as ops in the program: ``SGD``, ``Momentum``, ``Adam``.

``opt.minimize(loss)`` appends the backward pass (``rg.append_backward``),
optional global-norm clipping, and one update op per parameter; optimizer
state is persistable, initialised by the startup program and saved by
``rg.save_params`` with the parameters.

Example::

    with rg.program_guard(main, startup):
        loss = ...
        rg.optim.Adam(1e-3).minimize(loss)
    exe.run(startup)
    exe.run(main, feed=batch)          # forward, backward and update in one run
"""
from . import fused  # noqa: F401  (registers FusedAdamUpdate, built by retrograd.passes)
from .clip import clip_by_global_norm, global_norm  # noqa: F401
from .ops import adam_update, increment, momentum_update, sgd_update  # noqa: F401
from .optimizer import SGD, Adam, Momentum, Optimizer  # noqa: F401
from .state import create_state  # noqa: F401

__all__ = ["SGD", "Momentum", "Adam", "Optimizer", "clip_by_global_norm", "global_norm",
           "create_state", "increment", "sgd_update", "momentum_update", "adam_update"]
