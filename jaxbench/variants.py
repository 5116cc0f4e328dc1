"""Metamorphic variants of any task: the same computation written otherwise, or a changed one on purpose.

    python -m jaxbench.variants TASK [TASK ...] --out DIR [--kinds permute,transpose,...] [--seed S] [--check]

Kinds that keep the work (an optimizer should do exactly as well on them):
- ``permute``: the reference's arguments reordered and renamed;
- ``statics``: its keyword statics renamed, or folded into constants where they do not change with size;
- ``transpose``: a two-dimensional weight that feeds a matmul stored transposed;
- ``matmul_form``: ``@`` / ``jnp.dot`` / ``jnp.matmul`` / ``einsum`` rewritten into another of ``einsum``,
  ``lax.dot_general`` and ``@``;
- ``batch_added``: a leading axis of size one on every argument and output (``jax.vmap``);
- ``batch_removed``: the batch axis merged into the next one on every argument and output it leads.
Kinds that change the work (and get their tolerance measured again):
- ``dtype``: float32 arguments and outputs in bfloat16, or bfloat16 ones in float32;
- ``extra_op``: one more elementwise operation (SiLU) on the first floating output.

A variant is a task folder: the original source with its two functions renamed, and a new ``get_inputs``
and ``reference`` around them (or the reference itself rewritten, for renames and matmul forms).
"""

from __future__ import annotations

import argparse
import ast
import random
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from jaxbench.task import Task, TaskError, load_task

KEEP = ("permute", "statics", "transpose", "matmul_form", "batch_added", "batch_removed")
CHANGE = ("dtype", "extra_op")
KINDS = KEEP + CHANGE
NAME_POOL = ("lhs", "rhs", "operand", "tensor", "inp", "data", "arr", "buf", "val", "src", "feat", "mat")


class NotApplicable(Exception):
    """The kind does not apply to this task (no weight to transpose, no batch axis, ...)."""


# ---------------------------------------------------------------- source helpers

def _tree(task: Task) -> ast.Module:
    return ast.parse(task.reference_path.read_text())


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    raise NotApplicable(f"no top-level def {name}")


