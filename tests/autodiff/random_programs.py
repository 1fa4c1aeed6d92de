"""Random programs with control flow, built the same way in retrograd and in PyTorch.

Shared by the hypothesis tests (``test_random_control_flow.py``) and the
long-running fuzz script (``benchmarks/fuzz_random_programs.py``). A program is
a plain description (a dict of ints, strings and lists, printable as a
reproducer) drawn from any source of choices (``Choices``: hypothesis'
``draw`` or ``random.Random``):

* ``pre``: a small DAG of elementwise ops and products with a weight ``W``
  over the leaves ``x`` and ``y`` (``[m, n]``); every node is ``[m, n]``;
* one structure over those nodes: ``cond`` (two branch expressions, taken on
  whether a node's sum exceeds -0.3: a row-centred node sums to 0 up to
  rounding, so a threshold of 0 would pick branches by rounding), ``while``
  (a loop var updated by an expression for a trip count fed at run time,
  optionally under a ``recompute`` byte budget), ``recurrent`` (a state
  updated from a sequence ``s [T, m, n]``, with ``recompute`` None,
  ``"steps"`` or a byte budget, one or two states, with or without
  per-example ``seq_lengths``), ``array`` (a while_loop appending rows to a
  ``TensorArray``, optionally from a nested loop of ``i % 2`` trips (ragged),
  then stacked and read back under a ``cond`` on its size) or ``none``; loop
  bodies may nest a ``cond`` or a ``while_loop``;
* the loss projects the structure's result and the last node onto fixed
  random weights; ``second`` asks for second derivatives: the gradients of
  ``x`` and ``W`` are projected again and differentiated once more.

Values and gradients (first and, where asked, second order) are compared with
torch in float64.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

# name -> (retrograd, torch). Singular ops see safe arguments so every program is smooth
# enough to compare (log/sqrt of x*x + 1, division by y*y + 1).
UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "exp": (lambda x: rg.exp(rg.tanh(x)), lambda x: torch.exp(torch.tanh(x))),
    "tanh": (rg.tanh, torch.tanh),
    "sigmoid": (rg.sigmoid, torch.sigmoid),
    "square": (rg.square, torch.square),
    "relu": (rg.relu, torch.relu),
    "log": (lambda x: rg.log(x * x + 1.0), lambda x: torch.log(x * x + 1.0)),
    "sqrt": (lambda x: rg.sqrt(x * x + 1.0), lambda x: torch.sqrt(x * x + 1.0)),
    "scale": (lambda x: x * 0.5 + 1.0, lambda x: x * 0.5 + 1.0),
    "softmax": (lambda x: rg.softmax(x, axis=-1), lambda x: torch.softmax(x, -1)),
    "rowmean": (lambda x: x - rg.mean(x, axis=1, keepdims=True), lambda x: x - x.mean(1, keepdim=True)),
}
# Drawn only with ``edges`` (the differential fuzz): 0-d intermediates and reductions over the batch
# (NaN means on an empty batch).
EDGE_UNARY = {
    "plusmean": (lambda x: x + rg.mean(x) * 0.5, lambda x: x + x.mean() * 0.5),
    "colmean": (lambda x: x - rg.mean(x, axis=0, keepdims=True), lambda x: x - x.mean(0, keepdim=True)),
    "scalarloop": (lambda x: x * _scalar_loop(rg.sum(x), 0), lambda x: x * _scalar_loop(x.sum(), 1)),
}
BINARY = {
    "add": (rg.add, torch.add),
    "sub": (rg.sub, torch.sub),
    "mul": (rg.mul, torch.mul),
    "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0)),
    "maximum": (rg.maximum, torch.maximum),
    "where": (lambda a, b: rg.where(a > b, a * b, b), lambda a, b: torch.where(a > b, a * b, b)),
}
STRUCTURES = ("none", "cond", "while", "recurrent", "array")

Choices = Callable[[str, list], Any]   # choose(label, options) -> one of options


def draw_expression(choose: Choices, inputs: int, length: int, nested: bool = False, edges: bool = False) -> list:
    """Ops over ``inputs`` nodes: ("u", name, i), ("b", name, i, j), ("mm", i) (node @ W) and,
    when ``nested``, ("if", i, j, k) (a cond on the sign of node i's sum) and ("loop", i, trips)
    (a while_loop with a constant trip count), so that control flow nests inside loop bodies.
    With ``edges`` (the differential fuzz): ("k", i) (node * the 0-d leaf k), conds on a mean
    (``("if", i, j, k, "mean")``: NaN on an empty batch) and, nested, ("dloop", i, j): a
    while_loop from node i whose trip count depends on the values (so it changes between the
    iterations of an enclosing loop)."""
    ops = []
    kinds = ["u", "b", "b", "mm"] + (["if", "loop"] if nested else []) + (["k"] if edges else []) \
        + (["dloop"] if nested and edges else [])
    for k in range(length):
        nodes = inputs + k
        kind = choose("kind", kinds)
        args = list(range(nodes))
        if kind == "if":
            pred = choose("pred", ["sum", "mean"]) if edges else "sum"
            ops.append(("if", choose("arg", args), choose("arg", args), choose("arg", args))
                       + ((pred,) if pred != "sum" else ()))
        elif kind == "loop":
            ops.append(("loop", choose("arg", args), choose("trips", [0, 1, 3])))
        elif kind == "dloop":
            ops.append(("dloop", choose("arg", args), choose("arg", args)))
        elif kind == "k":
            ops.append(("k", choose("arg", args)))
        elif kind == "u":
            unary = sorted(UNARY) + (sorted(EDGE_UNARY) if edges else [])
            ops.append(("u", choose("unary", unary), choose("arg", list(range(nodes)))))
        elif kind == "b":
            ops.append(("b", choose("binary", sorted(BINARY)), choose("arg", list(range(nodes))),
                        choose("arg", list(range(nodes)))))
        else:
            ops.append(("mm", choose("arg", list(range(nodes)))))
    return ops


def draw_program(choose: Choices, edges: bool = False) -> dict:
    """A description: sizes, the ``pre`` DAG, one structure and its options. ``edges`` (the
    differential fuzz) adds empty and single-row batches (m = 0, 1), float32, the 0-d leaf
    ``k``, conds on means, value-dependent inner loops, ``max_iters`` below the fed trip
    count, inputs declared with -1 sizes and W as a parameter."""
    structure = choose("structure", list(STRUCTURES))
    desc = {"m": choose("m", [0, 1, 1, 2, 3] if edges else [1, 2, 3]), "n": choose("n", [1, 2, 3]),
            "T": choose("T", [0, 1, 3, 7]),
            "structure": structure, "pre": draw_expression(choose, 2, choose("len", [1, 2, 3]), edges=edges),
            "a": draw_expression(choose, 2, choose("len", [1, 2, 3]), nested=choose("nested", [False, True]),
                                 edges=edges),
            "b": draw_expression(choose, 2, choose("len", [1, 2]), edges=edges),
            "pick": choose("pick", [0, 1, 2]), "trips": choose("trips", [0, 1, 2, 5]),
            "recompute": None, "second": choose("second", [False, True])}
    if edges:
        desc["dtype"] = choose("dtype", ["float64", "float64", "float32"])
        desc["dynamic"] = choose("dynamic", [False, True])     # x, y, s declared with -1 sizes
        desc["param_w"] = choose("param_w", [False, True])     # W a parameter (an initializer)
        if structure == "cond":
            desc["pred"] = choose("pred", ["sum", "mean"])
        if structure == "while":
            desc["max_iters"] = choose("max_iters", [None, None, 3])
    if structure == "recurrent":
        desc["recompute"] = choose("recompute", [None, "steps", 1 << 8, 1 << 10, 1 << 12, 1 << 16])
        desc["two_states"] = choose("two_states", [False, True])
        if choose("with_lengths", [False, True]):
            desc["lengths"] = [choose("length", list(range(desc["T"] + 1))) for _ in range(desc["m"])]
    elif structure == "while":
        desc["recompute"] = choose("recompute", [None, None, 1 << 8, 1 << 10, 1 << 12, 1 << 16])
    elif structure == "array":
        desc["inner"] = choose("inner", [False, True])
    if edges and desc["second"] and isinstance(desc.get("recompute"), int):
        desc["recompute"] = None         # a budgeted loop's gradient has no gradient (refused at build)
    return desc


# --- building --------------------------------------------------------------------------------

def _apply(ops: list, env: list, w, fw: int, k=None) -> Any:
    """Evaluate ``ops`` over ``env`` (retrograd Vars for fw=0, torch tensors for fw=1); the last
    node. ``k``: the 0-d leaf the ("k", i) ops scale by."""
    nodes = list(env)
    for op in ops:
        if op[0] == "if":
            pred = op[4] if len(op) > 4 else "sum"
            nodes.append(_nested_cond(nodes[op[1]], nodes[op[2]], nodes[op[3]], fw, pred))
        elif op[0] == "loop":
            nodes.append(_nested_loop(nodes[op[1]], op[2], fw))
        elif op[0] == "dloop":
            nodes.append(_value_loop(nodes[op[1]], nodes[op[2]], fw))
        elif op[0] == "k":
            nodes.append(nodes[op[1]] * k)
        elif op[0] == "u":
            nodes.append({**UNARY, **EDGE_UNARY}[op[1]][fw](nodes[op[2]]))
        elif op[0] == "b":
            nodes.append(BINARY[op[1]][fw](nodes[op[2]], nodes[op[3]]))
        else:
            nodes.append(nodes[op[1]] @ w)
    return nodes[-1]


def _holds(p, fw: int, pred: str = "sum"):
    """sum(p) > -0.3 (or mean(p) > -0.3: false on an empty batch, whose mean is NaN)."""
    if fw == 0:
        return (rg.mean(p) if pred == "mean" else rg.sum(p)) > -0.3
    return float(p.detach().mean() if pred == "mean" else p.detach().sum()) > -0.3


def _nested_cond(p, a, b, fw: int, pred: str = "sum"):
    if fw == 0:
        return rg.cond(_holds(p, 0, pred), lambda: rg.tanh(a), lambda: b * 0.5)
    return torch.tanh(a) if _holds(p, 1, pred) else b * 0.5


def _scalar_loop(total, fw: int):
    """A 0-d loop var: c <- tanh(c * 0.5 + 0.1 * total) twice, from 0.5."""
    if fw == 0:
        _, c = rg.while_loop(lambda j, c: j < 2, lambda j, c: [j + 1, rg.tanh(c * 0.5 + total * 0.1)],
                             [rg.constant(0, dtype="int64"), total * 0.0 + 0.5])
        return c
    c = total * 0.0 + 0.5
    for _ in range(2):
        c = torch.tanh(c * 0.5 + total * 0.1)
    return c


def _value_loop(v0, x, fw: int):
    """v <- tanh(0.9 v + x) from v0 while sum(v) > -0.3, at most 3 times: a trip count that depends
    on the values (it changes between the iterations of an enclosing loop; -0.3, not 0, as for the
    conds: a centred node sums to 0 up to rounding, which NumPy and torch may round apart)."""
    if fw == 0:
        _, v = rg.while_loop(lambda j, v: rg.logical_and(j < 3, rg.sum(v) > -0.3),
                             lambda j, v: [j + 1, rg.tanh(v * 0.9 + x)], [rg.constant(0, dtype="int64"), v0])
        return v
    v, j = v0, 0
    while j < 3 and float(v.detach().sum()) > -0.3:
        v, j = torch.tanh(v * 0.9 + x), j + 1
    return v


def _nested_loop(v0, trips: int, fw: int):
    """v <- tanh(0.9 v + v0), ``trips`` times (a trip count known only to the loop's condition)."""
    if fw == 0:
        _, v = rg.while_loop(lambda i, v: i < trips, lambda i, v: [i + 1, rg.tanh(v * 0.9 + v0)],
                             [rg.constant(0, dtype="int64"), v0])
        return v
    v = v0
    for _ in range(trips):
        v = torch.tanh(v * 0.9 + v0)
    return v


def _structure(desc: dict, pre: Any, x, w, s, trips, fw: int, lengths=None, k=None):
    """The structure's result over the node ``pre`` (and leaf ``x``), in one framework."""
    kind, a, b = desc["structure"], desc["a"], desc["b"]
    if kind == "none":
        return _apply(a, [pre, x], w, fw, k)
    if kind == "cond":
        pred = desc.get("pred", "sum")
        if fw == 0:
            return rg.cond(_holds(pre, 0, pred), lambda: _apply(a, [pre, x], w, 0, k),
                           lambda: _apply(b, [pre, x], w, 0, k))
        return _apply(a, [pre, x], w, 1, k) if _holds(pre, 1, pred) else _apply(b, [pre, x], w, 1, k)
    if kind == "while":
        # tanh keeps the loop var bounded however many times the body runs
        if fw == 0:
            zero = rg.constant(0, dtype="int64")
            _, v = rg.while_loop(lambda i, v: i < trips, lambda i, v: [i + 1, rg.tanh(_apply(a, [v, x], w, 0, k))],
                                 [zero, pre], recompute=desc["recompute"], max_iters=desc.get("max_iters"))
            return v
        v = pre
        for _ in range(desc["trips"]):
            v = torch.tanh(_apply(a, [v, x], w, 1, k))
        return v
    if kind == "array":
        return _array(desc, pre, x, w, trips, fw)
    return _recurrent(desc, pre, w, s, lengths, fw, k)


def _array(desc: dict, pre, x, w, trips, fw: int):
    """v <- tanh(a(v, x)) ``trips`` times, appending 0.5 v to a TensorArray and, with ``inner``,
    sin(v) (j + 1) for j < i % 2 from a nested loop; then v + 0.3 sum(rows) + 0.2 rows[pick]
    (zeros when there are not that many rows)."""
    a, pick = desc["a"], desc["pick"]
    if fw == 0:
        def inner(v, arr, i):
            def step(j, arr):
                return j + 1, arr.write(arr.size(), rg.sin(v) * rg.cast(j + 1, "float64"))
            return rg.while_loop(lambda j, arr: j < i % 2, step, [rg.constant(0), arr])[1]

        def body(i, v, arr):
            v = rg.tanh(_apply(a, [v, x], w, 0))
            arr = arr.write(arr.size(), v * 0.5)
            return i + 1, v, inner(v, arr, i) if desc.get("inner") else arr
        arr = rg.TensorArray(dtype="float64", element_shape=list(pre.shape))
        _, v, arr = rg.while_loop(lambda i, v, arr: i < trips, body, [rg.constant(0), pre, arr])
        row = rg.cond(arr.size() > pick, lambda: arr.read(pick), lambda: rg.zeros_like(v))
        return v + rg.sum(arr.stack(), axis=0) * 0.3 + row * 0.2
    v, rows = pre, []
    for i in range(desc["trips"]):
        v = torch.tanh(_apply(a, [v, x], w, 1))
        rows.append(v * 0.5)
        for j in range(i % 2 if desc.get("inner") else 0):
            rows.append(torch.sin(v) * (j + 1))
    total = sum(rows, torch.zeros_like(v))
    return v + total * 0.3 + (rows[pick] if len(rows) > pick else torch.zeros_like(v)) * 0.2


def _recurrent(desc: dict, pre, w, s, lengths, fw: int, k=None):
    """h' = tanh(a(x_t, h)) over s [T, m, n] (and c' = 0.5 c + h' with ``two_states``); rows past
    their length (``lengths``) keep their state."""
    a, two = desc["a"], desc.get("two_states", False)
    if fw == 0:
        def step(xs, hs):
            h = rg.tanh(_apply(a, [xs[0], hs[0]], w, 0, k))
            return [h, hs[1] * 0.5 + h] if two else [h]
        alls, lasts = rg.recurrent(step, [s], [pre, pre * 0.25] if two else [pre], seq_lengths=lengths,
                                   recompute=desc["recompute"])
        out = lasts[0] + rg.sum(alls[0], axis=0) * 0.5
        return out + lasts[1] * 0.3 + rg.sum(alls[1], axis=0) * 0.2 if two else out
    h, c = pre, pre * 0.25
    total_h, total_c = torch.zeros_like(pre), torch.zeros_like(pre)
    for t in range(s.shape[0]):
        new_h = torch.tanh(_apply(a, [s[t], h], w, 1, k))
        new_c = c * 0.5 + new_h
        if desc.get("lengths") is not None:
            running = torch.tensor([t < n for n in desc["lengths"]], dtype=torch.bool).reshape(-1, 1)
            new_h, new_c = torch.where(running, new_h, h), torch.where(running, new_c, c)
        h, c = new_h, new_c
        total_h, total_c = total_h + h, total_c + c
    out = h + total_h * 0.5
    return out + c * 0.3 + total_c * 0.2 if two else out


def _values(desc: dict, seed: int) -> dict:
    r = np.random.default_rng(seed)
    m, n, steps = desc["m"], desc["n"], desc["T"]
    return {"x": r.uniform(-1.5, 1.5, (m, n)), "y": r.uniform(-1.5, 1.5, (m, n)),
            "W": r.uniform(-1.0, 1.0, (n, n)), "s": r.uniform(-1.5, 1.5, (steps, m, n)),
            "p1": r.standard_normal((m, n)), "p2": r.standard_normal((m, n)),
            "q1": r.standard_normal((m, n)), "q2": r.standard_normal((n, n)),
            "k": np.array(r.uniform(0.5, 1.2))}


def _uses_k(desc: dict) -> bool:
    return any(op[0] == "k" for part in ("pre", "a", "b") for op in desc[part])


def _leaf_names(desc: dict) -> list[str]:
    return ["x", "y", "W"] + (["s"] if desc["structure"] == "recurrent" else []) + (["k"] if _uses_k(desc) else [])


def torch_reference(desc: dict, seed: int) -> dict:
    """loss, first gradients (per leaf) and, with ``second``, loss2 and its gradients."""
    vals = _values(desc, seed)
    names = _leaf_names(desc)
    leaves = {k: torch.tensor(vals[k], requires_grad=True) for k in names}
    x, w = leaves["x"], leaves["W"]
    nodes = [x, leaves["y"]]
    pre = _apply(desc["pre"], nodes, w, 1, leaves.get("k"))
    out = _structure(desc, pre, x, w, leaves.get("s"), desc["trips"], 1, k=leaves.get("k"))
    loss = (out * torch.tensor(vals["p1"])).sum() + (pre * torch.tensor(vals["p2"])).sum()
    if "k" in leaves:          # a 0-d value computed from the 0-d leaf alone
        loss = loss + leaves["k"] * leaves["k"] * 0.1
    second = desc["second"]
    grads = torch.autograd.grad(loss, [leaves[k] for k in names], allow_unused=True, create_graph=second)
    result = {"loss": loss.detach().numpy(), "grads": _as_numpy(names, grads, vals)}
    if second:
        gx, gw = grads[0], grads[2]
        loss2 = sum((g * torch.tensor(vals[q])).sum() for g, q in ((gx, "q1"), (gw, "q2")) if g is not None)
        if isinstance(loss2, torch.Tensor) and loss2.requires_grad:
            grads2 = torch.autograd.grad(loss2, [leaves[k] for k in names], allow_unused=True)
        else:
            grads2 = [None] * len(names)
        result["loss2"] = float(loss2.detach()) if isinstance(loss2, torch.Tensor) else 0.0
        result["grads2"] = _as_numpy(names, grads2, vals)
    return result


def _as_numpy(names, grads, vals) -> dict:
    return {k: np.zeros_like(vals[k]) if g is None else g.detach().numpy() for k, g in zip(names, grads)}


def build_program(desc: dict, seed: int):
    """The retrograd program of ``desc``: (main, startup, feed, fetch, labels), ``labels`` naming
    each fetch as ``torch_reference`` does ("loss", "grads.x", "loss2", "grads2.W", ...); leaves
    and constants in ``desc["dtype"]`` (float64 unless drawn with ``edges``)."""
    vals = _values(desc, seed)
    names = _leaf_names(desc)
    dtype = desc.get("dtype", "float64")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        leaves = {k: _leaf(desc, k, vals[k], dtype) for k in names}
        trips = rg.data("trips", [], dtype="int64")
        lengths = rg.data("lengths", [-1], dtype="int64") if desc.get("lengths") is not None else None
        x, w = leaves["x"], leaves["W"]
        pre = _apply(desc["pre"], [x, leaves["y"]], w, 0, leaves.get("k"))
        out = _structure(desc, pre, x, w, leaves.get("s"), trips, 0, lengths, leaves.get("k"))
        loss = rg.sum(out * rg.constant(vals["p1"], dtype=dtype)) + rg.sum(pre * rg.constant(vals["p2"], dtype=dtype))
        if "k" in leaves:      # a 0-d value computed from the 0-d leaf alone
            loss = loss + leaves["k"] * leaves["k"] * 0.1
        grads = rg.gradients(loss, [leaves[k] for k in names])
        fetch = [loss] + [g for g in grads if g is not None]
        labels = ["loss"] + [f"grads.{k}" for k, g in zip(names, grads) if g is not None]
        if desc["second"]:
            terms = [rg.sum(g * rg.constant(vals[q], dtype=dtype))
                     for g, q in ((grads[0], "q1"), (grads[2], "q2")) if g is not None]
            if terms:
                loss2 = rg.add_n(terms) if len(terms) > 1 else terms[0]
                grads2 = rg.gradients(loss2, [leaves[k] for k in names])
                fetch += [loss2] + [g for g in grads2 if g is not None]
                labels += ["loss2"] + [f"grads2.{k}" for k, g in zip(names, grads2) if g is not None]
    feed = {k: np.asarray(vals[k], dtype=dtype) for k in names if not (k == "W" and desc.get("param_w"))}
    feed["trips"] = np.array(desc["trips"], dtype=np.int64)
    if desc.get("lengths") is not None:
        feed["lengths"] = np.array(desc["lengths"], dtype=np.int64)
    return main, startup, feed, fetch, labels


def _leaf(desc: dict, name: str, value: np.ndarray, dtype: str):
    """Leaf ``name``: fed data (with -1 sizes but the last where ``desc["dynamic"]``), or for W
    with ``desc["param_w"]`` a parameter initialised to ``value``."""
    if name == "W" and desc.get("param_w"):
        return rg.create_parameter("W", list(value.shape), dtype=dtype, init=value.astype(dtype))
    shape = list(value.shape)
    if desc.get("dynamic") and name in ("x", "y", "s"):
        shape = [-1] * (len(shape) - 1) + shape[-1:]
    return rg.data(name, shape, dtype=dtype)


def reference_values(desc: dict, seed: int, labels) -> list:
    """``torch_reference``'s values for ``labels`` (``build_program``'s), float64."""
    ref = torch_reference(desc, seed)
    values = []
    for label in labels:
        key, _, leaf = label.partition(".")
        values.append(np.asarray(ref[key][leaf] if leaf else ref[key], dtype=np.float64))
    return values


def retrograd_result(desc: dict, seed: int) -> dict:
    """The same as ``torch_reference``, computed by a retrograd program."""
    vals = _values(desc, seed)
    names = _leaf_names(desc)
    main, _, feed, fetch, labels = build_program(desc, seed)
    got = dict(zip(labels, rg.Executor().run(main, feed=feed, fetch_list=fetch)))
    result = {"loss": got["loss"], "grads": {k: got.get(f"grads.{k}", np.zeros_like(vals[k])) for k in names}}
    if desc["second"]:
        result["loss2"] = float(got.get("loss2", 0.0))
        result["grads2"] = {k: got.get(f"grads2.{k}", np.zeros_like(vals[k])) for k in names}
    return result


def compare(desc: dict, seed: int, rtol: float = 1e-7) -> None:
    """AssertionError (naming the quantity and the description) where retrograd and torch differ."""
    ref = torch_reference(desc, seed)
    if not all(np.all(np.isfinite(v)) for v in _flat(ref)):
        return                                       # an overflow in both: nothing to compare
    got = retrograd_result(desc, seed)
    for key in ("loss", "loss2"):
        if key in ref:
            np.testing.assert_allclose(got[key], ref[key], rtol=rtol, atol=1e-9,
                                       err_msg=f"{key}; program: {desc}, seed {seed}")
    for key in ("grads", "grads2"):
        for name, expected in ref.get(key, {}).items():
            value = got[key][name]
            assert np.shape(value) == np.shape(expected), f"{key} of {name} has shape {np.shape(value)}"
            scale = 1.0 + float(np.max(np.abs(expected), initial=0.0))
            np.testing.assert_allclose(value, expected, rtol=rtol, atol=1e-9 * scale,
                                       err_msg=f"{key} of {name}; program: {desc}, seed {seed}")


def _flat(result: dict):
    yield np.asarray(result["loss"])
    for key in ("grads", "grads2"):
        yield from result.get(key, {}).values()


# --- across backends (the differential fuzz) -------------------------------------------------------

def differential_verdict(desc: dict, seed: int, runners=None):
    """The program of ``desc`` run on every backend and through export + a plain onnxruntime session
    (``differential.py``): its ``Verdict``. Where NumPy computes float64 numbers, they must also be
    the torch twin's (else a "mismatch" naming the twin). A program retrograd refuses to build (a
    second derivative through a budgeted loop's gradient) is "refused" too."""
    import differential
    try:
        main, startup, feed, fetch, labels = build_program(desc, seed)
    except rg.RetrogradError as exc:
        return differential.Verdict("refused", f"build: {type(exc).__name__}: {exc}")
    outcomes = differential.run_everywhere(main, startup, feed, fetch, runners or differential.RUNNERS)
    verdict = differential.classify(outcomes, fetch)
    ref = outcomes["numpy"]
    if verdict.kind in ("agree", "refused") and ref.error is None and desc.get("dtype", "float64") == "float64":
        why = differential.differences(ref.values, reference_values(desc, seed, labels), labels)
        if why is not None:
            return differential.Verdict("mismatch", f"torch twin: {why}", outcomes)
    return verdict
