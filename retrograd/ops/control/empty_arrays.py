"""The element shape of a ``while_loop``'s TensorArray that no iteration wrote.

``TensorArray(element_shape=[-1, D])`` starts as ``[0, 0, D]``: the -1 sizes are set by the
first write. A ``while_loop`` that runs zero iterations (or whose body never writes) hands the
array back unwritten, and its stack would be ``[0, 0, D]`` where NumPy's ``np.stack`` of the rows
the body writes gives ``[0, N, D]``. The body is not run (its condition is false: running it
could fail, e.g. reading row ``i`` of an empty sequence), so the sizes come from shapes alone:

* ``element_sources`` re-runs the shape rules of the body's ops on probe shapes in which every
  run-time size of the loop's inputs (initial loop vars, outer values the body reads) is a
  distinct sentinel; a -1 element size that comes out as an input's sentinel is that input's
  size at run time (``[N, D]`` written from ``x[i]`` of ``x [T, N, D]``: x's axis 1). Where a
  rule refuses two different sentinels (``h + x[i]``: N and N'), they are made one (the op
  would refuse them at run time too unless they are equal). A size that comes out otherwise
  (computed from several sizes, or from values: a reshape to a fed shape) stays unknown.
* The kernels and the ONNX lowering take those sizes of the run-time inputs for every array
  that is still empty after the loop (``[0, *sizes]``). Where a size stays unknown
  (``unresolved``), ``stack()`` (and ``gather``/``concat``) reads the array through a
  ``TensorArrayStack`` check: an ExecutionError naming the TensorArray, the while_loop and the
  line when the array is empty, as TensorFlow refuses to stack an empty list with a partly
  unknown element shape (its ``size()`` still reads 0).
"""
from __future__ import annotations

from typing import Sequence

from ...ir.program import Op, Var
from ..core.registry import get_op_def

_BASES = (1_000_003, 2_000_029)     # two probes: a size equal in both that is no sentinel is a constant
_STRIDE = 1_009
_MAX_MERGES = 16


def element_sources(op: Op, j: int) -> list:
    """For loop var ``j`` (a TensorArray) of a While, one entry per element axis: an int (a size
    known when built or the same in every probe), ``(input position, axis)`` (that input's
    run-time size) or None (unknown)."""
    attrs = op.attrs
    body, n = attrs["body"], len(attrs["carry_binds"])
    name = attrs["body_outs"][j]
    declared = op.block.var(op.inputs[j]).shape[1:]
    dims = _input_dims(op, n)
    classes = {key: c for c, key in enumerate(dims)}      # (position, axis) -> class
    for _ in range(_MAX_MERGES):
        probes = [_probe(op, body, n, dims, classes, base) for base in _BASES]
        failed = next((p for p in probes if isinstance(p, tuple)), None)
        if failed is None:
            break
        if not _merge(classes, failed):
            return [d if d >= 0 else None for d in declared]
    else:
        return [d if d >= 0 else None for d in declared]
    shapes = [p.get(name) for p in probes]
    if shapes[0] is None or len(shapes[0]) != len(declared) + 1:
        return [d if d >= 0 else None for d in declared]
    members = {}
    for key, c in classes.items():
        members.setdefault(c, key)
    out = []
    for axis, d in enumerate(declared):
        a, b = shapes[0][axis + 1], shapes[1][axis + 1]
        if d >= 0:
            out.append(d)
        elif a == b and 0 <= a < _BASES[0]:
            out.append(int(a))
        else:
            c = _class_of(a, _BASES[0])
            out.append(members[c] if c is not None and c == _class_of(b, _BASES[1]) else None)
    return out


def _input_dims(op: Op, n: int) -> list[tuple[int, int]]:
    """Every (input position, axis) of the While whose size is known only at run time, but a
    TensorArray loop var's element axes (an unwritten array has 0 there)."""
    arrays = set(op.attrs.get("array_carries") or ())
    return [(p, axis) for p, name in enumerate(op.inputs)
            for axis, d in enumerate(op.block.var(name).shape) if d < 0 and not (p in arrays and axis > 0)]


