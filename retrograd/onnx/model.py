"""Whole programs to ONNX models: which values are inputs, initializers and outputs.

``build_model`` is the entry the onnxruntime engine (``engine.py``) uses;
``export`` (``rg.onnx.export``) is the user-facing wrapper over it.

Inputs, initializers, outputs of the model built from block 0:

* every non-persistable value the needed ops read before writing it is a
  graph input under its own name (the feeds);
* every persistable they read is an initializer holding its scope value
  (``export`` with a scope), or a graph input under its own name
  (``param_inputs=True``, or ``export`` without a scope);
* each fetch is an output under its own name, except a fetch that is also
  an input's name and that the program overwrites: that output is named
  ``<name>.new``, like the written persistables below;
* a program with random ops (dropout) has one more input,
  ``retrograd.run_id`` (int64 scalar): the masks are the keyed generator's for
  that run id, the same as the NumPy executor draws in its run of that
  number (``exe._run.run_id`` counts runs); feed a new value per run;
* every persistable the program writes (optimizer updates, step counters) is
  an output named ``<name>.new`` holding the value after the run, so a runtime
  feeds it back as ``<name>`` on the next run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import onnx
from onnx import helper

from ..errors import BackendError, FeedError
from ..ir.dtypes import is_low_float
from ..ir.program import Program, Var
from .graph import Check, Env, Graph, Names, needed_ops, onnx_dtype, var_shape
from ..ir.analysis import op_reads

NEWEST_OPSET = 28         # the newest opset the lowerings are tested at (onnxruntime 1.32 runs it)
IR_VERSION = 10           # onnxruntime 1.18+ reads it; opset 28 models check with it
NEW_SUFFIX = ".new"


def newest_runnable_opset() -> int:
    """The newest ai.onnx opset (at most ``NEWEST_OPSET`` and the installed onnx's newest) that
    the installed onnxruntime loads, found by loading a one-node model; without onnxruntime,
    the newest the two bounds allow. (onnxruntime 1.30 refuses opset 28 as "under
    development", 1.32 runs it: a fixed number would break one of them.)"""
    newest = min(NEWEST_OPSET, onnx.defs.onnx_opset_version())
    try:
        import onnxruntime as ort
    except ImportError:
        return newest
    options = ort.SessionOptions()
    options.log_severity_level = 4
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    for opset in range(newest, 16, -1):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=IR_VERSION)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:     # noqa: BLE001 (onnxruntime raises its own exception types)
            continue
        return opset
    return newest


DEFAULT_OPSET = newest_runnable_opset()   # the default of export (tests/onnx check it runs)


@dataclass
class BuiltModel:
    """What ``build_model`` returns: the model and how its names relate to the program's.

    ``inputs``: program names fed as graph inputs (feeds, then persistables
    when they are inputs), graph input name == program name. ``outputs``:
    fetch name -> graph output name. ``written``: persistable name -> graph
    output holding its new value (``<name>.new``).
    """
    model: onnx.ModelProto
    inputs: list[str]
    param_inputs: list[str]
    outputs: dict[str, str]
    written: dict[str, str]
    checks: list[Check] = field(default_factory=list)   # run-time checks by guard number (graph.py)
    names: Names | None = None      # the model's names: ``names.op_of_failure(message)`` finds a failed op
    all_nodes: list = field(default_factory=list)   # every node lowered (the model keeps the live ones)


def build_model(program: Program, fetch: Sequence[str], scope=None, param_inputs: bool = False,
                feed_names: Iterable[str] | None = None, opset: int | None = None,
                name: str = "retrograd", scan_loops: bool = False) -> BuiltModel:
    """Lower block 0 of ``program`` (the ops ``fetch`` and the persistable writes need) to ONNX.

    ``param_inputs``: persistables read become graph inputs (named as in the
    program) instead of initializers from ``scope``. ``feed_names``, if
    given, are the only non-persistable names allowed to be inputs (others
    read before written raise FeedError). ``scan_loops``: recurrent loops as
    ``If(T > 0: Scan, else: Loop)``, which onnxruntime runs faster, instead of
    one ``Loop``. Raises BackendError naming the op and block when an op (or
    attribute) has no ONNX form.
    """
    opset = DEFAULT_OPSET if opset is None else int(opset)
    block = program.global_block()
    fetch = list(dict.fromkeys(fetch))
    written = _persistable_writes(block)
    ops = needed_ops(block, set(fetch) | set(written))
    reads = _free_reads(ops, fetch)
    names = Names()
    names.scan_loops = scan_loops
    graph = Graph(names, opset)
    env = Env()
    feeds, params = [], []
    for rname in reads:
        var = block.find_var(rname)
        if var is None:
            raise BackendError(f"'{rname}' is read by the program but not declared in block 0")
        if var.persistable:
            params.append(rname)
            if param_inputs or scope is None:
                env.set(rname, graph.input(rname, var.dtype, var_shape(var)))
            else:
                env.set(rname, graph.initializer(rname, _scope_value(scope, var)))
        else:
            if feed_names is not None and rname not in set(feed_names):
                raise FeedError(f"'{rname}' is read by the program but has no value: feed it")
            feeds.append(rname)
            env.set(rname, graph.input(rname, var.dtype, _input_shape(var)))
    input_names = set(reads)
    # Reserve output names first, so no intermediate value takes them.
    out_names = {}
    for fname in fetch:
        out_names[fname] = fname + NEW_SUFFIX if fname in input_names and fname in written else fname
    written_out = {w: w + NEW_SUFFIX for w in written}
    for oname in list(out_names.values()) + list(written_out.values()):
        if oname not in input_names:
            names.reserve(oname)
    for op in ops:
        graph.lower_op(op, env)
    outputs, infos = [], []
    renamed: dict[str, str] = {}
    computed = {name for node in graph.nodes for name in node.output} - {
        name for check in names.checks for name in check.payload}
    for fname, oname in list(out_names.items()) + list(written_out.items()):
        if oname in outputs:
            continue
        var = block.find_var(fname)
        value = Graph.value_of(env, fname, block)
        value = renamed.get(value, value)
        if value in computed and value not in renamed:
            renamed[value] = oname      # the node computing it writes the output itself
        elif oname != value:
            graph.nodes.append(helper.make_node("Identity", [value], [oname]))
        outputs.append(oname)
        infos.append(helper.make_tensor_value_info(oname, onnx_dtype(var.dtype), [None] * var.ndim))
    _rename_values(graph.nodes, {v: o for v, o in renamed.items() if v != o})
    if names.run_id is not None:    # a random op reads the run id: an input like the feeds
        feeds.append(names.run_id)
    nodes = _live_nodes(graph.nodes, outputs)   # a check's payload is computed only if it fails (checks_model)
    gp = helper.make_graph(nodes, name, graph.inputs, infos, initializer=graph.initializers)
    model = helper.make_model(gp, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="retrograd")
    model.ir_version = IR_VERSION
    return BuiltModel(model, feeds + (params if (param_inputs or scope is None) else []),
                      params if (param_inputs or scope is None) else [], out_names, written_out,
                      names.checks, names, graph.nodes)


def checks_model(model: onnx.ModelProto, all_nodes: list, payload: Sequence[str]) -> onnx.ModelProto:
    """A model computing the int64 values ``payload`` of ``model``'s main graph (the inputs of a
    failed run-time check's message) from its inputs, with the nodes of ``all_nodes``
    (``BuiltModel.all_nodes``: the model itself may have dropped the ones only they need)."""
    graph = model.graph
    nodes = _live_nodes(all_nodes, payload)
    outputs = [helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None) for name in payload]
    reduced = helper.make_graph(nodes, graph.name, graph.input, outputs, initializer=graph.initializer)
    small = helper.make_model(reduced, opset_imports=model.opset_import, producer_name="retrograd")
    small.ir_version = model.ir_version
    return small


