"""``AllReduce`` and ``Broadcast``: the collectives of data parallelism, as ordinary ops.

Both fuse their inputs into one flat buffer per dtype, so a step makes one
MPI call (per dtype: usually one) however many gradients there are::

    inputs   g0[8, 4]  g1[4]  g2[4, 4]
    flat     [ g0 (32) | g1 (4) | g2 (16) ]   one device concat, one move to the host
    MPI      Allreduce(IN_PLACE, flat, SUM) ; flat /= size
    outputs  views of flat, reshaped          one move back, no copies

MPI works on host memory: a backend's arrays go through its ``to_numpy`` /
``from_numpy`` (once per op, on the flat buffer). In one process (no
``mpiexec``) both ops return their inputs unchanged.

Example::

    mean_grads = all_reduce([g0, g1], "mean")     # in the main program, after the backward
    broadcast([w, b], root=0)                     # in the startup program, after the initialisers
"""
from __future__ import annotations

import math
import weakref
from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ProgramError, ShapeError
from ..ir.builder import current_block
from ..ir.program import Block, Op, Var
from ..ops.core.registry import append_op, defop, infer_specs
from ..ops.core.shapes import require_float
from .comm import world

REDUCTIONS = ("mean", "sum")


def _same_as_inputs(ins: list[Var], attrs: dict):
    if not ins:
        raise ShapeError("needs at least one input")
    return [(v.shape, v.dtype) for v in ins]


def _all_reduce_rule(ins: list[Var], attrs: dict):
    if attrs.get("reduce") not in REDUCTIONS:
        raise ShapeError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {attrs.get('reduce')!r}")
    if attrs["reduce"] == "mean":
        for var in ins:
            require_float(var)
    return _same_as_inputs(ins, attrs)


def _all_reduce_grad(g):
    """The gradient of a mean (sum) over ranks is the mean (sum) over ranks of the output gradients."""
    present = [i for i, d in enumerate(g.dout) if d is not None]
    reduced = all_reduce([g.dout[i] for i in present], g.attrs["reduce"]) if present else []
    grads: list = [None] * len(g.x)
    for i, d in zip(present, reduced):
        grads[i] = d
    return grads


# AllReduce ops whose inputs have been compared across the ranks (once per op, on its first run).
_checked: "weakref.WeakSet[Op]" = weakref.WeakSet()


@defop("AllReduce", inputs=("xs*",), outputs=("outs*",), infer=_all_reduce_rule, grad=_all_reduce_grad)
def _all_reduce(k, *xs):
    """Sum or mean of each input over all ranks, in one fused ``Allreduce``."""
    comm = world()
    if comm.size == 1:
        return xs[0] if len(xs) == 1 else xs
    if k.op not in _checked:
        check_same_on_all_ranks(comm, k.op, xs, "AllReduce inputs")
        _checked.add(k.op)
    scale = 1.0 / comm.size if k.attrs["reduce"] == "mean" else None

    def reduce(host):
        comm.allreduce_sum(host)
        if scale is not None:
            host *= scale           # a float buffer (a mean needs floats); 3x faster than /=
    return _fused(k, xs, reduce)


def all_reduce(xs: Sequence[Var], reduce: str = "mean") -> list[Var]:
    """One ``AllReduce`` op: each Var's mean (or sum) over all ranks; returns new Vars.

    Outputs are named ``<input>.<reduce>``; a mean needs float inputs.

    Example::

        g_w, g_b = rg.distributed.all_reduce([w_grad, b_grad], "mean")
    """
    xs = list(xs)
    if not xs:
        raise ProgramError("all_reduce needs at least one Var")
    block = current_block()
    outputs = _declare_outputs(block, xs, reduce)
    return append_op("AllReduce", xs, {"reduce": reduce}, outputs=outputs, block=block)


def _declare_outputs(block: Block, xs: list[Var], reduce: str) -> list[Var]:
    infer_specs("AllReduce", xs, {"reduce": reduce}, block)     # complain before declaring anything
    program = block.program
    outs = []
    for x in xs:
        name = f"{x.name}.{reduce}"
        if program.has_name(name):
            name = program.unique_name(name)
        outs.append(block.create_var(name, x.shape, x.dtype))
    return outs


