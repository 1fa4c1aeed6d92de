"""The gradient of While and Scan: a Scan in the other direction over the body's backward block."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...ir.analysis import free_reads
from ...ir.dtypes import is_float
from ...ir.program import Block, Op, Var
from ..core import streams
from ..array.creation import zeros_like
from ..array.tensor import shape
from ..math.elementwise import add
from ..core.registry import GradCtx, append_op, get_op_def
from ..core.subblock_grad import detach, report_ops, run_backward
from ..core.subblocks import bound_var, build_into, full_flags, outer_reads


@dataclass
class LoopView:
    """Where a While's or a Scan's parts sit, so one gradient maker serves both."""
    op: Op
    body: Block
    carry_binds: list[str]
    body_outs: list[str]
    x_binds: list[str]
    ys: list[str]
    carry_pos: list[int]
    xs_pos: list[int]
    const_pos: list[int]
    finals: list[Var]
    ys_start: int
    count: Var
    reverse: bool

    @staticmethod
    def of_while(g: GradCtx) -> "LoopView":
        a, n = g.attrs, len(g.attrs["carry_binds"])
        return LoopView(g.op, a["body"], list(a["carry_binds"]), list(a["body_outs"]), [], list(a["ys"]),
                         list(range(n)), [], list(range(n, len(g.x))), g.out[:n], n + 1, g.out[n], False)

    @staticmethod
    def of_scan(g: GradCtx) -> "LoopView":
        a = g.attrs
        c, s = len(a["carry_binds"]), len(a["x_binds"])
        return LoopView(g.op, a["body"], list(a["carry_binds"]), list(a["body_outs"]), list(a["x_binds"]),
                         list(a["ys"]), list(range(1, 1 + c)), list(range(1 + c, 1 + c + s)),
                         list(range(1 + c + s, len(g.x))), g.out[:c], c, g.x[0], bool(a["reverse"]))


def _reaching(ops: Sequence[Op], targets: set[str]) -> set[str]:
    """Names whose values flow into ``targets`` through differentiable inputs. An op without a
    gradient maker counts too: the body's backward then refuses it, naming the op, as a backward
    outside a loop does (skipping it gave a silent zero gradient)."""
    relevant = set(targets)
    for op in reversed(ops):
        opdef = get_op_def(op.type)
        if not any(n in relevant for n in op.outputs):
            continue
        relevant.update(n for i, n in enumerate(op.inputs) if i not in opdef.nondiff_inputs)
        for sub in op.sub_blocks():
            relevant.update(free_reads(sub))
    return relevant


def _active_carries(L: LoopView, x: list[Var], active: set[int], ys_in: list[int]) -> tuple[list[int], set]:
    """The loop vars that carry a gradient: those given one, and (to a fixed point) those that
    reach one through the body. Also every body name reaching a gradient."""
    while True:
        reach = _reaching(L.body.ops, {L.body_outs[j] for j in active} | {L.ys[i] for i in ys_in})
        more = {j for j, name in enumerate(L.carry_binds) if name in reach and is_float(x[L.carry_pos[j]].dtype)}
        if more <= active:
            return sorted(active), reach
        active = active | more


def loop_grad(g: GradCtx, L: LoopView) -> list:
    """Gradient of While or Scan: a Scan in the other direction over the body's backward block.

    Its carries are the loop vars' gradients and one accumulator per outer
    value the body reads; per iteration it binds the gradients of the kept
    values (double backward) and the forward values the backward reads.
    """
    x, body = g.x, L.body
    c = len(L.carry_binds)
    result: list = [None] * len(x)
    dfinal = g.dout[:c]
    dys = g.dout[L.ys_start:L.ys_start + len(L.ys)]
    ys_in = [i for i, d in enumerate(dys) if d is not None]

    def diff(pos: int) -> bool:
        return g.wanted[pos] and is_float(x[pos].dtype)

    carries, reach = _active_carries(L, x, {j for j in range(c) if dfinal[j] is not None}, ys_in)
    consts = [i for i, pos in enumerate(L.const_pos) if diff(pos) and x[pos].name in reach]
    xs_diff = [i for i, pos in enumerate(L.xs_pos) if diff(pos) and L.x_binds[i] in reach]
    if not any(diff(L.carry_pos[j]) for j in carries) and not consts and not xs_diff:
        return result

    # The backward of one iteration.
    G = body.program.create_block(body)
    dcarry = {j: bound_var(G, f"{L.carry_binds[j]}.grad_in", body.var(L.carry_binds[j])) for j in carries}
    dy = {i: bound_var(G, f"{L.ys[i]}.grad_in", body.var(L.ys[i])) for i in ys_in}
    parts: dict[str, list[Var]] = {}
    for j in carries:
        parts.setdefault(L.body_outs[j], []).append(dcarry[j])
    for i in ys_in:
        parts.setdefault(L.ys[i], []).append(dy[i])
    const_names = [x[L.const_pos[i]].name for i in consts]
    grads = run_backward(G, body, parts, [L.carry_binds[j] for j in carries]
                          + [L.x_binds[i] for i in xs_diff] + const_names, g.callbacks)
    n_built = len(G.ops)
    with build_into(G):
        new_dcarry = [zeros_like(dcarry[j]) if grads[L.carry_binds[j]] is None else grads[L.carry_binds[j]]
                      for j in carries]
        summed = [(i, grads[name]) for i, name in zip(consts, const_names) if grads[name] is not None]
        accs = [bound_var(G, f"{x[L.const_pos[i]].name}.grad_acc", x[L.const_pos[i]]) for i, _ in summed]
        new_accs = [add(acc, grad) for acc, (_, grad) in zip(accs, summed)]
    report_ops(G, G.ops[n_built:], g.callbacks)     # zero and accumulated gradients are gradient ops too
    dxs = [(i, grads[L.x_binds[i]]) for i in xs_diff if grads[L.x_binds[i]] is not None]
    fetch = [v.name for v in new_dcarry + new_accs] + [v.name for _, v in dxs]
    saved, shape_only = detach(G, body, g.block, fetch, [v.name for v in [*dcarry.values(), *dy.values(), *accs]])

    # Per iteration: the kept values' gradients, then the forward values the backward reads.
    stacks = _save_loop_values(L, [n for n in saved if n not in L.x_binds], shape_only)
    ragged = bool(L.op.attrs.get("ragged"))     # loop vars change shape: each iteration's shapes kept too
    shapes = _saved_shapes(L, x, saved) if ragged else {}
    for name in saved:
        if name in L.x_binds and name not in shape_only:
            _need_in_full(x[L.xs_pos[L.x_binds.index(name)]])
    xs_vars = [dys[i] for i in ys_in] + [x[L.xs_pos[L.x_binds.index(n)]] if n in L.x_binds else stacks[n]
                                         for n in saved]
    x_binds = [dy[i].name for i in ys_in] + saved
    inits = [dfinal[j] if dfinal[j] is not None else zeros_like(L.finals[j]) for j in carries]
    inits += [zeros_like(x[L.const_pos[i]]) for i, _ in summed]
    inputs = [L.count] + inits + xs_vars + [g.block.var(n) for n in outer_reads(G, fetch)]
    ys_like = []
    for i, _ in dxs:  # the gradient of a sliced input has that input's shape
        ref = x[L.xs_pos[i]]
        if not any(v.name == ref.name for v in inputs[1 + len(inits):]):
            inputs.append(ref)
        ys_like.append(next(p for p, v in enumerate(inputs) if p > len(inits) and v.name == ref.name))
    x_shapes = [None] * len(ys_in)
    for name in saved:      # a padded stack is cut back to iteration i's shape when bound
        x_shapes.append(len(inputs) if name in shapes else None)
        if name in shapes:
            inputs.append(shapes[name])
    attrs = {"body": G, "carry_binds": [dcarry[j].name for j in carries] + [a.name for a in accs],
             "body_outs": fetch[:len(carries) + len(accs)], "x_binds": x_binds,
             "ys": [v.name for _, v in dxs], "ys_like": ys_like, "ys_full": [True] * len(dxs),
             "reverse": not L.reverse}
    if ragged:
        attrs.update(ragged=True, x_shapes=x_shapes)
    streams.copy_stream(L.op.attrs, attrs)   # iteration i replays the forward's iteration i
    outs = append_op("Scan", inputs, attrs, name="scan_grad")
    for var, j in zip(outs, carries):
        if diff(L.carry_pos[j]):
            result[L.carry_pos[j]] = var
    for var, (i, _) in zip(outs[len(carries):], summed):
        result[L.const_pos[i]] = var
    for var, (i, _) in zip(outs[len(carries) + len(summed):], dxs):
        result[L.xs_pos[i]] = var
    return result


def _saved_shapes(L: LoopView, x: list[Var], names: Sequence[str]) -> dict[str, Var]:
    """Per saved name, the [iterations, rank] stack of its shape in each iteration: computed in the
    body (``Shape``) and kept like any value, or, for a slice of a ragged Scan input, that input's."""
    found, made = {}, {}
    x_shapes = L.op.attrs.get("x_shapes") or [None] * len(L.x_binds)
    for name in names:
        if name in L.x_binds:
            position = x_shapes[L.x_binds.index(name)]
            if position is not None:
                found[name] = x[position]
            continue
        with build_into(L.body):
            made[name] = shape(L.body.var(name)).name
    stacks = _save_loop_values(L, list(made.values()), set())
    found.update({name: stacks[inner] for name, inner in made.items()})
    return found


