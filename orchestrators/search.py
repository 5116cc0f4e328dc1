"""Graph search over candidates: ``parallel`` lanes, ``beam`` and ``evolve``, resumable after ``kill -9``.

A search works in rounds. Each round decides its expansions from the graph as the store holds it (a seeded
``random.Random`` per round, so the same seed and the same results give the same search), writes them to
the expansions table, then runs each as one session through the actors: the coder writes the strategy at
the given parameters, the tester judges it, the debugger may fix it. The tuner gets no parameter space:
searching the parameters is the search's own job. On resume, an expansion whose session already holds an
evaluation counts as done (its candidates are in the graph, never judged again); one with none is run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import asyncio
import json
import random
import time
import uuid
from typing import Any, Callable, Literal

import sqlalchemy as sa
import structlog
from pydantic import BaseModel, Field

from actors import policy
from actors.config import ActorConfig
from actors.services import Services
from jaxbench.report import format_speedup
from maxkernel.messages import Budget, OptimizeRequest, Plan, SessionFinished, StrategyRef
from memory import Store
from memory.errors import RecordNotFoundError
from orchestrators.auto import brain_label, reference_ref
from orchestrators.bus import Bus
from orchestrators.interrupt import INTERRUPTED, run_interruptible
from orchestrators.graph import (
    Expansion,
    Node,
    SearchGraph,
    confirm_session,
    load_graph,
    params_key,
    session_for,
    shown,
)
from orchestrators.tables import ensure, expansions, searches, utcnow, writing

log = structlog.get_logger("orchestrators.search")

Algorithm = Literal["parallel", "beam", "evolve"]
OnEvent = Callable[[str, dict[str, Any]], None]


class SearchConfig(BaseModel):
    algorithm: Algorithm = "beam"
    seed: int = 0
    target: str = "cpu"
    size: str = "cpu"
    max_evaluations: int = 30
    time_s: float | None = None
    max_rounds: int = 20
    max_fix_attempts: int = 1
    width: int = Field(2, description="beam: nodes kept per depth (valid ones only)")
    branching: int = Field(2, description="beam: children per beam node")
    depth: int = Field(3, description="beam: rounds after the first")
    lanes: int = Field(2, description="parallel: independent lanes, each an Auto-like greedy run")
    islands: int = Field(2, description="evolve: islands with their own archive")
    migrate_every: int = Field(2, description="evolve: rounds between migrations of each island's best")
    explore: float = Field(0.3, description="evolve: chance to pick a parent from a random niche, not the best")
    children: int = Field(2, description="evolve: children per island per round")


class SearchLimits(BaseModel):
    """What a resume may change: the search's limits (a resume can extend its budget). Its shape (algorithm,
    seed, widths) stays the stored one, so that the graph already built keeps its meaning."""

    max_evaluations: int | None = None
    time_s: float | None = None

    def applied(self, config: SearchConfig) -> SearchConfig:
        """``config`` with the limits given here in place of its own."""
        return config.model_copy(update={k: v for k, v in self.model_dump().items() if v is not None})


class Spec(BaseModel):
    """One expansion decided for a round: apply ``strategy`` at ``params`` to ``parent_id``."""

    parent_id: str | None
    strategy: str
    params: dict[str, Any]
    edge: str
    lane: int = 0


# -- moves on the catalog ---------------------------------------------------------------------------


def neighbours(ref: StrategyRef, params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One-step moves in the strategy's space: each parameter to the value just below or above it."""
    out = []
    for name, values in sorted(ref.space.items()):
        if name not in params or params[name] not in values:
            continue
        i = values.index(params[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                moved = dict(params) | {name: values[j]}
                out.append((f"{name}={values[j]}", moved))
    return out


def parse_strategy(text: str) -> tuple[str, dict[str, Any]]:
    """``name {json params}`` (how searches remember a kernel's strategy) back into its parts."""
    name, brace, rest = text.partition(" {")
    if not brace:
        return text, {}
    try:
        params = json.loads("{" + rest)
    except ValueError:
        return name, {}
    return name, params if isinstance(params, dict) else {}


def memory_hints(services: Services, task: Any, catalog: list[StrategyRef], target: str, k: int = 5) -> list[Spec]:
    """Strategies that memory says worked on similar tasks, at the parameters that worked there (when they
    are legal here): tried first. The planner already puts a kernel of this very task first."""
    by_name = {s.name: s for s in catalog}
    out: list[Spec] = []
    seen: set[str] = set()
    for hit in services.memory.recall_kernels(task, k=k, target=target):
        name, params = parse_strategy(hit.kernel.strategy)
        ref = by_name.get(name)
        if ref is None or hit.kernel.task_id == task.id:
            continue
        legal = {p: v for p, v in params.items() if p in ref.space and v in ref.space[p]}
        merged = dict(ref.params) | legal
        key = params_key(name, merged)
        if key in seen:
            continue
        seen.add(key)
        out.append(Spec(parent_id=None, strategy=name, params=merged,
                        edge=f"recalled from {hit.kernel.task_id}", lane=len(out)))
    return out


class Decider(ABC):
    """Decides a round's expansions from the graph; one subclass per algorithm."""

    def __init__(self, config: SearchConfig, catalog: list[StrategyRef], hints: list[Spec] | None = None) -> None:
        self.config, self.catalog = config, catalog
        self.by_name = {s.name: s for s in catalog}
        self.hints = hints or []

    def roots(self) -> list[Spec]:
        """Round 0: what memory suggests first, then every catalog strategy at its defaults."""
        out = list(self.hints)
        keys = {params_key(s.strategy, s.params) for s in out}
        for s in self.catalog:
            if params_key(s.name, s.params) not in keys:
                out.append(Spec(parent_id=None, strategy=s.name, params=dict(s.params), edge=f"apply {s.name}",
                                lane=len(out)))
        return out

    def moves(self, node: Node, tried: set[str]) -> list[Spec]:
        ref = self.by_name.get(node.strategy)
        if ref is None:
            return []
        return [Spec(parent_id=node.candidate_id, strategy=node.strategy, params=p, edge=label, lane=node.lane)
                for label, p in neighbours(ref, node.params) if params_key(node.strategy, p) not in tried]

    def mutations(self, node: Node, tried: set[str]) -> list[Spec]:
        """Evolve's wider step: any one parameter to any other legal value."""
        ref = self.by_name.get(node.strategy)
        if ref is None:
            return []
        out = []
        for name, values in sorted(ref.space.items()):
            for value in values:
                if name in node.params and value != node.params[name]:
                    moved = dict(node.params) | {name: value}
                    if params_key(node.strategy, moved) not in tried:
                        out.append(Spec(parent_id=node.candidate_id, strategy=node.strategy, params=moved,
                                        edge=f"mutate {name}={value}", lane=node.lane))
        return out

    def switches(self, node: Node | None, tried: set[str], lane: int) -> list[Spec]:
        return [Spec(parent_id=node.candidate_id if node else None, strategy=s.name, params=dict(s.params),
                     edge=f"switch to {s.name}", lane=lane)
                for s in self.catalog if params_key(s.name, s.params) not in tried]

    @abstractmethod
    def decide(self, graph: SearchGraph, round_: int, rng: random.Random, tried: set[str]) -> list[Spec]:
        """The expansions of round ``round_``, chosen from the stored graph."""


class Beam(Decider):
    def decide(self, graph: SearchGraph, round_: int, rng: random.Random, tried: set[str]) -> list[Spec]:
        if round_ == 0:
            return self.roots()
        if round_ > self.config.depth:
            return []
        # Only valid nodes enter the beam, and only those with a move left: a dead end (the reference, a
        # recalled kernel, a fully explored corner) would waste a slot.
        last = [n for n in graph.nodes if n.passed and n.expansion is not None
                and graph.expansions[n.expansion].round == round_ - 1 and self.moves(n, tried)]
        beam = sorted(last, key=lambda n: (-n.low, n.seq))[: self.config.width]
        out: list[Spec] = []
        for node in beam:
            moves = self.moves(node, tried | {params_key(s.strategy, s.params) for s in out})
            rng.shuffle(moves)
            out.extend(moves[: self.config.branching])
        return out


class Parallel(Decider):
    """Independent lanes: each starts from its own catalog strategy and climbs greedily from its best node
    (a neighbour of it, else the next strategy not yet tried); lanes share only the rule that no candidate
    is judged twice."""

    def decide(self, graph: SearchGraph, round_: int, rng: random.Random, tried: set[str]) -> list[Spec]:
        out: list[Spec] = []
        for lane in range(self.config.lanes):
            taken = tried | {params_key(s.strategy, s.params) for s in out}
            mine = [n for n in graph.valid if n.lane == lane]
            best = max(mine, key=lambda n: n.low, default=None)
            if round_ == 0 or best is None:
                roots = self.roots()
                order = roots[lane % len(roots):] + roots[: lane % len(roots)]
                options = [s.model_copy(update={"lane": lane}) for s in order
                           if params_key(s.strategy, s.params) not in taken]
                out.extend(options[:1])
                continue
            options = self.moves(best, taken)
            rng.shuffle(options)
            options = options or self.switches(best, taken, lane)
            out.extend(options[:1])
        return out


class Evolve(Decider):
    """Islands of MAP-Elites archives keyed by behaviour niche; parents by tournament on speedup or, with
    probability ``explore``, from a random niche; ring migration of each island's best."""

    def archives(self, graph: SearchGraph, round_: int) -> list[dict[str, Node]]:
        islands: list[dict[str, Node]] = [{} for _ in range(self.config.islands)]
        for node in sorted(graph.valid, key=lambda n: n.seq):
            archive = islands[node.lane % self.config.islands]
            if node.niche not in archive or node.low > archive[node.niche].low:
                archive[node.niche] = node
        every = max(1, self.config.migrate_every)
        for _ in range(round_ // every):  # the migrations that happened up to this round, replayed
            bests = [max(a.values(), key=lambda n: n.low, default=None) for a in islands]
            for i, best in enumerate(bests):
                if best is None:
                    continue
                target = islands[(i + 1) % len(islands)]
                if best.niche not in target or best.low > target[best.niche].low:
                    target[best.niche] = best
        return islands

    def decide(self, graph: SearchGraph, round_: int, rng: random.Random, tried: set[str]) -> list[Spec]:
        if round_ == 0:
            return [s.model_copy(update={"lane": i % self.config.islands}) for i, s in enumerate(self.roots())]
        out: list[Spec] = []
        for island, archive in enumerate(self.archives(graph, round_)):
            if not archive:
                continue
            for _ in range(self.config.children):
                taken = tried | {params_key(s.strategy, s.params) for s in out}
                # Parents that can still have a child; ties broken by id so that a seed fixes the choice.
                live = sorted((n for n in archive.values() if self.mutations(n, taken) or self.switches(n, taken, island)),
                              key=lambda n: (-n.low, n.niche, n.candidate_id))
                if not live:
                    break
                if rng.random() < self.config.explore:
                    parent = rng.choice(sorted(live, key=lambda n: n.niche))  # explore: any niche
                else:
                    pool = rng.sample(live, min(2, len(live)))  # exploit: a tournament on speedup
                    parent = min(pool, key=lambda n: live.index(n))
                options = self.mutations(parent, taken)
                if not options or rng.random() < 0.15:
                    options = options + self.switches(parent, taken, island)
                out.append(rng.choice(options).model_copy(update={"lane": island}))
        return out


DECIDERS: dict[str, type[Decider]] = {"beam": Beam, "parallel": Parallel, "evolve": Evolve}


# -- the search ----------------------------------------------------------------------------------


class SearchResult(BaseModel):
    search_id: str
    task_id: str
    algorithm: str
    status: str
    stop_reason: str
    evaluations: int
    expansions: int
    nodes: int
    best_candidate_id: str | None = None
    best_strategy: str = ""
    best_params: dict[str, Any] = Field(default_factory=dict)
    best_speedup: float | None = Field(None, description="the best node's speedup (nodes rank by the lower end of "
                                                           "their confirmed interval)")
    best_speedup_ci: tuple[float, float] | None = Field(None, description="its interval over the timing rounds")
    confirmed: bool = Field(False, description="the best node was re-measured (or is modelled, deterministic)")
    claim: str = Field("at par", description="faster | at par | slower: what the confirmed interval allows")
    baseline_speedup: float | None = Field(None, description="the reference itself judged as a candidate (measured "
                                                             "only when a node was to be confirmed)")
    baseline_speedup_ci: tuple[float, float] | None = Field(None, description="that reading's interval")
    first_correct_at: int | None = None
    resumed: int = Field(0, description="expansions found interrupted and closed from their recorded evaluations")


class Search:
    def __init__(self, bus: Bus, store: Store, search_id: str, task_id: str, config: SearchConfig,
                 on_event: OnEvent | None = None) -> None:
        self.bus, self.store, self.search_id, self.task_id, self.config = bus, store, search_id, task_id, config
        self.emit: OnEvent = on_event or (lambda _k, _d: None)
        self.writer = writing(store.engine)
        self.started = time.monotonic()
        self.resumed = 0

    # -- bookkeeping in the store ---------------------------------------------------------------

    def register(self) -> None:
        with self.writer.begin() as conn:
            row = conn.execute(sa.select(searches.c.id).where(searches.c.id == self.search_id)).first()
            if row is None:
                conn.execute(searches.insert().values(
                    id=self.search_id, task_id=self.task_id, algorithm=self.config.algorithm,
                    config=self.config.model_dump(), status="running", created_at=utcnow(), updated_at=utcnow()))
            else:  # a resume: the limits it was given are the search's from now on
                conn.execute(searches.update().where(searches.c.id == self.search_id)
                             .values(status="running", config=self.config.model_dump(), updated_at=utcnow()))

    def set_status(self, status: str) -> None:
        with self.writer.begin() as conn:
            conn.execute(searches.update().where(searches.c.id == self.search_id)
                         .values(status=status, updated_at=utcnow()))

    def add_round(self, round_: int, specs: list[Spec], first_n: int) -> None:
        with self.writer.begin() as conn:
            for i, spec in enumerate(specs):
                n = first_n + i
                conn.execute(expansions.insert().values(
                    search_id=self.search_id, n=n, round=round_, session_id=session_for(self.search_id, n),
                    parent_id=spec.parent_id, strategy=spec.strategy, params=spec.params, edge=spec.edge,
                    lane=spec.lane, status="planned", created_at=utcnow()))

    def mark(self, n: int, status: str) -> None:
        with self.writer.begin() as conn:
            conn.execute(expansions.update().where(expansions.c.search_id == self.search_id, expansions.c.n == n)
                         .values(status=status))

    def ensure_session(self, session_id: str) -> None:
        try:
            self.store.get_session(session_id)
        except RecordNotFoundError:
            self.store.create_session(mode="search", brain=brain_label(self.bus.services.config),
                                      target=self.config.target, budget=self.config.model_dump(),
                                      task_id=self.task_id, id=session_id)

    # -- the catalog ----------------------------------------------------------------------------

    async def catalog(self) -> Plan:
        """The planner's strategies (memory recalled first); asked once per search, then read from the log."""
        session_id = session_for(self.search_id, "plan")
        for event in await asyncio.to_thread(self.store.events, session_id=session_id):
            if event.message_type == "Plan":
                return Plan.model_validate(event.payload)
        await asyncio.to_thread(self.ensure_session, session_id)
        outcome = await self.bus.plan(OptimizeRequest(
            session_id=session_id, task_id=self.task_id, target=self.config.target, size=self.config.size,
            brain=brain_label(self.bus.services.config), budget=self.budget(), sender="search"))
        if isinstance(outcome, SessionFinished):
            raise RuntimeError(f"the planner gave no plan: {outcome.reason}")
        await asyncio.to_thread(self.store.set_session_status, session_id, "planned")
        return outcome

    def budget(self) -> Budget:
        return Budget(max_fix_attempts=self.config.max_fix_attempts, tune_max_trials=1, tune_budget_s=0.0)

    # -- running expansions ---------------------------------------------------------------------

    async def expand(self, exp: Expansion, plan: Plan) -> None:
        ref = next(s for s in plan.strategies if s.name == exp.strategy)
        params = dict(exp.params) | ({"source": ref.params["source"]} if "source" in ref.params else {})
        strategy = ref.model_copy(update={"params": params, "space": {}})
        await asyncio.to_thread(self.ensure_session, exp.session_id)
        one = plan.model_copy(update={"session_id": exp.session_id, "strategies": [strategy], "step": 0,
                                      "budget": self.budget(), "candidate_id": None, "parent_id": None})
        self.emit("expansion", {"n": exp.n, "round": exp.round, "edge": exp.edge, "strategy": exp.strategy,
                                "params": shown(exp.params)})
        finished = await self.bus.run_plan(one)
        await asyncio.to_thread(self.store.set_session_status, exp.session_id, finished.status)
        await asyncio.to_thread(self.mark, exp.n, "done")

    async def settle(self, graph: SearchGraph, plan: Plan) -> SearchGraph:
        """Close what a killed run left open: expansions with evaluations are done, the others run now."""
        evaluated = {n.expansion for n in graph.nodes}
        todo = []
        for exp in graph.expansions:
            if exp.status == "done":
                continue
            if exp.n in evaluated:
                await asyncio.to_thread(self.mark, exp.n, "done")
                self.resumed += 1
            else:
                todo.append(exp)
        if todo:
            await asyncio.gather(*(self.expand(exp, plan) for exp in todo))
        return await asyncio.to_thread(load_graph, self.store, self.search_id)

    def stop_reason(self, graph: SearchGraph, round_: int) -> str | None:
        if len(graph.nodes) >= self.config.max_evaluations:
            return f"evaluation budget spent ({len(graph.nodes)} of {self.config.max_evaluations})"
        if self.config.time_s is not None and time.monotonic() - self.started >= self.config.time_s:
            return f"time budget of {self.config.time_s} s spent"
        if round_ >= self.config.max_rounds:
            return f"{self.config.max_rounds} rounds done"
        return None

    async def run(self) -> SearchResult:
        await asyncio.to_thread(self.register)
        plan = await self.catalog()
        hints = await asyncio.to_thread(memory_hints, self.bus.services, self.bus.services.task(self.task_id),
                                        plan.strategies, self.config.target)
        decider = DECIDERS[self.config.algorithm](self.config, plan.strategies, hints)
        graph = await asyncio.to_thread(load_graph, self.store, self.search_id)
        graph = await self.settle(graph, plan)
        reason = None
        while True:
            round_ = 1 + max((e.round for e in graph.expansions), default=-1)
            reason = self.stop_reason(graph, round_)
            if reason:
                break
            tried = {params_key(e.strategy, e.params) for e in graph.expansions}
            rng = random.Random(f"{self.config.seed}:{round_}")
            specs = decider.decide(graph, round_, rng, tried)
            specs = specs[: max(0, self.config.max_evaluations - len(graph.nodes))]
            if not specs:
                reason = "no expansion left to try"
                break
            await asyncio.to_thread(self.add_round, round_, specs, len(graph.expansions))
            self.emit("round", {"round": round_, "expansions": len(specs)})
            graph = await asyncio.to_thread(load_graph, self.store, self.search_id)
            graph = await self.settle(graph, plan)
        graph = await self.confirm(graph, plan)
        await asyncio.to_thread(self.set_status, "done")
        return result_of(graph, reason or "", self.resumed)

    async def confirm(self, graph: SearchGraph, plan: Plan) -> SearchGraph:
        """Judge the reference as a candidate (the baseline), then re-measure the top nodes against it
        (``actors.policy``), so that the search names its best by confirmed speedup; runs a killed search
        recorded already are not repeated."""
        measured = [n for n in graph.valid if n.label != "reference-equivalent" and n.basis == "measured"]
        if not policy.to_confirm(measured, lambda n: n.low, centre_of=policy.centre):
            return graph
        session_id = confirm_session(self.search_id)
        await asyncio.to_thread(self.ensure_session, session_id)
        graph = await self.measure_baseline(graph, session_id)
        kernels = [n for n in graph.valid if n.label != "reference-equivalent" and n.basis == "measured"]
        baseline = graph.baseline
        for node in policy.to_confirm(kernels, lambda n: n.over, centre_of=lambda n: policy.centre(n, baseline)):
            runs = [node.over, *node.confirm_runs]
            if not policy.confirm_more(runs):
                continue
            ref = next((s for s in plan.strategies if s.name == node.strategy), StrategyRef(name=node.strategy))
            ref = ref.model_copy(update={"params": dict(ref.params) | node.params, "space": {}})
            source = (await asyncio.to_thread(self.store.get_candidate, node.candidate_id)).code
            while policy.confirm_more(runs):
                reply = await self.bus.judge(session_id, self.task_id, source, ref, policy.CONFIRM,
                                             target=self.config.target, size=self.config.size,
                                             candidate_id=node.candidate_id)
                runs.append(policy.cleared(reply.report, baseline))
                self.emit("confirm", {"strategy": node.strategy, "params": shown(node.params), "runs": runs})
        await asyncio.to_thread(self.store.set_session_status, session_id, "done")
        return await asyncio.to_thread(load_graph, self.store, self.search_id)

    async def measure_baseline(self, graph: SearchGraph, session_id: str) -> SearchGraph:
        """The reference run as a candidate, as an Auto session judges it (once, three times when the first
        reading is suspect); what a killed search recorded of it counts."""
        from maxkernel.rules.strategy import reference_source

        runs = list(graph.baseline_runs)
        if not policy.baseline_more(runs):
            return graph
        source = reference_source(self.bus.services.task(self.task_id))
        ref = reference_ref(self.config.target)
        while policy.baseline_more(runs):
            reply = await self.bus.judge(session_id, self.task_id, source, ref, policy.BASELINE,
                                         target=self.config.target, size=self.config.size)
            runs.append(reply.report)
        self.emit("baseline", {"speedup": runs[0].speedup, "runs": len(runs),
                               "bar": policy.baseline_bar(runs)[0]})
        return await asyncio.to_thread(load_graph, self.store, self.search_id)


def claim_of(best: Node | None) -> str:
    """``faster`` only for a node whose confirmed value (re-measured against the baseline, or modelled)
    clears 1.0; ``slower`` for one whose interval lies wholly below 1.0; else ``at par``."""
    if best is None or best.interval is None:
        return "at par"
    # unconfirmed: never faster, but slower where its whole interval lies below 1.0 (the rule of actors.priors)
    return policy.claim(best.interval, best.confirmed if best.confirmed is not None else 0.0)


def result_of(graph: SearchGraph, reason: str, resumed: int = 0) -> SearchResult:
    best = graph.best()
    ordered = sorted(graph.nodes, key=lambda n: n.seq)
    first = next((i + 1 for i, n in enumerate(ordered) if n.passed), None)
    return SearchResult(search_id=graph.search_id, task_id=graph.task_id, algorithm=graph.algorithm,
                        status="scored" if best else "failed", stop_reason=reason, evaluations=len(graph.nodes),
                        expansions=len(graph.expansions), nodes=len(graph.nodes),
                        best_candidate_id=best.candidate_id if best else None, best_strategy=best.strategy if best else "",
                        best_params=best.params if best else {},
                        best_speedup=best.speedup if best else None,
                        best_speedup_ci=best.interval if best else None,
                        confirmed=best is not None and best.confirmed is not None, claim=claim_of(best),
                        baseline_speedup=graph.baseline.speedup if graph.baseline is not None else None,
                        baseline_speedup_ci=graph.baseline.interval if graph.baseline is not None else None,
                        first_correct_at=first,
                        resumed=resumed)


async def run_search(task_id: str, config: SearchConfig | None = None, actor_config: ActorConfig | None = None, *,
                     services: Services | None = None, search_id: str | None = None,
                     limits: SearchLimits | None = None, on_event: OnEvent | None = None) -> SearchResult:
    """Run (or resume, with the same ``search_id``) one search; memory gets the best kernel at the end. A
    resume keeps the stored configuration but for the ``limits`` it is given."""
    config = config or SearchConfig()
    own = services is None
    services = services or Services((actor_config or ActorConfig()).model_copy(update={"remember": False}))
    try:
        task = services.task(task_id)
        store = services.store
        ensure(store.engine)
        search_id = search_id or uuid.uuid4().hex
        if search_id_exists(store, search_id):
            stored_task = stored_task_id(store, search_id)
            if stored_task != task.id:
                raise RecordNotFoundError(f"search {search_id} is a search of {stored_task}, not of {task.id}")
            config = (limits or SearchLimits()).applied(stored_config(store, search_id))
        async with Bus(services) as bus:
            search = Search(bus, store, search_id, task.id, config, on_event)
            try:
                result = await search.run()
            except asyncio.CancelledError:  # Ctrl-C or SIGTERM (``run_interruptible``): resumable, not running
                search.set_status(INTERRUPTED)  # one quick write, done before anything else can cancel it
                raise
        await asyncio.to_thread(remember_best, services, store, search_id)
        return result
    finally:
        if own:
            await services.aclose()


def search_id_exists(store: Store, search_id: str) -> bool:
    with store.engine.connect() as conn:
        return conn.execute(sa.select(searches.c.id).where(searches.c.id == search_id)).first() is not None


def stored_task_id(store: Store, search_id: str) -> str:
    with store.engine.connect() as conn:
        return str(conn.execute(sa.select(searches.c.task_id).where(searches.c.id == search_id)).scalar_one())


def stored_config(store: Store, search_id: str) -> SearchConfig:
    with store.engine.connect() as conn:
        return SearchConfig.model_validate(conn.execute(
            sa.select(searches.c.config).where(searches.c.id == search_id)).scalar_one())


def remember_best(services: Services, store: Store, search_id: str) -> str | None:
    """The search's best Pallas kernel and a note on what each strategy gave, into memory."""
    graph = load_graph(store, search_id)
    kernels = [n for n in graph.valid if n.label != "reference-equivalent"]
    confirmed = [n for n in kernels if n.confirmed is not None]
    best = (max(confirmed, key=lambda n: n.confirmed or 0.0) if confirmed
            else max(kernels, key=lambda n: n.low, default=None))
    task = services.task(graph.task_id)
    if best is None:
        return None
    evaluations = store.evaluations(best.candidate_id)
    candidate = store.get_candidate(best.candidate_id)
    record = services.memory.remember_kernel(evaluations[-1].report, candidate.code, task=task,
                                             strategy=params_key(best.strategy, best.params),
                                             produced_by=f"search:{graph.algorithm}", session_id=best.session_id,
                                             candidate_id=best.candidate_id)
    per: dict[str, Node] = {}  # each strategy's reading with the highest lower end, as the ranking goes
    for node in graph.valid:
        if node.strategy not in per or node.low > per[node.strategy].low:
            per[node.strategy] = node
    failed = sorted({n.strategy for n in graph.nodes if not n.passed} - set(per))
    text = (f"{graph.algorithm} search on {graph.task_id}: best {best.strategy} {best.params}, "
            f"{policy.describe(best.speedup, best.interval, best.confirmed)}. "
            + "; ".join(f"{s}: best {format_speedup(n.speedup, n.interval)}" for s, n in sorted(per.items()))
            + (f". Never correct: {', '.join(failed)}" if failed else ""))
    services.memory.remember_note(text[:2000], task=task, outcome="worked" if claim_of(best) == "faster" else "info",
                                  target=evaluations[-1].report.target, session_id=best.session_id)
    return record.id


class SuiteResult(BaseModel):
    results: list[SearchResult]
    evaluations: int
    skipped: list[str] = Field(default_factory=list)


async def run_suite(tasks: list[str], config: SearchConfig, actor_config: ActorConfig | None = None, *,
                    global_evaluations: int | None = None, on_event: OnEvent | None = None) -> SuiteResult:
    """Batch mode: one search per task, each within ``config.max_evaluations`` and all within the global
    budget; one evaluator, store and memory for the whole batch, so later tasks recall earlier ones."""
    services = Services((actor_config or ActorConfig()).model_copy(update={"remember": False}))
    results: list[SearchResult] = []
    spent, skipped = 0, []
    try:
        for task_id in tasks:
            left = None if global_evaluations is None else global_evaluations - spent
            if left is not None and left <= 0:
                skipped.append(task_id)
                continue
            per = config.model_copy(update={"max_evaluations": min(config.max_evaluations, left or config.max_evaluations)})
            if on_event:
                on_event("task", {"task": task_id})
            result = await run_search(task_id, per, services=services, on_event=on_event)
            spent += result.evaluations
            results.append(result)
    finally:
        await services.aclose()
    return SuiteResult(results=results, evaluations=spent, skipped=skipped)


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrators.search TASK ...``: the same run as ``maxkernel search`` (used by tests that
    kill the process)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orchestrators.search")
    parser.add_argument("task")
    parser.add_argument("--algo", default="beam", choices=sorted(DECIDERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evals", type=int, default=30)
    parser.add_argument("--search-id", default=None)
    args = parser.parse_args(argv)
    from maxkernel.logging import configure

    configure("warning")
    config = SearchConfig(algorithm=args.algo, seed=args.seed, max_evaluations=args.evals)
    result = run_interruptible(run_search(args.task, config, search_id=args.search_id))
    print(result.model_dump_json())
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
