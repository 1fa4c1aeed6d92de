"""Memory as a dial: one budget for a training step, reports, recompute at checkpoints,
checkpoint choice, schedules over time.

Example::

    rg.append_backward(loss, memory_budget=64 << 20, feed_shapes={"x": (64, 784)})   # the one knob
    ckpts = rg.memory.auto_checkpoints(loss, budget_bytes=8 << 20, feed_shapes={"x": (64, 784)})
    rg.append_backward(loss, checkpoints=ckpts)
    print(rg.memory.report(main, feed_shapes={"x": (64, 784)}))
"""
from .loops import schedules
from .loops import rnn_budget, while_budget  # noqa: F401  (register the budgeted loops' gradient ops)
from . import budget
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
           "report", "revolve_cost", "schedules", "sqrt_plan"]
