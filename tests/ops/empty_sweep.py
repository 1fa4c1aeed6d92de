"""The size-0 sweep's table and its child process (``tests/ops/test_empty_axes.py`` drives it).

Each ``Entry`` names an op, its inputs as letter shapes (``"ab,bc"``: the letters are axes,
shared letters share a size) and a reference written in PyTorch (float64, autograd for the
gradient). A case sets one letter to 0 (or 1); the program (the op, and the gradient of the sum
of its float outputs with respect to its float inputs) runs on NumPy, torch, the onnxruntime
engine and ``rg.onnx.export`` + onnxruntime, and each result must equal the reference: the
empty (or zero) result PyTorch gives. Where PyTorch raises, every runner must raise a
RetrogradError (no wrong answer, no crash).

A vendor kernel that mishandles size 0 can kill the process (SIGFPE), so the cases run here, in
a child: ``python tests/ops/empty_sweep.py`` reads op names on stdin, one a line, and answers
each with one JSON line ``{"op": name, "failures": [...]}``; before each case it writes
``{"case": ...}`` so that the parent names the case a crash happened in.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

CRASH = "(crash)"           # the op name that makes the child die, for the sweep's own test
SIZES = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 2, "f": 3, "h": 2, "k": 3, "l": 4, "n": 3, "s": 5}


@dataclass
class Entry:
    name: str
    shapes: str                      # "ab,bc": one letter group per input ("" for a 0-d input)
    build: Callable                  # (*Vars) -> Var | list[Var]
    ref: Callable                    # (torch, *tensors) -> tensor | list[tensor]
    ints: dict = field(default_factory=dict)   # input index -> (low, high): an int64 input
    sizes: dict = field(default_factory=dict)  # letter sizes other than SIZES'
    fixed: str = ""                  # letters not swept (a kernel size, a static channel count)
    static: str = ""                 # letters declared with their size (others are -1)
    grad: bool = True
    test_ref: Callable | None = None  # the reference of ``clone(for_test=True)`` where it differs
    fd: bool = True                  # False: the documented gradient is not the derivative (repeats)
    constants: tuple = ()            # float inputs held constant by the op's rule (running statistics)


def _rg():
    import retrograd as rg
    return rg


def _sdpa(t, q, k, v):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return t.softmax(s, -1) @ v


def _bn_eval(t, x, m, v):
    shape = [1, -1] + [1] * (x.ndim - 2)
    return (x - m.detach().reshape(shape)) / t.sqrt(v.detach().abs().reshape(shape) + 1e-5)


def _conv(nd: int, **kw):
    """torch's conv with a zero input channel and a zero filter added (same result): torch
    refuses 0 filters and gives a wrong shape for 0 input channels, where the sum is empty."""
    def ref(t, x, w):
        pad = (0, 0) * nd
        x = t.nn.functional.pad(x, pad + (0, 1))
        w = t.nn.functional.pad(w, pad + (0, 1, 0, 1))
        return getattr(t.nn.functional, f"conv{nd}d")(x, w, **kw)[:, :-1]
    return ref


def _conv_groups(groups: int, **kw):
    """torch's grouped conv2d with bias; with 0 filters, one zero filter per group is added and its
    outputs dropped (torch refuses 0 filters)."""
    def ref(t, x, w, b):
        n = w.shape[0]
        if n == 0:
            w = t.cat([w, w.new_zeros((groups,) + tuple(w.shape[1:]))])
            b = t.cat([b, b.new_zeros(groups)])
        return t.nn.functional.conv2d(x, w, b, groups=groups, **kw)[:, :n]
    return ref


def _pool(kind: str, kernel: int = 2, **kw):
    """torch's pooling of x with one channel added, then dropped (torch refuses 0 channels)."""
    def ref(t, x):
        padded = t.nn.functional.pad(x, (0, 0, 0, 0, 0, 1))
        return getattr(t.nn.functional, f"{kind}_pool2d")(padded, kernel, **kw)[:, :-1]
    return ref


def _sdpa_causal(t, q, k, v):
    s = q @ k.transpose(-1, -2) * 0.7
    keep = t.ones(s.shape[-2:], dtype=t.bool).tril()
    weights = t.softmax(s.masked_fill(~keep, float("-inf")), -1)
    return t.nan_to_num(weights, nan=0.0) @ v          # a row with every key masked: zeros


def _bn_train(t, x, m, v):
    """Batch statistics over every axis but 1 (biased variance); like torch, refused with one
    value (or none) per channel."""
    axes = [0] + list(range(2, x.ndim))
    if x.shape[0] * int(np.prod(x.shape[2:])) <= 1:
        raise ValueError("batch_norm: expected more than 1 value per channel when training")
    shape = [1, -1] + [1] * (x.ndim - 2)
    mean = x.mean(axes).reshape(shape)
    var = ((x - mean) ** 2).mean(axes).reshape(shape)
    return (x - mean) / t.sqrt(var + 1e-5) + 0 * (m.sum() + v.sum())


def _scatter_rows(add: bool):
    """``x[ids[j]] = updates[j]`` in order (the last repeated id wins), or ``+=``."""
    def ref(t, x, ids, u):
        out = x.clone()
        for j, i in enumerate(ids.tolist()):
            out[i] = out[i] + u[j] if add else u[j]
        return out
    return ref


