"""``retrograd sample``: text from a model saved by ``retrograd train``.

The text is drawn by one program (``retrograd/generation.py``): a
``while_loop`` over the characters that carries the model's state and draws
each character with ``rg.categorical``, keyed on ``--seed``; ``retrograd
export --generate`` writes the same program as one ONNX model, which draws the
same characters for the same seed.

The file says which model it holds (layer type and count from the parameter
names, sizes from their shapes, the vocabulary and the default prompt from the
run record ``retrograd train`` saves with them), so no model options are needed.

Examples::

    retrograd sample retrograd-lstm.npz
    retrograd sample m.npz --length 400 --prompt "def " --temperature 0.5
    retrograd sample m.npz --top-k 5 --seed 3
"""
from __future__ import annotations

import argparse
import sys

import retrograd as rg

from ..models.charlm import ModelConfig, config_from_params, read_record
from ..models.generation import generate_text
from ..io import read_params
from ..options import non_negative, non_negative_int


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd sample``."""
    parser.add_argument("file", help="parameter file (.npz) written by retrograd train")
    parser.add_argument("--length", type=non_negative_int, default=300,
                        help="characters to generate after the prompt (default: 300)")
    parser.add_argument("--prompt", default=None,
                        help="text to start from (default: the first characters of the text the "
                             'model was trained on, "def " for the built-in corpus)')
    parser.add_argument("--temperature", type=non_negative, default=0.8,
                        help="lower is more predictable, higher more varied; 0 always takes the most "
                             "likely character (default: 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="seed for drawing characters (default: 0)")
    parser.add_argument("--top-k", type=non_negative_int, default=0,
                        help="draw only among the K most likely characters; 0: among all (default: 0)")


def run_sample(args: argparse.Namespace) -> int:
    """Print the prompt and ``args.length`` generated characters; return 0."""
    params = read_params(args.file)         # ParamFileError (one line) for a missing or foreign file
    cfg: ModelConfig = config_from_params(params, args.file)
    prompt = args.prompt if args.prompt is not None else read_record(params, args.file).get("prompt", "def ")
    exe = rg.Executor()
    for name, value in params.items():
        exe.scope.set(name, value)
    text = generate_text(exe, cfg, prompt, args.length, args.temperature, args.seed, args.top_k)
    sys.stdout.write(text + "\n")
    return 0
