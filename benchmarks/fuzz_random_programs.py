"""Random programs vs PyTorch for a given time: values, gradients, second derivatives.

Programs come from ``tests/autodiff/random_programs.py`` (the generator the
hypothesis tests use): a small DAG of elementwise ops and products, then a
``cond``, a ``while_loop`` (trip count fed at run time, optionally under a
``recompute=`` byte budget), a ``recurrent`` network (``recompute`` None,
``"steps"`` or a byte budget; one or two states; with or without
``seq_lengths``) or nothing, with ``cond``/``while_loop`` nested
in loop bodies, sizes from 1 to 3 and sequences of 0 to 7 steps; half of them
also ask for second derivatives. Each is compared with the same computation
in torch (float64, rtol 1e-7).

Outcomes are counted: ``agree``; ``refused`` (a RetrogradError that says
what is unsupported: a budget below the least that fits, a gradient op with
no gradient maker, i.e. no second derivative there); ``MISMATCH`` (numbers
differ) and ``FOREIGN`` (an exception that is not a RetrogradError), both
printed with the description and seed that reproduce them:

    python benchmarks/fuzz_random_programs.py --seconds 600
    python -c "import sys; sys.path.insert(0, 'tests/autodiff'); import random_programs as rp; \\
               rp.compare(<description>, <seed>)"
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import traceback
import warnings
from pathlib import Path

import retrograd as rg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "autodiff"))
import random_programs as rp  # noqa: E402

_REFUSALS = ("has no gradient maker", "least budget", "minimum budget", "cannot hold")


def _key(desc: dict) -> str:
    budget = desc["recompute"]
    budget = "budget" if isinstance(budget, int) else str(budget)
    nested = any(op[0] in ("if", "loop") for op in desc["a"])
    extras = ("+nested" if nested else "") + ("+lengths" if desc.get("lengths") is not None else "") \
        + ("+2states" if desc.get("two_states") else "")
    return f"{desc['structure']}{extras} recompute={budget} second={desc['second']}"


def run(seconds: float, seed: int, show: int) -> int:
    warnings.simplefilter("ignore")
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    failures = 0
    deadline = time.monotonic() + seconds
    case = 0
    while time.monotonic() < deadline:
        case += 1
        desc = rp.draw_program(lambda label, options: rng.choice(options))
        program_seed = rng.randrange(2**31)
        try:
            rp.compare(desc, program_seed)
            outcome = "agree"
        except AssertionError as exc:
            outcome, detail = "MISMATCH", str(exc)
        except rg.RetrogradError as exc:
            refused = any(text in str(exc) for text in _REFUSALS)
            outcome, detail = ("refused" if refused else f"ERROR {type(exc).__name__}"), str(exc)
        except Exception as exc:  # noqa: BLE001 -- anything not a RetrogradError is a finding
            outcome, detail = f"FOREIGN {type(exc).__name__}", traceback.format_exc()
        counts[outcome] += 1
        by_kind[(outcome, _key(desc))] += 1
        if outcome not in ("agree", "refused"):
            failures += 1
            if failures <= show:
                print(f"--- {outcome}: rp.compare({desc!r}, {program_seed})\n{detail[-1500:]}", file=sys.stderr)
    print(f"seconds: {seconds:.0f}  seed: {seed}  programs: {case}  "
          + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    for (outcome, kind), count in sorted(by_kind.items()):
        print(f"  {outcome:<12} {kind}: {count}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="failures printed in full")
    args = parser.parse_args(argv)
    return 1 if run(args.seconds, args.seed, args.show) else 0


if __name__ == "__main__":
    sys.exit(main())
