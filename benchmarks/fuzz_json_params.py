"""Fuzz the two file formats retrograd reads: program JSON and parameter files (.npz).

Seed programs (an MLP trained with Adam, cond + while_loop with gradients, an
LSTM with sequence lengths, a budgeted GRU) are saved, then mutated for a given
time, both as text (bytes flipped, cut, repeated; brackets nested deep; numbers
replaced by NaN, 1e999, huge ints) and as structure (any field replaced by a
value of another type, a wrong block reference, a shape of floats, a random op
type, ...). Each mutant is loaded; one that loads is printed, saved again,
reloaded, and run (small shapes only, 2 s at most). Parameter files are
mutated the same way (bytes, and rebuilt archives: members that are not .npy,
headers declaring enormous shapes, object arrays, corrupt compression,
encrypted or unknown compression methods, other .npy versions, duplicates) and
loaded with and without the program; saves go to directories and bad values.

Every failure must be a ``rg.RetrogradError``; anything else is a *foreign*
exception, printed with the input that caused it (also written to --out).

    python benchmarks/fuzz_json_params.py --seconds 600         # prints counts at the end
    python benchmarks/fuzz_json_params.py --seconds 20 --seed 3
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from pathlib import Path

import numpy as np

import retrograd as rg
from retrograd.ops.core.registry import OPS


class FuzzTimeout(BaseException):
    """A run took too long (a mutated loop may never end); not an error of retrograd."""


# --- seed programs ------------------------------------------------------------------------------

def _mlp():
    x = rg.data("x", [-1, 4], dtype="float64")
    label = rg.data("label", [-1], dtype="int64")
    h = rg.layers.fc(x, 5, act="tanh", name="l1")
    logits = rg.layers.fc(h, 3, name="l2")
    loss = rg.mean(rg.softmax_cross_entropy(logits, label))
    rg.optim.Adam(0.01).minimize(loss)


def _control_flow():
    x = rg.data("x", [2, 3], dtype="float64")
    y = rg.cond(rg.sum(x) > 0.0, lambda: rg.tanh(x) * 2.0, lambda: x * x)
    i0 = rg.constant(0, dtype="int64")
    _, z = rg.while_loop(lambda i, v: i < 3, lambda i, v: [i + 1, rg.sin(v) if hasattr(rg, "sin") else v * 0.5],
                         [i0, y])
    rg.gradients(rg.sum(z * z), [x])


def _lstm():
    x = rg.data("x", [3, 2, 4], dtype="float64")
    lengths = rg.data("lengths", [2], dtype="int64")
    h_all, h_last, _, _ = rg.layers.lstm(x, 3, seq_lengths=lengths, name="lstm")
    rg.append_backward(rg.sum(h_all) + rg.sum(h_last))


def _gru():
    x = rg.data("x", [4, 2, 3], dtype="float64")
    h_all, _ = rg.layers.gru(x, 3, name="gru", recompute=2048) \
        if "recompute" in rg.layers.gru.__code__.co_varnames else rg.layers.gru(x, 3, name="gru")
    rg.append_backward(rg.mean(h_all))


SEEDS = {"mlp": _mlp, "control_flow": _control_flow, "lstm": _lstm, "gru": _gru}


def seed_programs():
    """name -> (main, startup, executor with parameters initialised)."""
    built = {}
    for name, fn in SEEDS.items():
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            fn()
        exe = rg.Executor()
        exe.run(startup)
        built[name] = (main, startup, exe)
    return built


# --- JSON mutations -------------------------------------------------------------------------------

def _paths(doc):
    """Every (container, key) in the document, iteratively."""
    found, stack = [], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            found.append((node, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    return found


def _deep(rng, kind="["):
    depth = rng.choice([50, 99, 101, 200, 1000, 100000])
    return json.loads("[" * min(depth, 90) + "]" * min(depth, 90)) if kind == "[" else {"block": depth}


def _random_value(rng, names, blocks):
    choices = [
        lambda: rng.choice([0, 1, -1, -2, 2, 3, 7, 2**31, 2**62, -2**63]),
        lambda: rng.choice([0.5, 1.5, -0.0, 1e308, -1e-300, 2.0]),
        lambda: rng.choice(["", "x", "float32", "float16", "int8", "object", "O", "<f4", "nan"]),
        lambda: rng.choice([True, False, None]),
        lambda: [], lambda: {},
        lambda: [rng.choice([1.5, "a", None, True, -7, 2**40]) for _ in range(rng.randint(0, 4))],
        lambda: {"block": rng.choice([-1, 0, 1, blocks - 1, blocks, 10**6, 1.5, "1", True, None, [1]])},
        lambda: {"tuple": rng.choice([[], [1, 2], "x", None])},
        lambda: {"float": rng.choice(["nan", "inf", "-inf", "NaN", 1, None])},
        lambda: {"dict": rng.choice([[], [[1, 2]], [["a", [1]]], [[[1], 2]], "x", [[1]]])},
        lambda: {"array": rng.choice([[1, 2], [[1], [2, 3]], "x", [], [[1e308]]]),
                 "dtype": rng.choice(["float32", "int64", "bool", "object", "c16", 3])},
        lambda: rng.choice(names) if names else "x",
        lambda: rng.choice(sorted(OPS)),
        lambda: _deep(rng, rng.choice("[{")),
        lambda: {"block": 1, "extra": 2},
    ]
    return rng.choice(choices)()


def mutate_semantic(rng, doc, names):
    """A change that keeps the document well-typed, so more mutants load and run: an input
    renamed, an integer attribute nudged, a dimension or dtype changed, two ops swapped."""
    blocks = doc.get("blocks") or []
    ops = [op for b in blocks if isinstance(b, dict) for op in b.get("ops", []) if isinstance(op, dict)]
    var_docs = [v for b in blocks if isinstance(b, dict) for v in b.get("vars", []) if isinstance(v, dict)]
    action = rng.randrange(5)
    if action == 0 and ops:
        op = rng.choice(ops)
        if op.get("inputs"):
            op["inputs"][rng.randrange(len(op["inputs"]))] = rng.choice(names)
    elif action == 1 and ops:
        op = rng.choice(ops)
        ints = [k for k, v in op.get("attrs", {}).items() if isinstance(v, int) and not isinstance(v, bool)]
        if ints:
            key = rng.choice(ints)
            op["attrs"][key] += rng.choice([-2, -1, 1, 2])
    elif action == 2 and var_docs:
        var = rng.choice(var_docs)
        if var.get("shape"):
            var["shape"][rng.randrange(len(var["shape"]))] = rng.choice([-1, 0, 1, 2, 3])
    elif action == 3 and var_docs:
        rng.choice(var_docs)["dtype"] = rng.choice(["float32", "float64", "int64", "int32", "bool"])
    elif blocks:
        block = rng.choice(blocks)
        block_ops = block.get("ops") if isinstance(block, dict) else None
        if block_ops and len(block_ops) > 1:
            i, j = rng.randrange(len(block_ops)), rng.randrange(len(block_ops))
            block_ops[i], block_ops[j] = block_ops[j], block_ops[i]
    return doc


def mutate_doc(rng, doc, names, blocks):
    """Change 1-3 places of a parsed program document."""
    if rng.random() < 0.4:
        return mutate_semantic(rng, doc, names)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(doc)
        if not paths:
            return doc
        node, key = rng.choice(paths)
        action = rng.random()
        if action < 0.6:
            node[key] = _random_value(rng, names, blocks)
        elif action < 0.75:
            del node[key]
        elif action < 0.85 and isinstance(node, list):
            node.insert(key, node[key])
        elif isinstance(node[key], list) and node[key]:
            rng.shuffle(node[key])
        else:
            node[key] = _random_value(rng, names, blocks)
    return doc


_TEXT_TOKENS = ["[", "]", "{", "}", '"', ",", ":", "0", "-1", "1e999", "NaN", "Infinity", "-Infinity",
                "1" * 5000, "1.5", "null", "true", "\\", "\\u0000", '"block"', "\ud800"]


def mutate_text(rng, text):
    """Byte-level damage to the JSON text."""
    for _ in range(rng.randint(1, 3)):
        if not text:
            return text
        i = rng.randrange(len(text))
        j = min(len(text), i + rng.randint(1, 40))
        action = rng.random()
        if action < 0.25:
            text = text[:i] + text[j:]
        elif action < 0.45:
            text = text[:i] + rng.choice(_TEXT_TOKENS) + text[i:]
        elif action < 0.55:
            text = text[:i]
        elif action < 0.65:
            depth = rng.choice([99, 101, 5000, 200000])
            text = text[:i] + "[" * depth + "]" * depth + text[i:]
        elif action < 0.85:
            # replace a number with another
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = rng.choice(digits)
                text = text[:k] + rng.choice(["NaN", "1e999", "-1e999", "1.5", "-7", "9" * 30, "0"]) + text[k + 1:]
        else:
            text = text[:i] + text[i:j] * rng.randint(2, 4) + text[j:]
    return text


# --- checking a loaded program ------------------------------------------------------------------------

@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise FuzzTimeout()
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _small(program) -> bool:
    """True when every declared size and every integer attribute is small (running is safe)."""
    for block in program.blocks:
        for var in block.vars.values():
            if any(d > 16 for d in var.shape) or var.ndim > 5:
                return False
        for op in block.ops:
            stack = list(op.attrs.values())
            while stack:
                value = stack.pop()
                if isinstance(value, (list, tuple)):
                    stack.extend(value)
                elif isinstance(value, dict):
                    stack.extend(value.values())
                elif isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > 64:
                    return False
                elif isinstance(value, np.ndarray) and value.size > 256:
                    return False
    return True


def _feed_for(program, rng):
    feed = {}
    for var in program.global_block().vars.values():
        if var.is_data:
            shape = [d if d >= 0 else 2 for d in var.shape]
            if var.dtype == "bool":
                feed[var.name] = rng.random(shape) > 0.5
            elif var.dtype.startswith("int"):
                feed[var.name] = rng.integers(0, 3, shape).astype(var.dtype)
            else:
                feed[var.name] = rng.standard_normal(shape).astype(var.dtype)
    return feed


def check_loaded(program, startup_exe, np_rng, counts):
    text = str(program)
    program.to_string(locations=True)
    saved = program.to_json()
    again = rg.Program.from_json(saved)
    if again.to_json() != saved:
        raise AssertionError("JSON round trip of a loaded program changed it")
    if not _small(program):
        counts["json: not run (large sizes)"] += 1
        return text
    exe = rg.Executor()
    for name in startup_exe.scope.names():
        exe.scope.set(name, startup_exe.scope.get(name))
    fetch = [v.name for v in program.global_block().vars.values() if not v.persistable][-3:]
    with time_limit(2.0):
        exe.run(program, feed=_feed_for(program, np_rng), fetch_list=fetch)
    counts["json: ran"] += 1
    floats = [v for v in program.global_block().vars.values()
              if v.dtype.startswith("float") and not v.persistable and not v.is_data]
    if floats and np_rng.random() < 0.3:      # differentiate the mutant too
        with rg.program_guard(program, rg.Program()):
            loss = rg.sum(floats[-1])
            inputs = [v for v in program.global_block().vars.values() if v.is_data and v.dtype.startswith("float")]
            grads = [g for g in rg.gradients(loss, inputs) if g is not None] if inputs else []
        with time_limit(2.0):
            exe.run(program, feed=_feed_for(program, np_rng), fetch_list=[loss] + grads)
        counts["json: differentiated and ran"] += 1
    return text


# --- parameter files -------------------------------------------------------------------------------

def _members(data: bytes):
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _npy(array, allow_pickle=False, version=None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=allow_pickle)
    return buf.getvalue()


def _header_npy(shape, descr="<f8", fortran=False, payload=b"") -> bytes:
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin1")
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload


def _zip(members, compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buf.getvalue()


def mutate_params(rng, data: bytes) -> bytes:
    members = _members(data)
    name, payload = rng.choice(members)
    action = rng.randrange(16)
    if action == 0:        # flip bytes anywhere
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if action == 1:
        return data[:rng.randrange(len(data))]
    if action == 2:        # a member that is not .npy
        members.append((rng.choice(["readme.txt", "x", "dir/", "w.npy.bak", ".npy/"]), b"hello"))
    elif action == 3:      # an enormous declared shape
        shape = rng.choice([(10**12,), (2**31, 2**31), (10**6, 10**6, 10**6), (-1, 3), (3, 0)])
        members = [(n, _header_npy(shape) if n == name else p) for n, p in members]
    elif action == 4:      # the declared shape of a real member, enlarged
        array = np.load(io.BytesIO(payload))
        big = tuple(d * 1000 + 1 for d in array.shape) or (10**9,)
        members = [(n, _header_npy(big, array.dtype.str, payload=payload[128:]) if n == name else p)
                   for n, p in members]
    elif action == 5:      # an object array (a pickle)
        members = [(n, _npy(np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
                    if n == name else p) for n, p in members]
    elif action == 6:      # another dtype
        dtype = rng.choice(["complex128", "float16", "U3", "V8", "int8", ">f8", "uint64", "S2"])
        members = [(n, _npy(np.zeros(np.load(io.BytesIO(payload)).shape, dtype)) if n == name else p)
                   for n, p in members]
    elif action == 7:      # corrupt compression
        raw = bytearray(_zip(members, zipfile.ZIP_DEFLATED))
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(40, len(raw) - 30)] ^= 0xFF
        return bytes(raw)
    elif action == 8:      # a duplicated member
        members.append((name, payload))
    elif action == 9:      # a member dropped
        members.remove((name, payload))
    elif action == 10:     # encrypted flag, or an unknown compression method
        raw = bytearray(_zip(members))
        offset = raw.find(b"PK\x01\x02")
        if rng.random() < 0.5:
            raw[offset + 8] |= 1                     # central directory: general purpose flags
        else:
            raw[offset + 10] = 99                    # central directory: compression method
        return bytes(raw)
    elif action == 11:     # other .npy versions and magic
        fixed = bytearray(payload)
        fixed[6:8] = bytes(rng.choice([(3, 0), (2, 0), (9, 9), (0, 0)]))
        members = [(n, bytes(fixed) if n == name else p) for n, p in members]
    elif action == 12:     # truncated or extended member data
        cut = payload[:rng.randrange(len(payload))] if rng.random() < 0.5 else payload + b"\0" * 8
        members = [(n, cut if n == name else p) for n, p in members]
    elif action == 13:     # a mangled header dict
        header = rng.choice(["{'descr': '<f8', 'fortran_order': 'x', 'shape': (2,)}",
                             "{'descr': '<f8', 'fortran_order': False, 'shape': (2.5,)}",
                             "{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (1,)}",
                             "__import__('os')", "{'descr': '<f8'}", "{" * 200,
                             "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3)}"])
        body = header.encode() + b"\n"
        members = [(n, b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body + b"\0" * 48
                    if n == name else p) for n, p in members]
    elif action == 14:     # a single .npy instead of a zip
        return payload
    else:                  # deflated but valid, or an empty archive
        return _zip(members, zipfile.ZIP_DEFLATED) if rng.random() < 0.5 else _zip([])
    return _zip(members)


def check_params(path: Path, main, exe, counts):
    try:
        rg.read_params(path)
        counts["params: read ok"] += 1
    except rg.RetrogradError as exc:
        counts[f"params: read rejected ({type(exc).__name__})"] += 1
    for program in (main, None):
        scope = rg.Scope()
        for name in exe.scope.names():
            scope.set(name, exe.scope.get(name))
        try:
            rg.load_params(scope, path, program)
            counts["params: load ok"] += 1
        except rg.RetrogradError as exc:
            counts[f"params: load rejected ({type(exc).__name__})"] += 1


def check_saves(rng, workdir: Path, main, exe, counts):
    scope = rg.Scope()
    for name in exe.scope.names():
        scope.set(name, exe.scope.get(name))
    choice = rng.randrange(5)
    target = workdir / "save.npz"
    if choice == 0:
        target = workdir                                    # a directory
    elif choice == 1:
        target = workdir / "missing" / "x.npz"              # no such directory
    elif choice == 2:
        name = rng.choice(scope.names())
        scope.vars[name] = np.array([object(), 1], dtype=object)
    elif choice == 3:
        name = rng.choice(scope.names())
        scope.vars[name] = rng.choice(["text", [1, 2], None, {"a": 1}, np.array(["a"])])
    try:
        rg.save_params(scope, target, main)
        counts["params: save ok"] += 1
    except rg.RetrogradError as exc:
        counts[f"params: save rejected ({type(exc).__name__})"] += 1
    leftovers = [p.name for p in workdir.iterdir() if p.name.endswith(".tmp")]
    if leftovers:
        raise AssertionError(f"temporary files left behind: {leftovers}")


# --- the loop --------------------------------------------------------------------------------------

def run(seconds: float, seed: int, out: Path) -> int:
    warnings.simplefilter("ignore")      # duplicate zip members, overflow in casts: made on purpose
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    seeds = seed_programs()
    texts = {name: main.to_json() for name, (main, _, _) in seeds.items()}
    workdir = Path(tempfile.mkdtemp(prefix="retrograd-fuzz-"))
    param_files = {}
    for name, (main, _, exe) in seeds.items():
        if rg.io.persistable_vars(main):
            path = workdir / f"{name}.npz"
            rg.save_params(exe.scope, path, main)
            param_files[name] = path.read_bytes()
    counts: collections.Counter = collections.Counter()
    foreign = 0
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kind = rng.random()
        name = rng.choice(sorted(seeds))
        main, _, exe = seeds[name]
        try:
            if kind < 0.75:
                if rng.random() < 0.6:
                    doc = json.loads(texts[name])
                    names = [v["name"] for b in doc["blocks"] for v in b["vars"]]
                    subject = json.dumps(mutate_doc(rng, doc, names, len(doc["blocks"])))
                else:
                    subject = mutate_text(rng, texts[name])
                counts["json mutations"] += 1
                try:
                    program = rg.Program.from_json(subject)
                except rg.RetrogradError as exc:
                    counts[f"json: rejected ({type(exc).__name__})"] += 1
                    continue
                counts["json: loaded"] += 1
                try:
                    check_loaded(program, exe, np_rng, counts)
                except rg.RetrogradError as exc:
                    counts[f"json: loaded, then {type(exc).__name__}"] += 1
                except FuzzTimeout:
                    counts["json: run timed out"] += 1
            elif kind < 0.95:
                pname = rng.choice(sorted(param_files))
                subject = mutate_params(rng, param_files[pname])
                path = workdir / "mutant.npz"
                path.write_bytes(subject)
                counts["params mutations"] += 1
                check_params(path, seeds[pname][0], seeds[pname][2], counts)
            else:
                subject = "save"
                counts["save attempts"] += 1
                pname = rng.choice(sorted(param_files))
                check_saves(rng, workdir, seeds[pname][0], seeds[pname][2], counts)
        except FuzzTimeout:
            counts["timed out"] += 1
        except Exception as exc:  # noqa: BLE001 -- the point: anything not a RetrogradError is a finding
            foreign += 1
            counts[f"FOREIGN {type(exc).__name__}"] += 1
            where = out / f"foreign_{foreign}"
            data = subject.encode("utf-8", "surrogatepass") if isinstance(subject, str) else subject
            where.with_suffix(".input").write_bytes(data)
            where.with_suffix(".txt").write_text(traceback.format_exc())
            if foreign <= 20:
                print(f"FOREIGN {type(exc).__name__}: {str(exc)[:200]} (input: {where}.input)",
                      file=sys.stderr)
                print("".join(traceback.format_exc().splitlines(True)[-6:]), file=sys.stderr)
    mutations = counts["json mutations"] + counts["params mutations"] + counts["save attempts"]
    print(f"seconds: {seconds:.0f}  seed: {seed}  mutations: {mutations}  foreign exceptions: {foreign}")
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")
    return foreign


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "retrograd-fuzz-findings")
    args = parser.parse_args(argv)
    return 1 if run(args.seconds, args.seed, args.out) else 0


if __name__ == "__main__":
    sys.exit(main())
