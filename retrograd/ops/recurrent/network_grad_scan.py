"""The gradient of ``RecurrentNetworkGrad``: the first-order backward rebuilt as a reversed ``Scan``.

``RecurrentNetworkGrad`` runs the backward step block in reverse time with
fused bookkeeping (gradient buffers, products batched over time, masks). For
a second derivative its gradient maker builds the same computation as a
reversed Scan over one body block and returns that Scan's gradient (a Scan
again, ``loop_grad.py``), so derivatives of any order follow. Iteration t of
the body::

    dnext_i = dcur_i + d_all_i[t]       (rows past their length: dnext 0, dcur passed on)
    <the forward step>                  step values recomputed from x_t and the previous states
    <the backward step block>
    dcur_i  = d(previous state i)       acc_o += d(outer o)  (+ a_t^T d_t, batched products)
    ys:       d(x_t)

binding x_t = seq[t], the previous state prev_i[t] (init_i, then all_i[t-1])
and d_all_i[t]; the carries start from d_last_i and zeros. The step values
are recomputed, not read from the forward op's saved outputs, so the second
derivative reaches the inputs through them; the first-order op keeps its
fast kernel and the Scan runs only in the second backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ProgramError
from ...ir.builder import capture_ops, emit
from ...ir.dtypes import is_float
from ...ir.program import Block, Var
from ..core import streams
from ..array.creation import assign, zeros_like
from ..control.loop_grad import LoopView, loop_grad
from ..math.elementwise import add, greater, matmul, sub, where
from ..reduce.reductions import sum as reduce_sum
from ..core.registry import GradCtx, append_op
from ..core.subblocks import bound_var, build_into, clone_ops_into, outer_reads
from ..array.tensor import cast, concat, dim, reshape, slice, unsqueeze

_END = 2 ** 62     # a slice end past any length


@dataclass
class _Inputs:
    """Positions of a RecurrentNetworkGrad's inputs by role (None: not given)."""
    seq: list[int]
    init: list[int]
    lengths: int | None
    outer: list[int]
    alls: list[int]
    d_all: list[int | None]
    d_last: list[int | None]

    @staticmethod
    def of(attrs: dict) -> "_Inputs":
        s, k = len(attrs["inputs_t"]), len(attrs["states"])
        has_lengths = bool(attrs["has_lengths"])
        outer_start = s + k + int(has_lengths)
        n = outer_start + int(attrs["n_outer"])
        given, position = [], n + k + len(attrs["saved"])
        for flag in list(attrs["dall_given"]) + list(attrs["dlast_given"]):
            given.append(position if flag else None)
            position += bool(flag)
        return _Inputs(list(range(s)), list(range(s, s + k)), s + k if has_lengths else None,
                       list(range(outer_start, n)), list(range(n, n + k)), given[:k], given[k:])


@dataclass
class _Scan:
    """The Scan being built: its inputs, its body's bindings, and where each input came from
    (``origin[i]``: (RecurrentNetworkGrad input position, how its gradient maps back))."""
    body: Block
    carry_binds: list[str] = field(default_factory=list)
    inits: list[Var] = field(default_factory=list)
    carry_role: list[tuple] = field(default_factory=list)     # ("counter",), ("state", i), ("acc", j)
    body_outs: list[str] = field(default_factory=list)
    x_binds: list[str] = field(default_factory=list)
    xs: list[Var] = field(default_factory=list)
    x_origin: list[list] = field(default_factory=list)
    init_origin: list[list] = field(default_factory=list)

    def carry(self, hint: str, init: Var, role: tuple, origin: list) -> Var:
        var = bound_var(self.body, hint, init)
        self.carry_binds.append(var.name)
        self.inits.append(init)
        self.carry_role.append(role)
        self.init_origin.append(origin)
        return var

    def x(self, name: str, stack: Var, like: Var | None, origin: list) -> Var:
        if name not in self.body.vars:
            ref = like if like is not None else stack
            shape = ref.shape if like is not None else stack.shape[1:]
            self.body.create_var(name, shape, ref.dtype)
        self.x_binds.append(name)
        self.xs.append(stack)
        self.x_origin.append(origin)
        return self.body.var(name)


