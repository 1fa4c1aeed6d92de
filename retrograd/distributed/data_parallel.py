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
    on the whole batch. ``minimize`` also makes the startup program broadcast
    rank 0's initial values. In one process (no ``mpiexec``) the collectives return their inputs, so the
    same code runs on one rank or many (``mpiexec -n 4 python train.py``).

    Args:
        optimizer: An ``rg.optim`` optimizer.

    Raises:
        ProgramError: ``optimizer`` is not an ``rg.optim.Optimizer``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
            opt = rg.distributed.DataParallel(rg.optim.Adam(1e-2, clip_norm=5.0))
            params_grads = opt.minimize(loss)      # [(param, gradient averaged over the ranks)]
        exe = rg.Executor()
        exe.run(startup)                           # every rank starts from rank 0's parameters
        xb = np.ones((8, 3), "float32")
        for _ in range(3):
            exe.run(main, feed={"x": rg.distributed.shard(xb)})   # each rank its 1/size of the batch
        assert opt.grad_norm is not None
        ```
    """

    def __init__(self, optimizer: Optimizer):
        if not isinstance(optimizer, Optimizer):
            raise ProgramError(f"DataParallel wraps an rg.optim optimizer (SGD, Momentum, Adam), "
                               f"got {type(optimizer).__name__}")
        self.optimizer = optimizer

    @property
    def grad_norm(self) -> Var | None:
        """The global norm of the averaged gradients before clipping (with ``clip_norm``), else None."""
        return self.optimizer.grad_norm

    def minimize(self, loss: Var, parameter_list=None, no_grad_set=None, checkpoints=None, *,
                 startup_program: Program | None = None, **backward_options) -> list[tuple[Var, Var]]:
        """Backward, one ``AllReduce`` of all gradients, updates; return ``[(param, averaged grad)]``.

        Args:
            loss: The scalar loss Var.
            parameter_list: The parameters to train (all trainable ones by default).
            no_grad_set: Vars or names that get no gradient.
            checkpoints: Passed to ``rg.append_backward``.
            startup_program: The startup program (the current one by default).
            **backward_options: Other ``rg.append_backward`` keywords.

        Returns:
            ``[(param, gradient averaged over the ranks)]``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                x = rg.data("x", [-1, 3])
                loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
                params_grads = rg.distributed.DataParallel(rg.optim.SGD(0.1)).minimize(loss)
            assert "AllReduce" in [op.type for op in main.global_block().ops]
            assert "Broadcast" in [op.type for op in startup.global_block().ops]
            ```
        """
        startup = startup_program if startup_program is not None else default_startup_program()
        params_grads = self.optimizer.backward(loss, parameter_list, no_grad_set, checkpoints,
                                               startup_program=startup, **backward_options)
        return self.apply_gradients(params_grads, main_program=loss.block.program, startup_program=startup)

    def apply_gradients(self, params_grads: Sequence[tuple[Var, Var]], *,
                        main_program: Program | None = None,
                        startup_program: Program | None = None) -> list[tuple[Var, Var]]:
        """Average the gradients over the ranks, then clip and update as the optimizer does.

        Args:
            params_grads: ``[(param, grad)]`` pairs.
            main_program: The program to append to (the parameters' by default).
            startup_program: The startup program (the current one by default).

        Returns:
            ``[(param, averaged grad)]``.

        Raises:
            ProgramError: ``params_grads`` is empty.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            main, startup = rg.Program(), rg.Program()
            with rg.program_guard(main, startup):
                x = rg.data("x", [-1, 3])
                loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
                opt = rg.distributed.DataParallel(rg.optim.SGD(0.1))
                averaged = opt.apply_gradients(rg.append_backward(loss))
            exe = rg.Executor()
            exe.run(startup)
            exe.run(main, feed={"x": np.ones((4, 3), "float32")})
            assert [p.name for p, _ in averaged] == ["fc.w", "fc.b"]
            ```
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

    In one process (no ``mpiexec``) the collectives return their inputs, so the
    same code runs on one rank or many (``mpiexec -n 4 python train.py``).

    Args:
        params_grads: ``[(param, grad)]`` pairs.

    Returns:
        ``[(param, averaged grad)]``.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
            params_grads = rg.distributed.average_gradients(rg.append_backward(loss))
        exe = rg.Executor()
        exe.run(startup)
        (g,) = exe.run(main, feed={"x": np.ones((4, 3), "float32")}, fetch_list=[params_grads[0][1]])
        assert g.shape == (3, 1)
        ```
    """
    means = all_reduce([g for _, g in params_grads], "mean")
    return [(param, mean) for (param, _), mean in zip(params_grads, means)]


def broadcast_initial_values(startup: Program) -> None:
    """Append a ``Broadcast`` from rank 0 of every persistable value ``startup`` writes.

    Args:
        startup: The startup program.

    Raises:
        ProgramError: The startup program initialises nothing.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3])
            loss = rg.mean(rg.square(rg.layers.fc(x, 1, name="fc")))
        rg.distributed.broadcast_initial_values(startup)   # every rank starts from rank 0's values
        assert startup.global_block().ops[-1].type == "Broadcast"
        ```
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