def _scatter_elements(add: bool, axis: int = 1):
    """ONNX ScatterElements written out: ids in row-major order, the last write wins (or adds).
    Gradients by torch's rule (``rg.scatter_elements``' documented one): ``x`` gets ``dy`` where
    no id wrote, each update the ``dy`` of the place it wrote, also where a later one won."""
    def ref(t, x, ids, u):
        out = x.clone()
        for pos in np.ndindex(*ids.shape):
            target = list(pos)
            target[axis] = int(ids[pos])
            target = tuple(target)
            out[target] = out[target] + u[pos] if add else u[pos]
        if add:
            return out
        where = ids % x.shape[axis] if x.shape[axis] else ids
        written = t.zeros_like(x, dtype=t.bool).scatter(axis, where, True)
        path = x.masked_fill(written, 0.0) + t.zeros_like(x).scatter_add(axis, where, u)   # the rule's VJP
        return out.detach() + path - path.detach()
    return ref


def _cumprod(reverse: bool, exclusive: bool, axis: int = 1):
    def ref(t, x):
        y = t.flip(x, [axis]) if reverse else x
        if exclusive:      # 1, x0, x0*x1, ...: the product of the elements before
            ones = t.ones_like(y.narrow(axis, 0, min(1, y.shape[axis])))
            y = t.cat([ones, t.cumprod(y, axis).narrow(axis, 0, max(y.shape[axis] - 1, 0))], axis)
        else:
            y = t.cumprod(y, axis)
        return t.flip(y, [axis]) if reverse else y
    return ref


