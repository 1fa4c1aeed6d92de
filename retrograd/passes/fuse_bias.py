"""``fuse_linear_bias``: a product followed by its bias add as one ``SeqLinear`` with the bias;
``fuse_conv_bias``: a convolution followed by its bias add as one ``ConvBias``.

The pattern, in the global block (what ``layers.fc`` builds: the product, then
``+ b``)::

    y   = MatMul(x, w)      (x [N, D], w [D, K], no transposes)   |  SeqLinear(x, w)
    out = Add(y, b)         (b [K], y's dtype)

becomes ``out = SeqLinear(x, w, b)`` at the ``Add``'s place: one product that
adds the bias as it writes (torch: ``addmm``, ``Backend.linear``) instead of a
second pass over ``[N, K]``. ``y`` must be read by nothing else (in any
block), be neither persistable nor kept (fetched), and ``x``/``w`` must not be
written between the two ops. Gradient ops read ``out``'s gradient, ``x`` and
``w``, never ``y``, so a training program keeps its backward unchanged. The
torch backend runs it on every program (``Backend.program_passes``).

``fuse_conv_bias`` does the same for what ``layers.conv2d`` / ``conv1d`` build::

    y   = Conv(x, w)
    rb  = Reshape(b; shape=[-1, 1, ...])     (b [F], w [F, ...], y's dtype)
    out = Add(y, rb)

becomes ``out = ConvBias(x, w, b)`` (torch: oneDNN's convolution adds the bias
as it writes, where the add was a second pass over ``[N, F, *out]``), on the
same conditions; the ``Reshape`` stays for whatever else reads it.
"""
from __future__ import annotations

from ..ir.analysis import read_counts
from ..ir.program import Block, Op, Program


def fuse_linear_bias(program: Program, keep=frozenset()) -> int:
    """Fuse ``MatMul(x, w)`` then ``Add(y, b)`` into one ``SeqLinear(x, w, b)`` wherever it matches, in place.

    The pattern and its conditions are in the module docstring; the torch
    backend runs it on every program (``Backend.program_passes``).

    Args:
        program: The program to rewrite (its global block).
        keep: Names of values that must stay computed (fetches).

    Returns:
        How many matches were fused.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            y = rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc")   # MatMul + Add
        fused = rg.passes.fuse_linear_bias(main, keep={"fc"})
        assert fused == 1 and [op.type for op in main.global_block().ops] == ["SeqLinear"]
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.ones((1, 3), "float32")}, fetch_list=["fc"])
        assert np.allclose(out, exe.scope.get("fc.w").sum(axis=0) + exe.scope.get("fc.b"))
        ```
    """
    block = program.global_block()
    readers = read_counts(program)
    fused = 0
    for add in [op for op in block.ops if op.type == "Add"]:
        product = _match(block, add, readers, keep)
        if product is None:
            continue
        x, w = product.inputs[0], product.inputs[1]
        new = Op("SeqLinear", [x, w, add.inputs[1]], [add.outputs[0]], {"transpose_w": False},
                 location=add.location)
        block.remove_op(block.ops.index(product))
        block.insert_op(block.ops.index(add), new)
        block.remove_op(block.ops.index(add))
        block.vars.pop(product.outputs[0], None)
        fused += 1
    return fused


def _match(block: Block, add: Op, readers: dict[str, int], keep) -> Op | None:
    """The MatMul / SeqLinear feeding ``add`` as its unbiased product, or None."""
    if len(add.inputs) != 2:
        return None
    y, b = (block.find_var(n) for n in add.inputs)
    if y is None or b is None or y.persistable or y.name in keep or readers.get(y.name) != 1:
        return None
    product = next((op for op in block.ops if y.name in op.outputs), None)
    if product is None or len(product.outputs) != 1 or not _unbiased_product(block, product):
        return None
    width = block.find_var(product.inputs[1]).shape[-1]
    if b.ndim != 1 or b.dtype != y.dtype or b.shape[0] != width or width < 0:
        return None
    start, end = block.ops.index(product), block.ops.index(add)
    operands = set(product.inputs)
    if any(operands & set(op.outputs) for op in block.ops[start + 1:end]):
        return None
    return product


