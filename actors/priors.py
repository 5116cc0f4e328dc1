"""Priors from memory: which strategies to try first, and which parameters the tuner starts from.

Strategies that ran clearly faster than the reference on the nearest measured tasks (same target) move
to the front of the plan, those that failed or ran slower there move back, each with the recalled reason
in its rationale. The tuner starts from
the best parameters the same strategy reached on the most similar task (its entry in the tuned table,
``maxkernel.tuning.table``), scaled to this task's extents
and snapped to this task's legal values; the learned cost model (``maxkernel.tuning.learned``) orders the
rest. Memory only reorders what is tried: every candidate is still judged by the evaluator.

The functions above ``prioritize`` are pure; ``prioritize`` and ``tuning_priors`` read the memory and
never let a memory failure stop a session.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, Field

from actors.policy import MOVE, prior_band
from maxkernel.messages import StrategyRef
from maxkernel.tuning.table import TunedTable
from memory.insights import Measurement, StrategyOutcome, TaskMatch, strategy_outcomes

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.tuning.learned import LearnedCostModel, Sample
    from memory import Memory

log = structlog.get_logger("actors.priors")

Config = dict[str, Any]
Order = Callable[[list[Config]], list[Config]]
NEIGHBOURS = 5
FIXED_KINDS = frozenset({"recalled", "reference"})  # a same-task recall stays first, the reference last


class StrategyPrior(BaseModel):
    name: str
    score: float = Field(description="> 0: won on similar tasks; < 0: failed there; weighted by similarity")
    reasons: list[str] = Field(default_factory=list)
    passed: bool = Field(True, description="some outcome of it passed: a measured speedup, not only failures")


def _outcome_value(o: StrategyOutcome, top: float | None = None) -> float:
    """How a strategy fared on one task, as a bounded log speedup; -1 for a strategy that never passed.

    Judged beyond the noise of its reading: faster than the reference by the lower end of its interval,
    slower by the upper end, and at par (0) when the interval holds 1.0. A strategy that passed without
    winning counts as a loss only as far as its upper end lies below the task's best lower end (``top``):
    on a task where nothing cleared the reference, readings a few percent apart rank nothing."""
    if o.best_speedup is None or o.best_speedup <= 0:
        return -1.0
    low = o.best_speedup
    high = max(o.best_high or low, low)
    value = math.log(low) if low > 1.0 else math.log(high) if high < 1.0 else 0.0
    if not o.won and top is not None and top > high:
        value = min(value, math.log(high / top))
    return max(-0.5, min(2.0, value))


def _reason(o: StrategyOutcome, top: float | None = None) -> str:
    where = f"{o.task_id} (similarity {o.similarity:.2f})"
    if o.won:
        return f"won on {where} at {o.best_speedup:.2f}x"
    if o.best_speedup is not None:
        best = f", where the best reached {top:.2f}x" if top is not None and top > o.best_speedup else ""
        return f"reached {o.best_speedup:.2f}x on {where} without winning{best}"
    return f"failed on {where}: {o.reason[:160]}"


def strategy_priors(outcomes: Sequence[StrategyOutcome]) -> dict[str, StrategyPrior]:
    """One prior per strategy name: the similarity-weighted mean of its outcomes on the recalled tasks."""
    by_name: dict[str, list[StrategyOutcome]] = defaultdict(list)
    top: dict[str, float] = {}  # each recalled task's best correct speedup of any strategy but the reference
    for o in outcomes:
        by_name[o.strategy].append(o)
        if o.best_speedup is not None and o.kind != "reference":
            top[o.task_id] = max(top.get(o.task_id, 0.0), o.best_speedup)
    priors: dict[str, StrategyPrior] = {}
    for name, group in by_name.items():
        weight = sum(max(o.similarity, 0.0) for o in group) or 1.0
        score = sum(max(o.similarity, 0.0) * _outcome_value(o, top.get(o.task_id)) for o in group) / weight
        ranked = sorted(group, key=lambda o: (-o.similarity, -abs(_outcome_value(o, top.get(o.task_id)))))
        priors[name] = StrategyPrior(name=name, score=score, reasons=[_reason(o, top.get(o.task_id)) for o in ranked[:3]],
                                     passed=any(o.best_speedup is not None for o in group))
    return priors


def _parts(name: str) -> set[str]:
    """The single rewrites of a combined one (``rewrite:a+b`` -> {a, b}); empty for anything else."""
    kind, _, rest = name.partition(":")
    return set(rest.split("+")) if kind == "rewrite" and rest else set()


def prior_for(name: str, priors: dict[str, StrategyPrior]) -> StrategyPrior | None:
    """The prior of ``name``, or for a combination of rewrites never measured as such, the mean prior
    of the measured strategies that share one of its rewrites (rewrite sets differ from task to task).
    Only those that passed lend theirs: a combination that failed does not say which of its rewrites
    failed (nor whether the check refused the task's size), so it says nothing of one rewrite alone.
    A loss is lent only when every rewrite of the combination is among theirs: a rewrite memory knows
    nothing of may be the one that does the work (``pool_into_weights`` beside a ``cheaper_activations``
    that lost elsewhere), while a rewrite that won elsewhere brings its work into any combination."""
    if name in priors:
        return priors[name]
    parts = _parts(name)
    related = [p for other, p in priors.items() if parts & _parts(other) and p.passed]
    if not related:
        return None
    score = sum(p.score for p in related) / len(related)
    if score < 0 and not parts <= set().union(*(_parts(p.name) for p in related)):
        return None
    return StrategyPrior(name=name, score=score,
                         reasons=[f"as {p.name}: {p.reasons[0]}" for p in related[:2] if p.reasons])


def order_strategies(strategies: Sequence[StrategyRef], priors: dict[str, StrategyPrior]) -> tuple[list[StrategyRef], str]:
    """Clear winners first (best prior first), then strategies memory knows nothing or little of (in their
    given order), then those that failed or ran slower on similar tasks; a same-task recall stays first
    and the reference last.
    Returns the new order and the notes that say why."""
    def band(ref: StrategyRef) -> tuple[int, float]:
        prior = prior_for(ref.name, priors)
        band = prior_band(prior.score if prior is not None else None)
        return band, 0.0 if band == 1 or prior is None else -prior.score

    head = [s for s in strategies if s.kind == "recalled"]
    tail = [s for s in strategies if s.kind == "reference"]
    middle = [s for s in strategies if s.kind not in FIXED_KINDS]
    ranked = [s for _, _, s in sorted(((band(s), i, s) for i, s in enumerate(middle)), key=lambda t: (t[0], t[1]))]
    out: list[StrategyRef] = []
    notes: list[str] = []
    for ref in head + ranked + tail:
        prior = prior_for(ref.name, priors)
        if prior is not None and ref.kind not in FIXED_KINDS:
            # The score travels with the strategy: the work order (``actors.policy.work_order``) weighs it
            # against the target's own rule.
            ref = ref.model_copy(update={"prior": round(prior.score, 4)})
        if prior is not None and prior.reasons:
            why = "; ".join(prior.reasons)
            ref = ref.model_copy(update={"rationale": f"{ref.rationale} [memory: {why}]".strip()})
            notes.append(f"Memory on {ref.name} (prior {prior.score:+.2f}): {why}")
        out.append(ref)
    return out, "\n".join(notes)


def snap(value: Any, legal: Sequence[Any]) -> Any:
    """The legal value nearest to ``value`` (in log scale for positive numbers; the smaller on a tie)."""
    if value in legal or not legal:  # the legal value itself: a scaled 128.0 becomes the block 128
        return legal[legal.index(value)] if value in legal else None
    numbers = [v for v in legal if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not numbers:
        return None
    if value > 0 and all(v > 0 for v in numbers):
        return min(numbers, key=lambda v: (abs(math.log2(v) - math.log2(value)), v))
    return min(numbers, key=lambda v: (abs(v - value), v))


def tiled_extents(extents: dict[str, int], space: dict[str, list[Any]]) -> dict[str, int]:
    """What each block parameter tiles: the strategy's own extents, else the largest legal value (a
    space of block sizes is clipped to the extent it tiles)."""
    out = dict(extents)
    for name, legal in space.items():
        numbers = [v for v in legal if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        if name not in out and numbers:
            out[name] = max(numbers)
    return out


def scale_params(params: Config, from_extents: dict[str, int], to_extents: dict[str, int],
                 space: dict[str, list[Any]]) -> Config:
    """Recalled parameters for this task: a block size keeps its fraction of the extent it tiles
    (``block * new_extent / old_extent``), then every value is snapped to this task's legal values.
    Parameters this space does not have, or whose value cannot be made legal, are left out."""
    out: Config = {}
    for name, legal in space.items():
        if name not in params:
            continue
        value = params[name]
        if (isinstance(value, int) and not isinstance(value, bool) and from_extents.get(name)
                and to_extents.get(name)):
            value = value * to_extents[name] / from_extents[name]
        snapped = snap(value, legal)
        if snapped is not None:
            out[name] = snapped
    return out


def _extent_distance(a: dict[str, int], b: dict[str, int]) -> float:
    shared = [k for k in a if k in b and a[k] > 0 and b[k] > 0]
    return sum(abs(math.log2(a[k] / b[k])) for k in shared)


def param_start(rows: Sequence[Measurement], matches: Sequence[TaskMatch], ref: StrategyRef) -> tuple[Config, str] | None:
    """Where the tuner of ``ref`` starts: the best passing parameters of the same strategy on the most
    similar recalled task where they beat the reference (closer extents break ties), scaled to ``ref``;
    None when memory has none or they come out as the strategy's own defaults."""
    if not ref.space:
        return None
    similarity = {m.task_id: m.score for m in matches}
    # The tuned table (the one ``maxkernel export`` ships) of the similar tasks: the best of each shape class.
    entries = TunedTable.from_rows(r for r in rows if r.strategy == ref.name and r.task_id in similarity).entries
    # A configuration that did not beat the reference there says nothing about where to start here: a bf16
    # GEMM's tiles at par would send an f32 one to the wrong product passes before its defaults are tried.
    entries = [e for e in entries if e.speedup > 1.0]
    if not entries:
        return None
    here = tiled_extents(ref.extents, ref.space)
    source = max(entries, key=lambda r: (
        similarity[r.task_id] - 0.05 * _extent_distance(tiled_extents(r.extents, r.space), here), r.speedup))
    scaled = scale_params(source.params, tiled_extents(source.extents, source.space),
                          tiled_extents(ref.extents, ref.space), ref.space)
    start = {**ref.params, **scaled}
    if start == ref.params:
        return None
    return start, (f"tuning starts from {scaled}, scaled from {source.params} that reached {source.speedup:.2f}x "
                   f"on {source.task_id} (similarity {similarity[source.task_id]:.2f})")


