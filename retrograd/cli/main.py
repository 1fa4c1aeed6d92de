"""The ``retrograd`` command: ``train``, ``sample``, ``export``, ``show``, ``graph``.

Examples::

    retrograd train                         # the main job: a character-level LSTM (retrograd/cli/train.py)
    retrograd sample retrograd-lstm.npz --length 400 --prompt "def "   # text from a saved model
    retrograd export retrograd-lstm.npz -o lm.onnx   # its sampling step as ONNX (retrograd/cli/onnx_sampler.py)
    retrograd show retrograd-lstm.npz       # print the training program a model file holds
    retrograd show model.json               # or a program saved with Program.to_json()
    retrograd graph retrograd-lstm.npz -o model.svg # draw it (DOT text, or SVG/PNG through `dot`)

User mistakes (a missing file, a malformed program) end with one line on
stderr and exit status 2; a bad option ends with argparse's message and a
line pointing at ``--help`` (not the whole usage). Ctrl-C ends with one line
and status 130. Output cut short by the reader (``retrograd show m.json |
head``) ends quietly.

Each subcommand is one ``_add_<name>(commands)`` function below that adds its
parser and sets ``handler``; the jobs live in their own modules
(``train.py``: ``add_train_arguments``, ``run_train``; ``sample.py``), which
never import this one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Sequence

from ..errors import RetrogradError
from ..ir.program import Block, Program

EXIT_USAGE = 2  # argparse's status for bad usage; bad input files get the same
EXIT_INTERRUPTED = 130
_RENDERED = {".svg": "svg", ".png": "png", ".pdf": "pdf"}


class CliError(Exception):
    """A user mistake the command reports as one line (no traceback)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Example::

        main(["show", "model.json"])
    """
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:       # named by the command's parser, whose --help lists its options
        (parser.commands.get(args.command) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:           # during start-up (imports, reading files): one line
        print(f"retrograd {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except (CliError, RetrogradError, OSError) as exc:
        # Verifier messages add the printed op on a second line; keep the report to one.
        message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        # Prints to stderr; under mpiexec it also stops the ranks that would wait for this one.
        from ..distributed import abort_all_ranks
        abort_all_ranks(EXIT_USAGE, f"retrograd {args.command}: error: {message}")
        return EXIT_USAGE


def _quiet_stdout() -> None:
    """The reader of our stdout went away: point stdout at /dev/null so the exit flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # no real file descriptor (tests capturing stdout)
        pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option prints its message first and a pointer to ``--help``, not the
    whole usage (16 lines for ``train``) above the message."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n"
                              f"usage: {self.prog} [options]; `{self.prog} --help` lists them\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="retrograd",
        description="Define-then-run deep learning whose backward pass is a program.")
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"retrograd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_train, _add_sample, _add_export, _add_show, _add_graph):
        add(commands)
    parser.commands = commands.choices        # name -> the command's parser
    return parser


def _add_train(commands) -> None:
    from .train import add_train_arguments, run_train
    train = commands.add_parser("train", help="train a character-level language model (train -h: options)",
                                description="Train a character-level language model on the Python "
                                            "standard library's source (or on your --text files), "
                                            "save it, print a sample.")
    add_train_arguments(train)
    train.set_defaults(handler=run_train)


def _add_sample(commands) -> None:
    from .sample import add_sample_arguments, run_sample
    sample = commands.add_parser("sample", help="generate text from a model saved by train",
                                 description="Generate text, one character at a time, from a "
                                             "parameter file written by `retrograd train`.")
    add_sample_arguments(sample)
    sample.set_defaults(handler=run_sample)


def _add_export(commands) -> None:
    from .onnx_sampler import add_export_arguments, run_export
    export = commands.add_parser("export", help="write a saved model's sampling step as ONNX",
                                 description="Write the one-step sampling program of a model saved "
                                             "by `retrograd train` as an ONNX model (onnxruntime "
                                             "runs it; see the README's ONNX section).")
    add_export_arguments(export)
    export.set_defaults(handler=run_export)


def _add_show(commands) -> None:
    show = commands.add_parser("show", help="print a saved program (a model file or JSON) as text",
                               description="Print the program a model file saved by `retrograd "
                                           "train` holds, or one saved with Program.to_json().")
    show.add_argument("file", help="model file (.npz) or program JSON file")
    show.add_argument("--locations", action="store_true",
                      help="end each op's line with the file:line that built it")
    show.set_defaults(handler=_show)