def rnn_grad_grad(g: GradCtx) -> list[Var | None]:
    """Gradient of RecurrentNetworkGrad ``g.op``: the gradient of an equivalent reversed Scan."""
    attrs, x = g.attrs, g.x
    step, back = _step_block(g.op), attrs["backward"]
    pos = _Inputs.of(attrs)
    program = g.block.program
    scan = _Scan(program.create_block(g.block))
    n = dim(x[pos.seq[0]] if pos.seq else x[pos.alls[0]], 0)
    counter = None
    if pos.lengths is not None or attrs.get("timestep"):
        counter = scan.carry("t", sub(n, 1), ("counter",), [])
    floats = [i for i in range(len(attrs["states"])) if is_float(x[pos.init[i]].dtype)]
    dcur = {}
    for i in floats:
        d_last = pos.d_last[i]
        init = x[d_last] if d_last is not None else zeros_like(x[pos.init[i]])
        dcur[i] = scan.carry(f"{attrs['states'][i]}.dcur", init, ("state", i),
                             [] if d_last is None else [(d_last, "same")])
    accs = {j: scan.carry(f"{g.op.inputs[pos.outer[j]]}.acc", zeros_like(x[pos.outer[j]]), ("acc", j), [])
            for j in _accumulated_outers(attrs)}
    for i, p in enumerate(pos.seq):
        scan.x(attrs["inputs_t"][i], x[p], step.vars.get(attrs["inputs_t"][i]), [(p, "same")])
    for i, name in enumerate(attrs["states"]):
        prev = concat([unsqueeze(x[pos.init[i]], 0), slice(x[pos.alls[i]], [0], [0], [-1])], axis=0)
        scan.x(name, prev, step.vars.get(name), [(pos.init[i], "first"), (pos.alls[i], "shifted")])
    dall_t = {i: scan.x(program.unique_name(f"{attrs['states'][i]}.dall_t"), x[pos.d_all[i]], None,
                        [(pos.d_all[i], "same")])
              for i in floats if pos.d_all[i] is not None}
    lengths = x[pos.lengths] if pos.lengths is not None else None
    carried = _body_start(scan.body, step, back, attrs, counter, dcur, dall_t, lengths)
    copies = {step.idx: scan.body, back.idx: scan.body}
    clone_ops_into(step, scan.body, None, copies)
    written = {name for op in step.ops for name in op.outputs}
    clone_ops_into(back, scan.body, [op for op in back.ops if not set(op.outputs) <= written], copies)
    ys = _body_end(scan, attrs, counter, dcur, accs, carried)
    return _gradient_of_scan(g, pos, scan, n, ys)


def _step_block(op) -> Block:
    index = op.attrs.get("step_block")
    blocks = op.block.program.blocks
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(blocks):
        raise ProgramError(f"{op.where()}: no second derivative through this op: it does not name its "
                           "forward step block (attribute step_block)")
    return blocks[index]


def _accumulated_outers(attrs: dict) -> list[int]:
    """Outer values whose gradient the op sums over steps (in the block or batched over time)."""
    found = {j for j, name in enumerate(attrs["fetch_outer"]) if name}
    found.update(entry[0] for entry in attrs["batched"])
    return sorted(found)


def _body_start(body: Block, step: Block, back: Block, attrs: dict, counter, dcur: dict, dall_t: dict,
                lengths) -> dict:
    """The timestep and each dnext_i, written under the names the step and backward blocks read;
    returns the gradient that finished rows pass on unchanged (with lengths), per state."""
    carried = {}
    with build_into(body):
        timestep = attrs.get("timestep")
        if timestep:
            var = step.var(timestep)
            out = _declared(body, timestep, var)
            value = cast(counter, var.dtype)
            assign(reshape(value, [max(d, 1) for d in var.shape]) if var.shape else value, out)
        for i, d in dcur.items():
            dn = d if i not in dall_t else add(d, dall_t[i])
            if lengths is not None:
                running = reshape(greater(lengths, counter), [-1] + [1] * (len(d.shape) - 1))
                carried[i] = where(running, zeros_like(dn), dn)
                dn = where(running, dn, zeros_like(dn))
            name = attrs["dnext"][i]
            assign(dn, _declared(body, name, back.vars[name] if name in back.vars else d))
    return carried


def _declared(block: Block, name: str, like: Var) -> Var:
    """``block``'s variable ``name``, declared with ``like``'s type if it is not yet."""
    if name not in block.vars:
        block.create_var(name, like.shape, like.dtype)
    return block.vars[name]