def _save_loop_values(L: LoopView, names: Sequence[str], shape_only: set[str]) -> dict[str, Var]:
    """Make the loop op also output, stacked over iterations, the body values ``names``
    (as zero-stride stand-ins for those in ``shape_only``)."""
    op, attrs = L.op, L.op.attrs
    ys = list(attrs["ys"])
    likes = list(attrs["ys_like"]) if "ys_like" in attrs else None
    full = full_flags(attrs, ys)
    found = {}
    for name in names:
        if name in ys:
            found[name] = op.block.var(op.outputs[L.ys_start + ys.index(name)])
            full[ys.index(name)] |= name not in shape_only
            continue
        full.append(name not in shape_only)
        inner = L.body.var(name)
        var = op.block.create_var(op.block.program.unique_name(f"{name}.saved"), (-1,) + inner.shape,
                                  inner.dtype)
        op.outputs.append(var.name)
        ys.append(name)
        if likes is not None:
            likes.append(None)
        found[name] = var
    attrs["ys"] = ys
    attrs["ys_full"] = full
    if likes is not None:
        attrs["ys_like"] = likes
    op.block.program.bump()
    return found


def _need_in_full(stack: Var) -> None:
    """A backward reads ``stack`` (a loop's kept values) in full: keep the values, not a stand-in."""
    for op in stack.block.ops:
        if stack.name in op.outputs and "ys_full" in op.attrs:
            index = op.outputs.index(stack.name) - (len(op.outputs) - len(op.attrs["ys"]))
            if index >= 0 and not op.attrs["ys_full"][index]:
                op.attrs["ys_full"] = [f or i == index for i, f in enumerate(op.attrs["ys_full"])]
                stack.block.program.bump()
