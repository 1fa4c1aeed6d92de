"""What ``If`` (``cond.py``) and ``Do`` (``do.py``) share: running one block with explicit bindings,
its shape rule, and its gradient (the same op over the blocks' backward blocks). Layout::

    If(pred, operands...; blocks=[then, else], binds, outs)  -> outs...
    Do(operands...;       blocks=[body],       binds, outs)  -> outs...
        runs blocks[b] (If: b = 0 when pred holds, else 1) with operand j
        bound to the name binds[b][j] (None: not bound there). Output i is
        outs[b][i]: a name in the block, an int j (zeros shaped like operand
        j: a gradient the branch that ran does not produce) or None (an empty
        array: a value saved for the backward of the other branch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...errors import ShapeError
from ...ir.dtypes import is_float
from ...ir.program import Block, Op, Var
from .registry import GradCtx, append_op
from .subblock_grad import detach, run_backward
from .subblocks import (as_outputs, bound_var, check_bound, empty_stand_in, merge_shapes,
                        outer_reads, unique)


def run_call(k, b: int, operands: Sequence):
    attrs, op = k.attrs, k.op
    bindings = {name: value for name, value in zip(attrs["binds"][b], operands) if name is not None}
    specs = attrs["outs"][b]
    fetched = iter(k.run.run_block(attrs["blocks"][b], bindings, [s for s in specs if isinstance(s, str)]))
    results = []
    for name, spec in zip(op.outputs, specs):
        if isinstance(spec, str):
            results.append(next(fetched))
        elif spec is None:
            results.append(empty_stand_in(k.xp, op.block.var(name)))
        else:
            results.append(k.xp.zeros_like(operands[spec]))
    return as_outputs(results)


def call_rule(operands: Sequence[Var], attrs: dict) -> list:
    """Each output's type from the blocks producing it: dtypes agree, shapes merge (-1 where they differ)."""
    blocks, outs = attrs["blocks"], attrs["outs"]
    if len(blocks) != len(outs) or len(blocks) != len(attrs["binds"]):
        raise ShapeError(f"{len(blocks)} blocks but {len(attrs['binds'])} binds and {len(outs)} outs lists")
    count = len(outs[0])
    for block, binds in zip(blocks, attrs["binds"]):
        if len(binds) != len(operands):
            raise ShapeError(f"block {block.idx} binds {len(binds)} names for {len(operands)} operands")
        check_bound(block, binds, "bound name")
    specs = []
    for i in range(count):
        found = []
        for block, block_outs in zip(blocks, outs):
            if len(block_outs) != count:
                raise ShapeError(f"block {block.idx} lists {len(block_outs)} outputs, block "
                                 f"{blocks[0].idx} lists {count}")
            spec = block_outs[i]
            if isinstance(spec, str):
                var = block.find_var(spec)
                if var is None:
                    raise ShapeError(f"output {i}: block {block.idx} has no variable '{spec}'")
                found.append(var)
            elif spec is not None:
                found.append(operands[spec])
        if not found:
            raise ShapeError(f"output {i} is produced by none of the blocks")
        shape, dtype = found[0].shape, found[0].dtype
        for var in found[1:]:
            if var.dtype != dtype or len(var.shape) != len(shape):
                raise ShapeError(f"output {i}: the blocks give {found[0].name}: {found[0].type_str()} and "
                                 f"{var.name}: {var.type_str()}")
            shape = merge_shapes(shape, var.shape)
        specs.append((shape, dtype))
    return specs


@dataclass
class _Derived:
    """One block's backward: the block, its gradient per operand, what it binds."""
    block: Block
    grads: dict[int, Var | None]
    fetch: list[str]
    dout_binds: list[tuple[str, Var]]    # (bound name, outer output gradient)
    saved: list[str]                     # forward values it reads, saved by the forward op


