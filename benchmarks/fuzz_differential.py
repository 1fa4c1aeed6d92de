"""Random programs on every backend for a given time: NumPy, torch-CPU, the onnxruntime engine and
``rg.onnx.export`` + a plain ``onnxruntime.InferenceSession`` (default options), compared.

Programs come from ``tests/autodiff/random_programs.py`` drawn with ``edges=True`` (the generator
of ``fuzz_random_programs.py`` and the hypothesis tests, with its torch twin): cond / while_loop /
recurrent (budgets, "steps", sequence lengths, two states), control flow nested in loop bodies
(conds on sums and on means, inner loops with constant and value-dependent trip counts),
second derivatives, float32 and float64, batches of 0 and 1 rows and of 2-3, sequences of 0 to 7
steps, a 0-d leaf, fed trip counts 0 to 5 with ``max_iters`` 3 sometimes below them, inputs
declared with -1 sizes or static ones, the weight fed or a parameter (an initializer of the exported
model, a parameter input of the engine's). Each runs on
every backend (``tests/autodiff/differential.py``) and is classified:

* ``agree``: every runner gave the NumPy executor's values (float64 NumPy also matches the
  torch twin);
* ``same error``: every runner raised NumPy's RetrogradError (e.g. ``max_iters`` exceeded);
* ``refused``: ``rg.onnx.export`` (or the engine) refused the program with a BackendError naming
  the op, or retrograd refused to build it (a second derivative with no gradient maker);
* ``mismatch``: values, shapes or dtypes differ, or one runner raised where another did not;
* ``foreign``: an exception that is not a RetrogradError, or a failure inside onnxruntime
  (session build or run) where NumPy ran.

``--ops`` fuzzes the op set of the size-0 sweep (``tests/ops/empty_sweep.py``: matmul and einsum
(ellipsis too), reductions, cumulative ops (reverse/exclusive), indexing (gather/scatter on an
axis, repeated and negative ids, gather_elements/scatter_elements), topk (axis, largest), norms
(normalized_ndim, batch_norm training and evaluation), conv (stride/dilation/groups) and pooling
(ceil_mode, dilation, count_include_pad), attention (causal, scaled), losses) instead: each
program is one op with random sizes, every axis 0, 1 or more, float32 or float64, alone or inside
``cond`` / ``scan`` (0 to 2 steps) / ``while_loop`` (0 to 2 more iterations), or its output through
a TensorArray (written in a while_loop, carried by a scan, unstack/gather/scatter/concat/split);
first or second order; gradients by ``rg.gradients``, by ``append_backward(memory_budget=)`` (an
ample budget, or the least that fits) or none (the forward of ``clone(for_test=True)``); on NumPy,
torch, the engine and an exported model, against PyTorch float64 autograd written from the op's
semantics, and in float64 half the time also against central finite differences
(``rg.testing.check_gradients``). The programs run in a child process, started again when one
dies: a ``crash`` is counted, with the case that caused it. Verdicts: ``agree`` (or every runner
refused where torch refuses), ``refused`` (a BackendError, a second order through an op with no
second-order gradient, or a memory budget over sizes a loop's trip count or a TensorArray's
length sets: issue 32 item 10), ``mismatch``, ``foreign`` (an exception that is not a
RetrogradError), ``crash``. The counts per axis of variation are printed after the totals.

Failures are printed with the description and seed that reproduce them::

    python benchmarks/fuzz_differential.py --seconds 600
    python -c "import sys; sys.path.insert(0, 'tests/autodiff'); import random_programs as rp; \\
               print(rp.differential_verdict(<description>, <seed>))"
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "autodiff"))
import random_programs as rp  # noqa: E402

FAILURES = ("mismatch", "foreign")


def _key(desc: dict) -> str:
    budget = desc["recompute"]
    budget = "budget" if isinstance(budget, int) else str(budget)
    nested = sorted({op[0] for op in desc["a"] if op[0] in ("if", "loop", "dloop")})
    sizes = "N=0" if desc["m"] == 0 else "N=1" if desc["m"] == 1 else "N>1"
    if desc["structure"] == "recurrent" and desc["T"] == 0:
        sizes += ",T=0"
    extras = "".join(f"+{kind}" for kind in nested) + (" 0-d" if rp._uses_k(desc) else "")
    return (f"{desc['structure']}{extras} {sizes} {desc.get('dtype', 'float64')} recompute={budget} "
            f"second={desc['second']}")


def run(seconds: float, seed: int, show: int) -> int:
    warnings.simplefilter("ignore")
    import onnxruntime as ort
    ort.set_default_logger_severity(4)       # failures are counted and printed here, not logged
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    failures = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        desc = rp.draw_program(lambda label, options: rng.choice(options), edges=True)
        program_seed = rng.randrange(2**31)
        verdict = rp.differential_verdict(desc, program_seed)
        counts[verdict.kind] += 1
        by_kind[(verdict.kind, _key(desc))] += 1
        if verdict.kind in FAILURES:
            failures += 1
            if failures <= show:
                print(f"--- {verdict.kind}: rp.differential_verdict({desc!r}, {program_seed})\n"
                      f"{verdict.detail[-1500:]}", file=sys.stderr, flush=True)
    total = sum(counts.values())
    print(f"seconds: {seconds:.0f}  seed: {seed}  programs: {total}  "
          + "  ".join(f"{k}: {counts.get(k, 0)}" for k in ("agree", "same error", "refused", "mismatch", "foreign")))
    for (outcome, kind), count in sorted(by_kind.items()):
        if outcome != "agree":
            print(f"  {outcome:<11} {kind}: {count}")
    return failures


OPS_KINDS = ("agree", "refused", "mismatch", "foreign", "crash")


WRAPS = ("none", "none", "cond", "scan", "while", "ta_while", "ta_scan", "ta_unstack", "ta_gather",
         "ta_scatter", "ta_concat", "ta_split")
MODES = ("gradients", "gradients", "budget", "budget_least", "for_test")


def draw_op_case(choose, sweep) -> dict:
    """One random op program of the sweep's table, described as the sweep's child reads it: the
    op, its sizes (each swept axis 0, 1, its base size or 2-5), and the ``Variant`` (dtype, the
    control flow or TensorArray around it, second order, memory budget or ``clone(for_test=True)``,
    finite differences). ``choose(label, options)`` picks one option (``random.choice`` here,
    hypothesis' ``sampled_from`` in ``tests/ops/test_empty_axes.py``)."""
    entry = choose("op", sweep.entry_names())
    spec = sweep.entry_spec(entry)
    sizes = dict(sweep.SIZES, **spec["sizes"])
    for letter in spec["swept"]:
        sizes[letter] = choose(f"size {letter}", [0, 1, sizes[letter], sizes[letter], 2, 3, 4, 5])
    dtype = choose("dtype", ["float32", "float64"])
    variant = {"dtype": dtype, "wrap": choose("wrap", list(WRAPS)), "steps": choose("steps", [0, 1, 2]),
               "pred": choose("pred", [False, True]), "order": choose("order", [1, 1, 2]),
               "mode": choose("mode", list(MODES)),
               "fd": dtype == "float64" and choose("finite differences", [False, True])}
    return {"op": entry, "sizes": sizes, "variant": variant, "seed": choose("seed", range(2**31))}


def _op_case(rng: random.Random, sweep) -> dict:
    return draw_op_case(lambda label, options: rng.choice(options), sweep)


def _refusal(failures: list[str]) -> str:
    """Why a refused program was refused (the first reason)."""
    text = failures[0]
    if "refused (second order)" in text:
        return "refused: no second order"
    if "issue 32 item 10" in text:
        return "refused: budget over loop/array"
    if "budget cannot size a cond" in text:
        return "refused: budget, cond output"
    return "refused: BackendError"


def _categories(case: dict) -> list[str]:
    """The axes of variation a case covers, for the per-category counts."""
    v, sizes = case["variant"], case["sizes"]
    empty = "size 0" if 0 in sizes.values() else "size 1" if 1 in sizes.values() else "sizes >= 2"
    return [f"wrap={v['wrap']}", f"dtype={v['dtype']}", f"order={v['order']}", f"mode={v['mode']}",
            f"finite differences={v['fd'] and v['dtype'] == 'float64'}", empty]


def _verdict(failures: list[str]) -> str:
    if not failures:
        return "agree"
    if any("process died" in f for f in failures):
        return "crash"
    if any("foreign" in f for f in failures):
        return "foreign"
    if all("BackendError" in f or "refused (" in f for f in failures):
        return "refused"
    return "mismatch"


def run_ops(seconds: float, seed: int, show: int) -> int:
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tests" / "ops"))
    import empty_sweep as sweep
    from test_empty_axes import Child
    rng = random.Random(seed)
    child = Child()
    counts: collections.Counter = collections.Counter()
    by_op: collections.Counter = collections.Counter()
    by_category: collections.Counter = collections.Counter()
    ops_seen: collections.Counter = collections.Counter()
    failures = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        case = _op_case(rng, sweep)
        found = child.sweep(json.dumps(case))
        kind = _verdict(found)
        counts[kind] += 1
        by_op[(kind, case["op"], case["variant"]["wrap"])] += 1
        ops_seen[case["op"]] += 1
        if kind == "refused":
            by_category[(_refusal(found), kind)] += 1
            if _refusal(found) == "refused: BackendError" and show:     # rare: say which op and runner
                print(f"--- refused: {json.dumps(case)}\n" + "\n".join(f[:400] for f in found[:2]),
                      file=sys.stderr, flush=True)
        for category in _categories(case):
            by_category[(category, kind)] += 1
        if kind not in ("agree", "refused"):
            failures += 1
            if failures <= show:
                print(f"--- {kind}: {json.dumps(case)}\n" + "\n".join(f[:600] for f in found[:4]),
                      file=sys.stderr, flush=True)
    child.close()
    total = sum(counts.values())
    print(f"seconds: {seconds:.0f}  seed: {seed}  op programs: {total}  "
          + "  ".join(f"{k}: {counts.get(k, 0)}" for k in OPS_KINDS))
    print(f"ops drawn: {len(ops_seen)} of {len(sweep.entry_names())}")
    print("per category (programs: " + ", ".join(OPS_KINDS) + "):")
    for category in sorted({c for c, _ in by_category}):
        row = [by_category.get((category, k), 0) for k in OPS_KINDS]
        print(f"  {category:<28} {sum(row):>5}: " + " ".join(f"{n:>4}" for n in row))
    for (outcome, op, wrap), count in sorted(by_op.items()):
        if outcome != "agree":
            print(f"  {outcome:<9} {op} ({wrap}): {count}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="failures printed in full")
    parser.add_argument("--ops", action="store_true",
                        help="fuzz the size-0 sweep's op set (empty and size-1 axes, control flow)")
    args = parser.parse_args(argv)
    if args.ops:
        return 1 if run_ops(args.seconds, args.seed, args.show) else 0
    return 1 if run(args.seconds, args.seed, args.show) else 0


if __name__ == "__main__":
    sys.exit(main())