def _entries() -> list[Entry]:
    rg = _rg()
    E = Entry
    return [
        E("exp", "ab", rg.exp, lambda t, x: t.exp(x)),
        E("tanh", "abc", rg.tanh, lambda t, x: t.tanh(x)),
        E("gelu", "ab", rg.gelu, lambda t, x: t.nn.functional.gelu(x)),
        E("add_broadcast", "ab,b", rg.add, lambda t, x, y: x + y),
        E("mul_broadcast", "abc,c", rg.mul, lambda t, x, y: x * y),
        E("matmul", "ab,bc", rg.matmul, lambda t, x, y: x @ y),
        E("matmul_batched", "abc,acd", rg.matmul, lambda t, x, y: x @ y),
        E("einsum_contract", "ab,cb", lambda x, y: rg.einsum("ab,cb->ac", x, y),
          lambda t, x, y: t.einsum("ab,cb->ac", x, y)),
        E("einsum_batched", "bcd,bde",
          lambda x, y: rg.einsum("bij,bjk->bik", x, y), lambda t, x, y: t.einsum("bij,bjk->bik", x, y)),
        E("einsum_sum", "abc", lambda x: rg.einsum("abc->b", x), lambda t, x: t.einsum("abc->b", x)),
        E("sum", "abc", lambda x: rg.sum(x, axis=1), lambda t, x: x.sum(1)),
        E("sum_all", "ab", rg.sum, lambda t, x: x.sum()),
        E("mean", "abc", lambda x: rg.mean(x, axis=1), lambda t, x: x.mean(1)),
        E("max", "ab", lambda x: rg.max(x, axis=1), lambda t, x: x.amax(1)),
        E("prod", "ab", lambda x: rg.prod(x, axis=0), lambda t, x: x.prod(0)),
        E("logsumexp", "ab", lambda x: rg.logsumexp(x, axis=1), lambda t, x: t.logsumexp(x, 1)),
        E("softmax", "ab", rg.softmax, lambda t, x: t.softmax(x, -1)),
        E("log_softmax", "abc", rg.log_softmax, lambda t, x: t.log_softmax(x, -1)),
        E("argmax", "ab", lambda x: rg.argmax(x, axis=0), lambda t, x: t.argmax(x, 0), grad=False),
        E("cumsum_0", "ab", lambda x: rg.cumsum(x, 0), lambda t, x: t.cumsum(x, 0)),
        E("cumsum_1", "ab", lambda x: rg.cumsum(x, 1), lambda t, x: t.cumsum(x, 1)),
        E("cumprod_0", "ab", lambda x: rg.cumprod(x, 0), lambda t, x: t.cumprod(x, 0)),
        E("cumprod_1", "ab", lambda x: rg.cumprod(x, 1), lambda t, x: t.cumprod(x, 1)),
        E("topk", "ab", lambda x: rg.topk(x, 1)[0], lambda t, x: t.topk(x, 1, -1)[0]),
        E("topk_smallest", "ab", lambda x: rg.topk(x, 1, largest=False)[0],
          lambda t, x: t.topk(x, 1, -1, largest=False)[0]),
        E("cumsum_exclusive", "ab", lambda x: rg.cumsum(x, 1, exclusive=True), lambda t, x: t.cumsum(x, 1) - x),
        E("relu", "ab", rg.relu, lambda t, x: t.relu(x)),
        E("gather_elements", "ab,cb", lambda x, i: rg.gather_elements(x, i, 0), lambda t, x, i: t.gather(x, 0, i),
          ints={1: (0, 2)}, fixed="a"),
        E("concat", "ab,cb", lambda x, y: rg.concat([x, y], 0), lambda t, x, y: t.cat([x, y], 0)),
        E("stack", "ab,ab", lambda x, y: rg.stack([x, y], 1), lambda t, x, y: t.stack([x, y], 1)),
        E("transpose", "abc", lambda x: rg.transpose(x, [2, 0, 1]), lambda t, x: x.permute(2, 0, 1)),
        E("reshape", "abc", lambda x: rg.reshape(x, [-1]),
          lambda t, x: x.reshape(-1)),
        E("slice", "ab", lambda x: x[:-1, 1:], lambda t, x: x[:-1, 1:]),
        E("gather", "ab,c", rg.gather, lambda t, x, i: x[i], ints={1: (0, 2)}, fixed="a"),
        E("where", "ab,ab", lambda x, y: rg.where(x > y, x, y), lambda t, x, y: t.where(x > y, x, y)),
        E("clip", "ab", lambda x: rg.clip(x, -0.5, 0.5), lambda t, x: t.clamp(x, -0.5, 0.5)),
        E("pad", "ab", lambda x: rg.pad(x, [(1, 0), (0, 2)]), lambda t, x: t.nn.functional.pad(x, (0, 2, 1, 0))),
        E("tile", "ab", lambda x: rg.tile(x, [2, 1]), lambda t, x: x.repeat(2, 1)),
        E("layer_norm", "ab", rg.layer_norm, lambda t, x: t.nn.functional.layer_norm(x, x.shape[-1:])),
        E("rms_norm", "ab", rg.rms_norm,
          lambda t, x: x / t.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)),
        E("batch_norm_eval", "abc,b,b", lambda x, m, v: rg.batch_norm(x, m, rg.abs(v), training=False), _bn_eval,
          static="b", constants=(1, 2)),
        E("conv1d", "abl,cbk", lambda x, w: rg.conv1d(x, w),
          _conv(1), fixed="k", static="bck"),
        E("conv2d", "abhl,cbkk", lambda x, w: rg.conv2d(x, w, padding=1),
          _conv(2, padding=1), fixed="k", static="bck",
          sizes={"h": 3}),
        E("max_pool2d", "abhl", lambda x: rg.max_pool2d(x, 2),
          _pool("max"), sizes={"h": 4}, static="b"),     # 0 channels: folded into the batch in ONNX
        E("avg_pool2d", "abhl", lambda x: rg.avg_pool2d(x, 2),
          _pool("avg"), sizes={"h": 4}, static="b"),
        E("max_pool2d_run_time_channels", "abhl", lambda x: rg.max_pool2d(x, 2), _pool("max"), sizes={"h": 4}),
        E("avg_pool2d_run_time_channels", "abhl", lambda x: rg.avg_pool2d(x, 2), _pool("avg"), sizes={"h": 4}),
        E("attention", "abc,adc,adc", rg.scaled_dot_product_attention, _sdpa),
        E("attention_heads", "eabc,eadc,eadc", rg.scaled_dot_product_attention, _sdpa),
        E("softmax_cross_entropy", "ab,a", rg.softmax_cross_entropy,
          lambda t, x, y: t.nn.functional.cross_entropy(x, y, reduction="none"), ints={1: (0, 3)},
          fixed="b"),
        E("nll_loss", "ab,a", rg.nll_loss,
          lambda t, x, y: t.nn.functional.nll_loss(x, y, reduction="none"), ints={1: (0, 3)}, fixed="b"),
        E("bce_with_logits", "ab,ab", rg.binary_cross_entropy_with_logits,
          lambda t, x, y: t.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="none")),
        E("linear_cross_entropy", "ab,bc,c,a", lambda h, w, b, y: rg.linear_cross_entropy(h, w, b, y),
          lambda t, h, w, b, y: t.nn.functional.cross_entropy(h @ w + b, y, reduction="none"),
          ints={3: (0, 4)}, fixed="c", static="bc"),
        # The Milestone 3 options (issue 32 items 11-14), each against torch written from its semantics.
        E("gather_axis1", "ab,c", lambda x, i: rg.gather(x, i, axis=1), lambda t, x, i: x[:, i],
          ints={1: (-3, 3)}, fixed="b"),
        E("scatter_overwrite", "ab,c,cb", lambda x, i, u: rg.scatter(x, i, u), _scatter_rows(False),
          ints={1: (-2, 2)}, fixed="a"),
        E("scatter_add_axis1", "ab,c,ac", lambda x, i, u: rg.scatter(x, i, u, overwrite=False, axis=1),
          lambda t, x, i, u: x.index_add(1, i % x.shape[1], u), ints={1: (-3, 3)}, fixed="b"),
        E("gather_elements_axis1", "ab,ac", lambda x, i: rg.gather_elements(x, i, 1),
          lambda t, x, i: t.gather(x, 1, i % x.shape[1]), ints={1: (-3, 3)}, fixed="b"),
        E("scatter_elements", "ab,ac,ac", lambda x, i, u: rg.scatter_elements(x, i, u, 1),
          _scatter_elements(False), ints={1: (-3, 3)}, fixed="b", fd=False),
        E("scatter_elements_add", "ab,cb,cb", lambda x, i, u: rg.scatter_elements(x, i, u, 0, reduction="add"),
          _scatter_elements(True, axis=0), ints={1: (-2, 2)}, fixed="a"),
        E("topk_axis0_smallest", "ab", lambda x: rg.topk(x, 2, axis=0, largest=False),
          lambda t, x: list(t.topk(x, 2, 0, largest=False))),
        E("cumsum_reverse_exclusive", "ab", lambda x: rg.cumsum(x, 1, reverse=True, exclusive=True),
          lambda t, x: t.flip(t.cumsum(t.flip(x, [1]), 1), [1]) - x),
        E("cumprod_exclusive", "ab", lambda x: rg.cumprod(x, 1, exclusive=True), _cumprod(False, True)),
        E("cumprod_reverse", "ab", lambda x: rg.cumprod(x, 0, reverse=True), _cumprod(True, False, axis=0)),
        E("cumprod_reverse_exclusive", "abc", lambda x: rg.cumprod(x, 1, reverse=True, exclusive=True),
          _cumprod(True, True)),
        E("layer_norm_2d_affine", "abc,bc,bc", lambda x, w, b: rg.layer_norm(x, w, b),
          lambda t, x, w, b: t.nn.functional.layer_norm(x, x.shape[-2:], w, b), static="bc"),
        E("layer_norm_ndim2", "abc", lambda x: rg.layer_norm(x, normalized_ndim=2),
          lambda t, x: t.nn.functional.layer_norm(x, x.shape[-2:]), static="bc"),
        E("rms_norm_ndim2", "abc", lambda x: rg.rms_norm(x, normalized_ndim=2),
          lambda t, x: x / t.sqrt((x * x).mean((-2, -1), keepdim=True) + 1e-6), static="bc"),
        E("mean_axes", "abc", lambda x: rg.mean(x, axis=[0, 2], keepdims=True), lambda t, x: x.mean((0, 2), True)),
        E("min_keepdims", "ab", lambda x: rg.min(x, axis=0, keepdims=True), lambda t, x: x.amin(0, True)),
        E("argmin", "ab", lambda x: rg.argmin(x, axis=1), lambda t, x: t.argmin(x, 1), grad=False),
        E("einsum_ellipsis", "eabc,acd", lambda x, y: rg.einsum("...ij,...jk->...ik", x, y),
          lambda t, x, y: t.einsum("...ij,...jk->...ik", x, y)),
        E("batch_norm_train", "abc,b,b", lambda x, m, v: rg.batch_norm(x, m, rg.abs(v), training=True),
          _bn_train, static="b", test_ref=_bn_eval, constants=(1, 2)),
        E("conv2d_options", "abhl,cfkk,c", lambda x, w, b: rg.conv2d(x, w, b, stride=2, padding=1, dilation=2,
                                                                     groups=2),
          _conv_groups(stride=2, padding=1, dilation=2, groups=2), fixed="bfk", static="bcfk",
          sizes={"b": 4, "c": 4, "f": 2, "k": 2, "h": 5}),
        E("max_pool2d_dilated", "abhl", lambda x: rg.max_pool2d(x, 2, stride=1, dilation=2),
          _pool("max", 2, stride=1, dilation=2), sizes={"h": 4}, static="b"),
        E("max_pool2d_ceil", "abhl", lambda x: rg.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
          _pool("max", 3, stride=2, padding=1, ceil_mode=True), sizes={"h": 4, "l": 5}, static="bhl"),
        E("avg_pool2d_ceil_exclude_pad", "abhl",
          lambda x: rg.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False, ceil_mode=True),
          _pool("avg", 3, stride=2, padding=1, count_include_pad=False, ceil_mode=True),
          sizes={"h": 4, "l": 5}, static="bhl"),
        E("avg_pool2d_include_pad", "abhl", lambda x: rg.avg_pool2d(x, 3, stride=1, padding=1),
          _pool("avg", 3, stride=1, padding=1), sizes={"h": 4}, static="b"),
        E("attention_causal_scaled", "eabc,eadc,eadc",
          lambda q, k, v: rg.scaled_dot_product_attention(q, k, v, causal=True, scale=0.7), _sdpa_causal),
    ]