def call_grad(g: GradCtx, first: int) -> list:
    """Gradient of If (``first`` = 1: the predicate) or Do: the same op over backward blocks."""
    op, attrs = g.op, g.attrs
    operands = g.x[first:]
    wanted = [w and is_float(v.dtype) for v, w in zip(operands, g.wanted[first:])]
    result: list = [None] * len(g.x)
    if not any(wanted) or all(d is None for d in g.dout):
        return result
    derived = [_derive_call(g, b, block, wanted) for b, block in enumerate(attrs["blocks"])]
    with_grad = [j for j in range(len(operands)) if any(d.grads.get(j) is not None for d in derived)]
    if not with_grad:
        return result
    nb = len(derived)
    # Outer values the backward blocks read by name, and operands whose zeros a block stands in.
    lexical = unique([n for d in derived for n in outer_reads(d.block, d.fetch)]
                      + [operands[j].name for j in with_grad if any(d.grads.get(j) is None for d in derived)])
    inputs = [g.block.var(n) for n in lexical]
    binds = [list(lexical) for _ in derived]
    for b, d in enumerate(derived):
        stored = _save_call_values(op, b, d.saved)
        for inner, outer in d.dout_binds + [(name, stored[name]) for name in d.saved]:
            inputs.append(outer)
            for c in range(nb):
                binds[c].append(inner if c == b else None)
    outs = [[d.grads[j].name if d.grads.get(j) is not None else lexical.index(operands[j].name)
             for j in with_grad] for d in derived]
    new = {"blocks": [d.block for d in derived], "binds": binds, "outs": outs}
    grads = append_op(op.type, g.x[:first] + inputs, new, name=f"{op.type.lower()}_grad")
    for var, j in zip(grads, with_grad):
        result[first + j] = var
    return result


def _derive_call(g: GradCtx, b: int, block: Block, wanted: list[bool]) -> _Derived:
    grad_block = block.program.create_block(block)
    parts: dict[str, list[Var]] = {}
    dout_binds = []
    for spec, dout in zip(g.attrs["outs"][b], g.dout):
        if isinstance(spec, str) and dout is not None:
            bound = bound_var(grad_block, f"{spec}.grad_in", dout)
            parts.setdefault(spec, []).append(bound)
            dout_binds.append((bound.name, dout))
    binds = g.attrs["binds"][b]
    operand_of = {binds[j]: j for j in range(len(wanted)) if wanted[j] and binds[j] is not None}
    grads = run_backward(grad_block, block, parts, list(operand_of), g.callbacks)
    per_operand = {j: grads.get(name) for name, j in operand_of.items()}
    fetch = [v.name for v in per_operand.values() if v is not None]
    saved, _ = detach(grad_block, block, g.block, fetch, [name for name, _ in dout_binds])
    return _Derived(grad_block, per_operand, fetch, dout_binds, saved)


def _save_call_values(op: Op, b: int, names: Sequence[str]) -> dict[str, Var]:
    """Make If/Do ``op`` also output block ``b``'s values ``names``; their outer Vars."""
    outs = [list(o) for o in op.attrs["outs"]]
    found = {}
    for name in names:
        if name in outs[b]:
            found[name] = op.block.var(op.outputs[outs[b].index(name)])
            continue
        inner = op.attrs["blocks"][b].var(name)
        var = op.block.create_var(op.block.program.unique_name(f"{name}.saved"), inner.shape, inner.dtype)
        op.outputs.append(var.name)
        for c, block_outs in enumerate(outs):
            block_outs.append(name if c == b else None)
        found[name] = var
    op.attrs["outs"] = outs
    op.block.program.bump()
    return found


def lower_call(g, b: int, operands: Sequence[str]) -> list[str]:
    """ONNX values of the outputs of block ``b`` of an If/Do (see the layout above), lowered into
    ``g``'s graph: the block's values, zeros shaped like an operand, or empty stand-ins."""
    attrs = g.attrs
    binds = {name: value for name, value in zip(attrs["binds"][b], operands) if name is not None}
    specs = attrs["outs"][b]
    fetched = iter(g.lower(attrs["blocks"][b], binds, [s for s in specs if isinstance(s, str)]))
    values = []
    for var, spec in zip(g.out_vars, specs):
        if isinstance(spec, str):
            values.append(next(fetched))
        elif spec is None:   # a value saved for the other branch's backward: never read. Zeros of its
            # shape where that is known, so a loop stacking it per iteration gets rows of one shape
            sizes = list(var.shape) if all(d >= 0 for d in var.shape) else [0] * var.ndim
            values.append(g.fill(g.const(sizes, "int64"), 0, var.dtype))
        else:
            values.append(g.fill(g.shape(operands[spec]), 0, var.dtype))
    return values
