"""Property tests: random programs with cond, while_loop, recurrent, budgets and second
derivatives get PyTorch's values and gradients (float64).

The programs come from ``random_programs.py`` (shared with the long fuzz script
``benchmarks/fuzz_random_programs.py``); hypothesis draws each choice, so a
failure shrinks to a small description printed with the assertion.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retrograd.ops.core.registry import OPS

sys.path.insert(0, str(Path(__file__).parent))
import random_programs as rp  # noqa: E402  (a helper module next to this file, not a package)

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def programs(draw, structures=rp.STRUCTURES, second=(False,)):
    def choose(label, options):
        if label == "structure":
            options = list(structures)
        elif label == "second":
            options = list(second)
        elif label == "recompute":
            options = [o for o in options if not isinstance(o, int) or o >= 1 << 12]   # budgets that fit
        return draw(st.sampled_from(options))
    return rp.draw_program(choose)


def _second_order_supported(desc: dict) -> bool:
    """Whether the structure's gradient op has a gradient maker itself (else the second
    derivative is refused with a ProgramError, which ``test_..._errors`` covers elsewhere)."""
    budgeted = isinstance(desc["recompute"], int)
    grad_op = {"recurrent": "RecurrentNetworkBudgetGrad" if budgeted else "RecurrentNetworkGrad",
               "while": "WhileBudgetGrad" if budgeted else "WhileGrad"}.get(desc["structure"])
    return grad_op is None or (grad_op in OPS and OPS[grad_op].grad is not None)


@SETTINGS
@given(programs(), st.integers(0, 2**31 - 1))
def test_random_control_flow_programs_match_torch_gradients(desc, seed):
    rp.compare(desc, seed)


@SETTINGS
@given(programs(second=(True,)), st.integers(0, 2**31 - 1))
def test_random_control_flow_programs_match_torch_second_derivatives(desc, seed):
    if not _second_order_supported(desc):
        desc = dict(desc, second=False)
    rp.compare(desc, seed)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(programs(structures=("recurrent", "while")), st.integers(0, 2**31 - 1))
def test_budgeted_loops_match_torch(desc, seed):
    """Byte budgets (binomial checkpointing over steps or iterations) and "steps" recompute."""
    desc = dict(desc, recompute=desc["recompute"] if desc["recompute"] is not None else 1 << 12)
    rp.compare(desc, seed)


@SETTINGS
@given(programs(structures=("array",), second=(False, True)), st.integers(0, 2**31 - 1))
def test_random_tensor_array_programs_match_torch_to_second_order(desc, seed):
    """TensorArrays appended in a loop (and in a nested loop of varying trips), stacked and read."""
    rp.compare(desc, seed)