ENTRIES = {e.name: e for e in _entries()} if __name__ == "__main__" else None


def entry_names() -> list[str]:
    """The table's op names, read without importing retrograd (for the parent's parametrize)."""
    import ast
    names = []
    for node in ast.walk(ast.parse(open(__file__).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "E":
            names.append(node.args[0].value)
    return names


def entry_spec(name: str) -> dict:
    """An entry's letter sizes and swept letters, read without importing retrograd."""
    import ast
    for node in ast.walk(ast.parse(open(__file__).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "E" and node.args[0].value == name:
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg in ("sizes", "fixed")}
            letters = set(node.args[1].value.replace(",", "")) - set(kw.get("fixed", ""))
            return {"sizes": kw.get("sizes", {}), "swept": sorted(letters)}
    raise KeyError(name)


# --- running one case ------------------------------------------------------------------------

def cases(entry: Entry) -> list[dict]:
    """The base sizes, then each swept letter at 0 and at 1."""
    base = {**SIZES, **entry.sizes}
    letters = sorted(set(entry.shapes.replace(",", "")) - set(entry.fixed))
    out = [dict(base)]
    for size in (0, 1):
        for letter in letters:
            out.append({**base, letter: size})
    return out


WRAPS = ("none", "cond", "scan", "while", "ta_while", "ta_scan", "ta_unstack", "ta_gather", "ta_scatter",
         "ta_concat", "ta_split")
MODES = ("gradients", "budget", "budget_least", "for_test")


@dataclass(frozen=True)
class Variant:
    """How a case is run (the fuzzer's programs). ``dtype``: the float dtype. ``wrap``: the op
    alone (``"none"``) or inside control flow: ``"cond"`` (both branches compute it), ``"scan"``
    (``steps`` copies stacked by a scan whose body reads the inputs from outside), ``"while"``
    (added ``steps`` more times); or its (first) output through a TensorArray: ``"ta_while"``
    (written before a while_loop and at each of its ``steps`` iterations, then stacked),
    ``"ta_scan"`` (an array of the op's declared element shape carried by a ``steps``-step scan,
    one write a step), ``"ta_unstack"``/``"ta_gather"``/``"ta_scatter"``/``"ta_concat"``/
    ``"ta_split"`` (TF's TensorArray API over the output's rows). ``order``: 2 also fetches the
    gradients of ``sum(g * g)`` over the first gradients ``g``. ``mode``: ``"gradients"``
    (``rg.gradients``), ``"budget"`` (``rg.append_backward(memory_budget=)``, an ample budget),
    ``"budget_least"`` (the least budget that fits, which the refusal of a 1-byte one names),
    ``"for_test"`` (the forward of ``clone(for_test=True)`` of the program with its gradients).
    ``fd``: float64 gradients also checked against central finite differences
    (``rg.testing.check_gradients`` on NumPy)."""
    dtype: str = "float32"
    wrap: str = "none"
    steps: int = 0
    pred: bool = True
    order: int = 1
    mode: str = "gradients"
    fd: bool = False


def _arrays(entry: Entry, sizes: dict, rng, dtype: str = "float32") -> list[np.ndarray]:
    arrays = []
    for i, group in enumerate(entry.shapes.split(",")):
        shape = tuple(sizes[c] for c in group)
        if i in entry.ints:
            low, high = entry.ints[i]
            arrays.append(rng.integers(low, high, size=shape).astype("int64"))
        else:
            arrays.append(rng.uniform(0.5, 1.5, size=shape).astype(dtype)
                          * rng.choice([-1.0, 1.0], size=shape).astype(dtype))
    return arrays


@dataclass
class Layout:
    """What a TensorArray wrap needs from the op's output (its shape from the reference, None
    where torch refuses): the static rows the array is made of, the ids fed to gather/scatter and
    the lengths of a split."""
    shape: tuple | None = None

    def rows(self, rank: int) -> list[int]:
        """The output's shape lifted to ``rank`` axes at least (a 0-d one: [1]; [n]: [n, 1])."""
        if self.shape is None:
            return [-1] + [1] * (rank - 1)
        shape = list(self.shape) or [1]
        return shape + [1] * (rank - len(shape))

    def ids(self, wrap: str) -> np.ndarray:
        n = self.rows(1)[0]
        if n <= 0:
            return np.zeros(0, "int64")
        if wrap == "ta_gather":                 # a repeat and a negative id
            return np.array([-1, 0, n - 1], "int64")
        return np.arange(n)[::-1].astype("int64")          # ta_scatter: a permutation

    def lengths(self) -> list[int]:
        n = max(self.rows(1)[0], 0)
        if n >= 3:
            return [1, n - 1]                    # ragged: a RaggedTensorArray
        if n == 2:
            return [1, 1]
        return [n]


def _reference(entry: Entry, arrays, variant: Variant = Variant(), layout: Layout | None = None):
    """(outputs, gradients) from PyTorch float64 autograd (it raises where torch refuses); for
    ``order=2`` the gradients are followed by the second-order ones."""
    import torch
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) if a.dtype != np.int64
               else torch.tensor(a) for a in arrays]
    ref = entry.test_ref if variant.mode == "for_test" and entry.test_ref else entry.ref
    outs = ref(torch, *tensors)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    outs = _wrapped_reference(torch, outs, variant, layout or Layout(tuple(outs[0].shape)))
    floats = [t for t in tensors if t.is_floating_point()]
    grads, second = [], []
    if entry.grad:
        total = sum(o.sum() for o in outs if o.is_floating_point())
        grads = _grads(torch, total, floats, create_graph=variant.order == 2)
        if variant.order == 2:
            second = _grads(torch, sum((g * g).sum() for g in grads), floats)
    if variant.mode == "for_test":
        grads, second = [], []
    return [o.detach().numpy() for o in outs], [g.detach().numpy() for g in grads + second]


def _grads(torch, total, xs, create_graph=False):
    if not getattr(total, "requires_grad", False):        # nothing depends on xs
        return [torch.zeros_like(x) for x in xs]
    grads = torch.autograd.grad(total, xs, allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(xs, grads)]


def _wrapped_reference(torch, outs, variant: Variant, layout: Layout):
    """The reference of ``_wrapped``: what the control flow or TensorArray makes of the outputs."""
    y, wrap = outs[0], variant.wrap
    if wrap in ("scan", "ta_scan"):
        return [torch.stack([y] * variant.steps) if variant.steps else y.new_zeros((0,) + tuple(y.shape))]
    if wrap == "while":
        return [y * (variant.steps + 1)]
    if wrap == "cond":
        return [y]
    if wrap == "ta_while":
        return [torch.stack([y] * (variant.steps + 1))]
    if wrap in ("ta_unstack", "ta_gather", "ta_scatter"):
        rows = y.reshape(layout.rows(1))
        if wrap == "ta_gather":
            return [rows[torch.tensor(layout.ids(wrap))]]
        return [rows.flip(0) if wrap == "ta_scatter" else rows]
    if wrap == "ta_concat":
        rows = y.reshape(layout.rows(2))
        return [rows.reshape((-1,) + tuple(rows.shape[2:]))]
    if wrap == "ta_split":
        rows = y.reshape(layout.rows(2))
        return [rows, rows[sum(layout.lengths()[:-1]):]]
    return outs


def _wrapped(entry: Entry, xs, variant: Variant, layout: Layout | None = None):
    """The entry's outputs, built inside the variant's control flow."""
    rg = _rg()
    layout = layout or Layout()

    def first():
        outs = entry.build(*xs)
        return outs[0] if isinstance(outs, (list, tuple)) else outs
    if variant.wrap == "cond":
        return [rg.cond(rg.data("pred", [], "bool"), first, first)]
    if variant.wrap == "scan":
        steps = rg.data("steps", [-1, 1], variant.dtype)
        _, ys = rg.scan(lambda c, _: (c, first()), rg.fill([1], 0.0, variant.dtype), steps)
        return [ys]
    if variant.wrap == "while":
        _, total = rg.while_loop(lambda i, acc: i < rg.data("count", [], "int64"),
                                 lambda i, acc: (i + 1, acc + first()),
                                 [rg.constant(np.array(0)), first()])
        return [total]
    if variant.wrap == "ta_while":
        y = first()
        arr = rg.TensorArray(y.dtype).write(0, y)
        _, arr = rg.while_loop(lambda i, a: i < rg.data("count", [], "int64"),
                               lambda i, a: (i + 1, a.write(i + 1, first())),
                               [rg.constant(np.array(0)), arr])
        return [arr.stack()]
    if variant.wrap == "ta_scan":
        y = first()
        steps = rg.data("steps", [-1, 1], variant.dtype)
        arr = rg.TensorArray(y.dtype, element_shape=list(y.shape))
        arr, _ = rg.scan(lambda a, s: (a.write(a.size(), first()), s), arr, steps)
        return [arr.stack()]
    if variant.wrap.startswith("ta_"):
        return _tensor_array_api(rg, first(), variant.wrap, layout)
    outs = entry.build(*xs)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _tensor_array_api(rg, y, wrap: str, layout: Layout):
    if wrap in ("ta_unstack", "ta_gather", "ta_scatter"):
        rows = y if y.ndim else rg.reshape(y, [1])
        if wrap == "ta_unstack":
            return [rg.TensorArray(y.dtype).unstack(rows).stack()]
        ids = rg.data("ids", [-1], "int64")
        if wrap == "ta_gather":
            return [rg.TensorArray(y.dtype).unstack(rows).gather(ids)]
        return [rg.TensorArray(y.dtype).scatter(ids, rows).stack()]
    rows = rg.reshape(y, layout.rows(2))         # concat and split need the element's axes when built
    if wrap == "ta_concat":
        return [rg.TensorArray(y.dtype).unstack(rows).concat()]
    pieces = rg.TensorArray(y.dtype).split(rows, layout.lengths())
    return [pieces.concat(), pieces.read(len(layout.lengths()) - 1)]


def variant_feed(variant: Variant, layout: Layout | None = None) -> dict:
    """The values a wrapped program reads besides the op's inputs."""
    layout = layout or Layout()
    return {"cond": {"pred": np.array(variant.pred)},
            "scan": {"steps": np.zeros((variant.steps, 1), variant.dtype)},
            "ta_scan": {"steps": np.zeros((variant.steps, 1), variant.dtype)},
            "while": {"count": np.array(variant.steps)},
            "ta_while": {"count": np.array(variant.steps)},
            "ta_gather": {"ids": layout.ids("ta_gather")},
            "ta_scatter": {"ids": layout.ids("ta_scatter")}}.get(variant.wrap, {})


def _budgeted(variant: Variant) -> bool:
    return variant.mode.startswith("budget")


def _program(entry: Entry, sizes: dict, variant: Variant = Variant(), layout: Layout | None = None,
             budget: int | None = None, arrays=None):
    """(program, startup, fetch names, number of outputs). ``budget``: the memory_budget of a
    ``budget*`` mode (the ample one by default); there the float inputs are parameters
    initialised to ``arrays`` (``append_backward`` differentiates parameters)."""
    rg = _rg()
    program, startup = rg.Program(), rg.Program()
    with rg.program_guard(program, startup):
        xs = []
        for i, group in enumerate(entry.shapes.split(",")):
            shape = [sizes[c] if c in entry.static else -1 for c in group]
            dtype = "int64" if i in entry.ints else variant.dtype
            if _budgeted(variant) and dtype != "int64":
                xs.append(rg.create_parameter(f"x{i}", list(arrays[i].shape), dtype, init=arrays[i]))
            else:
                xs.append(rg.data(f"x{i}", shape, dtype, stop_gradient=dtype == "int64"))
        outs = _wrapped(entry, xs, variant, layout)
        floats = [x for x in xs if x.dtype == variant.dtype]
        grads = []
        if entry.grad:
            total = rg.add_n([rg.sum(o) for o in outs if o.dtype == variant.dtype])
            grads = _first_gradients(rg, total, floats, variant, sizes, entry, layout, budget)
            if variant.order == 2:
                target = rg.add_n([rg.sum(g * g) for g in grads])
                grads += [g if g is not None else rg.zeros_like(x)
                          for x, g in zip(floats, rg.gradients(target, floats))]
    if variant.mode == "for_test":
        return program.clone(for_test=True), startup, [v.name for v in outs], len(outs)
    return program, startup, [v.name for v in outs + grads], len(outs)


def _first_gradients(rg, total, floats, variant: Variant, sizes, entry: Entry, layout, budget):
    if not _budgeted(variant):
        grads = rg.gradients(total, floats)
    else:
        feed_shapes = {f"x{i}": tuple(sizes[c] for c in group) for i, group in enumerate(entry.shapes.split(","))}
        feed_shapes.update({k: v.shape for k, v in variant_feed(variant, layout).items()})
        pairs = rg.append_backward(total, parameter_list=floats, memory_budget=budget or 1 << 40,
                                   feed_shapes=feed_shapes)
        by_name = {p.name: g for p, g in pairs}
        grads = [by_name.get(x.name) for x in floats]
    return [g if g is not None else rg.zeros_like(x) for x, g in zip(floats, grads)]


def _build(entry: Entry, sizes: dict, variant: Variant, layout: Layout, arrays):
    """``_program``, with the least budget that fits for ``budget_least`` (a 1-byte budget's
    refusal names it)."""
    rg = _rg()
    if variant.mode != "budget_least":
        return _program(entry, sizes, variant, layout, arrays=arrays)
    try:
        return _program(entry, sizes, variant, layout, budget=1, arrays=arrays)
    except rg.ProgramError as exc:
        least = getattr(exc, "least_budget", None)
        if least is None:
            raise
        return _program(entry, sizes, variant, layout, budget=least, arrays=arrays)


def _run_export(program, startup, feed, fetch):
    rg = _rg()
    import onnxruntime as ort
    exe = rg.Executor()
    exe.run(startup)                       # parameters: initializers from the scope
    model = rg.onnx.export(program, None, fetch, scope=exe.scope)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in sess.get_inputs()}
    return sess.run(fetch, {k: v for k, v in feed.items() if k in inputs})


