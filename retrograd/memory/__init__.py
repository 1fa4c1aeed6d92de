"""Memory as a dial: reports, recompute at checkpoints, checkpoint choice, schedules over time.

Example::

    ckpts = rg.memory.auto_checkpoints(loss, budget_bytes=8 << 20, feed_shapes={"x": (64, 784)})
    rg.append_backward(loss, checkpoints=ckpts)
    print(rg.memory.report(main, feed_shapes={"x": (64, 784)}))
"""
from .auto import auto_checkpoints
from .recompute import RecomputePlan, Segment, plan_recompute, recompute_backward
from .report import MemoryReport, ValueInfo, report

__all__ = ["MemoryReport", "RecomputePlan", "Segment", "ValueInfo", "auto_checkpoints",
           "plan_recompute", "recompute_backward", "report"]
