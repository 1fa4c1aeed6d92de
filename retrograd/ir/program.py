"""The IR: a Program is a list of Blocks; a Block holds Vars and Ops.

Block 0 is the global block. A sub-block (the body of a loop, a branch of a
cond) has a parent and sees its ancestors' variables (lexical scoping).
Ops refer to variables by name; attributes may reference sub-blocks.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ProgramError
from .dtypes import canonical
from .location import here

_RECORD = object()  # Op(location=...) default: record the user's line now

# Filled by ``retrograd.ops`` so that ``x + y`` on Vars builds ops while the IR
# itself depends on nothing above it.
OPERATORS: dict[str, Callable[..., "Var"]] = {}

_program_serials = itertools.count()

# ``clone(for_test=True)`` rewrites its copy with the pass that ``retrograd/passes/for_test.py``
# hands over when imported (the pass needs the op registry; the IR imports no ops).
_FOR_TEST_PASS: dict[str, Callable[["Program"], None]] = {}


def register_for_test_pass(fn: Callable[["Program"], None]) -> Callable[["Program"], None]:
    """Called once by ``retrograd/passes/for_test.py`` with its ``make_test_program``."""
    _FOR_TEST_PASS["pass"] = fn
    return fn

# Blocks inside blocks: passes, the printer and the executor walk nested blocks
# recursively, so loading and verifying refuse deeper nesting than this.
MAX_BLOCK_DEPTH = 64


def as_int(value, what: str) -> int:
    """``value`` as an int: ints (NumPy's too) and integral floats; ProgramError for anything
    else (1.5, NaN, "1", None, True), which ``int()`` would truncate, parse or crash on."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise ProgramError(f"{what} must be an integer, got {type(value).__name__} {value!r:.40}")


def as_ints(values, what: str) -> list[int]:
    """A list of ints from any iterable (see ``as_int``); ProgramError if ``values`` is not one."""
    if type(values) is tuple and all(type(v) is int for v in values):     # a Var's own shape: as is
        return list(values)
    return [as_int(v, what) for v in as_list(values, what)]


def as_list(values, what: str) -> list:
    """``list(values)``; ProgramError for a non-iterable (or a string) where a list belongs."""
    if isinstance(values, (str, bytes, Var)) or not hasattr(values, "__iter__"):
        raise ProgramError(f"{what} must be a list, got {type(values).__name__} {values!r:.40}")
    return list(values)


def as_float(value, what: str) -> float:
    """``float(value)`` for numbers; ProgramError for strings, None and other objects."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise ProgramError(f"{what} must be a number, got {type(value).__name__} {value!r:.40}")


def _format_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


class Var:
    """A named, typed value in a block. Build them with ``rg.data``, ops, layers.

    Example::

        x = rg.data("x", [-1, 8])      # batch size known only at run time
        y = rg.tanh(x * 2.0 + 1.0)     # operators build ops
    """

    # Let ``numpy_scalar * var`` reach Var.__rmul__ instead of NumPy broadcasting.
    __array_ufunc__ = None

    def __init__(self, block: "Block", name: str, shape, dtype="float32", *,
                 persistable: bool = False, trainable: bool = False,
                 stop_gradient: bool = False, is_parameter: bool = False,
                 is_data: bool = False):
        self.block = block
        self.name = name
        self.shape = tuple(as_ints(shape, f"the shape of '{name}'"))
        self.dtype = canonical(dtype)
        self.persistable = persistable
        self.trainable = trainable
        self.stop_gradient = stop_gradient
        self.is_parameter = is_parameter
        self.is_data = is_data

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def type_str(self) -> str:
        return f"{self.dtype}{_format_shape(self.shape)}"

    def __repr__(self) -> str:
        return f"Var({self.name}: {self.type_str()})"

    def __bool__(self):
        raise ProgramError(
            f"Var '{self.name}' has no truth value while the program is being built; "
            "use rg.cond / rg.while_loop for data-dependent control flow")

    # Arithmetic builds ops through the table filled by retrograd.ops.
    def __add__(self, other): return OPERATORS["add"](self, other)
    def __radd__(self, other): return OPERATORS["add"](other, self)
    def __sub__(self, other): return OPERATORS["sub"](self, other)
    def __rsub__(self, other): return OPERATORS["sub"](other, self)
    def __mul__(self, other): return OPERATORS["mul"](self, other)
    def __rmul__(self, other): return OPERATORS["mul"](other, self)
    def __truediv__(self, other): return OPERATORS["div"](self, other)
    def __rtruediv__(self, other): return OPERATORS["div"](other, self)
    def __matmul__(self, other): return OPERATORS["matmul"](self, other)
    def __rmatmul__(self, other): return OPERATORS["matmul"](other, self)
    def __pow__(self, other): return OPERATORS["pow"](self, other)
    def __rpow__(self, other): return OPERATORS["pow"](other, self)
    def __floordiv__(self, other): return OPERATORS["floor_divide"](self, other)
    def __rfloordiv__(self, other): return OPERATORS["floor_divide"](other, self)
    def __mod__(self, other): return OPERATORS["mod"](self, other)
    def __rmod__(self, other): return OPERATORS["mod"](other, self)
    def __neg__(self): return OPERATORS["neg"](self)
    def __lt__(self, other): return OPERATORS["less"](self, other)
    def __le__(self, other): return OPERATORS["less_equal"](self, other)
    def __gt__(self, other): return OPERATORS["greater"](self, other)
    def __ge__(self, other): return OPERATORS["greater_equal"](self, other)
    __hash__ = object.__hash__

    def __getitem__(self, key):
        """``x[1:, ::2, None, i]``: ints, slices (steps too), None, ``...`` and int64 0-d Vars."""
        return OPERATORS["getitem"](self, key)

    def __iter__(self):
        # Without this, __getitem__ would make a Var iterable (x[0], x[1], ... until IndexError),
        # and a dimension known only at run time would never end it.
        raise ProgramError(f"Var '{self.name}' cannot be iterated while the program is being built; "
                           "index it (x[i]) or split it (rg.split)")

    @property
    def T(self) -> "Var":
        """The axes reversed (``x.T`` of a matrix is its transpose)."""
        return OPERATORS["transpose"](self)


class Op:
    """One operator: ``outputs = type(inputs; attrs)``; names refer to Vars.

    ``location`` is where user code built it (``"train.py:42"``, or None when
    unknown); by default it is recorded from the call stack at construction.
    """

    def __init__(self, type: str, inputs, outputs, attrs: dict[str, Any] | None = None,
                 location: Any = _RECORD):
        self.type = type
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self.block: Block | None = None
        self.location: str | None = here() if location is _RECORD else location

    def sub_blocks(self) -> list["Block"]:
        """The sub-blocks this op's attributes reference, in attribute order."""
        found = []
        for value in self.attrs.values():
            if isinstance(value, Block):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(v for v in value if isinstance(v, Block))
        return found

    def index(self) -> int:
        """Position of this op in its block (-1 if not yet placed)."""
        if self.block is None:
            return -1
        for i, op in enumerate(self.block.ops):
            if op is self:
                return i
        return -1

    def where(self) -> str:
        """'train.py:42: op #3 MatMul in block 0' — used by every error message about this op.

        The user's line comes first, as in a compiler's message, when it is known.
        """
        block = "?" if self.block is None else self.block.idx
        place = f"{self.location}: " if self.location else ""
        return f"{place}op #{self.index()} {self.type} in block {block}"

    def __repr__(self) -> str:
        return f"Op({self.type}: {self.inputs} -> {self.outputs})"


class Block:
    """An ordered list of ops over the variables it declares (and its ancestors')."""

    def __init__(self, program: "Program", idx: int, parent_idx: int = -1):
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars: dict[str, Var] = {}
        self.ops: list[Op] = []

    @property
    def parent(self) -> "Block | None":
        return None if self.parent_idx < 0 else self.program.blocks[self.parent_idx]

    def ancestors(self) -> Iterator["Block"]:
        """This block, then its parent, up to the global block."""
        block: Block | None = self
        while block is not None:
            yield block
            block = block.parent

    def depth(self) -> int:
        """How many blocks enclose this one: 0 for the global block."""
        return sum(1 for _ in self.ancestors()) - 1

    def find_var(self, name: str) -> Var | None:
        """The variable ``name`` as seen from this block (lexical lookup), or None."""
        var = self.vars.get(name)
        if var is not None:
            return var
        for block in self.ancestors():
            var = block.vars.get(name)
            if var is not None:
                return var
        return None

    def var(self, name: str) -> Var:
        """The variable ``name`` as seen from this block; ProgramError if there is none."""
        var = self.find_var(name)
        if var is None:
            raise ProgramError(f"block {self.idx} has no variable '{name}' (nor do its ancestors)")
        return var

    def sees(self, var: Var) -> bool:
        """True when ``var`` is declared in this block or one of its ancestors."""
        return any(block is var.block for block in self.ancestors())

    def home_of(self, var: Var) -> str:
        """Where ``var`` lives, for errors about a Var this block cannot see: 'block 2', or
        'block 0 of another program' (Vars of two programs mixed in one op)."""
        other = "" if var.block.program is self.program else " of another program"
        return f"block {var.block.idx}{other}"

    def create_var(self, name: str, shape, dtype="float32", **flags) -> Var:
        if name in self.vars:
            raise ProgramError(f"block {self.idx} already has a variable named '{name}'")
        var = Var(self, name, shape, dtype, **flags)
        self.vars[name] = var
        self.program.bump()
        return var

    def append_op(self, op: Op) -> Op:
        op.block = self
        self.ops.append(op)
        self.program.bump()
        return op

    def insert_op(self, index: int, op: Op) -> Op:
        op.block = self
        self.ops.insert(index, op)
        self.program.bump()
        return op

    def remove_op(self, index: int) -> Op:
        op = self.ops.pop(index)
        self.program.bump()
        return op

    def __repr__(self) -> str:
        return f"Block({self.idx}, parent={self.parent_idx}, {len(self.ops)} ops)"


class Program:
    """A whole program: ``blocks[0]`` is the global block.

    Example::

        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 4])
            y = rg.layers.fc(x, 2, name="fc")
        print(main)
    """

    def __init__(self, random_seed: int = 0):
        self.random_seed = int(random_seed)
        self.blocks: list[Block] = [Block(self, 0)]
        self.version = 0
        self.serial = next(_program_serials)
        # serials of the programs this one was cloned from (``clone``): their Vars are its Vars too
        self.lineage: frozenset[int] = frozenset()
        self._name_counts: dict[str, int] = {}
        self._seed_counter = 0

    def bump(self) -> None:
        """Mark the program changed, so executors recompile their cached plans."""
        self.version += 1

    def global_block(self) -> Block:
        return self.blocks[0]

    def block(self, idx: int) -> Block:
        if not 0 <= idx < len(self.blocks):
            raise ProgramError(f"program has no block {idx} (it has {len(self.blocks)})")
        return self.blocks[idx]

    def create_block(self, parent: Block | None = None) -> Block:
        """A new sub-block; ``parent`` defaults to the block being built (else the global block).

        Example: ``cell = main.create_block()`` (a cell block for ``rg.recurrent_net``).
        """
        if parent is None:
            from .builder import current_block   # builder imports this module
            parent = current_block()
            if parent.program is not self:
                parent = self.global_block()
        block = Block(self, len(self.blocks), parent.idx)
        self.blocks.append(block)
        self.bump()
        return block

    def has_name(self, name: str) -> bool:
        return any(name in block.vars for block in self.blocks)

    def unique_name(self, prefix: str) -> str:
        """A variable name not used anywhere in the program: ``prefix_N``."""
        while True:
            count = self._name_counts.get(prefix, 0)
            self._name_counts[prefix] = count + 1
            name = f"{prefix}_{count}"
            if not self.has_name(name):
                return name

    def next_seed(self) -> int:
        """A reproducible seed for the next random op (depends on build order only)."""
        self._seed_counter += 1
        return (self.random_seed * 1_000_003 + self._seed_counter) % (2**31 - 1)

    def list_vars(self) -> list[Var]:
        return [var for block in self.blocks for var in block.vars.values()]

    def all_parameters(self) -> list[Var]:
        return [var for var in self.global_block().vars.values() if var.is_parameter]

    def __str__(self) -> str:
        from .printer import format_program
        return format_program(self)

    def to_string(self, locations: bool = False) -> str:
        """The program as text (``str(program)``); ``locations=True`` ends each op's line
        with ``# file:line`` where user code built it.

        Example::

            print(main.to_string(locations=True))
        """
        from .printer import format_program
        return format_program(self, locations=locations)

    def to_json(self) -> str:
        """The program as JSON text; ``Program.from_json`` restores it exactly."""
        from .serialize import program_to_json
        return program_to_json(self)

    @staticmethod
    def from_json(text: str) -> "Program":
        """Load a program saved by ``to_json`` (never executes code); it is verified."""
        from .serialize import program_from_json
        return program_from_json(text)

    def clone(self, for_test: bool = False) -> "Program":
        """A deep copy (through the JSON form, so nothing is shared).

        The copy remembers where it came from, so the original's Vars can be
        fetched from it and fed to it: ``exe.run(main.clone(), fetch_list=[loss])``.

        With ``for_test=True`` the copy is the program's evaluation form: forward
        only (no gradient ops, optimizer updates, AllReduce, nor the ops that only
        feed those); dropout is the identity and batch_norm uses its running
        statistics without writing them (ops registered ``test_mode=True`` get
        ``attrs["is_test"] = True``).

        Example::

            test_program = main.clone(for_test=True)
            acc_v, = exe.run(test_program, feed={"x": xb, "y": yb}, fetch_list=[acc])
        """
        copy = Program.from_json(self.to_json())
        copy.lineage = self.lineage | {self.serial}
        if for_test:
            if "pass" not in _FOR_TEST_PASS:
                raise ProgramError("clone(for_test=True) needs the op registry; import retrograd")
            _FOR_TEST_PASS["pass"](copy)
        return copy

    def owns(self, var: Var) -> bool:
        """Whether ``var`` is a Var of this program or of one related to it by ``clone``
        (its source, a clone of it, a clone of the same source). Executors and the ONNX
        exporter check fetches and feed keys with it: a Var of an unrelated program would
        bind by name to a different variable."""
        other = var.block.program
        if other is self:
            return True
        return bool((self.lineage | {self.serial}) & (other.lineage | {other.serial}))
