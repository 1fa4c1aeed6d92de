"""Building ONNX graphs from retrograd blocks: value names, environments, per-op contexts.

* ``Names`` hands out model-wide unique ONNX value names (ONNX values are
  SSA across a model and its subgraphs; retrograd programs write a name more
  than once for loop carries and optimizer updates).
* ``Env`` maps retrograd names to the ONNX value holding their current value;
  a sub-block's env falls back to its op's env, as sub-blocks read enclosing
  variables by name.
* ``Graph`` collects the nodes of one ``GraphProto`` (the model's main graph,
  or an ``If``/``Loop`` body) and lowers blocks into it, op by op, with the
  lowerings of ``retrograd.ops.core.lowering.LOWERINGS``.
* ``OpContext`` is the ``g`` a lowering receives (documented in
  ``retrograd/ops/core/lowering.py``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import BackendError
from ..ir.analysis import op_reads
from ..ir.program import Block, Op, Var
from ..ops.core.lowering import LOWERINGS

_DTYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE,
           "bfloat16": onnx.TensorProto.BFLOAT16, "float16": onnx.TensorProto.FLOAT16,
           "int64": onnx.TensorProto.INT64, "int32": onnx.TensorProto.INT32, "bool": onnx.TensorProto.BOOL,
           "uint64": onnx.TensorProto.UINT64}   # uint64: the keyed generator's shifts only


def onnx_dtype(dtype: str) -> int:
    """The ``TensorProto`` element type of a retrograd dtype name."""
    return _DTYPES[dtype]


RUN_ID = "retrograd.run_id"
SEQUENCE = "sequence:"      # a dtype "sequence:<dtype>": an ONNX sequence of tensors of <dtype>


def value_info(name: str, dtype: str, shape: Sequence | None = None) -> onnx.ValueInfoProto:
    """The value info of a tensor of ``dtype`` (``shape``: sizes, None for unknown ones), or of a
    sequence of such tensors for a dtype ``"sequence:<dtype>"``."""
    if dtype.startswith(SEQUENCE):
        return helper.make_tensor_sequence_value_info(name, onnx_dtype(dtype[len(SEQUENCE):]), shape)
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), shape)


class Names:
    """Model-wide unique value names, readable (derived from retrograd names); also the model's
    main graph, which gets the run-id input when a random op asks for it."""

    def __init__(self):
        self.used: set[str] = set()
        self.main: "Graph | None" = None
        self.run_id: str | None = None
        self.checks: list[Check] = []     # the model's run-time checks, numbered by position
        self.node_ops: list[Op] = []       # the op each lowered node comes from, by ``(node <n>)`` tag
        # Recurrent loops as If(T > 0: Scan, else Loop) (faster in onnxruntime; the engine's
        # choice) instead of one Loop (what ``rg.onnx.export`` writes: the contract's form).
        self.scan_loops = False

    def node_name(self, op: Op) -> str:
        """A node name that says which op it lowers (onnxruntime quotes it when the node fails):
        ``<op.where()> (node <n>)``; ``op_of_failure`` reads it back."""
        self.node_ops.append(op)
        return f"{op.where()} (node {len(self.node_ops) - 1})"

    def op_of_failure(self, message: str) -> Op | None:
        """The op whose node onnxruntime names last (innermost) in an error ``message``."""
        tags = re.findall(r"\(node (\d+)\)'", message)
        index = int(tags[-1]) if tags else -1
        return self.node_ops[index] if 0 <= index < len(self.node_ops) else None

    def reserve(self, name: str) -> str:
        self.used.add(name)
        return name

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        name, n = hint, 1
        while name in self.used:
            n += 1
            name = f"{hint}__{n}"
        self.used.add(name)
        return name


CHECK_PREFIX = "retrograd.check."


@dataclass
class Check:
    """A run-time check of a kernel inside the model (``OpContext.check``): its guard node is
    named ``retrograd.check.<index> (<op>: <what>)`` and fails the run when the check fails.
    ``payload``: int64 ONNX values of the main graph whose NumPy values ``verify`` takes to raise the
    kernel's own ExecutionError (empty for a check inside a loop or branch body)."""
    op: Op
    what: str
    verify: Callable[..., None] | None
    payload: list[str] = field(default_factory=list)


