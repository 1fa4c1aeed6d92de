"""``retrograd sample``: text from a model saved by ``retrograd train``.

The file says which model it holds (layer type and count from the parameter
names, sizes from their shapes, the vocabulary and the default prompt from the
run record ``retrograd train`` saves with them), so no model options are needed.

Examples::

    retrograd sample retrograd-lstm.npz
    retrograd sample m.npz --length 400 --prompt "def " --temperature 0.5
"""
from __future__ import annotations

import argparse
import sys

import retrograd as rg

from .charlm import ModelConfig, config_from_params, generate, read_record
from .io import read_params
from .options import non_negative_int, positive


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``retrograd sample``."""
    parser.add_argument("file", help="parameter file (.npz) written by retrograd train")
    parser.add_argument("--length", type=non_negative_int, default=300,
                        help="characters to generate after the prompt (default: 300)")
    parser.add_argument("--prompt", default=None,
                        help="text to start from (default: the first characters of the text the "
                             'model was trained on, "def " for the built-in corpus)')
    parser.add_argument("--temperature", type=positive(float), default=0.8,
                        help="lower is more predictable, higher more varied (default: 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="seed for drawing characters (default: 0)")


def run_sample(args: argparse.Namespace) -> int:
    """Print the prompt and ``args.length`` generated characters; return 0."""
    params = read_params(args.file)         # ParamFileError (one line) for a missing or foreign file
    cfg: ModelConfig = config_from_params(params, args.file)
    prompt = args.prompt if args.prompt is not None else read_record(params, args.file).get("prompt", "def ")
    exe = rg.Executor()
    for name, value in params.items():
        exe.scope.set(name, value)
    sys.stdout.write(generate(exe, cfg, prompt, args.length, args.temperature, args.seed) + "\n")
    return 0
