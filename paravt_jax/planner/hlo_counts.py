"""The HBM bytes of a compiled program, instruction by instruction, from its optimised HLO text.

XLA's `cost_analysis()` gives one number per program, and the TPU compiler's is its own model,
not XLA's generic count: it charges a gather a whole (8, 128) tile per gathered element (the
decode's top-p/top-k `take_along_axis` over the vocabulary: 45.5 GB for 64 x 151,936 float32
elements, 0.8 GB by XLA's generic analysis of the same module) and both branches of a
conditional. To see what a program's number is made of and to count what it must move, this
module reads the optimised module (`compiled.as_text()`) and counts each scheduled instruction
(the entry computation's, its loops' bodies and conditions, its conditionals' branches and
called computations; a fusion is one instruction, its fused computations are read only to see
how it touches its operands) two ways:

  counted   every operand read whole and the output written whole (a dynamic-slice reads and
            writes its slice, a dynamic-update-slice its update): the naive count;
  physical  what the instruction must move at least (`instruction_bytes`): an operand read once
            however often it is passed; an operand read only through slices (slice,
            dynamic-slice, gather, also inside a nested fusion) counted at the slices' sizes; an
            in-place update (a dynamic-update-slice or scatter, alone or as a fusion's output,
            writing into the updated operand's buffer) at the update, not the buffer; arrays in
            a memory space other than 0 (a TPU's on-chip VMEM / SMEM: `S(n)` in the layout)
            not at all; an asynchronous start whose output tuple holds its operands aliased
            (`ASYNC_OUTPUT`: a copy-start's destination, source and context) writes only what
            it writes, so a prefetch of weights into on-chip memory reads them once and writes
            nothing to HBM;
            no bytes for what moves nothing (parameters, tuples, bitcasts,
            optimisation barriers, the done half of async pairs, loops and conditionals
            themselves).

Each instruction also gets its runs per program call (`breakdown`): the product of the known
trip counts of the loops around it (`trip_count`: backend_config known_trip_count, or a
`counter < constant` condition; 1 where the trip count is data-dependent, as a cost analysis
counts such a loop), and only the costliest branch of a
conditional counts (one branch runs; the others get runs 0). The blockwise attention's loops
(traced under `ATTENTION_SCOPES`, found by their instructions' op_name) get runs 0 in
`physical_bytes`: the time plan adds every attention call's cost analytically (its keys and
values read at the mean fill), and one counted run of the loop would add one key block of each
call again. Sizes are the logical shapes'
(elements x item size, no tile padding). The physical count is a rule applied to the HLO, not a
measurement: what the compiled data flow needs to touch, each byte once per use.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re

from paravt_jax.models.qwen3_vl.blockwise import LOOP_SCOPE

ITEMSIZE = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
            "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1,
            "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# instructions that move no bytes of their own (their operands stay where they are)
FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "add-dependency",
        "partition-id", "replica-id", "opt-barrier", "optimization-barrier", "while", "conditional", "call",
        "domain", "get-dimension-size", "iota", "async-update"}
SLICING = {"slice", "dynamic-slice", "gather"}
IN_PLACE = {"dynamic-update-slice", "scatter"}
# asynchronous starts whose output tuple holds their operands aliased beside what they write: the
# index of the element written (copy-start: destination, source, context; all-gather-start:
# operand, output; collective-permute-start: operand, output, contexts; async-start: operands,
# output, context)
ASYNC_OUTPUT = {"copy-start": 0, "all-gather-start": 1, "collective-permute-start": 1, "async-start": 1}
# the attributes naming computations that run as scheduled code (counted once each)
_CALLED = re.compile(r"\b(?:body|condition|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}|(?:true|false)_computation=%?([\w.\-]+)")
_FUSED = re.compile(r"\bcalls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMMENT = re.compile(r"/\*.*?\*/")
_SOURCE = re.compile(r'source_file="([^"]*)"')
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def shape_bytes(text: str, hbm_only: bool = False) -> int:
    """Bytes of an HLO shape (an array or a tuple of them), logical sizes; hbm_only: leaving out
    arrays laid out in a memory space other than 0 (`S(1)`: a TPU's VMEM)."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(text):
        space = _MEMORY_SPACE.search(layout) if hbm_only and layout else None
        if dtype in ITEMSIZE and not (space and space.group(1) != "0"):
            total += math.prod(int(d) for d in dims.split(",") if d) * ITEMSIZE[dtype]
    return total


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    shape: str
    operands: tuple[tuple[str, str], ...]  # (shape text, name) of each operand; shape "" when not printed
    attributes: str
    root: bool = False

    @property
    def op_name(self) -> str:
        found = _OP_NAME.search(self.attributes)
        return found.group(1) if found else ""

    @property
    def source(self) -> str:
        found = _SOURCE.search(self.attributes)
        return found.group(1) if found else ""

    @property
    def fused(self) -> str:
        found = _FUSED.search(self.attributes)
        return found.group(1) if found and self.opcode == "fusion" else ""

    def branches(self) -> list[str]:
        """A conditional's branch computations."""
        if self.opcode != "conditional":
            return []
        names = []
        for listed, single in _BRANCHES.findall(self.attributes):
            names += [b.strip().lstrip("%") for b in listed.split(",") if b.strip()] if listed else [single]
        return names

    def loops(self) -> list[str]:
        """The computations a while loop or a call runs as scheduled code (body and condition)."""
        if self.opcode in ("while", "call"):
            return _CALLED.findall(self.attributes)
        if self.opcode == "async-start":
            return _FUSED.findall(self.attributes)
        return []


def _matching(text: str, start: int) -> int:
    """The index of the bracket closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced HLO text: {text[start:start + 80]!r}")


def _split_top(text: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    parts.append(text[last:])
    return [p.strip() for p in parts if p.strip()]


def parse_instruction(line: str) -> Instruction | None:
    """One instruction line of HLO text, or None for anything else."""
    text = _COMMENT.sub("", line).strip()
    root = text.startswith("ROOT ")
    text = text.removeprefix("ROOT ")
    if " = " not in text:
        return None
    name, rest = text.split(" = ", 1)
    rest = rest.lstrip()
    if rest.startswith("("):
        end = _matching(rest, 0)
        shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    found = re.match(r"([a-z][\w\-]*)\(", rest)
    if not found:
        return None
    close = _matching(rest, found.end() - 1)
    operands = []
    for part in _split_top(rest[found.end():close]):
        tokens = part.rsplit(" ", 1)
        operands.append((tokens[0], tokens[1].lstrip("%")) if len(tokens) == 2 else ("", tokens[0].lstrip("%")))
    return Instruction(name.strip().lstrip("%"), found.group(1), shape, tuple(operands), rest[close + 1:], root)


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """(computation name -> its instructions, the entry computation's name) of HLO text."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            head = line.split()
            is_entry = head[0] == "ENTRY"
            current = (head[1] if is_entry else head[0]).lstrip("%")
            computations[current] = []
            entry = current if is_entry else entry
        elif line.startswith("}"):
            current = None
        elif current is not None:
            ins = parse_instruction(line)
            if ins is not None:
                computations[current].append(ins)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


# ----------------------------------------------------------------------------- one instruction
def _fused_root(fused: list[Instruction]) -> Instruction | None:
    return next((i for i in fused if i.root), fused[-1] if fused else None)


def _output_names(fused: list[Instruction]) -> set[str]:
    """The instructions whose results are a fusion's outputs (its root, or a root tuple's elements)."""
    root = _fused_root(fused)
    if root is None:
        return set()
    return {name for _, name in root.operands} if root.opcode == "tuple" else {root.name}


def _parameter_number(ins: Instruction) -> int | None:
    found = re.match(r"(\d+)$", ins.operands[0][1]) if ins.opcode == "parameter" and ins.operands else None
    return int(found.group(1)) if found else None


def _parameter_reads(fused: list[Instruction], computations: dict[str, list[Instruction]]) -> dict[int, float]:
    """Fusion parameter number -> HBM bytes read where every use of it reads it in part: a
    slicing op (its slice), a nested fusion reading its parameter in part (what that one
    reads), or the buffer of an in-place update that is an output (0: only the update moves).
    Parameters read whole are absent."""
    params = {i.name: n for i in fused if (n := _parameter_number(i)) is not None}
    users = collections.defaultdict(list)
    for i in fused:
        for position, (_, name) in enumerate(i.operands):
            if name in params:
                users[name].append((i, position))
    outputs = _output_names(fused)
    nested: dict[str, dict[int, float]] = {}
    out = {}
    for name, number in params.items():
        read = 0.0
        for user, position in users.get(name, []):
            if user.opcode in SLICING and position == 0:
                read += shape_bytes(user.shape, hbm_only=True)
            elif user.opcode in IN_PLACE and position == 0 and user.name in outputs:
                pass
            elif user.opcode == "fusion" and position in nested.setdefault(
                    user.name, _parameter_reads(computations.get(user.fused, []), computations)):
                read += nested[user.name][position]
            else:
                break
        else:
            if users.get(name):
                out[number] = read
    return out


def _update_bytes(update: Instruction, inner: dict[str, Instruction]) -> float:
    index = 2 if update.opcode == "scatter" else 1  # scatter(buffer, indices, updates); dus(buffer, update, ...)
    if len(update.operands) <= index:
        return float(shape_bytes(update.shape, hbm_only=True))
    shape, name = update.operands[index]
    return float(shape_bytes(shape or (inner[name].shape if name in inner else ""), hbm_only=True))


def _written(ins: Instruction, fused: list[Instruction]) -> float:
    """HBM bytes an instruction writes: its output, where an output is an in-place update (a
    dynamic-update-slice or scatter: the instruction itself, or a fusion's root or a root
    tuple's element) the update's size instead."""
    if not fused:
        return _update_bytes(ins, {}) if ins.opcode in IN_PLACE else float(shape_bytes(ins.shape, hbm_only=True))
    inner = {i.name: i for i in fused}
    total = 0.0
    for name in _output_names(fused):
        element = inner.get(name)
        if element is not None:
            total += (_update_bytes(element, inner) if element.opcode in IN_PLACE
                      else float(shape_bytes(element.shape, hbm_only=True)))
    return total


def instruction_bytes(ins: Instruction, computations: dict[str, list[Instruction]],
                      shapes: dict[str, str]) -> tuple[float, float]:
    """(counted, physical) bytes of one scheduled instruction (see the module docstring);
    shapes: the shapes of the instructions of its computation (operands printed without one)."""
    if ins.opcode in FREE or ins.opcode.endswith("-done"):
        return 0.0, 0.0
    operand_shapes = [s or shapes.get(name, "") for s, name in ins.operands]
    output = float(shape_bytes(ins.shape))
    if ins.opcode == "dynamic-slice":
        return 2 * output, 2.0 * shape_bytes(ins.shape, hbm_only=True)
    if ins.opcode == "dynamic-update-slice":
        update = operand_shapes[1] if len(operand_shapes) > 1 else ins.shape
        return 2.0 * shape_bytes(update), 2.0 * shape_bytes(update, hbm_only=True)
    counted = sum(shape_bytes(s) for s in operand_shapes) + output
    fused = computations.get(ins.fused, [])
    reads = _parameter_reads(fused, computations) if fused else ({0: 0.0} if ins.opcode in IN_PLACE else {})
    physical, seen = 0.0, set()
    for number, ((_, name), shape) in enumerate(zip(ins.operands, operand_shapes)):
        if name not in seen:  # an operand read in part reads at most all of it (a gather may repeat rows)
            seen.add(name)
            whole = shape_bytes(shape, hbm_only=True)
            physical += min(reads.get(number, whole), whole)
    if ins.opcode in ASYNC_OUTPUT and ins.shape.strip().startswith("("):  # the output tuple aliases the operands
        elements = _split_top(ins.shape.strip()[1:-1])
        return counted, physical + float(shape_bytes(elements[ASYNC_OUTPUT[ins.opcode]], hbm_only=True))
    return counted, physical + _written(ins, fused)


# ----------------------------------------------------------------------------- a program
@dataclasses.dataclass(frozen=True)
class Row:
    """One scheduled instruction's bytes, counted once (as a cost analysis counts a loop body)."""
    computation: str
    name: str
    opcode: str
    kind: str  # the opcode, or for a fusion "fusion:<its root's opcode>"
    op_name: str
    counted: float
    physical: float
    # runs per program call: known trip counts of the loops around it; 0: a branch not taken or an
    # analytic loop's body
    runs: int = 1
    source: str = ""  # the Python file the instruction was traced from (its metadata's source_file)


def trip_count(ins: Instruction, computations: dict[str, list[Instruction]] | None = None) -> int:
    """A while loop's trip count where it is known: its backend_config's known_trip_count, or a
    condition that compares a loop counter with a constant (`counter < N`, the form of a
    counted loop: jax's fori_loop and scan, XLA's windowed einsums; the counter taken to start
    at 0 and step by 1); else 1 (data-dependent)."""
    if ins.opcode != "while":
        return 1
    found = _TRIPS.search(ins.attributes)
    if found:
        return int(found.group(1))
    condition = re.search(r"\bcondition=%?([\w.\-]+)", ins.attributes)
    body = (computations or {}).get(condition.group(1), []) if condition else []
    root = _fused_root(body)
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attributes or len(root.operands) != 2:
        return 1
    inner = {i.name: i for i in body}
    counter, limit = (inner.get(name) for _, name in root.operands)
    if counter is None or limit is None or counter.opcode != "get-tuple-element" or limit.opcode != "constant":
        return 1
    value = re.fullmatch(r"\d+", limit.operands[0][1]) if limit.operands else None
    return int(value.group(0)) if value else 1


class _Walk:
    """breakdown's traversal: each scheduled computation once, with its runs."""

    def __init__(self, computations: dict[str, list[Instruction]], analytic_scopes: tuple[str, ...]):
        self.computations, self.analytic_scopes = computations, analytic_scopes
        self.seen: set[str] = set()

    def rows(self, name: str, runs: int) -> list[Row]:
        if name in self.seen or name not in self.computations:
            return []
        self.seen.add(name)
        body = self.computations[name]
        shapes = {i.name: i.shape for i in body}
        out = []
        for ins in body:
            counted, physical = instruction_bytes(ins, self.computations, shapes)
            if counted or physical:
                root = _fused_root(self.computations.get(ins.fused, []))
                kind = f"fusion:{root.opcode}" if ins.opcode == "fusion" and root else ins.opcode
                out.append(Row(name, ins.name, ins.opcode, kind, ins.op_name, counted, physical, runs, ins.source))
            analytic = any(scope in ins.op_name for scope in self.analytic_scopes)
            trips = 0 if analytic else trip_count(ins, self.computations)
            for called in ins.loops():
                out += self.rows(called, runs * trips)
            out += self.branches(ins.branches(), runs)
        return out

    def branches(self, names: list[str], runs: int) -> list[Row]:
        """The costliest branch at `runs`, the others at runs 0 (one branch runs)."""
        taken = [self.rows(b, runs) for b in names]
        if not taken:
            return []
        best = max(range(len(taken)), key=lambda k: sum(r.physical for r in taken[k]))
        return [r if k == best else dataclasses.replace(r, runs=0) for k, rows in enumerate(taken) for r in rows]


def breakdown(text: str, analytic_scopes: tuple[str, ...] = ()) -> list[Row]:
    """Every scheduled instruction of an optimised HLO module with its bytes and runs (module
    docstring); the body of a loop whose op_name holds one of the named scopes `analytic_scopes`
    gets runs 0 (its work is counted analytically, elsewhere: counting one of its runs here as
    well would count one key block of every blockwise attention call twice)."""
    computations, entry = parse_module(text)
    return _Walk(computations, analytic_scopes).rows(entry, 1)


def summarize(rows, key) -> list[tuple[str, int, float, float]]:
    """(group, instructions, counted, physical x runs) per key(row), largest physical first."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        g = groups.setdefault(key(row), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += row.counted
        g[2] += row.physical * row.runs
    return sorted(((k, int(n), c, p) for k, (n, c, p) in groups.items()), key=lambda x: -x[3])


# Loops whose work the time plan adds analytically (the blockwise attention's: attention.attention_cost)
ATTENTION_SCOPES = (LOOP_SCOPE,)


def physical_bytes(text: str) -> float:
    """A program's HBM bytes per call by the physical rule: every run of each instruction
    (loops at their known trip counts, the blockwise attention's loops not at all: the time plan
    adds the attention analytically; one branch of each conditional)."""
    return sum(r.physical * r.runs for r in breakdown(text, ATTENTION_SCOPES))
