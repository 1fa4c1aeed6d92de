"""The ONNX lowering registry: how each op becomes standard ONNX nodes.

A lowering sits right after its op's ``defop``, in the same module, registered
with ``@lowers``::

    @defop("Tanh", infer=same_as_first, grad=...)
    def _tanh(k, x):
        return k.xp.tanh(x)

    @lowers("Tanh")
    def _tanh_onnx(g):
        return [g.node("Tanh", g.ins)]

This module imports nothing from onnx (retrograd imports without onnx
installed); ``retrograd/onnx/`` builds the graph and calls the lowerings.

The signature is ``lowering(g) -> list[str | None]``: one ONNX value name per
op output, in the order of ``op.outputs`` (``None`` for an output nobody can
read, e.g. an unused mask). ``g`` is a per-op context
(``retrograd.onnx.graph.OpContext``) offering:

* ``g.op``, ``g.attrs``, ``g.block``: the op, its attributes, its block.
* ``g.ins``: the ONNX value names of the op's inputs (same order as
  ``op.inputs``); ``g.in_vars`` / ``g.out_vars``: the retrograd Vars (static
  shape with -1 where unknown, ``.dtype``, ``.ndim``).
* ``g.node(op_type, inputs, n_out=1, domain="", **attrs)``: emit one ONNX
  node with fresh output names; returns the name (``n_out == 1``) or a list.
  Attribute values are plain Python (ints, floats, strings, lists,
  ``onnx.GraphProto`` for subgraphs).
* ``g.const(value, dtype)``: a constant (NumPy-convertible value) as an ONNX
  value name, e.g. ``g.const(1.0, g.in_vars[0].dtype)`` or
  ``g.const([0, 2], "int64")``.
* ``g.fill(shape, value, dtype)``: a tensor of the run-time ``shape`` (an
  int64 1-D ONNX value, e.g. ``g.shape(g.ins[0])``) filled with ``value``.
* ``g.cast(name, dtype)``, ``g.shape(name)`` (int64 1-D), ``g.dim(name, axis)``
  (int64 1-element), ``g.scalar_dim(name, axis)`` (int64 scalar), ``g.ndim(i)``.
* ``g.onnx_dtype(dtype)``: the ``TensorProto`` enum of a retrograd dtype.
* Control flow (``If``/``Loop`` bodies): ``g.child()`` is the same context
  emitting into a new empty graph; on it, ``input(hint, dtype, shape)`` adds
  a formal input, ``lower(block, binds, fetch)`` lowers the ops of a
  sub-block that ``fetch`` needs (``binds``: bound name -> ONNX value; other
  names resolve in the enclosing graphs) and returns the fetched values,
  and ``finish(name, [(value, Var), ...])`` returns the ``onnx.GraphProto``.
  ``g.lower(...)`` on the op's own context inlines a block (``Do``).
  ``g.nodes(...)`` is ``g.node`` always returning a list.
* Random ops: ``g.random_bits(seed, shape, per_run=True)`` is the keyed
  generator's int64 32-bit hashes (``retrograd/onnx/keyed_random.py``), key
  (seed, run id, loop keys and iterations) as the kernels'; a loop lowering
  calls ``body.stream(index)`` on its body context so random ops inside draw
  per iteration (a no-op unless the op has an ``rng_id``).
* ``g.check(failed, what, verify=None, payload=())``: a run-time check the
  kernel makes (ONNX cannot raise). ``failed`` is a bool scalar, true when
  the kernel would raise; the returned bool scalar (true when the check
  passes) must feed the op's outputs, e.g. a Loop's condition. A failed
  check stops onnxruntime in the guard node ``retrograd.check.<n> (<op>:
  <what>)``; the engine then calls ``verify(*values)`` on the NumPy values
  of ``payload`` (int64 values of the main graph) to raise the kernel's own
  ``ExecutionError`` (reuse the kernel's check function; see
  ``recurrent_steps.checked_inputs_onnx`` and ``while_loop._max_iters_onnx``).
* ``g.fail(reason)``: raise ``rg.BackendError`` naming the op and its block;
  call it for an attribute value the lowering cannot express. A program with
  an op that has no lowering fails the same way, before anything is written.

Lowerings must compute exactly what the kernel computes (float32 within
1e-5, float64 within 1e-10 of the NumPy executor) for every run-time shape the
program accepts, including zero-length loops and any batch size.
"""
from __future__ import annotations

from typing import Callable

from ...errors import ProgramError

LOWERINGS: dict[str, Callable] = {}


def lowers(type: str):
    """Register the decorated function as the ONNX lowering of op ``type``."""
    def register(fn):
        if type in LOWERINGS:
            raise ProgramError(f"op type '{type}' has two ONNX lowerings")
        LOWERINGS[type] = fn
        return fn
    return register


# --- Helpers shared by lowerings (they only call ``g``'s methods) ----------------------------

def inputs_as(g, dtype: str, ins=None) -> list[str]:
    """The op's inputs (or ``ins``, parallel to ``g.in_vars``) cast to ``dtype`` where they differ."""
    ins = g.ins if ins is None else ins
    return [v if var.dtype == dtype else g.cast(v, dtype) for v, var in zip(ins, g.in_vars)]


def elementwise(onnx_type: str):
    """A lowering for an op that is one ONNX node over inputs of the output's dtype."""
    def lower(g):
        return [g.node(onnx_type, inputs_as(g, g.out_vars[0].dtype))]
    return lower


def compare(onnx_type: str):
    """A lowering for a comparison: both operands in their promoted dtype, a bool result."""
    def lower(g):
        import numpy as np
        a, b = g.in_vars[:2]
        common = np.promote_types(a.dtype, b.dtype).name
        return [g.node(onnx_type, inputs_as(g, common))]
    return lower


def axes_input(g, axes) -> str:
    """An int64 axes tensor for Reduce*/Squeeze/Unsqueeze."""
    return g.const([int(a) for a in axes], "int64")
