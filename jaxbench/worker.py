"""A candidate worker: a long-lived process that imports JAX once and runs untrusted candidates.

The judge (``jaxbench.pool``) sends requests over a pipe; each candidate gets a fresh module namespace,
a temp dir of its own and a CPU-time budget, under the sandbox of ``jaxbench.sandbox``. The worker never
sees a task's reference or its outputs: it receives inputs and returns outputs and timings.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_perf_counter = time.perf_counter  # bound before any candidate runs: patching time.* cannot reach it


def _primitives(jaxpr: Any, acc: set[str]) -> set[str]:
    """Every primitive name in a (closed) jaxpr, sub-jaxprs included."""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in inner.eqns:
        acc.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    _primitives(sub, acc)
    return acc


def _grid_steps(jaxpr: Any) -> int:
    """Grid steps of every pallas_call in a (closed) jaxpr, sub-jaxprs included: what an interpreted run
    pays per step, whatever its blocks hold."""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    steps = 0
    for eqn in inner.eqns:
        if eqn.primitive.name == "pallas_call":
            grid = getattr(eqn.params.get("grid_mapping"), "grid", ())
            count = 1
            for extent in grid:
                count *= extent if isinstance(extent, int) else 1
            steps += count
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    steps += _grid_steps(sub)
    return steps


class Worker:
    def __init__(self, conn: Any, memory_bytes: int) -> None:
        import jax
        import numpy as np

        from jaxbench import sandbox, wire

        self.jax, self.np, self.sandbox, self.wire = jax, np, sandbox, wire
        self.conn = conn
        self.state: dict[str, Any] = {}
        jax.jit(lambda x: x + 1)(np.ones(4, np.float32)).block_until_ready()  # backend up before limits
        self.guarded = self._guarded_functions()
        self.layers = sandbox.enter(memory_bytes)

    def _guarded_functions(self) -> dict[str, Any]:
        import jax.numpy as jnp
        import numpy as np

        jax = self.jax
        return {
            "time.perf_counter": time.perf_counter,
            "time.time": time.time,
            "time.monotonic": time.monotonic,
            "jax.block_until_ready": jax.block_until_ready,
            "jax.jit": jax.jit,
            "jax.numpy.allclose": jnp.allclose,
            "numpy.allclose": np.allclose,
            "numpy.testing.assert_allclose": np.testing.assert_allclose,
        }

    def _tampered(self) -> list[str]:
        now = self._guarded_functions()
        return [name for name, fn in self.guarded.items() if now[name] is not fn]

    # --- requests ---------------------------------------------------------------------------------

    def serve(self) -> None:
        self.wire.send(self.conn, {"ok": True, "pid": os.getpid(), "layers": self.layers})
        while True:
            try:
                request = self.wire.recv(self.conn)
            except EOFError:
                return
            op = request.get("op")
            handler = getattr(self, f"op_{op}", None)
            if handler is None:
                self.wire.send(self.conn, {"ok": False, "status": "runtime_error", "reason": f"unknown op {op!r}"})
                continue
            reply = self._guard(handler, request)
            self.wire.send(self.conn, reply)
            if op == "exit":
                return

    def _guard(self, handler: Any, request: dict[str, Any]) -> dict[str, Any]:
        tmp = self.state.get("tmpdir")
        if tmp is not None and request.get("op") != "load":  # load sets up a new dir, then arms itself
            os.chdir(tmp)
            self.sandbox.arm(Path(tmp), [Path(p) for p in self.state.get("protected", [])])
        try:
            reply = handler(request)
        except BaseException as exc:  # a candidate may raise anything, SystemExit included
            reply = self._error_reply(exc, request)
        finally:
            violations = self.sandbox.disarm()
            os.chdir("/")
        tampered = self._tampered()
        if tampered:
            # The worker's own functions are no longer trustworthy: the judge must replace it.
            return {"ok": False, "status": "rejected", "poisoned": True,
                    "reason": f"patched harness functions: {', '.join(tampered)}"}
        if violations:
            return {"ok": False, "status": "rejected", "reason": f"sandbox: {violations[0]} is not allowed"}
        return reply

    def _error_reply(self, exc: BaseException, request: dict[str, Any]) -> dict[str, Any]:
        if isinstance(exc, self.sandbox.SandboxViolation):
            return {"ok": False, "status": "rejected", "reason": str(exc)}
        status = "compile_error" if request.get("op") == "load" else "runtime_error"
        if isinstance(exc, MemoryError):
            return {"ok": False, "status": "runtime_error", "reason": "out of memory (worker address-space limit)"}
        last = traceback.extract_tb(exc.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(last) if f.filename == self.state.get("filename")), "")
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {message}"[:600]
        return {"ok": False, "status": status, "reason": f"{text} ({where})" if where else text}

    def op_ping(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "pid": os.getpid()}

    def op_exit(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def op_load(self, request: dict[str, Any]) -> dict[str, Any]:
        """Load the candidate, trace and compile it for the given input shapes."""
        from jaxbench.candidate import CandidateError, check_signature, load_candidate
        from jaxbench.fingerprint import program_fingerprint
        from jaxbench.interpret import force_interpret

        self._drop_candidate()
        tmp = tempfile.mkdtemp(prefix="mk_cand_")
        self.state.update(tmpdir=tmp, protected=request.get("protected", []), filename=request["filename"])
        self.sandbox.set_cpu_budget(float(request.get("cpu_budget_s", 600)))
        force_interpret(request.get("interpret", "plain"))
        os.chdir(tmp)
        self.sandbox.arm(Path(tmp), [Path(p) for p in self.state["protected"]])
        try:
            loaded = load_candidate(request["source"], request["filename"])
        except CandidateError as exc:
            return {"ok": False, "status": exc.status, "reason": exc.reason}
        static = request["static"]
        jax = self.jax
        specs = [jax.ShapeDtypeStruct(tuple(s["shape"]), s["dtype"]) for s in request["arg_specs"]]
        bad = check_signature(loaded.kernel, len(specs), static)
        if bad:
            return {"ok": False, "status": "compile_error", "reason": bad}
        fn = partial(loaded.kernel, **static)
        closed = jax.make_jaxpr(fn)(*specs)
        prims = sorted(_primitives(closed, set()))
        steps = _grid_steps(closed)
        limit = request.get("max_grid_steps")
        if limit is not None and steps > int(limit):  # not compiled: the judge draws another size or refuses
            return {"ok": False, "status": "over_budget", "grid_steps": steps,
                    "reason": f"{steps} grid steps (limit {int(limit)})"}
        rounded = 0
        if request.get("interpret") == "tpu" and not request.get("exact_matmuls"):
            from jaxbench.tpu_numerics import computed_as_on_tpu

            fn, rounded = computed_as_on_tpu(fn, closed, specs)
        compiled = jax.jit(fn).lower(*specs).compile()
        cost = _cost(compiled)
        out_shapes = jax.tree_util.tree_leaves(jax.eval_shape(fn, *specs))
        self.state.update(module=loaded.module, compiled=compiled, executable=f"{id(compiled):x}-{loaded.sha}")
        return {
            "ok": True,
            "primitives": prims,
            "grid_steps": steps,
            "jaxpr": str(closed.jaxpr),
            "fingerprint": program_fingerprint(closed) if request.get("fingerprint") else None,
            "flops": cost.get("flops"),
            "bytes": cost.get("bytes accessed"),
            "out_dtypes": [str(s.dtype) for s in out_shapes],
            "tpu_rounded_matmuls": rounded,
        }

    def op_run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Outputs for each input set, and whether any input changed under the candidate."""
        np = self.np
        compiled = self.state["compiled"]
        outputs, mutated = [], False
        for inputs in request["inputs"]:
            before = [np.array(a, copy=True) for a in inputs]
            device = [self.jax.device_put(np.array(a, copy=True)) for a in inputs]
            out = compiled(*device)
            out = self.jax.block_until_ready(out)
            outputs.append(_to_numpy(out, self.jax, np))
            after = [np.asarray(d) for d in device]
            if any(not np.array_equal(b, a, equal_nan=True) for b, a in zip(before, after)):
                mutated = True
        return {"ok": True, "outputs": outputs, "mutated": mutated, "executable": self.state["executable"]}

    def op_time(self, request: dict[str, Any]) -> dict[str, Any]:
        """``calls`` timed calls (one unless asked) on fresh device arrays, scaled by the round's factor so
        the values are new every round; the calls of one round share them. ``ms`` is the first call's time,
        ``calls_ms`` every call's."""
        from jaxbench.timing import scaled

        jax = self.jax
        compiled = self.state["compiled"]  # the very executable whose outputs op_run returned
        args = jax.block_until_ready([jax.device_put(a) for a in scaled(request["inputs"], float(request["scale"]))])
        calls_ms = []
        for _ in range(max(1, int(request.get("calls", 1)))):
            t0 = _perf_counter()
            out = compiled(*args)
            jax.block_until_ready(out)
            calls_ms.append((_perf_counter() - t0) * 1e3)
            del out
        return {"ok": True, "ms": calls_ms[0], "calls_ms": calls_ms, "executable": self.state["executable"]}

    def op_unload(self, request: dict[str, Any]) -> dict[str, Any]:
        self._drop_candidate()
        return {"ok": True}

    def _drop_candidate(self) -> None:
        from jaxbench.candidate import unload_module

        module = self.state.get("module")
        if module is not None:
            unload_module(module)
        tmp = self.state.pop("tmpdir", None)
        self.state.clear()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        self.jax.clear_caches()
        gc.collect()