def _live_nodes(nodes: list, outputs: Sequence[str]) -> list:
    """The nodes the outputs depend on (lowerings may emit values nobody reads, e.g. the empty
    checkpoints of a budgeted loop); a node's subgraphs read outer values by name."""
    needed = set(outputs)
    live = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(_reads(node))
    return live[::-1]


def _reads(node) -> set[str]:
    names = set(node.input)
    for attr in node.attribute:
        for sub in list(attr.g.node if attr.HasField("g") else []) + [n for g in attr.graphs for n in g.node]:
            names.update(_reads(sub))
    return names


def _rename_values(nodes: list, renames: dict[str, str]) -> None:
    """Rename values in ``nodes`` and the subgraphs they hold (ONNX names are unique across a model).

    An output is the value itself, renamed, not an ``Identity`` of it: onnxruntime's basic
    optimisations (``IdentityElimination`` with a fusion such as ``MatMulAddFusion``) can leave a
    fused node reading the eliminated Identity's input, and the session then fails to build
    ("Node input '...' is not a graph input, initializer, or output of a previous node"), e.g.
    for ``x @ w^T + c`` with ``c`` fetched too."""
    if not renames:
        return
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for i, name in enumerate(node.output):
            if name in renames:
                node.output[i] = renames[name]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_values(list(sub.node), renames)      # bodies read outer values by name


