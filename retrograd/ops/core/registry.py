"""The op registry: one ``OpDef`` per op type, filled by the ``defop`` decorator.

An op is defined once, in one place::

    @defop("Tanh", infer=same_as_first, grad=lambda g: [g.dy * (1.0 - g.y * g.y)])
    def _tanh(k, x):
        return k.xp.tanh(x)

    def tanh(x):                       # the front-end builder users call
        return append_op("Tanh", [x])[0]

* ``infer(ins, attrs) -> [(shape, dtype), ...]`` is the shape/dtype rule; it
  sees input Vars (shapes may hold -1) and raises ``ShapeError``.
* the kernel ``(k, *arrays)`` returns one array, or a tuple for several
  outputs; ``k.xp`` is the array namespace, ``k.attrs`` the attributes.
* ``grad(g) -> [Var | None per input]`` builds the gradient with the same
  builders users call (so gradients of gradients work); ``g.x``/``g.out``/
  ``g.dout`` hold the forward inputs, outputs and output gradients.
* extra keywords land in ``OpDef.extra``; ``shape_only=(i, ...)`` marks inputs
  read only for their run-time shape (the ``like`` of ``SumTo``), so a pass
  may bind a stand-in of that shape instead of keeping the value.
  ``row_wise=(i, ...)`` (or ``ROW_WISE_ELEMENTWISE``: every input of the
  output's rank) marks an op whose output rows, over every leading axis, are
  made from the same rows of those inputs alone (the others read whole): the
  memory passes may split it over time steps or micro-batches.
  ``compile=False`` keeps an op out of compiled regions (``Executor(compile=True)``: it runs
  eagerly between them: an op whose kernel a region compiler cannot take whole).
  ``batch_rows=(i, ...)`` marks one separable over the first axis only (the
  heads of attention, a layer norm); ``batch_broadcast=True`` lets its other
  inputs broadcast over that axis (an attention mask).
  ``size_values=fn(shapes, values, attrs) -> (out shapes | None, out values | None)`` lets the
  memory planner follow sizes through int scalars (``Dim`` gives an axis' size, ``Arange`` a
  length from its bounds): ``values`` holds the known ints of the inputs (None where unknown).
  ``batch_axis=fn(axis, shape, declared shape, attrs) -> (axis, groups) | None`` declares where
  a one-input layout op puts its input's batch axis (micro-batches, ``memory/micro_batches.py``):
  ``groups > 1`` when fixed leading axes fold into the rows in front of it (rows ordered (group,
  batch element)); None when it mixes batch elements.
  ``flops=fn(in shapes, out shapes, attrs) -> number`` declares an op whose time goes into
  arithmetic (a contraction: GEMM, convolution, attention) and how much: the memory budget's
  selective recompute (``memory/selective.py``) weighs recomputing it by that count; an op
  declaring none is taken as memory-bound (its time follows the bytes it reads and writes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...errors import ProgramError, ShapeError
from ...ir.analysis import op_reads
from ...ir.builder import block_guard, capture_ops, current_block, emit
from ...ir.location import here, located
from ...ir.program import Block, Op, Var
from ...ir.verify import OpSchema, register_op_schema

Spec = tuple[tuple[int, ...], str]
ROW_WISE_ELEMENTWISE = "elementwise"    # defop(row_wise=...): any input of the output's rank


@dataclass(frozen=True)
class OpDef:
    """Everything about one op type: kernel, shape rule, gradient maker, schema.

    Built by ``defop``; looked up with ``get_op_def``. Frozen.

    Attributes:
        type: The op type (CamelCase).
        kernel: ``kernel(k, *arrays)`` returning one array or a tuple.
        infer: The shape/dtype rule ``infer(in_vars, attrs) -> [(shape, dtype)]``.
        grad: The gradient maker ``grad(g) -> [Var | None per input]``, or None.
        inputs: The input names (for printing and errors).
        outputs: The output names.
        nondiff_inputs: Indices of inputs that never get a gradient.
        random: Whether the op draws random numbers (replayed on recompute).
        doc: The kernel's docstring.
        extra: Other ``defop`` keywords (``shape_only``, ``row_wise``, ...).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        opdef = rg.get_op_def("MatMul")
        assert opdef.type == "MatMul" and opdef.inputs == ("x", "y") and opdef.differentiable
        ```
    """
    type: str
    kernel: Callable[..., Any]
    infer: Callable[[list[Var], dict], list[Spec]]
    grad: Callable[["GradCtx"], list] | None = None
    inputs: tuple[str, ...] = ("x",)
    outputs: tuple[str, ...] = ("out",)
    nondiff_inputs: frozenset[int] = frozenset()
    random: bool = False
    doc: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def differentiable(self) -> bool:
        """Whether the op has a gradient maker."""
        return self.grad is not None

    def input_differentiable(self, index: int) -> bool:
        """Whether input ``index`` gets a gradient: the op has a maker and the input is not marked ``nondiff``.

        Args:
            index: The input's position.

        Returns:
            True when the input is differentiable.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            gather = rg.get_op_def("Gather")                   # inputs (x, ids): ids get no gradient
            assert gather.input_differentiable(0) and not gather.input_differentiable(1)
            ```
        """
        return self.grad is not None and index not in self.nondiff_inputs


OPS: dict[str, OpDef] = {}


def defop(type: str, *, infer, grad=None, inputs: Sequence[str] = ("x",),
          outputs: Sequence[str] = ("out",), nondiff: Sequence[int] = (),
          random: bool = False, **extra):
    """Register the decorated kernel as op ``type`` with its shape rule and gradient maker.

    The shape rule sees input Vars (shapes may hold -1) and raises
    ``ShapeError``; the kernel computes with ``k.xp`` (the backend's array
    namespace) and reads ``k.attrs``; the gradient maker builds the gradient
    with the same builders users call, so gradients of gradients work
    (``g.x``/``g.out``/``g.dout`` hold the forward inputs, outputs and output
    gradients; ``g.dy`` is ``g.dout[0]``). See the module docstring for the
    extra keywords.

    Args:
        type: The op type, CamelCase, not yet registered.
        infer: ``infer(in_vars, attrs) -> [(shape, dtype), ...]``.
        grad: ``grad(g) -> [Var | None per input]``, or None (no gradient).
        inputs: The input names.
        outputs: The output names.
        nondiff: Indices of inputs that never get a gradient.
        random: The op draws random numbers.
        **extra: Stored in ``OpDef.extra`` (``shape_only``, ``row_wise``,
            ``batch_rows``, ``batch_broadcast``, ...).

    Returns:
        The decorator; it returns the kernel unchanged.

    Raises:
        ProgramError: ``type`` is registered already.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        @rg.defop("DocCube", infer=lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
                  grad=lambda g: [g.dy * 3.0 * g.x[0] * g.x[0]])
        def _cube(k, x):
            return x * x * x


        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2], dtype="float64", stop_gradient=False)
            (y,) = rg.append_op("DocCube", [x])
            (dx,) = rg.gradients(rg.sum(y), x)
        yv, dv = rg.Executor().run(main, feed={"x": np.array([1.0, 2.0])}, fetch_list=[y, dx])
        assert yv.tolist() == [1.0, 8.0] and dv.tolist() == [3.0, 12.0]
        rg.OPS.pop("DocCube")                              # (only so this example can run twice)
        ```
    """
    def register(kernel):
        if type in OPS:
            raise ProgramError(f"op type '{type}' is registered twice")
        OPS[type] = OpDef(type=type, kernel=kernel, infer=infer, grad=grad,
                          inputs=tuple(inputs), outputs=tuple(outputs),
                          nondiff_inputs=frozenset(nondiff), random=random,
                          doc=(kernel.__doc__ or "").strip(), extra=extra)
        return kernel
    return register


def get_op_def(type: str) -> OpDef:
    """The registered ``OpDef`` of op ``type``.

    Args:
        type: The op type.

    Returns:
        The OpDef.

    Raises:
        ProgramError: No op of that type is registered (the message lists the known ones).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        assert rg.get_op_def("MatMul").inputs == ("x", "y")
        ```
    """
    opdef = OPS.get(type)
    if opdef is None:
        raise ProgramError(f"op type '{type}' is not registered; known ops: {', '.join(sorted(OPS))}")
    return opdef


def _describe(vars_: Sequence[Var]) -> str:
    return ", ".join(f"{v.name}: {v.type_str()}" for v in vars_)


def infer_specs(type: str, in_vars: list[Var], attrs: dict, block: Block,
                building: bool = True) -> list[Spec]:
    """Run the op's shape rule, re-raising its complaint with the op, block and inputs named.

    While ``building`` (not checking a finished op), the message starts with
    the user's line that is building the op.
    """
    opdef = get_op_def(type)
    try:
        return opdef.infer(in_vars, attrs)
    except ShapeError as exc:
        raise ShapeError(f"{_building_at(building)}{type} in block {block.idx}: {exc} "
                         f"(inputs: {_describe(in_vars)})") from None


def _building_at(building: bool) -> str:
    """``"train.py:42: "`` for an error about an op being built (empty when unknown)."""
    location = here() if building else None
    return f"{location}: " if location else ""


def append_op(type: str, inputs: Sequence[Var], attrs: dict | None = None, *,
              outputs: Sequence[Var] | None = None, block: Block | None = None,
              name: str | None = None) -> list[Var]:
    """Build one op in the current block and return its output Vars.

    The op builders (``rg.tanh``...) call this; the shape rule gives the
    outputs' shapes and dtypes.

    Args:
        type: A registered op type.
        inputs: The input Vars (visible from the block).
        attrs: The op's attributes.
        outputs: Existing Vars to write (loop-carried values, optimizer
            updates); fresh outputs are created otherwise.
        block: The block to build in (the current block by default).
        name: The prefix of fresh output names (the op type in snake case by default).

    Returns:
        The output Vars.

    Raises:
        ProgramError: An input is not a Var this block sees, or the number of
            ``outputs`` is wrong.
        ShapeError: The shape rule rejects the inputs (naming op and inputs).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2])
            (y,) = rg.append_op("Tanh", [x])               # what rg.tanh(x) does
        (out,) = rg.Executor().run(main, feed={"x": np.zeros(2, "float32")}, fetch_list=[y])
        assert y.name.startswith("tanh") and out.tolist() == [0.0, 0.0]
        ```
    """
    block = block or current_block()
    attrs = dict(attrs or {})
    in_vars = list(inputs)
    for var in in_vars:
        if not isinstance(var, Var):
            raise ProgramError(f"{_building_at(True)}{type} in block {block.idx}: input {var!r} "
                               "is not a Var")
        if not block.sees(var):
            raise ProgramError(f"{_building_at(True)}{type} in block {block.idx}: input '{var.name}' "
                               f"belongs to {block.home_of(var)}, which block {block.idx} cannot see")
    specs = infer_specs(type, in_vars, attrs, block)
    if outputs is None:
        prefix = name or _snake(type)
        outputs = [block.create_var(block.program.unique_name(prefix), shape, dtype)
                   for shape, dtype in specs]
    elif len(outputs) != len(specs):
        raise ProgramError(f"{_building_at(True)}{type} in block {block.idx}: expects {len(specs)} outputs, got {len(outputs)}")
    emit(Op(type, [v.name for v in in_vars], [v.name for v in outputs], attrs), block)
    return list(outputs)


def _snake(type: str) -> str:
    found = _SNAKE.get(type)
    if found is None:
        found = _SNAKE[type] = _snake_case(type)
    return found


_SNAKE: dict[str, str] = {}         # op type -> its snake-case name prefix (asked once per op built)


def _snake_case(type: str) -> str:
    out = []
    for i, ch in enumerate(type):
        if ch.isupper() and i and not type[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class GradCtx:
    """What a gradient maker sees: the forward op's Vars and its output gradients."""

    def __init__(self, op: Op, block: Block, out_grads: Sequence[Var | None],
                 wanted: Sequence[bool] | None = None, callbacks: Sequence[Callable] = ()):
        self.op = op
        self.attrs = op.attrs
        self.block = block
        self.x = [block.var(n) for n in op.inputs]
        self.out = [block.var(n) for n in op.outputs]
        self.dout = list(out_grads)
        # Which inputs' gradients the caller needs: makers of ops that compute all their
        # input gradients in one kernel (RecurrentNetwork) skip the work for the others.
        self.wanted = [True] * len(op.inputs) if wanted is None else list(wanted)
        # append_backward's callbacks: makers that build a sub-block's backward pass them on.
        self.callbacks = list(callbacks)

    @property
    def y(self) -> Var:
        return self.out[0]

    @property
    def dy(self) -> Var:
        return self.dout[0]


def make_grad_ops(op: Op, out_grad_names: Sequence[str | None], block: Block | None = None,
                  wanted: Sequence[bool] | None = None,
                  callbacks: Sequence[Callable] = ()) -> tuple[list[Op], list[str | None]]:
    """The gradient ops of ``op``: the Caffe2 ``GetGradientDefs`` contract, ``(grad_ops, input_grad_names)``.

    The ops are built with their Vars declared in ``block`` but not placed in
    it; the caller (a backward pass) decides where they go. With ``wanted``,
    only the ops leading to wanted gradients are kept, so makers can stay
    one-liners that build every input's gradient.

    Args:
        op: The forward op.
        out_grad_names: The gradient's name per output of ``op`` (None where none).
        block: Where the gradient Vars are declared (default: the op's own block).
        wanted: One flag per input: which gradients the caller needs.
        callbacks: ``append_backward``'s callbacks, for makers that build
            sub-block backward passes (``GradCtx.callbacks``).

    Returns:
        ``(grad_ops, input_grad_names)``, a name or None per input.

    Raises:
        ProgramError: The op is not placed and no block is given, or has no gradient maker.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        main = rg.Program()
        with rg.program_guard(main):
            x = rg.data("x", [2], dtype="float64", stop_gradient=False)
            y = rg.tanh(x)
            dout = rg.data("dout", [2], dtype="float64")   # the gradient of the op's output
        op = main.global_block().ops[0]
        grad_ops, input_grads = rg.make_grad_ops(op, [dout.name])
        for g in grad_ops:
            main.global_block().append_op(g)
        feed = {"x": np.array([0.0, 1.0]), "dout": np.ones(2)}
        (dx,) = rg.Executor().run(main, feed=feed, fetch_list=[input_grads[0]])
        assert np.allclose(dx, 1.0 - np.tanh([0.0, 1.0]) ** 2)
        ```
    """
    opdef = get_op_def(op.type)
    if block is None:
        if op.block is None:
            raise ProgramError(f"{op.where()} is not placed in a block; pass block=")
        block = op.block
    if opdef.grad is None:
        raise ProgramError(f"{op.where()} has no gradient maker; it cannot be on the path to the loss "
                           f"(inputs: {', '.join(op.inputs)})")
    out_grads = [None if n is None else block.var(n) for n in out_grad_names]
    # The gradient's ops point at the line that built the forward op.
    with block_guard(block), capture_ops() as grad_ops, located(op.location):
        in_grads = opdef.grad(GradCtx(op, block, out_grads, wanted, callbacks))
    if len(in_grads) != len(op.inputs):
        raise ProgramError(f"gradient maker of {op.type} returned {len(in_grads)} gradients "
                           f"for {len(op.inputs)} inputs")
    names = [None if (g is None or not opdef.input_differentiable(i)
                      or (wanted is not None and not wanted[i])) else g.name
             for i, g in enumerate(in_grads)]
    kept = _ops_leading_to(grad_ops, {n for n in names if n is not None})
    _forget_outputs_of_dropped(grad_ops, kept, block)
    return kept, names


def _forget_outputs_of_dropped(built: list[Op], kept: list[Op], block: Block) -> None:
    """Undeclare the Vars that only dropped ops wrote, so no dangling names remain."""
    if len(kept) == len(built):
        return                  # nothing dropped (most makers)
    kept_ids = {id(op) for op in kept}
    still_written = {n for op in kept for n in op.outputs}
    for op in built:
        if id(op) in kept_ids:
            continue
        for name in op.outputs:
            var = block.vars.get(name)
            if var is not None and name not in still_written:
                del block.vars[name]
                block.program.bump()


def _ops_leading_to(ops: list[Op], needed: set[str]) -> list[Op]:
    """The ops among ``ops`` that (transitively) write a name in ``needed``."""
    kept = []
    needed = set(needed)
    for op in reversed(ops):
        if not needed.isdisjoint(op.outputs):
            kept.append(op)
            needed.update(op_reads(op))
    kept.reverse()
    return kept


# Gradient makers of ops with sub-blocks (control flow, recurrent) build those blocks' backward with
# autodiff's build_backward, which autodiff hands over here when imported: ops never imports autodiff.
_BACKWARD_BUILDER: dict[str, Callable] = {}


def register_backward_builder(fn: Callable) -> Callable:
    """Called by ``retrograd/autodiff/backward.py`` with its ``build_backward``."""
    _BACKWARD_BUILDER["build"] = fn
    return fn


def build_sub_backward(*args, **kwargs):
    """``autodiff.build_backward(*args, **kwargs)`` for a sub-block's backward."""
    if "build" not in _BACKWARD_BUILDER:
        raise ProgramError("no backward builder is registered; import retrograd (or retrograd.autodiff)")
    return _BACKWARD_BUILDER["build"](*args, **kwargs)


# The verifier (ir/verify.py) checks op types and shape rules through this hook: the IR imports no ops.
register_op_schema(OpSchema(
    is_registered=lambda op_type: op_type in OPS,
    infer=lambda op, in_vars, block: infer_specs(op.type, in_vars, op.attrs, block, building=False)))
