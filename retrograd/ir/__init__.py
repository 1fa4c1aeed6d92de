"""The program IR: Program, Block, Var, Op; the builder context; printer, JSON, verifier."""
from .builder import (block_guard, capture_ops, current_block, default_main_program,
                      default_startup_program, program_guard)
from .program import Block, Op, Program, Var
from . import printer, serialize  # noqa: F401  (hand str(program) and JSON to the Program class)

__all__ = ["Block", "Op", "Program", "Var", "block_guard", "capture_ops", "current_block",
           "default_main_program", "default_startup_program", "program_guard"]