class Env:
    """retrograd name -> ONNX value name, falling back to the enclosing block's env."""

    def __init__(self, parent: "Env | None" = None, values: dict | None = None):
        self.parent = parent
        self.values = dict(values or {})

    def find(self, name: str) -> str | None:
        env = self
        while env is not None:
            if name in env.values:
                return env.values[name]
            env = env.parent
        return None

    def set(self, name: str, value: str) -> None:
        self.values[name] = value


class Graph:
    """The nodes of one ONNX graph being built (main graph or a control-flow body)."""

    def __init__(self, names: Names, opset: int, rng_path: Sequence = ()):
        self.names = names
        self.opset = opset
        # (loop key, iteration) pairs of the loops this graph runs in: ints or ONNX int64 scalars
        self.rng_path = list(rng_path)
        if names.main is None:
            names.main = self
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []

    # -- values ---------------------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, domain: str = "",
             hint: str | None = None, **attrs):
        if op_type == "Loop" and len(inputs) > 1 and inputs[1] == "":
            # A counted Loop's condition is a constant True rather than absent: onnxruntime fails
            # ("vector::reserve") building a Loop with no condition and no loop-carried values
            # inlined from an If whose condition it folded (a cond on parameters, exported with
            # them as initializers).
            inputs = [inputs[0], self.const(True, "bool", hint="loop.cond")] + list(inputs[2:])
        outs = [self.names.fresh(f"{hint or op_type.lower()}") for _ in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype: str, hint: str = "c") -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.names.fresh(hint)
        self.nodes.append(helper.make_node("Constant", [], [name],
                                           value=numpy_helper.from_array(array, name)))
        return name

    def initializer(self, hint: str, array: np.ndarray) -> str:
        name = self.names.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def input(self, hint: str, dtype: str, shape: Sequence | None = None) -> str:
        """A formal input of this graph (a model input, or a Loop body's iteration/carry input)."""
        name = self.names.fresh(hint)
        self.inputs.append(value_info(name, dtype, shape))
        return name

    def proto(self, name: str, outputs: Sequence[tuple[str, str]], out_names: Sequence[str] | None = None,
              shapes: Sequence | None = None) -> onnx.GraphProto:
        """The finished graph; ``outputs`` are (value, dtype) pairs. An output is always a value
        computed in this graph: one that is not (an input, an outer value), one named otherwise
        (``out_names``) or one output twice passes through an Identity. In a loop body each
        Identity is a copy per iteration, so values computed here are output as they are."""
        infos = []
        computed = {name for node in self.nodes for name in node.output}
        taken: set[str] = set()
        for i, (value, dtype) in enumerate(outputs):
            if out_names is None and value in computed and value not in taken:
                out = value
            else:
                out = (self.names.reserve(out_names[i]) if out_names is not None
                       else self.names.fresh(f"{value}.out"))
                self.nodes.append(helper.make_node("Identity", [value], [out]))
            taken.add(value)
            shape = shapes[i] if shapes is not None else None
            infos.append(value_info(out, dtype, shape))
        return helper.make_graph(self.nodes, name, self.inputs, infos, initializer=self.initializers)

    # -- lowering blocks -------------------------------------------------------------------
    def lower_block(self, block: Block, env: Env, fetch: Sequence[str], extra_needed=()) -> list[str]:
        """Lower the ops of ``block`` that ``fetch`` (and ``extra_needed``) depend on, into this
        graph; return the ONNX values of ``fetch``."""
        for op in needed_ops(block, set(fetch) | set(extra_needed)):
            self.lower_op(op, env)
        return [self.value_of(env, name, block) for name in fetch]

    def lower_op(self, op: Op, env: Env) -> None:
        lowering = LOWERINGS.get(op.type)
        if lowering is None:
            raise BackendError(f"{op.where()} cannot be exported to ONNX: no lowering for op type "
                               f"'{op.type}'")
        ins = [self.value_of(env, name, op.block, op) for name in op.inputs]
        outs = lowering(OpContext(self, op, ins, env))
        if len(outs) != len(op.outputs):
            raise BackendError(f"{op.where()}: its ONNX lowering returned {len(outs)} values for "
                               f"{len(op.outputs)} outputs")
        for name, value in zip(op.outputs, outs):
            if value is not None:
                env.set(name, value)

    @staticmethod
    def value_of(env: Env, name: str, block: Block, op: Op | None = None) -> str:
        value = env.find(name)
        if value is None:
            who = op.where() if op is not None else f"block {block.idx}"
            raise BackendError(f"{who} reads '{name}', which has no value in the exported graph "
                               "(not fed, not a parameter of the scope, not computed)")
        return value


