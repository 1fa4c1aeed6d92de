"""The options of ``retrograd train`` a model file records, and how ``--resume`` reads them back.

A model file's run record (``charlm.RECORD``) holds, besides the vocabulary
and the prompt, the options of the run that made it (``RECORDED``: the model's
kind and sizes, the optimizer and its schedule, the batch, the seed, the text
files) and ``schedule_steps``, the length of its learning-rate schedule. A
resumed run takes every one of them from the file; an option given again must
agree with it (one line names the first that differs). ``--steps N`` on a
resume means N more steps after the checkpoint's, and a cosine or step
schedule keeps the length the first run gave it.

Files written before records held options tell the model's kind and sizes by
their arrays' names and shapes and the optimizer by its state
(``charlm.config_from_params``, ``optimizer_of``); the rest of their options
take the command's defaults.

Example::

    saved = rg.read_params("m.npz")
    resumed_options(args, saved, "m.npz")    # args.hidden, args.lr, ... now the file's
"""
from __future__ import annotations

from pathlib import Path

from ..models.charlm import (TrainError, config_from_params, expand_patterns, optimizer_of,
                             read_record)

# dest -> the default of a new run. Argparse leaves these out of the namespace when they are not
# given (default=SUPPRESS), so a resumed run can tell "not given" (take the file's) from "given".
RECORDED = {
    "model": "lstm", "hidden": 128, "layers": 1, "heads": 4, "embed": 64, "seq_len": 64, "batch": 32,
    "lr": 3e-3, "optimizer": "adam", "weight_decay": None, "lr_schedule": "constant", "warmup": 0,
    "clip_norm": 5.0, "seed": 0, "text": None,
}


SCHEDULES_WITH_LENGTH = ("cosine", "step")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def new_run_options(args) -> None:
    """A run from scratch: each recorded option not given takes its default; ``--text`` names its
    files as absolute paths (what the record keeps)."""
    for dest, default in RECORDED.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
    # the length of a schedule that has one (cosine, step): a resumed run keeps it
    args.schedule_steps = args.steps if args.lr_schedule in SCHEDULES_WITH_LENGTH else None


def options_record(args, text_files: list[str] | None) -> dict:
    """The options a new run's file records (``text_files``: the absolute paths it trained on)."""
    options = {dest: getattr(args, dest) for dest in RECORDED if dest != "text"}
    options["text"] = text_files
    options["schedule_steps"] = args.schedule_steps
    return options


def resumed_options(args, saved: dict, where: str) -> None:
    """Fill ``args`` with the options the file ``where`` (its arrays: ``saved``) was trained with;
    TrainError (one line) naming the first option given again with another value."""
    stored = stored_options(saved, where)
    for dest, default in RECORDED.items():
        if dest not in stored:
            if not hasattr(args, dest):
                setattr(args, dest, default)
            continue
        if not hasattr(args, dest):
            setattr(args, dest, stored[dest])
            continue
        given = _text_files(args.text) if dest == "text" else getattr(args, dest)
        if given != stored[dest]:
            raise TrainError(_differs(where, dest, stored[dest], getattr(args, dest)))
    _check_text_files(args.text, where)
    args.schedule_steps = stored.get("schedule_steps")


def stored_options(saved: dict, where: str) -> dict:
    """The options a file records; for older files, those its arrays tell (kind, sizes, optimizer)."""
    record = read_record(saved, where)
    if "options" in record:
        return dict(record["options"])
    cfg = config_from_params(saved, where)
    told = {"model": cfg.model, "hidden": cfg.hidden, "layers": cfg.layers,
            "optimizer": optimizer_of(saved, record)}
    if cfg.model == "transformer":
        told["heads"] = cfg.heads           # (its embedding is its --hidden: --embed is unused)
    else:
        told["embed"] = cfg.embed
    return told


def _differs(where: str, dest: str, stored, given) -> str:
    refuse = f"cannot resume from {where}:"
    if dest == "model":
        what = f"it holds a {stored} model and this run builds {given}"
    elif dest == "text":
        what = f"it was trained on {_files_words(stored)}, not on --text {' '.join(given)}"
    else:
        what = f"it was trained with {flag(dest)} {_value_words(stored)}, not {_value_words(given)}"
    files = "" if dest != "text" or stored else " (the built-in corpus)"
    kept = f"{flag(dest)} {_value_words(stored)}" if dest != "text" else f"--text{files}"
    return (f"{refuse} {what}; leave {flag(dest)} out to continue with the file's {kept}, or start "
            "a new run without --resume")


def _value_words(value) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _files_words(files) -> str:
    if not files:
        return "the built-in corpus"
    return " ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _text_files(patterns) -> list[str] | None:
    """The absolute paths ``--text patterns`` name (globs expanded), as a file records them."""
    if not patterns:
        return None
    return [str(path.resolve()) for path in expand_patterns(patterns)]


def text_files_of(corpus) -> list[str] | None:
    """The absolute paths of a loaded corpus's files (None for the built-in corpus)."""
    if corpus.builtin:
        return None
    return [str(Path(name).resolve()) for name, _ in corpus.sources]


def _check_text_files(files, where: str) -> None:
    for name in files or ():
        if not Path(name).is_file():
            raise TrainError(f"cannot resume from {where}: the text it was trained on, {name}, is "
                             "gone; pass the same text again with --text")
