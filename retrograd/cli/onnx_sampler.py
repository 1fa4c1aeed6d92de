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
``unknown``, so sampling needs onnxruntime alone. (A transformer has no such
step: it exports as the generator below.)

``retrograd export --generate`` writes the whole generation loop instead
(``retrograd/generation.py``): ONE model whose inputs are ``prompt`` (int64
``[P]``, P >= 1), ``length`` (int64 scalar), ``temperature`` (float32 scalar; 0:
greedy) and ``seed`` (int64 scalar), and whose output ``ids`` (int64
``[P + length]``) is the prompt followed by the drawn ids: the same ids
``retrograd sample`` prints for the same seed (``--top-k K`` builds top-k
sampling in; the metadata says ``top_k``). Generating text with onnxruntime alone (``python -m
retrograd.onnx.sampler`` prints these lines; with a model file it runs them)::

    import numpy as np, onnxruntime as ort
    sess = ort.InferenceSession("g.onnx")
    meta = sess.get_modelmeta().custom_metadata_map
    vocab, unknown = meta["vocab"], int(meta["unknown"])
    prompt = np.array([vocab.find(c) if c in vocab else unknown for c in "def "], dtype=np.int64)
    ids, = sess.run(["ids"], {"prompt": prompt, "length": np.array(200), "seed": np.array(0),
                              "temperature": np.array(0.8, dtype=np.float32)})
    print("def " + "".join(vocab[i] for i in ids[len(prompt):]))

Examples::

    retrograd export retrograd-lstm.npz                 # writes retrograd-lstm.onnx
    retrograd export m.npz -o m.onnx --opset 21
    retrograd export --generate m.npz -o g.onnx         # the generator
    retrograd export --generate m.npz --top-k 10 -o g10.onnx
    python -m retrograd.onnx.sampler g.onnx --prompt "def " --length 200 --seed 1
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from ..models.charlm import config_from_params, build_sampler
from ..models.generation import build_generator, max_positions
from ..io import read_params
from ..options import non_negative_int
from ..runtime import Scope
from ..onnx.export import INSTALL_HINT
from ..errors import BackendError

