"""``fuse_relu_grad``: ReLU's gradient, ``where(x > 0, dy, 0)``, as one ``ReluGrad(x, dy)``.

The pattern, in the global block (what ``Relu``'s gradient maker writes)::

    m  = Greater(x, c)        (c: a Constant 0)
    dx = Where(m, dy, z)      (z: a Constant 0; dy, dx shaped and typed as x)

becomes ``dx = ReluGrad(x, dy)`` at the ``Where``'s place: one pass over the
arrays (torch's ``threshold_backward``) instead of a comparison, a bool mask and
a select (~6x slower on torch's CPU kernels: the CNN of issue 34 spent a third of
its step there). ``m`` must be read by nothing else, be neither persistable nor
kept, and ``x`` must not be written between the two ops. The program keeps its
``Greater``/``Where`` (differentiable again); the torch backend runs the rewrite
on its copy (``Backend.program_passes``).
"""
from __future__ import annotations

from ..ir.analysis import read_counts
from ..ir.program import Block, Op, Program


def fuse_relu_grad(program: Program, keep=frozenset()) -> int:
    """Fuse relu's gradient (``where(x > 0, dy, 0)``) into one ``ReluGrad`` op, in place.

    The torch backend applies it to its copy of a program (``threshold_backward``).

    Args:
        program: The program (its global block is rewritten).
        keep: Names that must stay computed (fetches).

    Returns:
        How many were fused.

    Example:
        ```python
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [3])
            x.stop_gradient = False
            loss = rg.sum(rg.relu(x))
            (dx,) = rg.gradients(loss, [x])
        fused = rg.passes.fuse_relu_grad(main, keep=frozenset([dx.name]))
        assert fused == 1 and "ReluGrad(x, " in str(main)
        ```
    """
    block = program.global_block()
    readers = read_counts(program)
    fused = 0
    for select in [op for op in block.ops if op.type == "Where"]:
        compare = _match(block, select, readers, keep)
        if compare is None:
            continue
        new = Op("ReluGrad", [compare.inputs[0], select.inputs[1]], [select.outputs[0]], {},
                 location=select.location)
        block.remove_op(block.ops.index(compare))
        block.insert_op(block.ops.index(select), new)
        block.remove_op(block.ops.index(select))
        block.vars.pop(compare.outputs[0], None)
        fused += 1
    return fused


def _match(block: Block, select: Op, readers: dict[str, int], keep) -> Op | None:
    """The ``Greater(x, 0)`` giving ``select`` its mask when ``select`` is ``where(x > 0, dy, 0)``."""
    mask_name, dy_name, zero_name = select.inputs
    mask = block.find_var(mask_name)
    if mask is None or mask.persistable or mask_name in keep or readers.get(mask_name) != 1:
        return None
    compare = next((op for op in block.ops if mask_name in op.outputs), None)
    if compare is None or compare.type != "Greater" or not _zero_constant(block, compare.inputs[1]):
        return None
    if not _zero_constant(block, zero_name):
        return None
    x, dy, out = (block.find_var(n) for n in (compare.inputs[0], dy_name, select.outputs[0]))
    if x is None or dy is None or out is None or x.dtype not in ("float32", "float64"):
        return None
    if not (x.shape == dy.shape == out.shape and x.dtype == dy.dtype == out.dtype):
        return None
    if x.shape.count(-1) > 1:        # two unknown sizes: equal declarations need not mean equal shapes
        return None
    start, end = block.ops.index(compare), block.ops.index(select)
    if end < start or any(x.name in op.outputs for op in block.ops[start + 1:end]):
        return None
    return compare


def _zero_constant(block: Block, name: str) -> bool:
    """Whether ``name`` is written by a ``Constant`` op of the block holding one 0."""
    op = next((op for op in block.ops if name in op.outputs), None)
    if op is None or op.type != "Constant":
        return False
    value = op.attrs.get("value")
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return isinstance(value, (int, float)) and value == 0 and not isinstance(value, bool)
