"""``rg.einsum``: NumPy's subscripts over any number of operands, and its gradient.

The equation is checked against the operands when the op is built and stored
explicit ("ij,jk->ik": ``...`` replaced by letters, the implicit output
written out), so kernels, lowering and gradient read one form. The gradient of
operand k is one more einsum: of the other operands and the output gradient,
into operand k's subscripts. A letter only operand k has (summed away, as j
in "ij->i") comes back as a ones vector; a repeated letter (a diagonal, "ii")
through an identity matrix — both built from ``arange`` of the run-time size,
so gradients of gradients are einsums too.
"""
from __future__ import annotations

import math
import string
from typing import Sequence

from ...errors import ShapeError
from ...ir.dtypes import is_float
from ...ir.program import Var
from .creation import constant, fill_like
from ..core.lowering import lowers
from ..math.elementwise import equal
from ..core.registry import append_op, defop
from .shape_ops import arange, broadcast_to
from .tensor import cast, dim, unsqueeze

LETTERS = string.ascii_letters


def _split(equation: str) -> tuple[list[str], str | None]:
    equation = equation.replace(" ", "")
    if equation.count("->") > 1:
        raise ShapeError(f"einsum equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = equation.partition("->")
    return lhs.split(","), (rhs if arrow else None)


def _expand_ellipses(inputs: list[str], output: str | None, ranks: list[int]):
    """Replace '...' by fresh letters, right-aligned as NumPy broadcasts them."""
    used = set("".join(inputs) + (output or ""))
    fresh = [c for c in LETTERS if c not in used]
    widths = []
    for subs, rank in zip(inputs, ranks):
        if "..." in subs:
            widths.append(rank - (len(subs) - 3))
            if widths[-1] < 0:
                raise ShapeError(f"einsum subscripts {subs!r} have more letters than the rank {rank}")
    width = max(widths, default=0)
    dots = "".join(fresh[:width])
    expanded = [subs.replace("...", dots[width - (rank - (len(subs) - 3)):]) if "..." in subs else subs
                for subs, rank in zip(inputs, ranks)]
    if output is not None and "..." in output:
        output = output.replace("...", dots)
    return expanded, output, dots


def normalize_equation(equation: str, shapes: Sequence[Sequence[int]]) -> str:
    """The explicit equation ("ij,jk->ik") for operands of ``shapes``; ShapeError when they do
    not match (operand count, subscripts per rank, sizes of one letter, unknown letters)."""
    if not isinstance(equation, str):
        raise ShapeError(f"einsum equation must be a string, got {type(equation).__name__}")
    inputs, output = _split(equation)
    if len(inputs) != len(shapes):
        raise ShapeError(f"einsum equation {equation!r} names {len(inputs)} operands, got {len(shapes)}")
    for text in inputs + ([output] if output is not None else []):
        bad = set(text.replace("...", "")) - set(LETTERS)
        if bad or text.count("...") > 1:
            raise ShapeError(f"einsum subscripts {text!r} may hold letters and one '...', got {sorted(bad)}")
    inputs, output, dots = _expand_ellipses(inputs, output, [len(s) for s in shapes])
    for i, (subs, shape) in enumerate(zip(inputs, shapes)):
        if len(subs) != len(shape):
            raise ShapeError(f"einsum operand {i} has {len(shape)} axes but subscripts {subs!r} "
                             f"({equation!r})")
    if output is None:
        joined = "".join(inputs)
        output = dots + "".join(sorted(c for c in set(joined) if joined.count(c) == 1 and c not in dots))
    if len(set(output)) != len(output) or set(output) - set("".join(inputs)):
        raise ShapeError(f"einsum output {output!r} must name distinct letters of the inputs ({equation!r})")
    letter_sizes(inputs, shapes, equation, broadcast=dots)
    return ",".join(inputs) + "->" + output


def letter_sizes(inputs: list[str], shapes, equation: str, broadcast: str = "") -> dict[str, int]:
    """Each letter's size (-1 when unknown); ShapeError when two known sizes differ (for the
    letters in ``broadcast``, the ellipsis' axes, a size 1 broadcasts as NumPy's)."""
    sizes: dict[str, int] = {}
    for i, (subs, shape) in enumerate(zip(inputs, shapes)):
        for letter, d in zip(subs, shape):
            known = sizes.get(letter, -1)
            if letter in broadcast and 1 in (d, known):
                sizes[letter] = known if d == 1 else d
                continue
            if d >= 0 and known >= 0 and d != known:
                raise ShapeError(f"einsum {equation!r}: letter {letter!r} has size {known} and {d} "
                                 f"(operand {i})")
            sizes[letter] = d if d >= 0 else known
    return sizes


def _einsum_rule(ins, attrs):
    if not ins:
        raise ShapeError("einsum needs at least one operand")
    dtypes = {v.dtype for v in ins}
    if len(dtypes) > 1:
        raise ShapeError(f"einsum operands must share one dtype, got {', '.join(sorted(dtypes))}")
    equation = attrs["equation"]
    if normalize_equation(equation, [v.shape for v in ins]) != equation:
        raise ShapeError(f"einsum equation {equation!r} is not in explicit form")
    inputs, output = _split(equation)
    sizes = letter_sizes(inputs, [v.shape for v in ins], equation)
    return [(tuple(sizes[c] for c in output), ins[0].dtype)]


def _operand_grad(g, k: int) -> Var:
    """d(loss)/d(operand k): an einsum of the other operands and dy into operand k's subscripts."""
    inputs, output = _split(g.attrs["equation"])
    x = g.x[k]
    terms = [(subs, v) for i, (subs, v) in enumerate(zip(inputs, g.x)) if i != k] + [(output, g.dy)]
    present = set("".join(subs for subs, _ in terms))
    fresh = iter(c for c in LETTERS if c not in set(g.attrs["equation"]))
    target, seen = [], {}
    for axis, letter in enumerate(inputs[k]):
        if letter in seen:                  # a diagonal: a fresh letter, tied by an identity
            again = next(fresh)
            terms.append((seen[letter][1] + again, _identity(x, seen[letter][0], g.dy.dtype)))
            target.append(again)
            continue
        seen[letter] = (axis, letter)
        if letter not in present:           # summed away in operand k alone: dy is the same along it
            terms.append((letter, _ones(x, axis, g.dy.dtype)))
            present.add(letter)
        target.append(letter)
    equation = ",".join(subs for subs, _ in terms) + "->" + "".join(target)
    return append_op("Einsum", [v for _, v in terms], {"equation": equation})[0]


def _positions(x: Var, axis: int) -> Var:
    return arange(dim(x, axis))


def _ones(x: Var, axis: int, dtype: str) -> Var:
    return fill_like(_positions(x, axis), 1.0, dtype)


def _identity(x: Var, axis: int, dtype: str) -> Var:
    positions = _positions(x, axis)
    return cast(equal(unsqueeze(positions, 1), unsqueeze(positions, 0)), dtype)


def _einsum_grad(g):
    if not is_float(g.dy.dtype):
        return [None] * len(g.x)
    return [_operand_grad(g, k) for k in range(len(g.x))]


def _einsum_flops(ins, outs, attrs) -> int:
    sizes = {}
    for letters, shape in zip(attrs["equation"].split("->")[0].split(","), ins):
        sizes.update(zip(letters, shape))
    return 2 * math.prod(sizes.values())      # one multiply-add per point of the index space


@defop("Einsum", inputs=("xs*",), infer=_einsum_rule, grad=_einsum_grad, flops=_einsum_flops)
def _einsum(k, *xs):
    """``numpy.einsum`` of the operands by the explicit ``equation``."""
    return k.backend.einsum(k.attrs["equation"], *xs)


@lowers("Einsum")
def _einsum_onnx(g):
    """ONNX Einsum, behind an If where an operand may be empty at run time: onnxruntime's kernel
    dies (SIGFPE) on a size-0 letter, so an empty operand gives zeros of the output's shape."""
    equation = g.attrs["equation"]
    if all(d > 0 for v in g.in_vars for d in v.shape):
        return [g.node("Einsum", g.ins, equation=equation)]
    inputs, output = _split(equation)
    dtype = g.out_vars[0].dtype
    if any(d == 0 for v in g.in_vars for d in v.shape):   # empty when built: no Einsum node at all
        # (onnxruntime folds an Einsum of initializers when the session is made, even in an If's
        # branch that never runs, and dies there)
        return [g.fill(g.node("Concat", [_onnx_letter_size(g, inputs, c) for c in output], axis=0)
                       if output else g.const([], "int64"), 0, dtype)]
    full = g.child()
    result = full.node("Einsum", g.ins, equation=equation)
    zeros = g.child()
    filled = zeros.fill(zeros.node("Concat", [_onnx_letter_size(zeros, inputs, c) for c in output], axis=0)
                        if output else zeros.const([], "int64"), 0, dtype)
    sizes = [g.node("ReduceProd", [g.shape(x)], keepdims=1) for x in g.ins]
    least = g.node("ReduceMin", [g.node("Concat", sizes, axis=0)], keepdims=0)
    empty = g.node("Equal", [least, g.const(0, "int64")])
    name, rank = g.op.outputs[0], [None] * len(output)     # (a rank: the If may be in a loop body)
    return [g.node("If", [empty], then_branch=zeros.finish(f"{name}.empty", [(filled, dtype, rank)]),
                   else_branch=full.finish(f"{name}.full", [(result, dtype, rank)]))]


def _onnx_letter_size(g, inputs: list[str], letter: str) -> str:
    """The run-time size of ``letter`` (int64 ``[1]``): its first operand's axis."""
    i = next(i for i, subs in enumerate(inputs) if letter in subs)
    return g.dim(g.ins[i], inputs[i].index(letter))


def einsum(equation: str, *xs) -> Var:
    """Sums of products over named axes: ``numpy.einsum``'s subscripts, any number of operands.

    The output may be explicit (``"ij,jk->ik"``) or implicit (``"ij,jk"``: the
    letters used once, in alphabetical order); ``...`` stands for the axes no
    letter names. Every float operand gets a gradient, itself an einsum (so
    second order works).

    Args:
        equation: The subscripts.
        *xs: The operands, one per term of the equation.

    Returns:
        The result Var.

    Raises:
        ShapeError: The equation does not match its operands (count, ranks, sizes).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            q = rg.data("q", [-1, 3, 4])
            k = rg.data("k", [-1, 5, 4])
            m = rg.data("m", [3, 3])
            scores = rg.einsum("nld,nsd->nls", q, k)       # batched q @ k^T
            trace = rg.einsum("ii", m)
        qv, kv, mv = np.ones((2, 3, 4), "float32"), np.ones((2, 5, 4), "float32"), np.eye(3, dtype="float32")
        s, t = rg.Executor().run(main, feed={"q": qv, "k": kv, "m": mv}, fetch_list=[scores, trace])
        assert s.shape == (2, 3, 5) and np.allclose(s, 4.0) and t == 3.0
        ```
    """
    if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
        xs = tuple(xs[0])
    operands = [x if isinstance(x, Var) else None for x in xs]
    like = next((x for x in operands if x is not None), None)
    operands = [x if x is not None else constant(v, like.dtype if like is not None else None)
                for x, v in zip(operands, xs)]
    operands = _broadcast_ellipsis(equation, operands)
    try:
        explicit = normalize_equation(equation, [v.shape for v in operands])
    except ShapeError:
        explicit = equation          # the shape rule raises it again, naming the op and the line
    return append_op("Einsum", operands, {"equation": explicit})[0]


def _broadcast_ellipsis(equation, operands: list[Var]) -> list[Var]:
    """The operands with the ellipsis' size-1 axes broadcast to the other operands' sizes
    (``"...ij,...jk"`` with ``[2, 1, 3, 4]`` and ``[5, 4, 2]``: the 1 becomes 5), as NumPy,
    torch and ONNX do; the Einsum op itself then sees equal sizes."""
    if not isinstance(equation, str) or "..." not in equation:
        return operands
    try:
        inputs, output = _split(equation)
        inputs, _, dots = _expand_ellipses(inputs, output, [v.ndim for v in operands])
    except ShapeError:
        return operands          # the shape rule raises it, naming the op and the line
    if len(inputs) != len(operands) or any(len(s) != v.ndim for s, v in zip(inputs, operands)):
        return operands
    target = {c: max((v.shape[s.index(c)] for s, v in zip(inputs, operands) if c in s), default=1)
              for c in dots}
    out = []
    for subs, v in zip(inputs, operands):
        shape = [target[c] if c in dots and d == 1 and target[c] > 1 else -1 for c, d in zip(subs, v.shape)]
        out.append(broadcast_to(v, shape) if any(d > 0 for d in shape) else v)
    return out