def _body_end(scan: _Scan, attrs: dict, counter, dcur: dict, accs: dict, carried: dict) -> list[str]:
    """The carries' new values; returns the ys (per sequence in grad_of: d(x_t))."""
    body = scan.body
    with build_into(body):
        for role in scan.carry_role:
            if role[0] == "counter":
                new = sub(counter, 1)
            elif role[0] == "state":
                i = role[1]
                name = attrs["fetch_state"][i]
                new = body.var(name) if name else zeros_like(dcur[i])
                new = add(new, carried[i]) if i in carried else new
            else:
                j = role[1]
                new = accs[j]
                if attrs["fetch_outer"][j]:
                    new = add(new, body.var(attrs["fetch_outer"][j]))
                for entry in attrs["batched"]:
                    if entry[0] == j:
                        product = matmul(body.var(_a_name(attrs, entry)), body.var(entry[3]), transpose_x=True)
                        new = add(new, product)
            scan.body_outs.append(new.name)
        return [name if name else zeros_like(body.var(attrs["inputs_t"][i])).name
                for i, name in enumerate(attrs["fetch_seq"]) if i in attrs["grad_of"]]


def _a_name(attrs: dict, entry: list) -> str:
    """The step value multiplying d_t in a product batched over time (``BackwardStep.batched``)."""
    _, kind, ref, _ = entry
    if kind == "seq":
        return attrs["inputs_t"][ref]
    if kind == "prev":
        return attrs["states"][ref]
    if kind == "new":
        return attrs["state_outs"][ref]
    return ref


def _gradient_of_scan(g: GradCtx, pos: _Inputs, scan: _Scan, n: Var, ys: list[str]) -> list:
    """Build the Scan, differentiate it, and map its input gradients onto the op's inputs."""
    attrs = g.attrs
    c = len(scan.inits)
    seqs_out = [i for i in range(len(pos.seq)) if i in attrs["grad_of"]]
    scan_attrs = {"body": scan.body, "carry_binds": scan.carry_binds, "body_outs": scan.body_outs,
                  "x_binds": scan.x_binds, "ys": ys, "ys_like": [1 + c + i for i in seqs_out],
                  "ys_full": [True] * len(ys), "reverse": True}
    streams.copy_stream(attrs, scan_attrs)       # iteration t replays forward step t's draws
    consts = [g.block.var(name) for name in outer_reads(scan.body, scan.body_outs + ys)]
    with capture_ops() as built:
        outs = append_op("Scan", [n] + scan.inits + scan.xs + consts, scan_attrs, name="rnn_grad_scan")
    for op in built:
        emit(op, g.block)
    scan_op = built[-1]
    dout: list = [None] * len(outs)
    for out_grad, position in zip(g.dout, attrs["grad_of"]):
        index = _output_index(pos, scan, seqs_out, position)
        if out_grad is not None and index is not None:
            dout[index] = out_grad
    origins = ([[]] + scan.init_origin + scan.x_origin
               + [[(p, "same") for p, name in enumerate(g.op.inputs) if name == v.name] for v in consts])
    wanted = [any(g.wanted[p] for p, _ in found) for found in origins]
    result: list = [None] * len(g.x)
    if all(d is None for d in dout) or not any(wanted):
        return result
    ctx = GradCtx(scan_op, g.block, dout, wanted, g.callbacks)
    for grad, found in zip(loop_grad(ctx, LoopView.of_scan(ctx)), origins):
        for p, how in found:
            if grad is not None and g.wanted[p]:
                part = _mapped(grad, how, g.x[p])
                result[p] = part if result[p] is None else add(result[p], part)
    return result


def _output_index(pos: _Inputs, scan: _Scan, seqs_out: list[int], position: int) -> int | None:
    """The Scan output holding the RecurrentNetworkGrad output for input ``position`` (None: that
    output is zeros, the gradient of an outer value no step reads differentiably)."""
    if position < len(pos.seq):
        return len(scan.inits) + seqs_out.index(position)
    role = ("state", pos.init.index(position)) if position in pos.init else ("acc", pos.outer.index(position))
    return scan.carry_role.index(role) if role in scan.carry_role else None


def _mapped(grad: Var, how: str, target: Var) -> Var:
    """A gradient of a Scan input as the gradient of the op input it was made from."""
    if how == "first":        # prev[0] is the initial state
        return reduce_sum(slice(grad, [0], [0], [1]), axis=0)
    if how == "shifted":      # prev[t] is all[t-1]
        return concat([slice(grad, [0], [1], [_END]), zeros_like(slice(target, [0], [0], [1]))], axis=0)
    return grad