def _cost(compiled: Any) -> dict[str, float]:
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return {k: float(v) for k, v in (cost or {}).items() if k in ("flops", "bytes accessed")}


def _to_numpy(out: Any, jax: Any, np: Any) -> Any:
    if isinstance(out, dict):
        return {str(k): _to_numpy(v, jax, np) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return tuple(_to_numpy(v, jax, np) for v in out)
    if isinstance(out, jax.Array):
        return np.asarray(out)
    raise TypeError(f"kernel returned {type(out).__name__}, not arrays")


def pin_to(cpus: str) -> None:
    """Pin this process to the comma-separated cores in ``cpus`` (those it may run on), before JAX sizes its
    thread pools from the cores it sees; nothing when none of them is allowed."""
    wanted = {int(c) for c in cpus.split(",") if c.strip()}
    allowed = wanted & os.sched_getaffinity(0)
    if allowed:
        os.sched_setaffinity(0, allowed)


# What a worker imports before it serves, imported once by the pool's fork server (``jaxbench.zygote``) rather
# than by every worker started: none of them starts a thread, opens a file a candidate could reach, or JAX's
# backend (each worker starts its own, then enters its sandbox).
PRELOAD = ("numpy", "jax", "jax.numpy", "jax.experimental.pallas", "jaxbench.sandbox", "jaxbench.wire",
           "jaxbench.candidate", "jaxbench.interpret", "jaxbench.timing", "jaxbench.tpu_numerics")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    read_fd, write_fd, memory_bytes = int(args[0]), int(args[1]), int(args[2])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    pin_to(os.environ.get("JAXBENCH_WORKER_CPUS", ""))
    from jaxbench.wire import Duplex

    conn = Duplex(Connection(read_fd, writable=False), Connection(write_fd, readable=False))
    Worker(conn, memory_bytes).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
