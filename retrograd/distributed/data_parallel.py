"""``DataParallel``: any optimizer, with the gradients averaged over the ranks before the updates.

``minimize`` builds, in order::

    forward, backward                      (the optimizer's ``backward``)
    AllReduce(all gradients; mean)         one op, one flat buffer per dtype (usually one)
    clipping, updates                      (the optimizer's ``apply_gradients``, on the means)

and appends one ``Broadcast`` of every value the startup program initialises
(parameters, optimizer state) to the startup program, so all ranks start from
rank 0's values. The program is the same for any number of ranks; with one
process the collectives return their inputs.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ProgramError
from ..ir.builder import default_startup_program, program_guard
from ..ir.program import Program, Var
from ..optim.optimizer import Optimizer
from .ops import all_reduce, broadcast


class DataParallel:
    """Wraps an optimizer so that each rank's gradients are replaced by their mean over all ranks.

    Feed each rank its own equal-sized shard of the batch: with a mean loss,
    the averaged gradients are those of the whole batch, so after any number
    of steps every rank holds the parameters one process would have trained
    on the whole batch.

    Example::

        opt = rg.distributed.DataParallel(rg.optim.Adam(1e-3, clip_norm=5.0))
        params_grads = opt.minimize(loss)      # [(param, gradient averaged over the ranks)]
    """

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ProgramError(f"DataParallel wraps an rg.optim optimizer (SGD, Momentum, Adam), "
                               f"got {type(optimizer).__name__}")
        self.optimizer = optimizer

    @property
    def grad_norm(self) -> Var | None:
        """The global norm of the averaged gradients before clipping (with ``clip_norm``)."""
        return self.optimizer.grad_norm

    def minimize(self, loss: Var, parameter_list=None, no_grad_set=None, checkpoints=None, *,
                 startup_program: Program | None = None, **backward_options) -> list[tuple[Var, Var]]:
        """Backward, one ``AllReduce`` of all gradients, updates; return ``[(param, averaged grad)]``.

        Takes what the wrapped optimizer's ``minimize`` takes.

        Example::

            params_grads = rg.distributed.DataParallel(rg.optim.SGD(0.1)).minimize(loss)
        """
        startup = startup_program if startup_program is not None else default_startup_program()
        params_grads = self.optimizer.backward(loss, parameter_list, no_grad_set, checkpoints,
                                               startup_program=startup, **backward_options)
        return self.apply_gradients(params_grads, main_program=loss.block.program, startup_program=startup)

    def apply_gradients(self, params_grads: Sequence[tuple[Var, Var]], *,
                        main_program: Program | None = None,
                        startup_program: Program | None = None) -> list[tuple[Var, Var]]:
        """Average the gradients over the ranks, then clip and update as the optimizer does.

        Example::

            opt.apply_gradients(rg.append_backward(loss))
        """
        if not params_grads:
            raise ProgramError("nothing to optimize: the loss depends on no trainable parameter")
        main = main_program if main_program is not None else params_grads[0][0].block.program
        startup = startup_program if startup_program is not None else default_startup_program()
        with program_guard(main, startup):
            averaged = average_gradients(params_grads)
        self.optimizer.apply_gradients(averaged, main_program=main, startup_program=startup)
        broadcast_initial_values(startup)
        return averaged


def average_gradients(params_grads: Sequence[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
    """``[(param, mean of grad over the ranks)]``: one ``AllReduce`` op over all the gradients.

    Example::

        params_grads = rg.distributed.average_gradients(rg.append_backward(loss))
    """
    means = all_reduce([g for _, g in params_grads], "mean")
    return [(param, mean) for (param, _), mean in zip(params_grads, means)]


def broadcast_initial_values(startup: Program) -> None:
    """Append a ``Broadcast`` from rank 0 of every persistable value ``startup`` writes.

    Example::

        rg.distributed.broadcast_initial_values(startup)   # every rank starts from rank 0's
    """
    block = startup.global_block()
    written: dict[str, Var] = {}
    for op in block.ops:
        for name in op.outputs:
            var = block.vars.get(name)
            if var is not None and var.persistable:
                written.setdefault(name, var)
    if not written:
        raise ProgramError("the startup program initialises nothing, so there is nothing to broadcast "
                           "from rank 0; call minimize inside rg.program_guard(main, startup)")
    with program_guard(startup, startup):
        broadcast(list(written.values()), root=0)
