"""``retrograd export``: the sampling step of a char-LM saved by ``retrograd train``, as ONNX.

The model is one step of ``build_sampler`` (``retrograd/charlm.py``) with the
trained parameters as initializers. Inputs: ``chars`` (int64 ``[1, N]``: the
current character of N streams) and per recurrent layer ``<layer>.h0`` (and
``<layer>.c0`` for LSTM/MILSTM), float32 ``[N, H]``. Outputs: ``probs``
(``[N, V]``, the next character's distribution) and ``<layer>.h0.new`` (and
``.c0.new``): feed them back as ``<layer>.h0`` for the next step. The
vocabulary the model was trained with (character ``i`` of the string is id
``i``; ``V`` characters, 96 for the built-in corpus) is in the model's
metadata under ``vocab``, the id any other character reads as under
``unknown``, so sampling needs onnxruntime alone.

Examples::

    retrograd export retrograd-lstm.npz                 # writes retrograd-lstm.onnx
    retrograd export m.npz -o m.onnx --opset 21
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..charlm import config_from_params, build_sampler
from ..io import read_params
from ..runtime import Scope
from .export import INSTALL_HINT
from ..errors import BackendError

NEW_SUFFIX = ".new"


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd export``."""
    parser.add_argument("file", help="parameter file (.npz) written by retrograd train")
    parser.add_argument("-o", "--output", help="ONNX file to write (default: FILE with the suffix .onnx)")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset (default: the newest onnxruntime accepts)")


def run_export(args: argparse.Namespace) -> int:
    """Write the sampling step of ``args.file`` to ``args.output``; print where; return 0."""
    output = Path(args.output) if args.output else Path(args.file).with_suffix(".onnx")
    model = export_sampler(read_params(args.file), args.file, output, opset=args.opset)
    inputs = ", ".join(i.name for i in model.graph.input)
    print(f"wrote {output}: inputs {inputs}; outputs {', '.join(o.name for o in model.graph.output)}")
    return 0


def export_sampler(params: dict, where: str, path, opset: int | None = None):
    """The one-step sampling model of the char-LM whose parameters are ``params`` (read from
    ``where``), written to ``path`` (None: not written); returns the ``onnx.ModelProto``."""
    try:
        import onnx
        from onnx import helper
    except ImportError:
        raise BackendError(f"retrograd export needs the onnx package: {INSTALL_HINT}") from None
    from .model import build_model, check
    cfg = config_from_params(params, where)
    main, net, probs = build_sampler(cfg)
    scope = Scope()
    for name, value in params.items():
        scope.set(name, value)
    states_in = [v for pair in zip(net.h0, net.c0) for v in pair if v is not None]
    states_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    fetch = [probs] + states_out
    built = build_model(main, [v.name for v in fetch], scope=scope, opset=opset, name="retrograd_sampler")
    model = built.model
    renames = {probs.name: "probs"}
    renames.update((out.name, inp.name + NEW_SUFFIX) for inp, out in zip(states_in, states_out))
    outputs = list(model.graph.output)
    del model.graph.output[:]
    for info in outputs:
        new = renames[info.name]
        model.graph.node.append(helper.make_node("Identity", [info.name], [new]))
        info.name = new
        model.graph.output.append(info)
    description = f"{cfg.model} x{cfg.layers}, hidden {cfg.hidden}"
    helper.set_model_props(model, {"vocab": cfg.vocab.chars, "unknown": str(cfg.vocab.unknown),
                                   "model": description})
    check(model)
    if path is not None:
        onnx.save(model, str(path))
    return model
