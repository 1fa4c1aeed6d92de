"""Programs as JSON text: an exact round trip that never executes code.

The document is plain JSON (no pickle, no eval)::

    {"format": "retrograd.program", "version": 1,
     "random_seed": 0, "seed_counter": 2, "name_counts": {"matmul": 1},
     "blocks": [{"idx": 0, "parent": -1,
                 "vars": [{"name": "x", "shape": [-1, 8], "dtype": "float32",
                           "persistable": false, "trainable": false,
                           "stop_gradient": true, "is_parameter": false,
                           "is_data": true}],
                 "ops": [{"type": "MatMul", "inputs": ["x", "w"],
                          "outputs": ["matmul_0"], "attrs": {},
                          "location": "train.py:12"}]}]}

Attribute values that JSON holds natively (None, bools, ints, finite floats,
strings, lists) are written as themselves; JSON objects are reserved for the
tagged values JSON lacks: ``{"block": 1}`` (a sub-block), ``{"tuple": [...]}``,
``{"float": "inf"}`` and friends, ``{"dict": [[key, value], ...]}`` and
``{"array": [...], "dtype": "float32"}``. Python prints floats with the
shortest text that reads back to the same double, so floats survive exactly.
An op's ``location`` (where user code built it) is present when known;
documents without it (older files) load with no locations.
"""
from __future__ import annotations

import json
import math
import warnings
import re
from typing import Any

import numpy as np

from ..errors import ProgramError
from .dtypes import DTYPES
from .program import MAX_BLOCK_DEPTH, Block, Op, Program, provides

FORMAT = "retrograd.program"
VERSION = 1
_VAR_FLAGS = ("persistable", "trainable", "stop_gradient", "is_parameter", "is_data")
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
MAX_JSON_DEPTH = 100  # lists and objects inside each other; a program needs about 10


# --- Writing --------------------------------------------------------------------------

@provides
def program_to_json(program: Program, indent: int | None = None) -> str:
    """The program as JSON text; ``program_from_json`` restores it exactly.

    Example::

        text = program_to_json(main)        # same as main.to_json()
        again = program_from_json(text)
        assert again.to_json() == text
    """
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "random_seed": program.random_seed,
        "seed_counter": program._seed_counter,
        "name_counts": dict(program.name_counts),
        "blocks": [_block_to_dict(block) for block in program.blocks],
    }
    return json.dumps(doc, indent=indent, allow_nan=False)


def _block_to_dict(block: Block) -> dict:
    return {
        "idx": block.idx,
        "parent": block.parent_idx,
        "vars": [{"name": var.name, "shape": list(var.shape), "dtype": var.dtype,
                  **{flag: bool(getattr(var, flag)) for flag in _VAR_FLAGS}}
                 for var in block.vars.values()],
        "ops": [_op_to_dict(op, f"block {block.idx}, op #{i} {op.type}")
                for i, op in enumerate(block.ops)],
    }


def _op_to_dict(op: Op, where: str) -> dict:
    for key in op.attrs:
        if not isinstance(key, str):
            raise ProgramError(f"{where}: attribute name {key!r} is not a string")
    doc = {"type": op.type, "inputs": list(op.inputs), "outputs": list(op.outputs),
           "attrs": {key: _encode(value, f"{where}, attribute '{key}'")
                     for key, value in op.attrs.items()}}
    if op.location is not None:
        doc["location"] = op.location
    return doc


def _encode(value: Any, where: str) -> Any:
    # bool before int: bool is a subclass of int and must stay a bool.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, Block):
        return {"block": value.idx}
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, where) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, where), _encode(v, where)] for k, v in value.items()]}
    if isinstance(value, np.ndarray) and value.dtype.name in DTYPES:
        return {"array": _encode(value.tolist(), where), "dtype": value.dtype.name}
    if isinstance(value, np.generic):  # NumPy scalars: store the Python number they hold
        return _encode(value.item(), where)
    raise ProgramError(f"{where}: cannot save a value of type {type(value).__name__} ({value!r}); "
                       "attributes hold None, bools, ints, floats, strings, lists, tuples, dicts, "
                       "arrays and sub-blocks")


# --- Reading ------------------------------------------------------------------------------