def _class_of(size: int, base: int) -> int | None:
    c, rest = divmod(size - base, _STRIDE)
    return c if rest == 0 and c >= 0 else None


def _probe(op: Op, body, n: int, dims, classes: dict, base: int):
    """The body's shapes with the inputs' run-time sizes as sentinels of ``base``; on a rule
    that refuses them, ``(sentinel classes among that op's inputs,)`` instead."""
    sentinel = {key: base + _STRIDE * classes[key] for key in dims}
    shapes: dict[str, tuple] = {}
    for p, name in enumerate(op.inputs):
        shape = tuple(sentinel.get((p, axis), d) for axis, d in enumerate(op.block.var(name).shape))
        shapes[op.attrs["carry_binds"][p] if p < n else name] = shape
    return _walk(body, shapes, base)


def _walk(block, shapes: dict, base: int):
    """``shapes`` completed over ``block``'s ops (a failure tuple as ``_probe``'s)."""
    for inner in block.ops:
        ins = [block.find_var(name) for name in inner.inputs]
        if any(v is None for v in ins):
            continue
        probes = [Var(v.block, v.name, shapes.get(v.name, v.shape), v.dtype) for v in ins]
        rule = _ON_EMPTY.get(inner.type, get_op_def(inner.type).infer)
        try:
            specs = [shape for shape, _ in rule(probes, inner.attrs)]
        except Exception:       # a rule refusing the probe (sentinel sizes that differ, say)
            found = {_class_of(d, base) for v in probes for d in v.shape} - {None}
            return (tuple(sorted(found)),)
        nested = _NESTED.get(inner.type)
        if nested is not None:
            specs = nested(inner, probes, specs, shapes, base)
            if isinstance(specs, tuple):
                return specs
        for out, shape in zip(inner.outputs, specs):
            var = block.find_var(out)
            declared = var.shape if var is not None else tuple(shape)
            if len(declared) == len(shape):
                shapes[out] = tuple(d if d >= 0 else int(s) for d, s in zip(declared, shape))
    return shapes


def _if_shapes(op: Op, probes, specs, shapes: dict, base: int):
    """An If's outputs: each branch walked on the operands' probe shapes; a size the branches
    agree on (else the rule's)."""
    a = op.attrs
    found = []
    for block, binds, outs in zip(a["blocks"], a["binds"], a["outs"]):
        inner = _walk(block, {**shapes, **{b: v.shape for b, v in zip(binds, probes[1:])}}, base)
        if isinstance(inner, tuple):
            return inner
        found.append([inner.get(o) if isinstance(o, str) else None if o is None else probes[1 + o].shape
                      for o in outs])
    merged = []
    for i, shape in enumerate(specs):
        got = [f[i] for f in found if f[i] is not None]
        if got and all(len(g) == len(shape) for g in got):
            shape = tuple(g[0] if all(x[k] == g[0] for x in got) and g[0] >= 0 else d
                          for k, (g, d) in enumerate(zip(zip(*got), shape)))
        merged.append(shape)
    return merged


def _while_shapes(op: Op, probes, specs, shapes: dict, base: int):
    """A While's loop vars keep their shapes (without shape_invariants): the initial ones'; a
    TensorArray loop var keeps its elements' (its rows change)."""
    n = len(op.attrs["carry_binds"])
    if not op.attrs.get("ragged"):
        return [probes[j].shape if j < n else shape for j, shape in enumerate(specs)]
    out = list(specs)
    for j in op.attrs.get("array_carries") or ():
        given = probes[j].shape
        if len(given) == len(out[j]):
            out[j] = (out[j][0],) + tuple(g if g >= 0 else d for g, d in zip(given[1:], out[j][1:]))
    return out


_NESTED = {"If": _if_shapes, "While": _while_shapes}


# An empty array takes the sizes of the element written into it (the kernel's first write), where
# the shape rule keeps only the sizes the array and the element share.
_ON_EMPTY = {"TensorArrayWrite": lambda ins, attrs: [((-1,) + tuple(ins[2].shape), ins[0].dtype), ((), "int64")]}