def _add_graph(commands) -> None:
    graph = commands.add_parser("graph", help="write a program's dataflow graph",
                                description="Write a saved program as a Graphviz graph: DOT "
                                            "text, or SVG/PNG/PDF (by the -o suffix) when "
                                            "Graphviz's `dot` is installed.")
    graph.add_argument("file", help="model file (.npz) or program JSON file")
    graph.add_argument("-o", "--output", help="output file (.dot, .svg, .png, .pdf); "
                                              "default: DOT on stdout")
    graph.set_defaults(handler=_graph)


# --- show --------------------------------------------------------------------------------

def _load(path: str) -> Program:
    file = Path(path)
    if not file.exists():
        raise CliError(f"{path}: no such file")
    if not file.is_file():
        raise CliError(f"{path}: not a file")
    if zipfile.is_zipfile(file):
        return _load_model_file(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not a program saved by Program.to_json (not UTF-8 text: {exc.reason} "
                       f"at byte {exc.start})") from None
    try:
        return Program.from_json(text)
    except RetrogradError as exc:
        raise CliError(f"{path}: {exc}") from None


def _load_model_file(file: Path) -> Program:
    """The program a parameter file holds (``retrograd train`` saves its training program)."""
    from ..io import read_program
    program = read_program(file)
    if program is None:
        raise CliError(f"{file}: a parameter file without a program (saved before `retrograd train` "
                       "stored its program, or by rg.save_params without with_program=True)")
    return program


def _show(args: argparse.Namespace) -> int:
    print(_load(args.file).to_string(locations=args.locations))
    return 0


# --- graph -------------------------------------------------------------------------------

def _graph(args: argparse.Namespace) -> int:
    dot = program_to_dot(_load(args.file))
    if args.output is None:
        sys.stdout.write(dot)
        return 0
    out = Path(args.output)
    fmt = _RENDERED.get(out.suffix.lower())
    if fmt is None:
        if out.suffix.lower() not in (".dot", ".gv"):
            raise CliError(f"{out}: unknown output type '{out.suffix}'; use .dot, .gv, "
                           f"{', '.join(_RENDERED)}")
        out.write_text(dot, encoding="utf-8")
        return 0
    binary = shutil.which("dot")
    if binary is None:
        raise CliError(f"writing {fmt.upper()} needs Graphviz's `dot`, which is not installed; "
                       f"use -o {out.with_suffix('.dot')} for DOT text")
    done = subprocess.run([binary, f"-T{fmt}", "-o", str(out)], input=dot.encode(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise CliError(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return 0


def program_to_dot(program: Program) -> str:
    """A Graphviz DOT digraph: ops are boxes, variables ellipses, sub-blocks clusters.

    Example::

        open("model.dot", "w").write(program_to_dot(main))
    """
    lines = ["digraph program {", '  node [fontname="Helvetica", fontsize=10];', "  rankdir=TB;"]
    for block in program.blocks:
        _dot_block(block, lines)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_block(block: Block, lines: list[str]) -> None:
    inner = block.parent_idx >= 0
    pad = "    " if inner else "  "
    if inner:
        lines.append(f"  subgraph cluster_b{block.idx} {{")
        lines.append(f"    label={_q(f'block {block.idx}')}; style=dashed;")
    for var in block.vars.values():
        fill = "#dde8f6" if var.persistable else "#e3f1df" if var.is_data else None
        style = f', style=filled, fillcolor="{fill}"' if fill else ""
        label = _q(var.name + "\n" + var.type_str())
        lines.append(f"{pad}{_var_id(var.block.idx, var.name)} [label={label}, shape=ellipse{style}];")
    for i, op in enumerate(block.ops):
        op_id = _q(f"b{block.idx}.op{i}")
        lines.append(f"{pad}{op_id} [label={_q(op.type)}, shape=box, style=rounded];")
        for name in op.inputs:
            lines.append(f"{pad}{_ref(block, name)} -> {op_id};")
        for name in op.outputs:
            lines.append(f"{pad}{op_id} -> {_ref(block, name)};")
        for sub in op.sub_blocks():
            lines.append(f"{pad}{op_id} -> {_q(f'b{sub.idx}.anchor')} [style=dashed, arrowhead=odot];")
    if inner:
        # An invisible point inside the cluster, so its op can point at the block.
        lines.append(f"    {_q(f'b{block.idx}.anchor')} [shape=point, style=invis];")
        lines.append("  }")


def _ref(block: Block, name: str) -> str:
    var = block.find_var(name)
    return _var_id(var.block.idx if var is not None else block.idx, name)


def _var_id(block_idx: int, name: str) -> str:
    return _q(f"b{block_idx}:{name}")


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
