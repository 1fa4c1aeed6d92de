"""Memory as a dial: one budget for a training step, reports, checkpoints and their choice, schedules over time.

Example:
    ```python
    import retrograd as rg

    def build():
        x = rg.data("x", [-1, 32])
        h = x
        for i in range(4):
            h = rg.layers.fc(h, 32, act="tanh", name=f"l{i}")
        return rg.mean(h)

    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        loss = build()
        rg.append_backward(loss, memory_budget=240_000, feed_shapes={"x": (256, 32)})   # the one knob
    print(rg.memory.report(main, feed_shapes={"x": (256, 32)}))

    other = rg.Program()
    with rg.program_guard(other, rg.Program()):
        loss = build()
        ckpts = rg.memory.auto_checkpoints(loss, budget_bytes=100_000, feed_shapes={"x": (256, 32)})
        rg.append_backward(loss, checkpoints=ckpts)
    ```
"""
from .loops import schedules
from .loops import rnn_budget, while_budget  # noqa: F401  (register the budgeted loops' gradient ops)
from . import budget, policies, selective  # noqa: F401  (rg.memory.policies: the recompute policies)
from .loops import unhoist  # noqa: F401  (register append_backward's memory rewrites)
from .auto import auto_checkpoints
from .budget import BudgetPlan
from .peak import planned_peak
from .recompute import RecomputePlan, Segment, plan_recompute, recompute_backward
from .report import MemoryReport, ValueInfo, report
from .shape_reads import bind_shape_stand_ins
from .loops.schedules import Plan, budget_plan, make_plan, revolve_cost, sqrt_plan

__all__ = ["BudgetPlan", "MemoryReport", "Plan", "RecomputePlan", "Segment", "ValueInfo", "auto_checkpoints",
           "bind_shape_stand_ins", "budget_plan", "make_plan", "plan_recompute", "planned_peak", "recompute_backward",
           "policies", "report", "revolve_cost", "schedules", "selective", "sqrt_plan"]
