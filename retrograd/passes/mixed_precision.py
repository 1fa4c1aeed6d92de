"""``cast_to_low_precision``: a forward program rewritten to compute in bfloat16 or float16.

The rule is ``torch.autocast``'s, as a rewrite of the program (TF1's and
Paddle's form), so the casts are ops one can print, save and export::

    before   h = MatMul(x, fc.w); h = Add(h, fc.b); y = Tanh(h); loss = Mean(y)
    after    x.bfloat16 = Cast(x); fc.w.bfloat16 = Cast(fc.w)          one cast per value
             h = MatMul(x.bfloat16, fc.w.bfloat16)       bfloat16     (an op of ``low``)
             fc.b.. h = Add(h, fc.b)                      float32      (others: the widest input)
             y = Tanh(h)                                  float32
             loss = Mean(y)                               float32      (an op of ``float32``)

* ops whose type is in ``low`` compute in ``dtype``: float inputs of another
  float dtype are cast (each value once: a parameter used twice is cast once);
* ops in ``float32`` compute in float32: low-precision inputs are cast up;
* every other op computes in the widest dtype of its float inputs.

Outputs keep their names and take the dtype the op's shape rule gives for
the new inputs. Values stay as they were where a change would reach what the
pass does not rewrite: ops with sub-blocks (loops, branches, recurrences)
compute as written, reading their operands and the outer values their blocks
read at the declared dtype (the low value's producer writes ``<name>.<dtype>``
and a Cast back writes ``<name>``); ops that write a persistable or
one of their own inputs (in-place updates, running statistics) read theirs
through casts to the declared dtype.
Nothing outside block 0 changes. The op-type lists are arguments: the
policy lives in ``rg.amp`` (``LOW``, ``FLOAT32``).
"""
from __future__ import annotations

import functools
from typing import Iterable

from ..errors import ProgramError
from ..ir.analysis import free_reads
from ..ir.dtypes import canonical, is_float, is_low_float, promote
from ..ir.program import Block, Op, Program
from ..ops.core.registry import infer_specs


def cast_to_low_precision(program: Program, dtype: str, low: Iterable[str], float32: Iterable[str]) -> int:
    """Rewrite the global block's ops (the forward built so far) in place; return the casts added.

    Ops whose type is in ``low`` compute in ``dtype``, those in ``float32`` in float32, the
    others in their inputs' widest dtype; each value is cast once. ``rg.amp.decorate``'s
    ``minimize`` runs it before the backward.

    Args:
        program: The program (its global block is rewritten).
        dtype: ``"bfloat16"`` or ``"float16"``.
        low: Op types that compute in ``dtype`` (``rg.amp.LOW``).
        float32: Op types that compute in float32 (``rg.amp.FLOAT32``).

    Returns:
        The number of Cast ops added.

    Raises:
        ProgramError: ``dtype`` is not a low-precision float.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [4, 8])
            w = rg.create_parameter("w", [8, 2])
            y = rg.softmax(rg.matmul(x, w))
        added = rg.passes.cast_to_low_precision(main, "bfloat16", rg.amp.LOW, rg.amp.FLOAT32)
        assert added > 0 and "Cast" in str(main)
        ```
    """
    dtype = canonical(dtype)
    if not is_low_float(dtype):
        raise ProgramError(f"cast_to_low_precision: dtype must be bfloat16 or float16, got {dtype}")
    rewrite = _Rewrite(program.global_block(), dtype, frozenset(low), frozenset(float32))
    for op in list(rewrite.block.ops):
        rewrite.op(op)
    if rewrite.added:
        program.bump()
    return rewrite.added