def first_then(start: Config | None, rank: Callable[[list[Config]], list[Config]] | None) -> Order | None:
    """The trial order: ``start`` first when known, the rest as ``rank`` puts them (None: leave the
    hand-written order alone, which already measures the defaults first)."""
    if rank is None:
        return None

    def is_start(config: Config) -> bool:
        return start is not None and all(start.get(k) == v for k, v in config.items())

    def order(configs: list[Config]) -> list[Config]:
        rest = [c for c in configs if not is_start(c)]
        head = [c for c in configs if is_start(c)]
        return head + rank(rest)

    return order


def model_pick(ref: StrategyRef, predict: Callable[[list[Config]], list[float]]) -> tuple[Config, float] | None:
    """The configuration of ``ref``'s space the learned cost model predicts fastest, with its predicted gain
    over the defaults; None when it is not clearly (``MOVE``) ahead of them (the defaults stay)."""
    from maxkernel.tuning.space import SearchSpace

    configs = SearchSpace(params=dict(ref.space), defaults=dict(ref.params)).configs()
    if len(configs) < 2:
        return None
    scores = predict(configs)
    best = max(range(len(configs)), key=lambda i: (scores[i], -i))
    gain = scores[best] / scores[0] if scores[0] > 0 else 0.0  # configs()[0] is the defaults
    if best == 0 or gain <= 0 or math.log(gain) < MOVE:
        return None
    return configs[best], gain