@provides
def program_from_json(text: str | bytes) -> Program:
    """Rebuild a program saved by ``program_to_json``, then verify it.

    Raises ProgramError, naming what is wrong, for malformed JSON, missing or
    mistyped fields, unknown dtypes, dangling block references and anything
    the verifier rejects (unknown op types, undeclared variables, ...).

    Example::

        main = program_from_json(open("model.json").read())
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise ProgramError(f"program JSON must be text, got {type(text).__name__}")
    doc = _expect(_parse(text), dict, "the program document")
    if doc.get("format", FORMAT) != FORMAT:
        raise ProgramError(f"not a retrograd program: format is {doc.get('format')!r}, expected {FORMAT!r}")
    version = _field(doc, "version", int, "the program document")
    if version > VERSION:
        raise ProgramError(f"program JSON has version {version}; this retrograd reads up to {VERSION}")

    program = Program(random_seed=_field(doc, "random_seed", int, "the program document"))
    blocks = _field(doc, "blocks", list, "the program document")
    if not blocks:
        raise ProgramError("program JSON has no blocks; block 0 (the global block) is required")
    block_docs = [_expect(b, dict, f"blocks[{i}]") for i, b in enumerate(blocks)]
    # All blocks first, so that ops may reference any block by index.
    for position, bdoc in enumerate(block_docs):
        _add_block(program, bdoc, position)
    for block, bdoc in zip(program.blocks, block_docs):
        _fill_block(block, bdoc)

    name_counts = _field(doc, "name_counts", dict, "the program document")
    for prefix, count in name_counts.items():
        program.name_counts[prefix] = _expect(count, int, f"name_counts['{prefix}']")
    program._seed_counter = _field(doc, "seed_counter", int, "the program document")

    from .verify import verify_program
    verify_program(program)
    return program


def _parse(text: str) -> Any:
    """``json.loads`` for untrusted text: bounded nesting, finite floats, int64-sized ints."""
    _check_nesting(text)
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=_int64)
    except json.JSONDecodeError as exc:
        # Some messages end in "at" already ("Unterminated string starting at").
        what = exc.msg[:-len(" at")] if exc.msg.endswith(" at") else exc.msg
        raise ProgramError(f"program JSON is malformed: {what} at line {exc.lineno}, "
                           f"column {exc.colno}") from None


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET_STEPS = np.zeros(256, dtype=np.int8)   # byte -> +1 opening, -1 closing, 0 otherwise
_BRACKET_STEPS[[ord("["), ord("{")]] = 1
_BRACKET_STEPS[[ord("]"), ord("}")]] = -1


def _check_nesting(text: str) -> None:
    # The decoder recurses once per nested list or object; measure the depth first (strings
    # removed, brackets counted with NumPy) so that no document reaches the recursion limit.
    brackets = _STRINGS.sub("", text).encode("ascii", errors="ignore")
    steps = _BRACKET_STEPS[np.frombuffer(brackets, dtype=np.uint8)]
    steps = steps[steps != 0].astype(np.int32)        # only the brackets: a small array
    depth = int(np.cumsum(steps).max(initial=0))
    if depth > MAX_JSON_DEPTH:
        raise ProgramError(f"program JSON nests lists and objects {depth} deep; at most "
                           f"{MAX_JSON_DEPTH} are allowed")


def _reject_constant(name: str) -> Any:
    raise ProgramError(f"program JSON is malformed: it holds {name}, which is not JSON; non-finite floats are "
                       'written {"float": "nan"}, {"float": "inf"} or {"float": "-inf"}')


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProgramError(f"program JSON holds the number {text[:40]}, which is too large for a float")
    return value


def _int64(text: str) -> int:
    # Checked before conversion: a long digit string costs quadratic time to convert.
    digits = text.lstrip("-")
    if len(digits) > 19 or not -2**63 <= int(text) < 2**63:
        raise ProgramError(f"program JSON holds the integer {text[:40]}{'...' if len(text) > 40 else ''}, "
                           "which does not fit in 64 bits")
    return int(text)


def _add_block(program: Program, bdoc: dict, position: int) -> None:
    where = f"blocks[{position}]"
    idx = _field(bdoc, "idx", int, where)
    parent = _field(bdoc, "parent", int, where)
    if idx != position:
        raise ProgramError(f"{where}: has idx {idx}; blocks must be listed in order 0, 1, 2, ...")
    if idx == 0:
        if parent != -1:
            raise ProgramError(f"block 0 is the global block and has no parent, but names parent {parent}")
        return
    # A parent is always created before its children, which also rules out cycles.
    if not 0 <= parent < idx:
        raise ProgramError(f"block {idx}: parent {parent} is not an earlier block (0..{idx - 1})")
    if program.blocks[parent].depth() >= MAX_BLOCK_DEPTH:
        raise ProgramError(f"block {idx}: nested more than {MAX_BLOCK_DEPTH} blocks deep")
    program.create_block(program.blocks[parent])


def _fill_block(block: Block, bdoc: dict) -> None:
    where = f"block {block.idx}"
    for i, vdoc in enumerate(_field(bdoc, "vars", list, where)):
        _add_var(block, _expect(vdoc, dict, f"{where}, vars[{i}]"), f"{where}, vars[{i}]")
    for i, odoc in enumerate(_field(bdoc, "ops", list, where)):
        _add_op(block, _expect(odoc, dict, f"{where}, op #{i}"), f"{where}, op #{i}")


def _add_var(block: Block, vdoc: dict, where: str) -> None:
    name = _field(vdoc, "name", str, where)
    where = f"{where} '{name}'"
    shape = _field(vdoc, "shape", list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape):
        raise ProgramError(f"{where}: shape {shape} must be a list of ints >= -1")
    dtype = _field(vdoc, "dtype", str, where)
    if dtype not in DTYPES:
        raise ProgramError(f"{where}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    flags = {flag: _field(vdoc, flag, bool, where) for flag in _VAR_FLAGS}
    if name in block.vars:
        raise ProgramError(f"{where}: declared twice in block {block.idx}")
    block.create_var(name, shape, dtype, **flags)


def _add_op(block: Block, odoc: dict, where: str) -> None:
    type_ = _field(odoc, "type", str, where)
    where = f"{where} {type_}"
    inputs = _names(_field(odoc, "inputs", list, where), f"{where} inputs")
    outputs = _names(_field(odoc, "outputs", list, where), f"{where} outputs")
    attrs_doc = _field(odoc, "attrs", dict, where)
    attrs = {key: _decode(value, block.program, f"{where}, attribute '{key}'")
             for key, value in attrs_doc.items()}
    location = odoc.get("location")  # absent in files written before locations existed
    if location is not None and not isinstance(location, str):
        raise ProgramError(f"{where}: field 'location' must be a string like \"train.py:42\", "
                           f"got {_json_kind(location)}")
    block.append_op(Op(type_, inputs, outputs, attrs, location=location))


def _names(items: list, where: str) -> list[str]:
    for item in items:
        if not isinstance(item, str):
            raise ProgramError(f"{where}: {item!r} is not a variable name (a string)")
    return list(items)


def _decode(value: Any, program: Program, where: str) -> Any:
    if isinstance(value, list):
        return [_decode(v, program, where) for v in value]
    if not isinstance(value, dict):
        return value  # None, bool, int, float, str: JSON's own
    if len(value) == 1 and "block" in value:
        idx = value["block"]
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(program.blocks):
            raise ProgramError(f"{where}: references block {idx!r}, but the program has blocks "
                               f"0..{len(program.blocks) - 1}")
        return program.blocks[idx]
    if len(value) == 1 and "tuple" in value:
        return tuple(_decode(v, program, where) for v in _expect(value["tuple"], list, where))
    if len(value) == 1 and "float" in value:
        if value["float"] not in _NONFINITE:
            raise ProgramError(f"{where}: unknown float {value['float']!r}; expected 'inf', '-inf' or 'nan'")
        return _NONFINITE[value["float"]]
    if len(value) == 1 and "dict" in value:
        pairs = _expect(value["dict"], list, where)
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ProgramError(f"{where}: a dict is stored as a list of [key, value] pairs")
        return {_hashable(_decode(k, program, where), where): _decode(v, program, where) for k, v in pairs}
    if set(value) == {"array", "dtype"}:
        if value["dtype"] not in DTYPES:
            raise ProgramError(f"{where}: unknown dtype {value['dtype']!r}; use one of {', '.join(DTYPES)}")
        try:
            with warnings.catch_warnings():
                # NumPy < 2 only warns (DeprecationWarning) where 2.x raises OverflowError.
                warnings.simplefilter("error", DeprecationWarning)
                return np.asarray(_decode(value["array"], program, where), dtype=value["dtype"])
        except (TypeError, ValueError, OverflowError, DeprecationWarning) as exc:
            raise ProgramError(f"{where}: not an array of {value['dtype']}: {exc}") from None
    raise ProgramError(f"{where}: unrecognised tagged value {json.dumps(value)[:80]}; expected "
                       "{\"block\": i}, {\"tuple\": [...]}, {\"float\": ...}, {\"dict\": [...]} or "
                       "{\"array\": [...], \"dtype\": ...}")


def _hashable(key: Any, where: str) -> Any:
    if isinstance(key, (list, dict)):
        raise ProgramError(f"{where}: dict key {key!r} is not hashable")
    return key


def _expect(value: Any, kind: type, where: str) -> Any:
    # bool is an int to Python but never a valid int field here.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProgramError(f"{where}: expected {_KIND_NAMES[kind]}, got {_json_kind(value)}")
    return value


def _field(doc: dict, key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise ProgramError(f"{where}: missing field '{key}'")
    return _expect(doc[key], kind, f"{where}: field '{key}'")


_KIND_NAMES = {dict: "an object", list: "a list", int: "an integer", str: "a string", bool: "true or false"}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", int: "an integer", float: "a number",
            str: "a string"}.get(type(value), type(value).__name__)