NEW_SUFFIX = ".new"


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd export``."""
    parser.add_argument("file", help="parameter file (.npz) written by retrograd train")
    parser.add_argument("-o", "--output", help="ONNX file to write (default: FILE with the suffix .onnx)")
    parser.add_argument("--opset", type=int, default=None,
                        help="ONNX opset (default: the newest onnxruntime accepts)")
    parser.add_argument("--generate", action="store_true",
                        help="write the whole generation loop as one model (inputs prompt, length, "
                             "temperature, seed; output ids) instead of one sampling step")
    parser.add_argument("--top-k", type=non_negative_int, default=0,
                        help="with --generate: draw only among the K most likely characters; "
                             "0: among all (default: 0)")


def run_export(args: argparse.Namespace) -> int:
    """Write the sampling step (``--generate``: the generator) of ``args.file`` to
    ``args.output``; print where; return 0."""
    output = Path(args.output) if args.output else Path(args.file).with_suffix(".onnx")
    params = read_params(args.file)
    if args.generate:
        model = export_generator(params, args.file, output, opset=args.opset, top_k=args.top_k)
    else:
        model = export_sampler(params, args.file, output, opset=args.opset)
    inputs = ", ".join(i.name for i in model.graph.input)
    print(f"wrote {output}: inputs {inputs}; outputs {', '.join(o.name for o in model.graph.output)}")
    return 0


def export_sampler(params: dict, where: str, path, opset: int | None = None):
    """The one-step sampling model of the char-LM whose parameters are ``params`` (read from
    ``where``), written to ``path`` (None: not written); returns the ``onnx.ModelProto``."""
    onnx = _onnx()
    from ..onnx.model import build_model
    cfg = config_from_params(params, where)
    main, net, probs = build_sampler(cfg)
    states_in = [v for pair in zip(net.h0, net.c0) for v in pair if v is not None]
    states_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    fetch = [probs] + states_out
    built = build_model(main, [v.name for v in fetch], scope=_scope(params), opset=opset,
                        name="retrograd_sampler")
    renames = {probs.name: "probs"}
    renames.update((out.name, inp.name + NEW_SUFFIX) for inp, out in zip(states_in, states_out))
    return _finish(onnx, built.model, renames, cfg, path)


def export_generator(params: dict, where: str, path, opset: int | None = None, top_k: int = 0):
    """The generation loop (``retrograd/generation.py``) of the char-LM whose parameters are
    ``params`` (read from ``where``) as one ONNX model, written to ``path`` (None: not
    written); returns the ``onnx.ModelProto``. ``top_k`` (0: off) is built in.

    Example::

        export_generator(rg.read_params("m.npz"), "m.npz", "g.onnx")
    """
    onnx = _onnx()
    from ..onnx.model import build_model
    cfg = config_from_params(params, where)
    gen = build_generator(cfg, top_k=top_k, max_positions=max_positions(params.get("pos.w")))
    built = build_model(gen.program, [gen.ids.name], scope=_scope(params), opset=opset,
                        name="retrograd_generator")
    return _finish(onnx, built.model, {gen.ids.name: "ids"}, cfg, path, top_k=top_k)


def _onnx():
    try:
        import onnx
    except ImportError:
        raise BackendError(f"retrograd export needs the onnx package: {INSTALL_HINT}") from None
    return onnx


def _scope(params: dict) -> Scope:
    scope = Scope()
    for name, value in params.items():
        scope.set(name, value)
    return scope


def _finish(onnx, model, renames: dict, cfg, path, **props):
    """Rename the outputs (``renames``: program name -> output name), add the vocabulary to the
    metadata, check the model and write it to ``path`` (None: not written)."""
    from onnx import helper
    from ..onnx.model import check
    outputs = list(model.graph.output)
    del model.graph.output[:]
    for info in outputs:
        new = renames[info.name]
        model.graph.node.append(helper.make_node("Identity", [info.name], [new]))
        info.name = new
        model.graph.output.append(info)
    description = f"{cfg.model} x{cfg.layers}, hidden {cfg.hidden}"
    helper.set_model_props(model, {"vocab": cfg.vocab.chars, "unknown": str(cfg.vocab.unknown),
                                   "model": description, **{k: str(v) for k, v in props.items()}})
    check(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


# --- python -m retrograd.onnx.sampler: generating with onnxruntime alone -------------------------

def generate_with_onnxruntime(path, prompt: str, length: int, temperature: float = 0.8, seed: int = 0) -> str:
    """``prompt`` and ``length`` characters from the generator model at ``path`` (written by
    ``retrograd export --generate``), run by onnxruntime alone: the lines of this module's
    docstring.

    Example::

        print(generate_with_onnxruntime("g.onnx", "def ", 200, seed=1))
    """
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    vocab, unknown = meta["vocab"], int(meta["unknown"])
    prompt_ids = np.array([vocab.find(c) if c in vocab else unknown for c in prompt or "\n"], dtype=np.int64)
    ids, = sess.run(["ids"], {"prompt": prompt_ids, "length": np.array(length, dtype=np.int64),
                              "temperature": np.array(temperature, dtype=np.float32),
                              "seed": np.array(seed, dtype=np.int64)})
    return prompt + "".join(vocab[i] for i in ids[len(prompt_ids):])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m retrograd.onnx.sampler [g.onnx --prompt ... --length ...]``: without a model
    file, print how to generate text with onnxruntime alone; with one, do it."""
    parser = argparse.ArgumentParser(prog="python -m retrograd.onnx.sampler",
                                     description="Generate text with onnxruntime alone from a model written "
                                                 "by `retrograd export --generate`.")
    parser.add_argument("model", nargs="?", help="the generator (.onnx); without it, print the code")
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.model is None:
        start = __doc__.index("    import numpy as np")
        print("retrograd export --generate m.npz -o g.onnx   # then, with onnxruntime alone:\n")
        print("\n".join(line[4:] for line in __doc__[start:].split("\n\n")[0].splitlines()))
        return 0
    print(generate_with_onnxruntime(args.model, args.prompt, args.length, args.temperature, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