def needed_ops(block: Block, keep: set[str]) -> list[Op]:
    """The ops of ``block`` whose outputs lead to ``keep`` (the executor's pruning)."""
    needed = set(keep)
    kept = []
    for op in reversed(block.ops):
        if any(n in needed for n in op.outputs):
            kept.append(op)
            needed.update(op_reads(op))
    kept.reverse()
    return kept


class OpContext:
    """What a lowering sees (``g``); see ``retrograd/ops/core/lowering.py``."""

    def __init__(self, graph: Graph, op: Op, ins: list[str], env: Env):
        self.graph = graph
        self.op = op
        self.attrs = op.attrs
        self.block = op.block
        self.ins = ins
        self.env = env
        self.in_vars = [op.block.var(n) for n in op.inputs]
        self.out_vars = [op.block.var(n) for n in op.outputs]

    @property
    def opset(self) -> int:
        return self.graph.opset

    def hint(self, i: int = 0) -> str:
        return self.op.outputs[i] if i < len(self.op.outputs) else self.op.type.lower()

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, domain: str = "", **attrs):
        attrs.setdefault("name", self.graph.names.node_name(self.op))
        return self.graph.node(op_type, inputs, n_out, domain, hint=self.hint(0), **attrs)

    def const(self, value, dtype: str) -> str:
        return self.graph.const(value, dtype, hint=f"{self.hint(0)}.c")

    def onnx_dtype(self, dtype: str) -> int:
        return onnx_dtype(dtype)

    def cast(self, value: str, dtype: str) -> str:
        return self.node("Cast", [value], to=onnx_dtype(dtype))

    def shape(self, value: str) -> str:
        return self.node("Shape", [value])

    def dim(self, value: str, axis: int) -> str:
        """The run-time size of ``axis`` as an int64 1-element tensor."""
        return self.node("Shape", [value], start=axis, end=(axis + 1) or None)

    def scalar_dim(self, value: str, axis: int) -> str:
        return self.node("Squeeze", [self.dim(value, axis)])

    def fill(self, shape: str, value, dtype: str) -> str:
        """A tensor of run-time ``shape`` (an int64 1-D value) filled with ``value``."""
        return self.node("ConstantOfShape", [shape],
                         value=numpy_helper.from_array(np.asarray([value], dtype=dtype)))

    def ndim(self, i: int) -> int:
        return self.in_vars[i].ndim

    def normal_from_bits(self, h1: str, h2: str) -> str:
        """float64 standard normals from two ``random_bits`` arrays (the second drawn with
        ``salt=0x5BD1E995``), the backends' Box-Muller operation for operation."""
        from .keyed_random import normal
        return normal(self, h1, h2)

    def fail(self, reason: str):
        raise BackendError(f"{self.op.where()} cannot be exported to ONNX: {reason}")

    def check(self, failed: str, what: str, verify: Callable[..., None] | None = None,
              payload: Sequence[str] = ()) -> str:
        """A run-time check the kernel makes, which ONNX cannot raise: ``failed`` (a bool scalar)
        is true when the kernel would raise. Returns a bool scalar that is true when the check
        passes; the op's outputs must depend on it (e.g. a Loop's first condition), and a failed
        check makes onnxruntime fail the run in the guard node ``retrograd.check.<n> (<op>:
        <what>)``. The engine then raises ``verify(*payload values)``'s ExecutionError (the
        kernel's message): the NumPy values of ``payload`` (int64 values of the main graph, read in a
        second, small session); for a check with a payload inside a loop or branch body, whose
        values are not reachable, an ExecutionError naming the op and ``what``."""
        names = self.graph.names
        top = self.graph is names.main
        index = len(names.checks)
        reachable = top or not payload     # a body's values cannot be read after a failed run
        names.checks.append(Check(self.op, what, verify if reachable else None, list(payload) if top else []))
        row = self.node("Cast", [failed], to=onnx.TensorProto.INT64)
        name = f"{CHECK_PREFIX}{index} ({self.op.where()}: {what})"
        return self.graph.node("Gather", [self.const([True], "bool"), row], hint=f"{self.hint(0)}.ok",
                               name=name)

    # -- sub-blocks -----------------------------------------------------------------------------
    def child(self) -> "OpContext":
        """The same op's context emitting into a new, empty graph (an If branch, a Loop body);
        values of the enclosing graphs stay readable by name."""
        return OpContext(Graph(self.graph.names, self.graph.opset, self.graph.rng_path), self.op, self.ins,
                         self.env)

    def stream(self, index: str) -> None:
        """This (child) graph is iteration ``index`` (an ONNX int64 scalar) of the op's loop: random
        ops in it draw from the op's loop key and that index (``ops/streams.py``)."""
        if "rng_id" in self.attrs:
            self.graph.rng_path = self.graph.rng_path + [int(self.attrs["rng_id"]), index]

    def random_bits(self, seed: int, shape: str, salt: int = 0, per_run: bool = True,
                    run: str | None = None) -> str:
        """The keyed generator's 32-bit hashes (int64) for an op with ``seed``, shaped by the int64
        1-D value ``shape``: key (seed, run id, loop keys and iterations), as the kernels draw.
        The run id is the model input ``retrograd.run_id`` (int64 scalar; the executor's count
        of runs, so feed a new one per run); ``per_run=False`` leaves it out of the key
        (initialisers draw the same values in every run); ``run`` (an int64 scalar >= 0 of the
        graph: a seed the program reads at run time) takes the run id's place."""
        from .keyed_random import hash_bits
        names = self.graph.names
        if run is not None:
            return hash_bits(self, [int(seed), run, *self.graph.rng_path], shape, salt)
        if names.run_id is None and per_run:
            names.run_id = names.main.input(RUN_ID, "int64", [])
        run = [names.run_id] if per_run else []
        return hash_bits(self, [int(seed), *run, *self.graph.rng_path], shape, salt)

    def input(self, hint: str, dtype: str, shape: Sequence | None = None) -> str:
        """A formal input of this context's graph (a Loop body's iteration count, carries)."""
        return self.graph.input(hint, dtype, shape)

    def lower(self, block: Block, binds: dict[str, str], fetch: Sequence[str]) -> list[str]:
        """Lower the ops of ``block`` that ``fetch`` needs into this context's graph, its bound
        names taking the ONNX values ``binds`` (other names resolve in the op's env); return
        the ONNX values of ``fetch``."""
        check_no_persistable_writes(block)
        return self.graph.lower_block(block, Env(self.env, binds), fetch)

    def finish(self, name: str, outputs: Sequence[tuple]) -> onnx.GraphProto:
        """This (child) context's graph with ``outputs``: ``(ONNX value, Var)`` pairs (the Var
        gives dtype and shape) or ``(ONNX value, dtype, shape)`` triples."""
        typed = [(item[0], item[1].dtype, var_shape(item[1])) if isinstance(item[1], Var) else tuple(item)
                 for item in outputs]
        return self.graph.proto(name, [(value, dtype) for value, dtype, _ in typed],
                                shapes=[shape for _, _, shape in typed])

    def nodes(self, op_type: str, inputs: Sequence[str], n_out: int, **attrs) -> list[str]:
        """``node`` that always returns a list of ``n_out`` names."""
        out = self.node(op_type, inputs, n_out, **attrs)
        return [out] if n_out == 1 else list(out)


def check_no_persistable_writes(block: Block) -> None:
    for op in block.ops:
        for name in op.outputs:
            var = block.find_var(name)
            if var is not None and var.persistable:
                raise BackendError(f"{op.where()} cannot be exported to ONNX: it writes persistable "
                                   f"'{name}' inside a sub-block")


def var_shape(var: Var) -> list:
    """A Var's shape for a value info: -1 becomes an unnamed dimension."""
    return [None if d < 0 else d for d in var.shape]
