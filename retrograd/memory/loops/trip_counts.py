"""The sizes a ``while_loop``'s outputs reach, where the program fixes its trip count.

A While's kept values (``[iterations, ...]``) and its TensorArray loop vars (one row per write)
have sizes its trip count decides. ``resolve_shapes`` asks ``while_shapes`` for them:

* the trip count is the loop's when it counts: the condition compares a loop var with a value
  the planner knows (a constant, a ``Dim`` of a fed shape: ``i < n``, ``i <= n``, ``n > i``),
  the loop var starts at a known value and the body adds 1 to it; else ``max_iters`` bounds it;
  else the sizes stay unknown (the planner names them);
* a TensorArray loop var grows by at most one row per write the body chains onto it
  (``TensorArrayWrite``s from the loop var to the body's result), so ``[rows + iterations *
  writes, *element]`` bounds it, the element shaped as the body's shape rules give for the
  loop's resolved inputs (an element written at a smaller index replaces a row: fewer rows);
* a kept value is ``[iterations, *its shape in the body]``.

The bound is what the memory planner needs (it plans peaks from above).
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.program import Block, Op

_COMPARISONS = {"Less": 0, "LessEqual": 1}          # i < n: n - i0 iterations; i <= n: one more
_FLIPPED = {"Greater": "Less", "GreaterEqual": "LessEqual"}


def int_value(block: Block, name: str, values: dict) -> int | None:
    """The value of the integer scalar ``name`` where the planner knows it: a size it resolved
    (``values``) or an integer Constant of ``block`` or a block above."""
    if name in values:
        return int(values[name])
    for scope in block.ancestors():
        made = next((op for op in reversed(scope.ops) if name in op.outputs), None)
        if made is None:
            continue
        a = made.attrs
        if made.type == "Constant" and str(a.get("dtype", "")).startswith("int") \
                and math.prod(a.get("shape") or ()) == 1:
            return int(np.asarray(a["value"]).reshape(-1)[0])
        return None
    return None


def trip_count(op: Op, values: dict) -> int | None:
    """The While's trip count where the program fixes it (bounded by ``max_iters``), else
    ``max_iters``, else None."""
    counted = _counted(op, values)
    bound = op.attrs.get("max_iters")
    if counted is None:
        return bound
    return counted if bound is None else min(counted, int(bound))


def _counted(op: Op, values: dict) -> int | None:
    a = op.attrs
    cond, body = a["cond"], a["body"]
    made = next((o for o in cond.ops if a["cond_out"] in o.outputs), None)
    if made is None or len(made.inputs) != 2:
        return None
    kind, (left, right) = made.type, made.inputs
    if kind in _FLIPPED:
        kind, left, right = _FLIPPED[kind], right, left
    if kind not in _COMPARISONS or left not in a["cond_binds"]:
        return None
    k = a["cond_binds"].index(left)
    start, stop = int_value(op.block, op.inputs[k], values), int_value(cond, right, values)
    if start is None or stop is None or not _adds_one(body, a["carry_binds"][k], a["body_outs"][k], values):
        return None
    return max(0, stop - start + _COMPARISONS[kind])


def _adds_one(body: Block, carry: str, out: str, values: dict) -> bool:
    made = next((o for o in body.ops if out in o.outputs), None)
    if made is None or made.type != "Add" or carry not in made.inputs:
        return False
    other = [n for n in made.inputs if n != carry]
    return len(other) == 1 and int_value(body, other[0], values) == 1


def _writes(body: Block, carry: str, out: str) -> int | None:
    """How many TensorArrayWrites chain the loop var ``carry`` to the body's result ``out``."""
    count, name = 0, out
    while name != carry:
        made = next((o for o in body.ops if name in o.outputs), None)
        if made is None or made.type != "TensorArrayWrite":
            return None
        count, name = count + 1, made.inputs[0]
    return count


def while_shapes(op: Op, shapes: dict, values: dict, resolve) -> None:
    """Set the shapes of the While's kept values and TensorArray loop vars that its trip count
    decides, and of its body's values at the loop's resolved inputs (``resolve``:
    ``resolve_shapes``), each array loop var at its largest."""
    a = op.attrs
    n = len(a["carry_binds"])
    trips = trip_count(op, values)
    known = _known_inputs(op, shapes, a["carry_binds"], list(range(n)))
    inner = _resolved(resolve, a["body"], known)
    if trips is None or inner is None:
        return
    grown = {}
    for j in a.get("array_carries") or []:
        writes = _writes(a["body"], a["carry_binds"][j], a["body_outs"][j])
        rows = shapes.get(op.inputs[j], (-1,))[0]
        element = _written_element(a["body"], a["body_outs"][j], inner)
        if writes is not None and rows >= 0 and element is not None and all(d >= 0 for d in element):
            shapes[op.outputs[j]] = grown[a["carry_binds"][j]] = (rows + trips * writes,) + tuple(element)
    for m, y in enumerate(a["ys"]):
        shape = inner.get(y)
        if shape is not None and all(d >= 0 for d in shape):
            shapes[op.outputs[n + 1 + m]] = (trips,) + tuple(shape)
    if grown:       # the body again with each array at its largest
        inner = _resolved(resolve, a["body"], {**known, **grown}) or inner
    _keep_body_shapes(a["body"], inner, shapes)