class _Rename(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.mapping:
            return ast.copy_location(ast.Name(self.mapping[node.id], node.ctx), node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        if node.arg in self.mapping:
            node.arg = self.mapping[node.arg]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name in self.mapping:
            node.name = self.mapping[node.name]
        self.generic_visit(node)
        return node


def _base_renamed(tree: ast.Module) -> ast.Module:
    """The module with ``get_inputs`` / ``reference`` renamed ``_base_get_inputs`` / ``_base_reference``."""
    return _Rename({"get_inputs": "_base_get_inputs", "reference": "_base_reference"}).visit(tree)


def _positional(fn: ast.FunctionDef) -> list[str]:
    if fn.args.vararg is not None:
        raise NotApplicable("the reference takes *args")
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _statics(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.kwonlyargs]


def _signature(positional: list[str], statics: list[str]) -> str:
    return ", ".join(positional) + ((", *, " + ", ".join(statics)) if statics else "")


def _static_values(task: Task) -> list[dict[str, Any]]:
    """The static values at every declared size (and a drawn unseen one): what folding must hold for."""
    from jaxbench.task_check import full_shapes

    values = []
    sizes = list(task.spec.sizes)
    if task.spec.free:  # the sizes the evaluator draws, as task_check draws them
        task = task.with_size("unseen", task.draw_unseen("cpu", random.Random(task.id)))
        sizes.append("unseen")
    for size in sizes:
        values.append(full_shapes(task, size)[1])
    return values


def _shapes(task: Task, size: str = "cpu") -> tuple[Any, Any]:
    from jaxbench.task_check import full_shapes

    args, _, outs = full_shapes(task, size)
    return args, outs


# ---------------------------------------------------------------- the kinds

def permute(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    tree = _tree(task)
    fn = _function(tree, "reference")
    names, statics = _positional(fn), _statics(fn)
    if len(names) < 1:
        raise NotApplicable("no positional arguments")
    order = list(range(len(names)))
    while len(order) > 1 and order == sorted(order):
        rng.shuffle(order)
    pool = [p for p in NAME_POOL if p not in names]
    rng.shuffle(pool)
    new = {old: f"{pool[i % len(pool)]}{i}" for i, old in enumerate(names)}
    _Rename(new).visit(fn)
    fn.args.posonlyargs = []
    fn.args.args = [ast.arg(new[names[i]]) for i in order]
    tree = _Rename({"get_inputs": "_base_get_inputs"}).visit(tree)
    ast.fix_missing_locations(tree)
    wrapper = f'''

def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    return tuple(args[i] for i in {tuple(order)!r}), static
'''
    del statics
    return ast.unparse(tree) + "\n" + wrapper, {"order": order, "names": [new[names[i]] for i in order]}


def statics(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    tree = _tree(task)
    fn = _function(tree, "reference")
    keys = _statics(fn)
    if not keys:
        raise NotApplicable("the reference has no keyword statics")
    seen = _static_values(task)
    foldable = [k for k in keys if all(k in v for v in seen) and all(v[k] == seen[0][k] for v in seen)
                and isinstance(seen[0][k], (int, float, bool, str, tuple))]
    fold = bool(foldable) and rng.random() < 0.5
    if fold:
        fn.args.kw_defaults = [d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if a.arg not in foldable]
        fn.args.kwonlyargs = [a for a in fn.args.kwonlyargs if a.arg not in foldable]
        consts = {k: f"{k.upper()}_CONST" for k in foldable}
        _Rename(consts).visit(fn)
        tree = _Rename({"get_inputs": "_base_get_inputs"}).visit(tree)
        header = "\n".join(f"{consts[k]} = {seen[0][k]!r}" for k in foldable)
        wrapper = f'''

def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    return args, {{k: v for k, v in static.items() if k not in {tuple(foldable)!r}}}
'''
        ast.fix_missing_locations(tree)
        return header + "\n\n" + ast.unparse(tree) + "\n" + wrapper, {"folded": foldable}
    new = {k: f"{k}_{rng.choice(['cfg', 'param', 'opt', 'value'])}" for k in keys}
    _Rename(new).visit(fn)
    tree = _Rename({"get_inputs": "_base_get_inputs"}).visit(tree)
    ast.fix_missing_locations(tree)
    wrapper = f'''

def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    names = {new!r}
    return args, {{names.get(k, k): v for k, v in static.items()}}
'''
    return ast.unparse(tree) + "\n" + wrapper, {"renamed": new}


def _matmul_operands(task: Task) -> list[int]:
    """Positional arguments that are two-dimensional and feed a matmul (directly, at any nesting)."""
    from functools import partial

    import jax
    from jax._src import core

    from jaxbench.task_check import full_shapes

    args, static, _ = full_shapes(task, "cpu")
    closed = jax.make_jaxpr(partial(task.reference, **static))(*args)
    used: set[int] = set()

    def walk(jaxpr: Any, alias: dict[Any, int]) -> None:
        for eqn in jaxpr.eqns:
            names = [v if isinstance(v, core.Var) else None for v in eqn.invars]  # literals are not arguments
            if eqn.primitive.name == "dot_general":
                for v in names[:2]:
                    if v is not None and v in alias:
                        used.add(alias[v])
            for param in eqn.params.values():
                sub = getattr(param, "jaxpr", param)
                if hasattr(sub, "eqns") and hasattr(sub, "invars") and len(sub.invars) == len(eqn.invars):
                    walk(sub, {iv: alias[ov] for iv, ov in zip(sub.invars, names) if ov is not None and ov in alias})

    walk(closed.jaxpr, {v: i for i, v in enumerate(closed.jaxpr.invars)})
    return sorted(i for i in used if len(args[i].shape) == 2)


def transpose(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    candidates = _matmul_operands(task)
    if not candidates:
        raise NotApplicable("no two-dimensional argument feeds a matmul")
    index = rng.choice(candidates)
    tree = _tree(task)
    fn = _function(tree, "reference")
    names = _positional(fn)
    old = names[index]
    stored = f"{old}_t"
    for a in fn.args.posonlyargs + fn.args.args:
        if a.arg == old:
            a.arg = stored
    fn.body.insert(0, ast.parse(f"{old} = {stored}.T").body[0])
    tree = _Rename({"get_inputs": "_base_get_inputs"}).visit(tree)
    ast.fix_missing_locations(tree)
    wrapper = f'''

def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    args = list(args)
    args[{index}] = jnp.asarray(args[{index}].T).copy()
    return tuple(args), static
'''
    return "import jax.numpy as jnp\n" + ast.unparse(tree) + "\n" + wrapper, {"argument": old}


MATMUL_HELPERS = '''

def _matmul_as_dot_general(a, b, precision=None, preferred_element_type=None):
    """a @ b written with lax.dot_general (b a matrix, or a stack matching a's leading axes)."""
    if b.ndim == 2:
        dims = (((a.ndim - 1,), (0,)), ((), ()))
    elif a.ndim == b.ndim:
        batch = tuple(range(a.ndim - 2))
        dims = (((a.ndim - 1,), (b.ndim - 2,)), (batch, batch))
    else:
        return jnp.matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=preferred_element_type)


def _einsum_as_dot_general(spec, a, b, precision=None, preferred_element_type=None):
    """A two-operand einsum written with lax.dot_general and a transpose."""
    ins, out = spec.replace(" ", "").split("->")
    sa, sb = ins.split(",")
    for s, x in ((sa, a), (sb, b)):
        if len(set(s)) != len(s) or "." in s:
            return jnp.einsum(spec, a, b, precision=precision, preferred_element_type=preferred_element_type)
    only_a = [c for c in sa if c not in sb and c not in out]
    only_b = [c for c in sb if c not in sa and c not in out]
    if only_a:
        a = a.sum(axis=tuple(sa.index(c) for c in only_a)); sa = "".join(c for c in sa if c not in only_a)
    if only_b:
        b = b.sum(axis=tuple(sb.index(c) for c in only_b)); sb = "".join(c for c in sb if c not in only_b)
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    dims = ((tuple(sa.index(c) for c in contract), tuple(sb.index(c) for c in contract)),
            (tuple(sa.index(c) for c in batch), tuple(sb.index(c) for c in batch)))
    y = jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=preferred_element_type)
    produced = batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
    return jnp.transpose(y, [produced.index(c) for c in out])
'''


class _MatmulForm(ast.NodeTransformer):
    """``@``, ``jnp.dot``, ``jnp.matmul`` and two-operand ``einsum`` calls, rewritten into another form."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.changed: list[str] = []

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.MatMult):
            return self._matmul(node, node.left, node.right, [])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = ast.unparse(node.func)
        if name in ("jnp.dot", "jnp.matmul", "jax.numpy.dot", "jax.numpy.matmul") and len(node.args) == 2:
            return self._matmul(node, node.args[0], node.args[1], node.keywords)
        if (name in ("jnp.einsum", "jax.numpy.einsum") and len(node.args) == 3
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            spec = node.args[0].value
            if "." not in spec and "->" in spec:
                self.changed.append(f"einsum {spec} -> dot_general")
                return ast.copy_location(ast.Call(ast.Name("_einsum_as_dot_general", ast.Load()), node.args,
                                                  node.keywords), node)
        return node

    def _matmul(self, node: ast.AST, a: ast.expr, b: ast.expr, keywords: list[ast.keyword]) -> ast.AST:
        if self.rng.random() < 0.5:
            self.changed.append("matmul -> einsum")
            call = ast.Call(ast.parse("jnp.einsum", mode="eval").body,
                            [ast.Constant("...ij,jk->...ik"), a, b], keywords)
            # the einsum form serves a matrix right operand; a stacked one keeps the dot_general form
            cond = ast.Compare(ast.Attribute(b, "ndim", ast.Load()), [ast.Eq()], [ast.Constant(2)])
            other = ast.Call(ast.Name("_matmul_as_dot_general", ast.Load()), [a, b], keywords)
            return ast.copy_location(ast.IfExp(cond, call, other), node)
        self.changed.append("matmul -> dot_general")
        return ast.copy_location(ast.Call(ast.Name("_matmul_as_dot_general", ast.Load()), [a, b], keywords), node)


def matmul_form(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    tree = _tree(task)
    form = _MatmulForm(rng)
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name != "get_inputs":
            form.visit(stmt)
    if not form.changed:
        raise NotApplicable("no matmul or two-operand einsum in the reference")
    ast.fix_missing_locations(tree)
    return "import jax\nimport jax.numpy as jnp\n" + ast.unparse(tree) + "\n" + MATMUL_HELPERS, {"changed": form.changed}


def _wrapped(task: Task, get_inputs: str, reference: str) -> str:
    tree = _base_renamed(_tree(task))
    ast.fix_missing_locations(tree)
    return "import functools\nimport jax\nimport jax.numpy as jnp\n" + ast.unparse(tree) + "\n\n" + get_inputs + "\n\n" + reference


def batch_added(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    del rng
    fn = _function(_tree(task), "reference")
    names, keys = _positional(fn), _statics(fn)
    gi = '''def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    return tuple(a[None] for a in args), static
'''
    ref = f'''def reference({_signature(names, keys)}):
    """The original computation under a leading axis of size one."""
    body = functools.partial(_base_reference{"".join(f", {k}={k}" for k in keys)})
    return jax.vmap(body)({", ".join(names)})
'''
    return _wrapped(task, gi, ref), {}


def batch_removed(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    del rng
    import jax

    size = task.size("cpu")
    batch = next((n for n in ("batch", "batch_size", "b", "n_batch") if n in size and isinstance(size[n], int)), None)
    if batch is None or size[batch] < 1:
        raise NotApplicable("no batch size parameter")
    bigger = task.with_size("bigger", {**size, batch: size[batch] + 1})
    args, outs = _shapes(task)
    args2, outs2 = _shapes(bigger, "bigger")
    lead = [i for i, (a, b) in enumerate(zip(args, args2)) if a.ndim >= 2 and b.shape[0] == a.shape[0] + 1
            and a.shape[1:] == b.shape[1:]]
    out_leaves, out2_leaves = jax.tree_util.tree_leaves(outs), jax.tree_util.tree_leaves(outs2)
    out_lead = [i for i, (a, b) in enumerate(zip(out_leaves, out2_leaves)) if a.ndim >= 2 and b.shape[0] == a.shape[0] + 1]
    if not lead:
        raise NotApplicable("no argument leads with the batch axis")
    fn = _function(_tree(task), "reference")
    names, keys = _positional(fn), _statics(fn)
    gi = f'''def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    args = tuple(a.reshape(-1, *a.shape[2:]) if i in {tuple(lead)!r} else a for i, a in enumerate(args))
    return args, {{**static, "batch_count": size[{batch!r}]}}
'''
    unfold = "\n".join(f"    {names[i]} = {names[i]}.reshape(batch_count, -1, *{names[i]}.shape[1:])" for i in lead)
    ref = f'''def reference({_signature(names, keys + ["batch_count"])}):
    """The original computation on arguments whose batch axis is merged into the next one."""
{unfold}
    out = _base_reference({", ".join(names)}{"".join(f", {k}={k}" for k in keys)})
    leaves, tree = jax.tree_util.tree_flatten(out)
    leaves = [x.reshape(-1, *x.shape[2:]) if i in {tuple(out_lead)!r} else x for i, x in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(tree, leaves)
'''
    return _wrapped(task, gi, ref), {"merged": [names[i] for i in lead]}


def dtype(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    del rng
    old = task.spec.dtype
    new = {"float32": "bfloat16", "bfloat16": "float32"}.get(old)
    if new is None:
        raise NotApplicable(f"dtype {old}")
    fn = _function(_tree(task), "reference")
    names, keys = _positional(fn), _statics(fn)
    gi = f'''def get_inputs(key, **size):
    args, static = _base_get_inputs(key, **size)
    return tuple(a.astype(jnp.{new}) if a.dtype == jnp.{old} else a for a in args), static
'''
    ref = f'''def reference({_signature(names, keys)}):
    out = _base_reference({", ".join(names)}{"".join(f", {k}={k}" for k in keys)})
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.{new}) if x.dtype == jnp.{old} else x, out)
'''
    return _wrapped(task, gi, ref), {"dtype": new}


def extra_op(task: Task, rng: random.Random) -> tuple[str, dict[str, Any]]:
    del rng
    fn = _function(_tree(task), "reference")
    names, keys = _positional(fn), _statics(fn)
    gi = '''def get_inputs(key, **size):
    return _base_get_inputs(key, **size)
'''
    ref = f'''def reference({_signature(names, keys)}):
    out = _base_reference({", ".join(names)}{"".join(f", {k}={k}" for k in keys)})
    leaves, tree = jax.tree_util.tree_flatten(out)
    first = leaves[0].astype(jnp.float32)
    leaves[0] = (first * jax.nn.sigmoid(first)).astype(leaves[0].dtype)
    return jax.tree_util.tree_unflatten(tree, leaves)
'''
    return _wrapped(task, gi, ref), {"op": "silu"}


DERIVE: dict[str, Callable[[Task, random.Random], tuple[str, dict[str, Any]]]] = {
    "permute": permute, "statics": statics, "transpose": transpose, "matmul_form": matmul_form,
    "batch_added": batch_added, "batch_removed": batch_removed, "dtype": dtype, "extra_op": extra_op,
}


# ---------------------------------------------------------------- writing

def derive(task: Task, kind: str, out: Path, seed: int = 0) -> Path:
    """Write the ``kind`` variant of ``task`` under ``out``; raises NotApplicable when it does not apply."""
    if kind not in DERIVE:
        raise ValueError(f"unknown variant kind {kind!r} (kinds: {', '.join(KINDS)})")
    rng = random.Random(f"{seed}:{task.id}:{kind}")
    source, detail = DERIVE[kind](task, rng)
    folder = out / f"{task.id}__{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference.py").write_text(source)
    spec = task.spec.model_dump()
    spec["id"] = folder.name
    spec["description"] = f"{spec['description'].strip()} [variant {kind}: {detail}]"
    if kind == "dtype":
        spec["dtype"] = detail["dtype"]
    if kind == "statics":  # the declared ranges follow the statics' new names; a folded one has none
        renamed, folded = detail.get("renamed", {}), detail.get("folded", [])
        spec["statics"] = {renamed.get(k, k): v for k, v in spec.get("statics", {}).items() if k not in folded}
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=110))
    if kind in CHANGE:
        from jaxbench.generate.tolerance import tolerance_for

        atol, rtol, _ = tolerance_for(folder, spec["dtype"])
        if kind == "extra_op":
            atol, rtol = max(atol, task.spec.tolerance.atol), max(rtol, task.spec.tolerance.rtol)
        spec["tolerance"] = {"atol": atol, "rtol": rtol}
        (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=110))
    return folder


def derive_for_benchmark(task: Task, out: Path, seed: int, per_task: int = 2) -> list[tuple[str, Path]]:
    """``per_task`` variants of ``task`` of kinds drawn from ``seed`` (skipping kinds that do not apply)."""
    kinds = list(KINDS)
    random.Random(f"{seed}:{task.id}").shuffle(kinds)
    written = []
    for kind in kinds:
        if len(written) == per_task:
            break
        folder = out / f"{task.id}__{kind}"
        if (folder / "task.yaml").is_file():
            written.append((kind, folder))
            continue
        try:
            written.append((kind, derive(task, kind, out, seed)))
        except NotApplicable:
            continue
        except Exception as exc:  # a kind the tool cannot derive for this task: said, and the next kind tried
            print(f"variant {task.id} {kind} not derived: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxbench.variants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tasks", nargs="+", help="suite ids or task folders")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="run task_check on every variant written")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in DERIVE]
    if unknown:
        print(f"error: unknown variant kinds {unknown} (kinds: {', '.join(KINDS)})", file=sys.stderr)
        return 2
    try:
        tasks = [load_task(t) for t in args.tasks]
    except TaskError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    failed = 0
    for task in tasks:
        for kind in kinds:
            try:
                folder = derive(task, kind, args.out, args.seed)
            except NotApplicable as exc:
                print(f"skip {task.id} {kind}: {exc}")
                continue
            except Exception as exc:  # said per kind, so one task's odd shape does not end the others
                print(f"not derived {task.id} {kind}: {type(exc).__name__}: {exc}"[:300])
                failed += 1
                continue
            line = f"{folder.name}"
            if args.check:
                from jaxbench.task_check import check_task

                res = check_task(load_task(folder))
                line += f"  {'ok' if res.ok else 'FAIL'} {res.ref_ms:.1f} ms" + "".join(f"\n    problem: {p}" for p in res.problems)
                failed += not res.ok
            print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