def draft_params(strategies: Sequence[StrategyRef], rows: Sequence[Measurement], matches: Sequence[TaskMatch],
                 predict_for: Callable[[StrategyRef], Callable[[list[Config]], list[float]] | None] | None = None,
                 ) -> tuple[list[StrategyRef], list[str]]:
    """Each tunable strategy set to be drafted where its tuning would start: the best parameters the same
    strategy reached on the most similar recalled task, scaled to this one; else, when the learned cost
    model ranks its space (``predict_for``), the configuration it predicts clearly faster than the defaults.
    The draft is the first trial: a recalled parameter is judged by the evaluator like any other."""
    out: list[StrategyRef] = []
    notes: list[str] = []
    for ref in strategies:
        if not ref.space:
            out.append(ref)
            continue
        found = param_start(rows, matches, ref)
        if found is not None:
            params, why = found
        else:
            predict = predict_for(ref) if predict_for is not None else None
            picked = model_pick(ref, predict) if predict is not None else None
            if picked is None:
                out.append(ref)
                continue
            params = {**ref.params, **picked[0]}
            why = f"the learned cost model predicts {picked[0]} {picked[1]:.2f}x faster than the defaults {ref.params}"
        out.append(ref.model_copy(update={"params": params, "defaults": dict(ref.params),
                                          "rationale": f"{ref.rationale} [memory: {why}]".strip()}))
        notes.append(f"Memory on {ref.name}: drafted at {params}: {why}")
    return out, notes


def samples_from(rows: Sequence[Measurement], task_features: dict[str, dict[str, float]]) -> list["Sample"]:
    """Training samples for the learned cost model: one per measured configuration of a known task."""
    from maxkernel.tuning.learned import Sample

    return [Sample(task=task_features[r.task_id], strategy=r.strategy, kind=r.kind, params=r.params,
                   extents=tiled_extents(r.extents, r.space), speedup=r.speedup if r.passed else None,
                   group=f"{r.task_id}|{r.strategy}")
            for r in rows if r.task_id in task_features and r.kind not in ("recalled", "reference")]