def scan_shapes(op: Op, shapes: dict, values: dict, resolve) -> None:
    """The shapes of a Scan's (``rg.scan``'s, a loop gradient's) stacked values ``[n, *y]`` where
    its trip count n is known (a ``Dim`` of a fed shape), and of its body values at its resolved
    inputs: carries, rows of the sliced inputs, outer values."""
    a = op.attrs
    c, s = len(a["carry_binds"]), len(a["x_binds"])
    known = _known_inputs(op, shapes, list(a["carry_binds"]) + list(a["x_binds"]), list(range(1, 1 + c + s)))
    for name, x in zip(a["x_binds"], op.inputs[1 + c:1 + c + s]):
        if name in known:
            known[name] = known[name][1:]
    inner = _resolved(resolve, a["body"], known)
    if inner is None:
        return
    _keep_body_shapes(a["body"], inner, shapes)
    trips = int_value(op.block, op.inputs[0], values)
    for m, (y, like) in enumerate(zip(a["ys"], a["ys_like"])):
        shape = inner.get(y) if like is None else None
        out = op.outputs[c + m]
        if trips is not None and shape is not None and all(d >= 0 for d in shape) \
                and any(d < 0 for d in shapes.get(out, (-1,))):
            shapes[out] = (trips,) + tuple(shape)


def budget_grad_shapes(op: Op, shapes: dict, resolve) -> None:
    """The shapes of a WhileBudgetGrad's body values (``while_budget.py``: the reversed Scan of a
    budgeted While): its carries, the rows of the forward's kept values (the forward body's
    values, resolved by ``while_shapes``), outer values."""
    a = op.attrs
    c = len(a["carry_binds"])
    known = _known_inputs(op, shapes, list(a["carry_binds"]), list(range(1, 1 + c)))
    known = {k: v for k, v in known.items() if k in a["carry_binds"]
             or k in op.inputs[1 + c:1 + c + int(a["n_consts"])]}
    known.update({x: shapes[x] for x in a["x_binds"] if x in shapes})
    inner = _resolved(resolve, a["body"], known)
    if inner is not None:
        _keep_body_shapes(a["body"], inner, shapes)


def _known_inputs(op: Op, shapes: dict, binds: list, positions: list) -> dict:
    """The op's inputs of fully known shape, under the names its body reads them by."""
    bound = dict(zip(positions, binds))
    known = {}
    for p, name in enumerate(op.inputs):
        shape = shapes.get(name, op.block.var(name).shape)
        if all(d >= 0 for d in shape) and (p in bound or p > max(positions, default=-1)):
            known[bound.get(p, name)] = tuple(shape)
    return known


def _resolved(resolve, body: Block, known: dict) -> dict | None:
    try:
        return resolve(body, known)
    except Exception:       # a body the rules cannot resolve leaves the sizes unknown
        return None


_ARRAY_OPS = ("TensorArrayWrite", "TensorArrayWriteGrad")


def _keep_body_shapes(body: Block, inner: dict, shapes: dict) -> None:
    """The body's own values of fully known shape, for sizing them (``Sizer.var_bytes``). An
    array a write (or its gradient) makes has at most the rows of the array it was given: with
    the loop's arrays at their largest, a bound (its rows are a value, not a shape)."""
    for op in body.ops:
        if op.type in _ARRAY_OPS and op.outputs[0] in inner and op.inputs[0] in inner:
            given, made = inner[op.inputs[0]], inner[op.outputs[0]]
            if given[0] >= 0 and made[0] < 0 and len(given) == len(made):
                inner[op.outputs[0]] = (given[0],) + tuple(m if m >= 0 else g for m, g in zip(made[1:], given[1:]))
    for name in body.vars:
        shape = inner.get(name)
        if shape is not None and all(d >= 0 for d in shape) and name not in shapes:
            shapes[name] = tuple(shape)


def unbounded_loops(block: Block, unknown) -> str:
    """What to do about the While ops of ``block`` whose outputs have sizes the planner could not
    give (``unknown``): each named, with how to bound its trip count (empty when none)."""
    unknown = set(unknown)
    loops = [op for op in block.ops if op.type in ("While", "Scan") and unknown & set(op.outputs)]
    if not loops:
        return ""
    named = "; ".join(op.where() for op in loops[:3])
    return (f"the trip count of the loop at {named} is known only at run time: bound a while_loop with "
            "max_iters= or count it against a size feed_shapes gives (i < n); a scan's is its xs' "
            "length, a fori_loop's its bounds (ints, or sizes feed_shapes gives); or ")


def largest_loop_vars(sizer, op: Op) -> int:
    """Bytes of a While's loop vars at their largest: a loop var that grows (a TensorArray) at
    its final size (``while_shapes``' bound), the others as given."""
    n = len(op.attrs["carry_binds"])
    return sum(max(sizer.of(i), sizer.of(o)) for i, o in zip(op.inputs[:n], op.outputs[:n]))


def _written_element(body: Block, out: str, inner: dict):
    made = next((o for o in body.ops if out in o.outputs), None)
    return None if made is None else inner.get(made.inputs[2])