def _unbiased_product(block: Block, op: Op) -> bool:
    """``x @ w`` with a 2-D ``w`` and no transposes (MatMul of a 2-D ``x``, or SeqLinear)."""
    if op.type == "SeqLinear":
        return len(op.inputs) == 2 and not op.attrs.get("transpose_w")
    if op.type != "MatMul" or op.attrs.get("transpose_x") or op.attrs.get("transpose_y"):
        return False
    x, w = (block.find_var(n) for n in op.inputs)
    return x is not None and w is not None and x.ndim == 2 and w.ndim == 2


def fuse_conv_bias(program: Program, keep=frozenset()) -> int:
    """Fuse ``Conv(x, w)`` then ``Add(y, Reshape(b))`` into one ``ConvBias(x, w, b)``, in place.

    The pattern and its conditions are in the module docstring; the torch
    backend runs it on every program (``Backend.program_passes``).

    Args:
        program: The program to rewrite (its global block).
        keep: Names of values that must stay computed (fetches).

    Returns:
        How many matches were fused.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            y = rg.layers.conv2d(rg.data("x", [-1, 1, 4, 4]), 2, 3, padding=1, name="c")   # Conv + Add
        assert rg.passes.fuse_conv_bias(main, keep={"c"}) == 1
        assert "ConvBias" in [op.type for op in main.global_block().ops]
        exe = rg.Executor()
        exe.run(startup)
        (out,) = exe.run(main, feed={"x": np.zeros((1, 1, 4, 4), "float32")}, fetch_list=["c"])
        assert np.allclose(out, exe.scope.get("c.b").reshape(1, 2, 1, 1))
        ```
    """
    block = program.global_block()
    readers = read_counts(program)
    fused = 0
    for add in [op for op in block.ops if op.type == "Add"]:
        match = _match_conv(block, add, readers, keep)
        if match is None:
            continue
        conv, bias = match
        new = Op("ConvBias", [conv.inputs[0], conv.inputs[1], bias], [add.outputs[0]], dict(conv.attrs),
                 location=add.location)
        block.remove_op(block.ops.index(conv))
        block.insert_op(block.ops.index(add), new)
        block.remove_op(block.ops.index(add))
        block.vars.pop(conv.outputs[0], None)
        fused += 1
    return fused


def _match_conv(block: Block, add: Op, readers: dict[str, int], keep) -> tuple[Op, str] | None:
    """(the Conv feeding ``add``, the name of its 1-D bias), or None."""
    if len(add.inputs) != 2:
        return None
    producers = {name: next((op for op in block.ops if name in op.outputs), None) for name in add.inputs}
    conv, reshape = (producers[n] for n in add.inputs)
    if conv is None or conv.type != "Conv" or len(conv.outputs) != 1 or len(conv.inputs) != 2:
        return None
    y, rb, out = (block.find_var(n) for n in (*add.inputs, add.outputs[0]))
    if y is None or out is None or y.persistable or y.name in keep or readers.get(y.name) != 1:
        return None
    if reshape is None or reshape.type != "Reshape" or len(reshape.inputs) != 1:
        return None
    b, w = block.find_var(reshape.inputs[0]), block.find_var(conv.inputs[1])
    filters = w.shape[0] if w is not None else -1
    if (b is None or b.ndim != 1 or b.dtype != y.dtype or filters < 0 or b.shape[0] != filters
            or tuple(rb.shape) != (filters,) + (1,) * (y.ndim - 2) or out.ndim != y.ndim):
        return None
    start, end = min(block.ops.index(conv), block.ops.index(reshape)), block.ops.index(add)
    operands = set(conv.inputs) | {b.name}
    if any(operands & set(op.outputs) for op in block.ops[start + 1:end]):
        return None
    return conv, b.name
