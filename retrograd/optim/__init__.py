"""Optimizers as ops in the program: ``SGD``, ``Momentum``, ``Adam``, ``AdamW``, ``RMSProp``, ``Adagrad``.

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
from ..ops.optim import fused_adam as fused  # noqa: F401  (registers FusedAdamUpdate, built by retrograd.passes)
from .clip import clip_by_global_norm, global_norm  # noqa: F401
from . import lr  # noqa: F401  (rg.optim.lr.cosine / step_decay / linear_warmup)
from ..ops.optim.updates import (adagrad_update, adam_update, increment, momentum_update,
                                 rmsprop_update, sgd_update)
from .optimizer import SGD, Adagrad, Adam, AdamW, Momentum, Optimizer, RMSProp  # noqa: F401
from .state import create_state  # noqa: F401

__all__ = ["SGD", "Momentum", "Adam", "AdamW", "RMSProp", "Adagrad", "Optimizer", "lr",
           "clip_by_global_norm", "global_norm", "create_state", "increment", "sgd_update",
           "momentum_update", "adam_update", "rmsprop_update", "adagrad_update"]