class _Rewrite:
    def __init__(self, block: Block, dtype: str, low: frozenset, float32: frozenset):
        self.block, self.dtype, self.low, self.float32 = block, dtype, low, float32
        self.declared = {name: var.dtype for name, var in block.vars.items()}   # before the pass
        self.casts: dict[tuple[str, str], str] = {}     # (value, dtype) -> the cast's output
        self.added = 0

    def op(self, op: Op) -> None:
        if op.sub_blocks():
            self._as_declared(op)
        elif self._in_place(op):
            for i, name in enumerate(op.inputs):
                self._restore(op, i, name)
        else:
            target = self._target(op)
            if target is not None:
                self._cast_inputs(op, lambda d: target if is_float(d) and d != target else None)
            self._retype_outputs(op)        # its inputs' dtypes may have changed upstream

    def _target(self, op: Op) -> str | None:
        """The float dtype ``op`` computes in (None: leave its inputs as they are)."""
        dtypes = [self._dtype(n) for n in op.inputs]
        floats = [d for d in dtypes if is_float(d)]
        if op.type in self.low:
            return self.dtype if floats and "float64" not in floats else None
        if op.type in self.float32:
            return "float32" if any(is_low_float(d) for d in floats) else None
        return functools.reduce(promote, floats) if len(set(floats)) > 1 else None

    def _as_declared(self, op: Op) -> None:
        """An op with sub-blocks reads its operands and the outer values its blocks read at the
        dtypes they were declared with, under their own names (it binds them by name)."""
        names = dict.fromkeys([*op.inputs, *(n for sub in op.sub_blocks() for n in free_reads(sub))])
        for name in names:
            if name in self.declared and self._dtype(name) != self.declared[name]:
                self._rename_producer(name)

    def _restore(self, op: Op, i: int, name: str) -> None:
        declared = self.declared.get(name)
        if declared is not None and self._dtype(name) != declared:
            op.inputs[i] = self._cast(name, declared, op.index())

    def _rename_producer(self, name: str) -> None:
        """``name`` goes back to its declared dtype: its producer writes ``name.<dtype>`` and a cast
        right after it writes ``name``; later readers that took the low value keep reading it."""
        var = self.block.var(name)
        low_name = _fresh(self.block.program, f"{name}.{var.dtype}")
        self.block.create_var(low_name, var.shape, var.dtype)
        producer = next(op for op in self.block.ops if name in op.outputs)
        producer.outputs[producer.outputs.index(name)] = low_name
        position = producer.index()
        for later in self.block.ops[position + 1:]:
            if not later.sub_blocks():
                later.inputs[:] = [low_name if n == name else n for n in later.inputs]
        var.dtype = self.declared[name]
        self.block.insert_op(position + 1, Op("Cast", [low_name], [name], {"dtype": var.dtype}))
        self.added += 1

    def _in_place(self, op: Op) -> bool:
        return any(n in op.inputs or self.block.var(n).persistable for n in op.outputs)

    def _cast_inputs(self, op: Op, wanted) -> None:
        for i, name in enumerate(op.inputs):
            to = wanted(self._dtype(name))
            if to is not None:
                op.inputs[i] = self._cast(name, to, op.index())

    def _cast(self, name: str, to: str, before: int) -> str:
        """The value ``name`` in dtype ``to``: a Cast inserted before op ``before``, once per value."""
        key = (name, to)
        if key not in self.casts:
            var = self.block.var(name)
            out = _fresh(self.block.program, f"{name}.{to}")
            self.block.create_var(out, var.shape, to)
            self.block.insert_op(before, Op("Cast", [name], [out], {"dtype": to}))
            self.casts[key] = out
            self.added += 1
        return self.casts[key]

    def _retype_outputs(self, op: Op) -> None:
        in_vars = [self.block.var(n) for n in op.inputs]
        specs = infer_specs(op.type, in_vars, op.attrs, self.block, building=False)
        for name, (_, dtype) in zip(op.outputs, specs):
            self.block.var(name).dtype = canonical(dtype)

    def _dtype(self, name: str) -> str | None:
        var = self.block.find_var(name)
        return var.dtype if var is not None else None


def _fresh(program: Program, name: str) -> str:
    return program.unique_name(name) if program.has_name(name) else name