def _runners():
    rg = _rg()

    def executor(backend):
        def run(program, startup, feed, fetch):
            exe = rg.Executor(backend=backend)
            exe.run(startup)
            return exe.run(program, feed=feed, fetch_list=fetch)
        return run
    return {"numpy": executor("numpy"), "torch": executor("torch"),
            "engine": executor("onnxruntime"), "export": _run_export}


def _compare(got, want, what: str) -> str | None:
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, torch {want.shape}"
    # float32 results are held to float32's rounding where sums cancel (torch's own float32 layer
    # norm gradient over 2 elements is 1e-3 off the float64 one); float64 to 1e-4
    rtol, atol = (2e-3, 1e-3) if got.dtype == np.float32 else (1e-4, 1e-4)
    if not np.allclose(got.astype("float64"), want, rtol=rtol, atol=atol, equal_nan=True):
        return f"{what}: values {got.ravel()[:6]}, torch {want.ravel()[:6]}"
    return None


FD_MAX_ELEMENTS = 48       # finite differences run the program twice per input element


def _finite_differences(entry: Entry, arrays, variant: Variant, layout: Layout, feed: dict) -> list[str]:
    """The float64 gradients (or, for ``order=2``, the gradients of ``sum(g * g)``) against
    central finite differences of the same program on NumPy (``rg.testing.check_gradients``)."""
    rg = _rg()
    if sum(a.size for a in arrays if a.dtype.kind == "f") > FD_MAX_ELEMENTS:
        return []

    def fn(*xs):
        outs = _wrapped(entry, list(xs), variant, layout)
        if variant.order == 1:
            return outs
        floats = [x for x in xs if x.dtype == "float64"]
        total = rg.add_n([rg.sum(o) for o in outs if o.dtype == "float64"])
        grads = [g for g in rg.gradients(total, floats) if g is not None]
        return rg.add_n([rg.sum(g * g) for g in grads]) if grads else rg.sum(floats[0]) * 0.0
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    wrt = [n for i, (n, a) in enumerate(inputs.items()) if a.dtype.kind == "f" and i not in entry.constants]
    try:
        rg.testing.check_gradients(fn, inputs, wrt=wrt, feeds=variant_feed(variant, layout), rtol=1e-4, atol=1e-6)
    except rg.RetrogradError as exc:
        return [f"finite differences: {type(exc).__name__}: {str(exc)[:400]}"]
    except Exception as exc:     # noqa: BLE001 - a foreign exception is what this sweep reports
        return [f"finite differences: foreign {type(exc).__name__}: {str(exc)[:300]}"]
    return []