def _merge(classes: dict, failed: tuple) -> bool:
    """Make the first two sentinel classes of a refusing op one; False when there are none."""
    found = failed[0]
    if len(found) < 2:
        return False
    keep, drop = found[0], found[1]
    for key, c in classes.items():
        if c == drop:
            classes[key] = keep
    return True


def array_sources(op: Op) -> dict[int, list]:
    """``element_sources`` of each TensorArray loop var with -1 element sizes (``array_carries``)."""
    return {j: element_sources(op, j) for j in op.attrs.get("array_carries") or []}


def unresolved(block, name: str) -> str | None:
    """For the value ``name`` of ``block``: when a While's TensorArray loop var gives it and a size
    of its elements follows from no input shape, why its stack has no shape when no iteration
    wrote it (the message of the ExecutionError reading it raises); else None."""
    made = next((op for op in reversed(block.ops) if name in op.outputs), None)
    if made is None or made.type != "While":
        return None
    j = made.outputs.index(name)
    if j not in (made.attrs.get("array_carries") or ()):
        return None
    sources = element_sources(made, j)
    if all(s is not None for s in sources):
        return None
    declared = list(made.block.var(made.inputs[j]).shape[1:])
    unknown = ", ".join(str(axis) for axis, s in enumerate(sources) if s is None)
    return (f"the while_loop at {made.where()} wrote nothing into the TensorArray '{made.inputs[j]}' "
            f"(loop var {j}, element_shape {declared}), and the size of element axis {unknown} (declared -1) "
            "follows from no shape the loop's inputs have, so its stack has no shape (TensorFlow refuses "
            "to stack it too; its size() still reads 0). Declare the size in element_shape, or write "
            "the array before the loop")


def fill_empty(k, inputs: Sequence, outputs: list) -> list:
    """The While kernel's outputs with each TensorArray loop var still empty ``[0, *sizes]`` where
    ``element_sources`` gives every size (else unchanged: reading its stack raises, ``unresolved``)."""
    op, xp = k.op, k.xp
    for j in op.attrs.get("array_carries") or []:
        arr = outputs[j]
        if arr.shape[0] != 0 or any(arr.shape[1 + a] != 0 for a in _unknown_axes(op, j)):
            continue        # written, or empty with sizes of its own (the rows of a value)
        sources = element_sources(op, j)
        if any(s is None for s in sources):
            continue
        shape = [s if isinstance(s, int) else inputs[s[0]].shape[s[1]] for s in sources]
        outputs[j] = xp.zeros((0,) + tuple(int(d) for d in shape), dtype=arr.dtype)
    return outputs


def _unknown_axes(op: Op, j: int) -> list[int]:
    """The element axes declared -1 of the While's loop var ``j``."""
    return [a for a, d in enumerate(op.block.var(op.inputs[j]).shape[1:]) if d < 0]


def fill_empty_onnx(g, finals: list[str]) -> list[str]:
    """``fill_empty`` in ONNX: each TensorArray loop var whose sizes ``element_sources`` gives,
    reshaped to ``[0, *sizes]`` where it is empty with 0 for them (its rows and those sizes all 0:
    the max of them is 0); its own shape otherwise."""
    op = g.op
    out = list(finals)
    for j in op.attrs.get("array_carries") or []:
        sources = element_sources(op, j)
        if any(s is None for s in sources):
            continue
        arr = finals[j]
        own = g.node("Shape", [arr])
        unknown = g.node("Gather", [own, g.const([0] + [1 + a for a in _unknown_axes(op, j)], "int64")])
        placeholder = g.node("Equal", [g.node("ReduceMax", [unknown], keepdims=0), g.const(0, "int64")])
        sizes = [g.const([s], "int64") if isinstance(s, int)
                 else g.node("Shape", [g.ins[s[0]]], start=s[1], end=s[1] + 1) for s in sources]
        wanted = g.node("Concat", [g.const([0], "int64")] + sizes, axis=0)
        shape = g.node("Where", [placeholder, wanted, own])
        out[j] = g.node("Reshape", [arr, shape], allowzero=1)
    return out