@defop("Broadcast", inputs=("xs*",), outputs=("outs*",), infer=_same_as_inputs)
def _broadcast(k, *xs):
    """Every rank gets rank ``root``'s values (written back to the same variables)."""
    comm = world()
    if comm.size == 1:
        return xs[0] if len(xs) == 1 else xs
    root = k.attrs["root"]
    if not 0 <= root < comm.size:
        raise ExecutionError(f"{k.op.where()}: root {root} is not a rank of this run (0 to {comm.size - 1})")
    check_same_on_all_ranks(comm, k.op, xs, "the programs' persistable values (parameters, "
                                            "optimizer state)")
    return _fused(k, xs, lambda host: comm.broadcast(host, root=root))


def broadcast(xs: Sequence[Var], root: int = 0) -> list[Var]:
    """Overwrite each Var with rank ``root``'s value, in place (one op, any dtypes).

    Put it in a startup program after the initialisers so every rank starts
    from the same parameters; it also checks that every rank built the same
    variables (names, shapes, dtypes) and raises ``ProgramError`` naming the
    first that differs otherwise.

    Example::

        with rg.program_guard(startup, startup):
            rg.distributed.broadcast([startup.global_block().var("fc.w")])
    """
    xs = list(xs)
    if not xs:
        raise ProgramError("broadcast needs at least one Var")
    return append_op("Broadcast", xs, {"root": int(root)}, outputs=xs)


# --- fusing into one buffer -----------------------------------------------------------------

def _fused(k, arrays, collective):
    """Run ``collective(host_buffer)`` (in place) once per dtype over the arrays packed flat;
    return the arrays unpacked from the results (views of one buffer per dtype)."""
    xp, backend = k.xp, k.backend
    groups: dict[object, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(i)
    outs: list = [None] * len(arrays)
    for members in groups.values():
        flat = xp.concat([xp.reshape(arrays[i], (-1,)) for i in members])
        host = np.require(backend.to_numpy(flat), requirements=["C", "W"])   # MPI reads host memory
        collective(host)
        flat, start = backend.from_numpy(host), 0
        for i in members:
            shape = tuple(arrays[i].shape)
            size = math.prod(shape)
            outs[i] = xp.reshape(flat[start:start + size], shape)
            start += size
    return outs[0] if len(outs) == 1 else tuple(outs)


# --- the programs must agree -----------------------------------------------------------------

def check_same_on_all_ranks(comm, op: Op, arrays, what: str) -> None:
    """Raise ``ProgramError`` on every rank, naming the first variable whose name, shape or
    dtype is not rank 0's, before any data moves (mismatched sizes would hang MPI)."""
    mine = [(name, tuple(int(d) for d in a.shape), str(a.dtype).rsplit(".", 1)[-1])
            for name, a in zip(op.inputs, arrays)]
    everyone = comm.allgather(mine)
    problem = _first_difference(everyone)
    if problem:
        raise ProgramError(f"{op.where()}: {what} differ across ranks: {problem}; every rank must "
                           "build the same program (same model options)")


def _first_difference(everyone: list[list[tuple]]) -> str | None:
    for rank, theirs in enumerate(everyone[1:], start=1):
        problem = _difference(everyone[0], theirs, rank)
        if problem:
            return problem
    return None


def _difference(reference: list[tuple], theirs: list[tuple], rank: int) -> str | None:
    """How rank ``rank``'s ``(name, shape, dtype)`` list differs from rank 0's (None: it does not)."""
    ours = {name: (shape, dtype) for name, shape, dtype in reference}
    for name, shape, dtype in theirs:
        if name not in ours:
            return f"'{name}' exists on rank {rank} but not on rank 0"
        if ours[name] != (shape, dtype):
            return (f"'{name}' is {ours[name][1]}{list(ours[name][0])} on rank 0 but "
                    f"{dtype}{list(shape)} on rank {rank}")
    missing = [name for name in ours if name not in {n for n, _, _ in theirs}]
    if missing:
        return f"'{missing[0]}' exists on rank 0 but not on rank {rank}"
    if [n for n, _, _ in theirs] != [n for n, _, _ in reference]:
        return f"the variables are in another order on rank {rank} than on rank 0"
    return None