def _persistable_writes(block) -> list[str]:
    return list(dict.fromkeys(n for op in block.ops for n in op.outputs
                              if (v := block.find_var(n)) is not None and v.persistable))


def _free_reads(ops, fetch) -> list[str]:
    written: set[str] = set()
    reads: dict[str, None] = {}
    for op in ops:
        for rname in op_reads(op):
            if rname not in written:
                reads.setdefault(rname)
        written.update(op.outputs)
    for fname in fetch:       # a fetched value no op writes: a feed or a parameter passed through
        if fname not in written:
            reads.setdefault(fname)
    return list(reads)


def _scope_value(scope, var: Var) -> np.ndarray:
    value = scope.find(var.name)
    if value is None:
        raise FeedError(f"persistable '{var.name}' has no value in the scope: run the startup program "
                        "first (or export without a scope to make it a graph input)")
    backend = getattr(scope, "backend", None)
    if backend is not None and hasattr(backend, "to_numpy") and not isinstance(value, np.ndarray):
        value = backend.to_numpy(value)
    return np.asarray(value, dtype=var.dtype)


def _input_shape(var: Var) -> list:
    return [f"{var.name}.{i}" if d < 0 else d for i, d in enumerate(var.shape)]


def check(model: onnx.ModelProto) -> None:
    """``onnx.checker`` with full shape inference, as a BackendError naming the fault."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise BackendError(f"the exported ONNX model does not check: {exc}") from exc


def refusal(exc: Exception, model: onnx.ModelProto) -> str:
    """onnxruntime's refusal of ``model``, with the dtype of the node it has no kernel for
    (a bfloat16 MatMul on the CPU): "op #2 MatMul in block 0 has no onnxruntime kernel for bfloat16"."""
    message = str(exc)
    match = re.search(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'", message)
    if match is None:
        return message
    node_type, node_name = match.groups()
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.input,
                                                            *inferred.graph.output)}
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    node = next((n for n in inferred.graph.node if n.name == node_name), None)
    dtypes = sorted({onnx.helper.tensor_dtype_to_np_dtype(types[i]).name if types.get(i) else "?"
                     for i in (node.input if node is not None else ()) if i})
    return (f"{node_name} (ONNX {node_type}) has no onnxruntime kernel for {', '.join(dtypes) or 'its dtypes'}; "
            "compute it in another dtype (rg.amp.decorate(..., custom_float32=[...]))")


def check_runnable(model: onnx.ModelProto, program: Program) -> None:
    """A model with bfloat16 or float16 values must load in onnxruntime (where installed): its CPU
    kernels lack many ops in those dtypes. BackendError naming the op and the dtype otherwise."""
    if not any(is_low_float(v.dtype) for v in program.list_vars()):
        return
    try:
        import onnxruntime as ort
    except ImportError:
        return
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:            # onnxruntime's own exception types: say what it said
        raise BackendError(f"the exported model does not run in onnxruntime: {refusal(exc, model)}") from None