def run_case(entry: Entry, sizes: dict, runners, variant: Variant = Variant(), seed: int = 0) -> list[str]:
    rg = _rg()
    rng = np.random.default_rng(seed)
    arrays = _arrays(entry, sizes, rng, variant.dtype)
    label = f"{entry.name} {entry.shapes} sizes {''.join(f'{c}={sizes[c]}' for c in sorted(set(entry.shapes) - {','}))}"
    if variant != Variant():
        label += f" {variant}"
    layout = Layout()
    try:
        import torch
        base = entry.ref(torch, *[torch.tensor(a, dtype=torch.float64 if a.dtype != np.int64 else torch.int64)
                                  for a in arrays])
        layout = Layout(tuple((base[0] if isinstance(base, (list, tuple)) else base).shape))
        outs, grads = _reference(entry, arrays, variant, layout)
        wants = outs + grads
    except (RuntimeError, IndexError, ValueError) as exc:
        wants = exc
    try:
        program, startup, fetch, n_out = _build(entry, sizes, variant, layout, arrays)
    except rg.RetrogradError as exc:
        if isinstance(wants, Exception):
            return []                    # refused when built, where torch refuses
        if variant.order == 2 and "has no gradient maker" in str(exc):
            return [f"{label}: refused (second order): {str(exc)[:300]}"]
        if _budgeted(variant) and "feed_shapes cannot give" in str(exc):
            if variant.wrap not in ("none", "cond"):
                # Issue 32 item 10 (branch `loops`): memory_budget cannot yet plan sizes that depend
                # on a loop's trip count or a TensorArray's length; it refuses, naming them.
                return [f"{label}: refused (budget over a loop or TensorArray, issue 32 item 10): "
                        f"{str(exc)[:300]}"]
            # The planner takes a cond's output sizes from an input declared alike; it does not
            # size the branch's ops (gather/scatter on axis 1, einsum): a refusal naming them.
            return [f"{label}: refused (budget cannot size a cond's output): {str(exc)[:300]}"]
        return [f"{label} when built: {type(exc).__name__}: {str(exc)[:400]}"]
    except Exception as exc:     # noqa: BLE001 - a foreign exception is what this sweep reports
        return [f"{label} when built: foreign {type(exc).__name__}: {traceback.format_exc()[-800:]}"]
    feed = {f"x{i}": a for i, a in enumerate(arrays) if not (_budgeted(variant) and a.dtype.kind == "f")}
    feed.update(variant_feed(variant, layout))
    failures, agreed = [], None
    for name, run in runners.items():
        try:
            got = run(program, startup, feed, fetch)
        except rg.RetrogradError as exc:
            if not isinstance(wants, Exception):
                failures.append(f"{label} on {name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        except Exception as exc:     # noqa: BLE001 - a foreign exception is what this sweep reports
            if name == "export" and isinstance(wants, Exception):
                continue                 # an exported model cannot raise a RetrogradError
            failures.append(f"{label} on {name}: foreign {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if isinstance(wants, Exception):     # torch refuses: the runners that ran must agree
            if agreed is None:
                agreed = [np.asarray(a, dtype="float64") for a in got]
                continue
            wants_here = agreed
        else:
            wants_here = wants
        if len(got) != len(wants_here):
            failures.append(f"{label} on {name}: {len(got)} results, torch {len(wants_here)}")
        for i, (g, w) in enumerate(zip(got, wants_here)):
            what = f"output {i}" if i < n_out else f"gradient {i - n_out}"
            problem = _compare(g, w, what)
            if problem:
                failures.append(f"{label} on {name}: {problem}")
    if variant.fd and variant.dtype == "float64" and entry.grad and entry.fd and not isinstance(wants, Exception):
        failures += [f"{label}: {f}" for f in _finite_differences(entry, arrays, variant, layout, feed)]
    return failures


def main() -> None:
    warnings.simplefilter("ignore")
    import onnxruntime as ort
    ort.set_default_logger_severity(4)
    runners = _runners()
    for line in sys.stdin:
        name = line.strip()
        if name.startswith("{"):         # one fuzz case (benchmarks/fuzz_differential.py --ops)
            case = json.loads(name)
            print(json.dumps({"case": case}), flush=True)
            try:
                failures = run_case(ENTRIES[case["op"]], case["sizes"], runners, Variant(**case["variant"]),
                                    case["seed"])
            except Exception:        # noqa: BLE001 - the case itself failed: report it, foreign
                failures = [f"{case}: foreign (the sweep's case failed): {traceback.format_exc()[-800:]}"]
            print(json.dumps({"op": case["op"], "failures": failures}), flush=True)
            continue
        if name == CRASH:
            print(json.dumps({"case": {"a": 0}}), flush=True)
            os.kill(os.getpid(), signal.SIGFPE)
        entry = ENTRIES[name]
        failures = []
        for sizes in cases(entry):
            print(json.dumps({"case": sizes}), flush=True)
            try:
                failures += run_case(entry, sizes, runners)
            except Exception:        # noqa: BLE001 - building the case failed: report it
                failures.append(f"{name} sizes {sizes}: {traceback.format_exc()[-800:]}")
        print(json.dumps({"op": name, "failures": failures}), flush=True)


if __name__ == "__main__":
    main()
