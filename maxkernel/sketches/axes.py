"""Parallel axes of a traced computation, found by data flow.

Every dimension of every value gets an iteration axis; a primitive ties the axes that it maps one to one
(an elementwise op ties each operand dimension to the output's, a matmul its batch and free dimensions,
a reduction the dimensions it keeps) and marks **whole** the ones it mixes (a reduced or contracted
dimension, a concatenated or sliced one, a position an ``iota`` counts, everything around a gather, a
loop or an unknown primitive). An axis that reaches every output once and is never mixed is parallel: a
kernel may split it over a grid and run the same computation on each block, the blocks of the inputs that
carry it and every other input whole. Nothing here reads argument names, order or dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from maxkernel.analysis.program import Const, Node, Program, Var

ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "pow", "max", "min", "neg", "exp", "exp2", "log", "log1p", "expm1",
    "tanh", "logistic", "sin", "cos", "tan", "sqrt", "rsqrt", "cbrt", "abs", "sign", "floor", "ceil", "round",
    "is_finite", "erf", "erfc", "erf_inv", "select_n", "convert_element_type", "integer_pow", "and", "or", "not",
    "xor", "eq", "ne", "lt", "le", "gt", "ge", "nextafter", "atan2", "clamp", "square", "reduce_precision", "copy",
    "copy_p", "shift_left", "shift_right_logical", "shift_right_arithmetic", "atan", "asin", "acos", "sinh",
    "cosh", "asinh", "acosh", "atanh", "reciprocal", "stop_gradient", "lt_to", "le_to",
})
REDUCING = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                      "argmax", "argmin"})
ALONG_ONE_AXIS = {"cumsum": "axis", "cumprod": "axis", "cummax": "axis", "cummin": "axis",
                  "cumlogsumexp": "axis", "sort": "dimension"}

Slot = tuple[int, int]  # (id of a Var, axis)


@dataclass
class Axes:
    """The union of dimensions one primitive chain maps one to one, per value, with what mixes them."""

    parent: dict[Slot, Slot] = field(default_factory=dict)
    whole: set[Slot] = field(default_factory=set)
    sizes: dict[Slot, int] = field(default_factory=dict)
    reasons: dict[Slot, str] = field(default_factory=dict)

    def add(self, var: Var) -> None:
        for axis, size in enumerate(var.shape):
            slot = (id(var), axis)
            if slot not in self.parent:
                self.parent[slot] = slot
                self.sizes[slot] = int(size)

    def find(self, slot: Slot) -> Slot:
        root = slot
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[slot] != root:
            self.parent[slot], slot = root, self.parent[slot]
        return root

    def tie(self, a: Slot, b: Slot) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.sizes[ra] != self.sizes[rb]:  # a size-1 broadcast or a reshape that is not one to one
            self.mark(a, "a dimension meets one of another size")
            self.mark(b, "a dimension meets one of another size")
            return
        self.parent[rb] = ra
        if rb in self.whole:
            self.whole.add(ra)
            self.reasons.setdefault(ra, self.reasons.get(rb, ""))

    def mark(self, slot: Slot, why: str) -> None:
        root = self.find(slot)
        self.whole.add(root)
        self.reasons.setdefault(root, why)

    def label(self, var: Var, axis: int) -> Slot:
        return self.find((id(var), axis))

    def is_whole(self, var: Var, axis: int) -> bool:
        return self.label(var, axis) in self.whole


def _vars(ops: list) -> list[Var]:
    return [op for op in ops if isinstance(op, Var)]


def _tie_same(axes: Axes, a: Var, b: Var) -> None:
    if len(a.shape) != len(b.shape):
        return
    for axis in range(len(a.shape)):
        axes.tie((id(a), axis), (id(b), axis))


def _mark_all(axes: Axes, node: Node, why: str) -> None:
    for v in _vars(node.ins) + list(node.outs):
        for axis in range(len(v.shape)):
            axes.mark((id(v), axis), why)


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Runs of source and destination axes whose sizes multiply to the same extent, in order."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        a = b = 1
        while True:
            if a <= b and i < len(src):
                gi.append(i)
                a *= src[i]
                i += 1
            elif j < len(dst):
                gj.append(j)
                b *= dst[j]
                j += 1
            else:
                break
            if a == b and gi and gj:
                break
        groups.append((gi, gj))
    return groups


def _visit(axes: Axes, node: Node, split: Node | None = None) -> None:
    prim, outs, params = node.prim, node.outs, node.params
    ins = _vars(node.ins)
    if prim in ELEMENTWISE and len(outs) == 1:
        out = outs[0]
        for v in ins:  # broadcasting as numpy does: aligned from the right, a size-1 axis repeats
            if len(v.shape) > len(out.shape):
                _mark_all(axes, node, f"{prim} of operands of higher rank than its result")
                continue
            shift = len(out.shape) - len(v.shape)
            for axis, size in enumerate(v.shape):
                if size == out.shape[axis + shift]:
                    axes.tie((id(v), axis), (id(out), axis + shift))
                elif size != 1:
                    axes.mark((id(v), axis), f"{prim} of operands of different shapes")
        return
    if prim == "broadcast_in_dim":
        src, out = node.ins[0], outs[0]
        if isinstance(src, Var):
            for axis, target in enumerate(params["broadcast_dimensions"]):
                if src.shape[axis] == out.shape[target]:
                    axes.tie((id(src), axis), (id(out), int(target)))
        return
    if prim in ("reshape", "squeeze", "expand_dims"):
        src, out = node.ins[0], outs[0]
        if not isinstance(src, Var):
            return
        for gi, gj in reshape_groups(tuple(src.shape), tuple(out.shape)):
            real_i = [i for i in gi if src.shape[i] != 1]
            real_j = [j for j in gj if out.shape[j] != 1]
            if len(real_i) == 1 and len(real_j) == 1:
                axes.tie((id(src), real_i[0]), (id(out), real_j[0]))
            else:
                for i in real_i:
                    axes.mark((id(src), i), "a reshape merges or splits it")
                for j in real_j:
                    axes.mark((id(out), j), "a reshape merges or splits it")
        return
    if prim == "transpose":
        src, out = node.ins[0], outs[0]
        if isinstance(src, Var):
            for axis, source_axis in enumerate(params["permutation"]):
                axes.tie((id(src), int(source_axis)), (id(out), axis))
        return
    if prim in REDUCING:
        src, out = node.ins[0], outs[0]
        if not isinstance(src, Var):
            return
        reduced = {int(a) for a in params["axes"]}
        kept = [a for a in range(len(src.shape)) if a not in reduced]
        for a in reduced:
            axes.mark((id(src), a), f"{prim} reduces it")
        for out_axis, a in enumerate(kept):
            axes.tie((id(src), a), (id(out), out_axis))
        return
    if prim == "dot_general" and len(ins) == 2 and all(isinstance(op, Var) for op in node.ins):
        lhs, rhs = node.ins
        out = outs[0]
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        for a, b in zip(lc, rc):
            axes.tie((id(lhs), int(a)), (id(rhs), int(b)))
            if node is not split:
                axes.mark((id(lhs), int(a)), "a matmul contracts it")
        for k, (a, b) in enumerate(zip(lb, rb)):
            axes.tie((id(lhs), int(a)), (id(out), k))
            axes.tie((id(rhs), int(b)), (id(out), k))
        lfree = [a for a in range(len(lhs.shape)) if a not in lc and a not in lb]
        rfree = [a for a in range(len(rhs.shape)) if a not in rc and a not in rb]
        for k, a in enumerate(lfree):
            axes.tie((id(lhs), a), (id(out), len(lb) + k))
        for k, a in enumerate(rfree):
            axes.tie((id(rhs), a), (id(out), len(lb) + len(lfree) + k))
        return
    if prim in ALONG_ONE_AXIS and len(ins) == len(node.ins):
        along = int(params[ALONG_ONE_AXIS[prim]])
        for v in ins:
            for o in outs:
                _tie_same(axes, v, o)
            axes.mark((id(v), along), f"{prim} runs along it")
        return
    if prim == "concatenate":
        along = int(params["dimension"])
        out = outs[0]
        for v in ins:
            _tie_same(axes, v, out)
        axes.mark((id(out), along), "a concatenation joins along it")
        for v in ins:
            axes.mark((id(v), along), "a concatenation joins along it")
        return
    if prim == "stack":  # a new axis at ``axis``, each operand's axes after it shifted by one
        along = int(params["axis"])
        out = outs[0]
        for v in ins:
            for a in range(len(v.shape)):
                axes.tie((id(v), a), (id(out), a if a < along else a + 1))
        axes.mark((id(out), along), "a stack joins along it")
        return
    if prim == "split":
        along = int(params["axis"])
        src = node.ins[0]
        if isinstance(src, Var):
            for out in outs:
                _tie_same(axes, src, out)
                axes.mark((id(out), along), "a split cuts it")
            axes.mark((id(src), along), "a split cuts it")
        return
    if prim == "slice":
        src, out = node.ins[0], outs[0]
        if not isinstance(src, Var):
            return
        strides = params.get("strides") or (1,) * len(src.shape)
        for a, (start, limit, stride) in enumerate(zip(params["start_indices"], params["limit_indices"], strides)):
            if int(start) == 0 and int(limit) == src.shape[a] and int(stride or 1) == 1:
                axes.tie((id(src), a), (id(out), a))
            else:
                axes.mark((id(src), a), "a slice takes part of it")
                axes.mark((id(out), a), "a slice takes part of it")
        return
    if prim == "pad":
        src, out = node.ins[0], outs[0]
        if not isinstance(src, Var):
            return
        for a, (lo, hi, interior) in enumerate(params["padding_config"]):
            if (int(lo), int(hi), int(interior)) == (0, 0, 0):
                axes.tie((id(src), a), (id(out), a))
            else:
                axes.mark((id(src), a), "padding extends it")
                axes.mark((id(out), a), "padding extends it")
        return
    if prim == "iota":
        axes.mark((id(outs[0]), int(params["dimension"])), "an iota counts positions along it")
        return
    _mark_all(axes, node, f"{prim} (not split by the general rules)")


def analyse_axes(program: Program, split: Node | None = None) -> Axes:
    """The parallel-axis structure of ``program`` (``split``: the matmul whose contracted axis is left
    free, for a kernel that accumulates it over the grid)."""
    axes = Axes()
    for v in program.inputs:
        axes.add(v)
    for node in program.nodes:
        for v in _vars(node.ins) + list(node.outs):
            axes.add(v)
    for node in program.nodes:
        _visit(axes, node, split)
    for v in program.inputs:
        for axis in range(len(v.shape)):
            if v.shape[axis] == 1:
                axes.mark((id(v), axis), "size one")
    return axes


def parallel_labels(program: Program, axes: Axes) -> list[Slot]:
    """Labels every output carries exactly once and nothing mixes, in the first output's axis order."""
    outputs = [o for o in program.outputs if isinstance(o, Var)]
    if not outputs or len(outputs) != len(program.outputs):
        return []
    found: list[Slot] = []
    first = outputs[0]
    for axis in range(len(first.shape)):
        label = axes.label(first, axis)
        if label in axes.whole or axes.sizes[label] < 2 or label in found:
            continue
        ok = True
        for out in outputs:
            carried = [a for a in range(len(out.shape)) if axes.label(out, a) == label]
            if len(carried) != 1:
                ok = False
        for v in program.inputs:
            if sum(axes.label(v, a) == label for a in range(len(v.shape))) > 1:
                ok = False
        if ok:
            found.append(label)
    return found


def axis_of(axes: Axes, var: Var | Const, label: Slot) -> int | None:
    """Which axis of ``var`` carries ``label`` (None: the value is read whole along it)."""
    if not isinstance(var, Var):
        return None
    for axis in range(len(var.shape)):
        if axes.label(var, axis) == label:
            return axis
    return None