# -- reading the memory ----------------------------------------------------------------------------


def prioritize(memory: "Memory", task: "Task", target: str, strategies: list[StrategyRef],
               cache_dir: Path | None = None) -> tuple[list[StrategyRef], str]:
    """The plan's strategies reordered by how they fared on the nearest measured tasks (same op family
    first), each tunable one set to be drafted at its recalled (or, with ``cache_dir``, model-picked)
    parameters, with the notes that say so; unchanged (and logged) when memory has nothing or cannot be read."""
    try:
        matches, rows = memory.nearest_measured(task, target, NEIGHBOURS)
        priors = strategy_priors(strategy_outcomes(rows, matches))
        model = learned_model(memory, cache_dir, task, target) if cache_dir is not None else None
    except Exception as exc:  # memory is advice: a session goes on without it
        log.warning("priors.strategies_unavailable", task=task.id, error=f"{type(exc).__name__}: {exc}")
        return strategies, ""
    ordered, notes = order_strategies(strategies, priors)
    try:
        drafted, param_notes = draft_params(ordered, rows, matches, predictor(model) if model else None)
    except Exception as exc:  # a model that cannot predict leaves the defaults
        log.warning("priors.params_unavailable", task=task.id, error=f"{type(exc).__name__}: {exc}")
        return ordered, notes
    return drafted, "\n".join(n for n in [notes, *param_notes] if n)


def learned_model(memory: "Memory", cache_dir: Path, task: "Task",
                  target: str) -> tuple["LearnedCostModel", dict[str, float]] | None:
    """The learned cost model of ``target`` and ``task``'s features; None when switched off or too little is
    measured to learn from."""
    from maxkernel.tuning import learned

    if not learned.enabled():
        return None

    def samples() -> list["Sample"]:  # read only when the model is trained (again)
        rows = memory.measurements(target)
        signatures = memory.signatures(sorted({r.task_id for r in rows}))
        return samples_from(rows, {tid: learned.task_features(sig) for tid, sig in signatures.items()})

    model = learned.cached_model(learned.model_path(cache_dir, target), memory.measured_count(), samples)
    if model is None:
        return None
    return model, learned.task_features(memory.signature(task))


def predictor(found: tuple["LearnedCostModel", dict[str, float]]
              ) -> Callable[[StrategyRef], Callable[[list[Config]], list[float]] | None]:
    """For a strategy, the model's predicted speedup of each configuration over the strategy's typical one;
    None for a strategy it has never seen measured: its pick would replace the strategy's own defaults by
    a guess from other strategies' blocks (on tpu-v6e such a pick for the cross-entropy template did not
    even compile), so the defaults stay the draft. Ordering trials (``learned_rank``) still uses it."""
    model, features = found

    def for_strategy(ref: StrategyRef) -> Callable[[list[Config]], list[float]] | None:
        if not model.knows(ref.name):
            return None
        extents = tiled_extents(ref.extents, ref.space)
        return lambda configs: model.predict(features, ref.name, ref.kind, configs, extents)

    return for_strategy


def learned_rank(memory: "Memory", cache_dir: Path, task: "Task", ref: StrategyRef,
                 target: str) -> Callable[[list[Config]], list[Config]] | None:
    """The learned cost model's ranking of ``ref``'s configurations on ``task``, or None (switched off,
    or too little measured to learn from)."""
    found = learned_model(memory, cache_dir, task, target)
    if found is None:
        return None
    model, features = found
    extents = tiled_extents(ref.extents, ref.space)
    return lambda configs: model.order(features, ref.name, ref.kind, configs, extents)


def tuning_priors(memory: "Memory", cache_dir: Path, task: "Task", ref: StrategyRef,
                  target: str) -> tuple[StrategyRef, Order | None]:
    """``ref`` with its parameters set to where tuning should start, and the order of the other trials
    (the learned cost model's, or None for the hand-written one). A strategy the planner already set to
    its recalled parameters starts where it was drafted: that trial is judged already."""
    if not ref.space:
        return ref, None
    try:
        matches, rows = memory.nearest_measured(task, target, NEIGHBOURS)
        found = param_start(rows, matches, ref)
        rank = learned_rank(memory, cache_dir, task, ref, target)
    except Exception as exc:  # memory is advice: the tuner goes on with the hand-written order
        log.warning("priors.tuning_unavailable", task=task.id, strategy=ref.name, error=f"{type(exc).__name__}: {exc}")
        return ref, None
    start = found[0] if found else dict(ref.params)
    if found:
        ref = ref.model_copy(update={"params": start, "rationale": f"{ref.rationale} [memory: {found[1]}]".strip()})
        log.info("priors.tuning_start", task=task.id, strategy=ref.name, start=start)
    return ref, first_then(start, rank)
