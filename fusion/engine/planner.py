"""Plan policies: `none` (every node alone), `static` (TVM FuseOps-style rules, decided once without data),
`dynamic` (cost-model-driven on the current data), `oracle` (every legal plan measured on the simulator).

Plans are data; the policies are functions of (model, profiles, cost model) with no side effects other than the
`Evaluator`'s memo of built kernels (so the engine reuses them instead of compiling twice).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

import numpy as np

from fusion.cost.analytic import unit_times
from fusion.cost.interface import CostEstimate, CostModel, KernelFeatures
from fusion.engine.bounds import cycle_bound
from fusion.engine.candidates import CONV_ABSORBABLE, Candidate, enumerate_candidates, schedules, zero_skip_twin
from fusion.engine.context import ModelContext
from fusion.engine.errors import EngineError
from fusion.engine.execute import timing_cycles
from fusion.engine.features import kernel_features
from fusion.engine.fuse_ops import fuse_ops
from fusion.engine.kernel import Kernel, storage_dtypes, try_build
from fusion.engine.legality import generator_accepts, no_cycle_through_outside, structurally_legal
from fusion.engine.plan import Group, GroupChoice, Measurement, Plan, baseline_group
from fusion.engine.profile import SPARSE_TILE_FRACTION, TensorProfile
from fusion.engine.strategies import REGISTRY, shape_bound, strategy_of
from fusion.engine.workers import CompilePool, build_and_count
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import MATRIX_OPS, OpType
from fusion.lower.compiler import ALIAS_OPS
from simulator.errors import SimulatorTrap

POLICIES = ("none", "static", "dynamic", "oracle")
ORACLE_MAX_PLANS = 512
# static: the kernel families that may run a TVM group's nodes, preferred in this order (a fixed rule, no cost model)
STATIC_FAMILIES = ("epilogue", "conv", "chain", "layout_chain", "stream", "swapped", "layout_load", "segment_chain")
STATIC_STRATEGY = {family: s.name for s in REGISTRY.values() for family in s.families}  # its default schedule
NARROW = 2  # GEMM schedules an epilogue candidate inherits from its matrix node
# The dynamic planner minimises predicted cycles + DRAM_WEIGHT x the DRAM channel time of the kernel's traffic.
# A kernel's cycles see the channel only while it runs, but its bytes also cost energy (325 pJ each: ~70 fp32 MACs)
# and, once kernels overlap, a neighbour's bandwidth: a schedule moving more bytes (a swapped GEMM's C^T round
# trip, an epilogue reloading A per panel) must win more than twice their channel time. 1.5 and 2 give the same
# plans on the bundled models (fp32 d128: the swapped GEMMs' extra bytes no longer exceed static's); 0 is cycles.
DRAM_WEIGHT = 2.0
# Measuring instead of trusting the model: a prediction's true value is taken as normal around it with the model's
# stated spread (`CostEstimate.spread`, relative); where the expected regret of trusting the model (cycles lost by
# taking its favourite unmeasured) is at least REGRET_FLOOR of what is at stake, the candidates are simulated.
DEFAULT_SPREAD = 0.25  # a model that states no spread: one standard deviation is a quarter of the prediction
REGRET_FLOOR = 0.005
THREADS_PER_WORKER = 2  # planning threads per compile worker: one waits for a kernel while another prices
T, R = TypeVar("T"), TypeVar("R")


@dataclass(frozen=True)
class Evaluated:
    group: Group
    # the kernel, or how to build it: a repeated structure's schedule is priced from the first one's features
    # (`Evaluator.evaluate`) and built only when something needs its program
    source: Kernel | Callable[[], Kernel]
    features: KernelFeatures
    cycles: float
    energy_pj: float
    score: float  # what the dynamic planner minimises: cycles plus priced DRAM channel time (see Evaluator)
    sd: float = 0.0  # the cost model's standard deviation of `cycles` (its spread x cycles)

    @property
    def kernel(self) -> Kernel:
        """The built kernel (built now if it was priced before it was built)."""
        source = self.source
        if isinstance(source, Kernel):
            return source
        kernel = source()
        object.__setattr__(self, "source", kernel)  # built once: a cache, the same kernel whenever asked
        return kernel


def _skips(group: Group) -> bool:
    """A zero-skip kernel: its timing depends on the data, so it is priced at the live zero-tile fraction and
    never simulated on zero inputs to settle a choice (`Strategy.skips_zero_tiles`)."""
    return strategy_of(group).skips_zero_tiles


def _later(mc: ModelContext, group: Group, sparsity: str) -> Callable[[], Kernel]:
    """How to build a group priced before it is built (see `Evaluated.source`)."""

    def build() -> Kernel:
        built = try_build(mc, group, sparsity)
        if isinstance(built, str):
            raise EngineError(
                f"{group.schedule} of {group.nodes[0]!r}, priced as a repeated structure, refused: {built}"
            )
        return built

    return build


def trailing_views(graph: Graph, nodes: Sequence[str]) -> frozenset[str]:
    """The group's views (`ALIAS_OPS`) of a value it computes that no other node of the group reads, and views
    of those: what it stores through them is their input's bytes."""
    inside = set(nodes)
    views: set[str] = set()
    for name in reversed(nodes):
        node = graph.node(name)
        readers = {c.name for v in node.outputs for c in graph.consumers.get(v, ())} & inside
        producer = graph.producers.get(node.inputs[0]) if node.inputs else None
        fed = producer is not None and producer.name in inside
        if node.op in ALIAS_OPS and fed and readers <= views and len(views) + 1 < len(nodes):
            views.add(name)
    return frozenset(views)


def _schedule(group: Group) -> tuple:
    """A group's schedule, without its nodes."""
    return group.strategy, group.tile_m, group.flatten, group.panels, group.resident_a


def expected_regret(chosen: float, chosen_sd: float, other: float, other_sd: float) -> float:
    """E[max(0, X - Y)] for independent normal X ~ (chosen, chosen_sd), Y ~ (other, other_sd): the cycles expected
    to be lost by taking the predicted `chosen` over `other` without measuring either."""
    sd, mu = math.hypot(chosen_sd, other_sd), chosen - other
    if sd == 0.0:
        return max(0.0, mu)
    z = mu / sd
    return sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) + mu * (1 + math.erf(z / math.sqrt(2))) / 2


class Scored(NamedTuple):
    """A fused candidate as `plan_dynamic` weighs it: its gain in score over its nodes' best single kernels
    (predicted or measured), their separate score, its best schedule and the others built, the candidate, and
    the share of `base` the gain must exceed (`fusion_bar`)."""

    gain: float
    base: float
    best: Evaluated
    alts: list
    cand: Candidate
    bar: float


def weight_bytes(mc: ModelContext, sub: Graph) -> int:
    """The least bytes the group's kernel reads of its matrix weights: each constant weight of a Conv, MatMul or
    Gemm (once, however many nodes share it), in its smallest storage (one byte an element on the int8 path), read
    from the program's DRAM image at least once (the matrix unit preloads or streams it from the scratchpad;
    resnet18 224's layer4 convs: 2.4 MB each, ~150k cycles of channel time at DRAM_WEIGHT, which the bound had
    left out). Weights under a tile (`array_size` elements), which a generator might hold in immediates, are left
    out."""
    weights = {
        node.inputs[1]
        for node in sub.nodes
        if node.op in MATRIX_OPS and len(node.inputs) > 1 and sub.is_constant(node.inputs[1])
    }
    counts = (math.prod(sub.types[w].shape) for w in weights)
    return (1 if mc.int8 else 4) * sum(c for c in counts if c >= mc.config.array_size)


class Evaluator:
    """Builds candidate kernels and predicts their cost, memoised per (group, priced zero-tile fraction);
    thread-safe. One evaluator per plan: the profiles it prices zero-skip kernels with are fixed.

    With a `CompilePool`, kernels are built in its worker processes, and `map` runs independent planning
    questions (one per node, one per candidate) on threads that wait for them: each question still builds what
    a serial planner would (the same bounds prune the same schedules), so plans do not depend on the pool.

    With `repeats` (and no pool, whose threads would decide which of two alike groups is built first), a group
    of the same structure and schedule as one built before for other nodes (a model's repeated layers,
    `ModelContext.shape_signature`) is priced from that kernel's features and built only when its program is
    needed (`evaluate`, `Evaluated.kernel`), and shares its measurements (`timing_key`) and pipelined pairs
    (`pair_key`)."""

    def __init__(
        self,
        mc: ModelContext,
        cost_model: CostModel,
        profiles: Mapping[str, TensorProfile],
        dram_weight: float = DRAM_WEIGHT,
        pool: CompilePool | None = None,
        overlap: Callable[[list[Evaluated]], float] | None = None,
        repeats: bool = True,
    ) -> None:
        self.mc, self.cost_model, self.profiles, self.dram_weight = mc, cost_model, profiles, dram_weight
        self.pool = pool
        self.repeats = repeats and pool is None
        # a plan run as one program: the separate kernels' predicted boundary overlap (`overlap.BoundaryOverlap`)
        self.overlap = overlap or (lambda parts: 0.0)
        self._overlaps: dict[tuple, float] = {}  # with `repeats`, by the parts' structures (`parts_overlap`)
        self._memo: dict[tuple[Group, float], Future[Evaluated | str]] = {}
        self._measured: dict[tuple, int] = {}  # simulated cycles by program (see `measured_cycles`)
        self._over: dict[tuple, int] = {}  # by program: a budget its simulation exceeded (`measured_within`)
        self._alike: dict[tuple, tuple] = {}  # a structure's first program key (`timing_key`)
        self._firsts: dict[tuple, Evaluated] = {}  # a structure's first built schedule (`_like`)
        self.measure_seconds = 0.0  # host time of those simulations
        self.stopped = 0  # simulations stopped past their budget (`simulated_within`)
        self.guarded = Counter[str]()  # guard outcomes by region: "measured", "fallback"
        self._joint: dict[tuple[tuple[Group, KernelFeatures], ...], list[Evaluated]] = {}  # see `jointly`
        self._cores: dict[Group, Group] = {}  # a group priced and timed from its view-less core (`_viewless`)
        self._bounds: dict[Group, float] = {}  # `bound` by group (a pure function of it: no lock)
        self._lock = threading.Lock()
        self.evaluations: Counter[tuple[str, ...]] = Counter()  # evaluate() calls by the group's nodes: planning work

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items, concurrently when kernels build in a pool (results in the items' order)."""
        if self.pool is None:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=THREADS_PER_WORKER * self.pool.workers) as threads:
            return list(threads.map(fn, items))

    def zero_fraction(self, group: Group) -> float:
        """The live zero-tile fraction of the group's GEMM operand (0 when it is not profiled)."""
        profile = self.profiles.get(self.mc.graph.node(group.nodes[0]).inputs[0])
        return 0.0 if profile is None else profile.zero_tile_fraction

    def sparse(self, group: Group) -> bool:
        return self.zero_fraction(group) >= SPARSE_TILE_FRACTION

    def evaluate(self, group: Group, zero_fraction: float | None = None) -> Evaluated | str:
        """Build and price a group; a zero-skip kernel is priced at `zero_fraction` (default: the live one) and
        built for the sparse data class (the only class its guard admits)."""
        fraction = self.zero_fraction(group) if zero_fraction is None else zero_fraction
        skip = _skips(group)
        key = (group, fraction if skip else 0.0)
        with self._lock:
            self.evaluations[group.nodes] += 1
            entry = self._memo.get(key)
            owner = entry is None
            if owner:
                entry = self._memo[key] = Future()
        if owner:  # this call builds it; concurrent callers of the same key wait for its result
            try:
                sparsity = "sparse" if skip else "any"
                like = self._like(group, key[1])
                feats = like.features if like is not None else self._viewless(group, key[1]) or self._folded(group)
                if feats is not None:
                    entry.set_result(self._priced(group, _later(self.mc, group, sparsity), feats))
                    if like is None:  # a repeated layer's view variant is priced as this one (`_like`)
                        with self._lock:
                            self._firsts.setdefault(self._like_key(group, key[1]), entry.result())
                    return entry.result()
                if self.pool is None:
                    built, feats = build_and_count(self.mc, group, sparsity, key[1])
                else:
                    built, feats = self.pool.submit(group, sparsity, key[1]).result()
                entry.set_result(built if feats is None else self._priced(group, built, feats))
                if feats is not None and self.repeats:
                    with self._lock:
                        self._firsts.setdefault(self._like_key(group, key[1]), entry.result())
            except BaseException as err:
                entry.set_exception(err)
                raise
        return entry.result()

    def _like_key(self, group: Group, fraction: float) -> tuple:
        """A group's structure, schedule and priced zero-tile fraction."""
        return self.mc.shape_signature(group.nodes), _schedule(group), fraction

    def _like(self, group: Group, fraction: float) -> Evaluated | None:
        """With `repeats`, the built group of the same structure and schedule (`ModelContext.shape_signature`)
        priced at the same zero-tile fraction, if any: a repeated layer's kernel has its features (its program
        differs only in immediates its data sets: tests/fusion/engine/test_planner_repeats.py)."""
        if not self.repeats:
            return None
        with self._lock:
            return self._firsts.get(self._like_key(group, fraction))

    def _viewless(self, group: Group, fraction: float) -> KernelFeatures | None:
        """With `repeats`, the group's features from the built group without the views it ends in
        (`trailing_views`), of the same schedule: a view shares its input's DRAM bytes
        (`lower.compiler.alias_roots`), so storing the view's value is storing its input, and the two groups
        generate one program (side by side GEMMs taking a Reshape along: tests/fusion/engine/test_planner_views.py);
        the features are that program's counted for this group's nodes. Its timing is the core's (`timed_kernel`)."""
        if not self.repeats:
            return None
        views = trailing_views(self.mc.graph, group.nodes)
        if not views:
            return None
        core = replace(group, nodes=tuple(n for n in group.nodes if n not in views))
        feats = self._counted_as(group, self._done(core, fraction), fraction)
        if feats is not None:
            with self._lock:
                self._cores[group] = core
        return feats

    def _counted_as(self, group: Group, core: Evaluated | str | None, fraction: float) -> KernelFeatures | None:
        """The core's program counted for `group`'s nodes (`kernel_features` of it as `group`'s kernel), None
        unless the core is built."""
        if not isinstance(core, Evaluated) or not isinstance(core.source, Kernel):
            return None
        return kernel_features(self.mc, replace(core.source, group=group), fraction)

    def _folded(self, group: Group) -> KernelFeatures | None:
        """The features of a group ending in a Relu its strategy folds into its drain (`Strategy.folds_relu`), from
        the group without it (its core, built for this if need be): the two kernels differ only in the drain's
        configuration, so the core's program counted for this group's nodes is what building this one would
        count, but for a `li` or two where the drain's bounds hit or miss the register cache (resnet18 224: 45 of
        210 builds, a conv or conv + Add with and without its Relu). It is built when its program is needed
        (`Evaluated.kernel`): to be measured, its own program is simulated, so measured cycles stay exact."""
        graph, folds = self.mc.graph, strategy_of(group).folds_relu
        if folds is None or len(group.nodes) < 2 or graph.node(group.nodes[-1]).op != OpType.Relu:
            return None
        if not folds(self.mc, graph.node(group.nodes[0])):
            return None
        return self._counted_as(group, self.evaluate(replace(group, nodes=group.nodes[:-1])), 0.0)

    def _priced(
        self,
        group: Group,
        kernel: Kernel | Callable[[], Kernel],
        feats: KernelFeatures,
        est: CostEstimate | None = None,
    ) -> Evaluated:
        est = est or self.cost_model.predict(feats, self.mc.config)
        spread = DEFAULT_SPREAD if est.spread is None else est.spread
        score = est.cycles + self.priced_traffic(feats)
        return Evaluated(group, kernel, feats, est.cycles, est.energy_pj, score, spread * est.cycles)

    def priced_traffic(self, feats: KernelFeatures) -> float:
        """DRAM_WEIGHT x the DRAM channel time of the kernel's traffic: the score's term besides cycles."""
        return self.dram_weight * (feats.dram_read_bytes + feats.dram_write_bytes) / self.mc.config.dram_bytes_per_cycle

    def _done(self, group: Group, fraction: float = 0.0) -> Evaluated | None:
        """The group as built and priced at the zero-tile fraction, if it is (nothing is built)."""
        with self._lock:
            found = self._memo.get((group, fraction))
        done = found.result() if found is not None and found.done() else None
        return done if isinstance(done, Evaluated) else None

    def priced(self, groups: list[Group]) -> list[Evaluated]:
        """The groups already built and priced (dense variants), without building any."""
        return [e for g in groups if (e := self._done(g)) is not None]

    def with_twins(self, groups: list[Group]) -> list[Group]:
        """The groups plus, when their GEMM operand is sparse now, their zero-skip twins (priced live)."""
        return groups + [t for g in groups if (t := zero_skip_twin(g)) is not None and self.sparse(g)]

    def bound(self, group: Group) -> float:
        """A lower bound on the group's score: the matrix bound plus the priced channel time of the traffic every
        GEMM schedule has (each input read once, each output written once, in storage dtypes, and each matrix
        weight read once, `weight_bytes`). Memoised: every ranking of a node's schedules asks again."""
        found = self._bounds.get(group)
        if found is None:
            found = self._bounds.setdefault(group, self._bound(group))
        return found

    def _bound(self, group: Group) -> float:
        cycles = shape_bound(self.mc, group)
        if not cycles:
            return 0.0
        sub = self.mc.subgraph(group.nodes)
        values = (*sub.inputs, *sub.outputs)
        sizes = (math.prod(sub.types[v].shape) * np.dtype(d).itemsize for v, d in storage_dtypes(self.mc, sub, values))
        weights = 0 if _skips(group) else weight_bytes(self.mc, sub)  # a zero-skip kernel skips weight rows too
        return cycles + self.dram_weight * (sum(sizes) + weights) / self.mc.config.dram_bytes_per_cycle

    def ranked(self, groups: list[Group], keep: int = 1) -> tuple[list[Evaluated], str]:
        """The `keep` best buildable schedules by score, best first, and the last refusal reason. Groups are built
        in the order of their lower bound (`bound`); once a bound reaches the `keep`-th best score, the rest are
        dominated and never generated. A group absorbing consumers into its head's drain is also skipped once
        the head alone in its schedule (`head_floor`, a lower bound on its predicted score) is past the
        `keep`-th best by more than the spreads leave uncertain: its expected regret against that one is below
        REGRET_FLOOR, so neither this ranking nor `settle` would take or measure it."""
        done: list[Evaluated] = []
        reason = ""
        for bound, _, group in sorted((self.bound(g), i, g) for i, g in enumerate(groups)):
            if len(done) >= keep and bound >= done[keep - 1].score:
                break
            floor = self.head_floor(group) if len(done) >= keep else None
            if floor is not None and self._dominated(done[keep - 1], *floor):
                continue
            ev = self.evaluate(group)
            if isinstance(ev, str):
                reason = ev
            else:
                done.append(ev)
                done.sort(key=lambda e: e.score)
        return self.jointly(done), reason

    def head_alone(self, group: Group) -> Evaluated | None:
        """The group's head alone in the group's schedule, when priced, for a group whose other nodes are
        elementwise consumers its drain absorbs (`candidates.CONV_ABSORBABLE`: a bias, residual Add, Relu,
        Clip): they only add work (their loads and vector passes) to the head's, and the analytic model never
        predicts more work on any unit or the channel faster (`fusion.cost.analytic`), nor prices more traffic
        lower, so the head's score bounds the group's from below (resnet18: every conv + Relu or + Add + Relu of
        a strategy is predicted within 0.1% of the conv alone in it; an int8 head that dequantizes bounds less:
        `head_floor`). None otherwise, and for zero-skip kernels (priced at the data's zero-tile fraction)."""
        graph = self.mc.graph
        if len(group.nodes) < 2 or _skips(group):
            return None
        if any(graph.node(n).op not in CONV_ABSORBABLE for n in group.nodes[1:]):
            return None
        return self._done(replace(group, nodes=group.nodes[:1]))

    def head_floor(self, group: Group) -> tuple[float, float] | None:
        """(a lower bound on the group's predicted score, the head's spread) from its head alone in its schedule
        (`head_alone`), None when that is not priced. The head's score, but for an int8 head that dequantizes
        (read only by Adds): alone it stores float32, four times the bytes its group stores, and its vector work
        differs (resnet18 224: conv2 + Add + Relu is predicted up to 7% below its stores-less head), so only its
        load and matrix stages (a group loads what its head loads and runs its matmuls; the analytic model's cycles
        are at least each stage, `fusion.cost.analytic`) and its priced reads bound the group's
        (tests/fusion/engine/test_planner_lazy.py)."""
        head = self.head_alone(group)
        if head is None:
            return None
        if not self.mc.dequantizes(group.nodes[0]):
            return head.score, head.sd
        stages = unit_times(head.features, self.mc.config)
        reads = self.dram_weight * head.features.dram_read_bytes / self.mc.config.dram_bytes_per_cycle
        return max(stages.load, stages.matrix) + reads, head.sd

    @staticmethod
    def _dominated(best: Evaluated, floor: float, sd: float) -> bool:
        """Whether a group whose score is at least `floor` (with about `sd` of spread) is too far past `best` to be
        worth building: the expected regret of taking `best` over it is below REGRET_FLOOR of `best`'s score."""
        return floor > best.score and expected_regret(best.score, best.sd, floor, sd) < REGRET_FLOOR * best.score

    def jointly(self, done: list[Evaluated]) -> list[Evaluated]:
        """Built schedules of one set of nodes re-priced together (`CostModel.predict_group`: the learned model
        ranks a group's schedules better than one at a time), best first; memoised per set, so the planner
        asking about the same schedules again gets the same objects."""
        if len(done) < 2:
            return done
        key = tuple((e.group, e.features) for e in done)
        with self._lock:
            found = self._joint.get(key)
        if found is None:
            estimates = self.cost_model.predict_group([e.features for e in done], self.mc.config)
            priced = [self._priced(e.group, e.source, e.features, est) for e, est in zip(done, estimates, strict=True)]
            with self._lock:
                found = self._joint.setdefault(key, sorted(priced, key=lambda e: e.score))
        return found

    def best(self, groups: list[Group]) -> tuple[Evaluated | None, list[tuple[str, float]], str]:
        """The cheapest buildable schedule, the other built ones' (schedule, cycles), and the last refusal."""
        done, reason = self.ranked(groups)
        if not done:
            return None, [], reason
        return done[0], [(e.group.schedule, e.cycles) for e in done[1:]], reason

    def settle(self, done: list[Evaluated]) -> Evaluated:
        """The best of `done` (schedules of the same nodes, best score first) once the uncertain ones are measured:
        every schedule whose expected regret against the favourite (`expected_regret` of their scores with the
        model's spreads) is at least REGRET_FLOOR of the favourite's score is simulated once on zero inputs with
        the favourite (timing does not depend on the values, so zero-skip kernels are left out), and the lowest
        measured score wins (each rival of the favourite simulated only as far as it could still win:
        `measured_within`)."""
        best = done[0]
        if _skips(best.group):
            return best
        floor = REGRET_FLOOR * best.score
        risky = [
            e for e in done[1:] if not _skips(e.group) and expected_regret(best.score, best.sd, e.score, e.sd) >= floor
        ]
        if not risky:
            return best
        # min([best, *risky], key=measured_score), each rival simulated only as far as it could still win
        winner, score = best, self.measured_score(best)
        for e in risky:
            traffic = self.priced_traffic(e.features)
            cycles = self.measured_within(e, below(score - traffic) + 1)  # + 1: float rounding, compared below
            if cycles is not None and cycles + traffic < score:
                winner, score = e, cycles + traffic
        return winner

    def measured_score(self, e: Evaluated) -> float:
        """The simulated cycles of a built kernel plus its priced DRAM traffic."""
        return self.measured_cycles(e) + self.priced_traffic(e.features)

    def measured_cycles(self, e: Evaluated) -> int:
        """A built kernel's cycles simulated on zero inputs (`execute.timing_cycles`), memoised by program: the
        regret tests, the plan guard and the pipelining pass measure the same kernels, and a model's repeated
        layers generate the same programs (same instructions and input shapes: the same timing, since only
        zero-skip kernels, never measured, test data), or with `repeats` programs differing only in their data's
        immediates (`timing_key`). A view runs no kernel: 0."""
        if strategy_of(e.group).host_view:  # a view: no kernel runs
            return 0
        key = self.timing_key(e)
        with self._lock:
            found = self._measured.get(key)
        if found is None:
            found = self.timed(lambda: timing_cycles(self.mc, self.timed_kernel(e)))
            with self._lock:
                self._measured[key] = found
        return found

    def measured_within(self, e: Evaluated, budget: int) -> int | None:
        """`measured_cycles(e)` when they are at most `budget`, else None. For a measurement that matters only if
        it comes in under a known alternative (a loser's exact cycles decide nothing): its simulation stops once
        past the budget (the machine's watchdog at `max_cycles = budget`), which for a kernel several times slower
        than the winner saves most of it. What is learnt is memoised (exact cycles, or a budget exceeded)."""
        if strategy_of(e.group).host_view or budget < 1:
            cycles = self.measured_cycles(e)
            return cycles if cycles <= budget else None
        if self.cycle_bound(e) > budget:  # past the budget whatever it measures: not simulated
            return None
        key = self.timing_key(e)
        with self._lock:
            found, over = self._measured.get(key), self._over.get(key, 0)
        if found is None and budget <= over:
            return None
        if found is None:
            found = self.simulated_within(self.timed_kernel(e), budget)
            with self._lock:
                if found is None:
                    self._over[key] = max(budget, self._over.get(key, 0))
                else:
                    self._measured[key] = found
        return found if found is not None and found <= budget else None

    def cycle_bound(self, e: Evaluated) -> int:
        """A lower bound on `measured_cycles(e)` from its features (`bounds.cycle_bound`; 0 for a zero-skip kernel,
        never measured, and a view, no kernel)."""
        if _skips(e.group) or strategy_of(e.group).host_view:
            return 0
        return cycle_bound(self.mc, e.features)

    def timing_key(self, e: Evaluated) -> tuple:
        """What a kernel's measured cycles are memoised by: its program (`_program_key`), or with `repeats` the
        first program seen of the same structure and schedule (`ModelContext.shape_signature`: a repeated
        layer's kernel differs from the first's only in immediates its data sets, int8 requantization
        multipliers and shifts, which no timing rule reads: `simulator.timing`), so a repeated layer's kernel
        priced before it was built is not built to be measured (`timed_kernel`)."""
        if not self.repeats:
            return _program_key(e.kernel)
        alike = self._like_key(e.group, 0.0)
        with self._lock:
            found = self._alike.get(alike)
        if found is not None:
            return found
        key = _program_key(self.timed_kernel(e))
        with self._lock:
            return self._alike.setdefault(alike, key)

    def timed_kernel(self, e: Evaluated) -> Kernel:
        """The kernel simulated for `e`'s timing: with `repeats`, the first built kernel of its structure and
        schedule (the same timing: `timing_key`), so a repeated layer's kernel measured before the first one
        (the plan guard's regions, in plan order) is not built to be measured; else `e`'s own."""
        while True:
            with self._lock:
                core = self._cores.get(e.group)
            if core is not None:  # the same program (`_viewless`)
                found = self.evaluate(core)
                assert isinstance(found, Evaluated), "a view-less core is built before the groups priced from it"
                e = found
                continue
            first = self._like(e.group, 0.0)
            if first is None or first is e:
                return e.kernel
            e = first

    def pair_key(self, producer: Group, consumer: Group) -> tuple | None:
        """With `repeats`, what a pipelined pair's outcome is shared by (`pairing.plan_pipelines`): both groups'
        structures and schedules and the structure of their nodes together (how the producer's values reach the
        consumer). A repeated layer's pair program differs from the first's only in the immediates its data
        sets, like its kernels (`timing_key`): the same timing, accesses and addresses. None without `repeats`."""
        if not self.repeats:
            return None
        return self._like_key(producer, 0.0), self._like_key(consumer, 0.0), self._joint_signature((producer, consumer))

    def parts_overlap(self, parts: list[Evaluated]) -> float:
        """`overlap(parts)`: the predicted overlap at the boundaries of separate kernels run in a row in one
        program. With `repeats`, memoised by the parts' structures, schedules and predicted cycles and their
        nodes' joint structure: a repeated layer's boundaries join programs that differ from the first layer's
        only in immediates (`overlap.early_loads` generates and joins the two kernels' steps for each)."""
        if not self.repeats:
            return self.overlap(parts)
        key = (
            tuple((self._like_key(p.group, 0.0), p.cycles) for p in parts),
            self._joint_signature([p.group for p in parts]),
        )
        with self._lock:
            found = self._overlaps.get(key)
        if found is None:
            found = self.overlap(parts)
            with self._lock:
                found = self._overlaps.setdefault(key, found)
        return found

    def _joint_signature(self, groups: Sequence[Group]) -> str:
        """The structure of the groups' nodes together (`ModelContext.shape_signature`, memoised): how values flow
        between them, which neither group's own signature says."""
        return self.mc.shape_signature(self.mc.graph.in_order(n for g in groups for n in g.nodes))

    def simulated_within(self, kernel: Kernel, budget: int, checked: bool = False) -> int | None:
        """The kernel's cycles on zero inputs (`timing_cycles`, timed), or None once its run is past `budget`
        cycles (>= 1), or cannot finish within it: the watchdog looks at halt, at taken branches and loop ends,
        and every `machine.WATCHDOG_EVERY` instructions, where it also bounds the time the rest of the program
        needs (`simulator.remaining`), so a run stops soon after its bound proves it too slow (resnet18 224's
        unfused layer1 conv, 678k cycles against a 505k budget: after ~150k) and never ends past it."""
        try:
            return self.timed(lambda: timing_cycles(self.mc, kernel, checked, max_cycles=budget))
        except SimulatorTrap as trap:
            if trap.reason.startswith("watchdog"):  # past the budget, or it could not finish within it
                with self._lock:
                    self.stopped += 1
                return None
            raise

    def timed(self, simulate: Callable[[], int]) -> int:
        """Run one planning simulation, counting its host time."""
        start = time.perf_counter()
        try:
            return simulate()
        finally:
            with self._lock:
                self.measure_seconds += time.perf_counter() - start

    def measurement(self, pairs: int = 0) -> Measurement:
        """What this evaluator simulated so far (`pairs`: pipelined programs simulated besides its kernels)."""
        with self._lock:
            kernels = len(self._measured.keys() | self._over.keys()) + pairs
            return Measurement(kernels, self.measure_seconds, self.guarded["measured"], self.guarded["fallback"])

    def count(self, outcome: str) -> None:
        """Count a guard outcome ("measured": a region simulated, "fallback": a rival's groups taken there)."""
        with self._lock:
            self.guarded[outcome] += 1


def _dispatch_variants(ev: Evaluator, cand: Candidate, best: Group) -> tuple[Group | None, Group | None]:
    """The dispatch table of a planned group: (zero-skip kernel for sparse calls, dense kernel for dense calls).

    A group planned dense gets the zero-skip twin of its nodes' best GEMM schedule that planning already priced
    (else the one with the lowest matrix bound), whatever the planned schedule is (an unfused GEMM too): no
    kernel is built for it until a call's data is sparse, and the table prices it at that call's zero-tile
    fraction. A group planned zero-skip keeps its nodes' cheapest dense schedule for calls whose data is dense."""
    dense = [g for g in _narrowed(ev, cand) if not _skips(g)]
    if _skips(best):
        ranked, _ = ev.ranked(dense)
        return best, ranked[0].group if ranked else None
    gemm = [g for g in dense if strategy_of(g).sparse_twin is not None]
    priced = ev.priced(gemm)
    if priced:
        return zero_skip_twin(min(priced, key=lambda e: e.score).group), None
    if gemm:
        return zero_skip_twin(min(gemm, key=lambda g: shape_bound(ev.mc, g))), None
    return None, None


def _choice(ev: Evaluator, cand: Candidate, best: Evaluated, alts: list, reason: str) -> GroupChoice:
    """A picked group as planned: its schedule once the uncertain ones are measured (`Evaluator.settle`) and its
    dispatch table."""
    done, _ = ev.ranked(ev.with_twins(_narrowed(ev, cand)))
    chosen = ev.settle(done) if done and done[0] is best else best
    if chosen is not best:
        alts = [(e.group.schedule, e.cycles) for e in done if e is not chosen]
        reason += f"; measured: beats the predicted best {best.group.schedule}"
        best = chosen
    twin, dense = _dispatch_variants(ev, cand, best.group)
    return GroupChoice(best.group, best.cycles, reason, tuple(alts), twin, dense)


def plan_none(ev: Evaluator, nodes: Collection[str] | None = None, priced: bool = True) -> Plan:
    """Every node (of `nodes`, default all) its own baseline kernel. Not `priced`: nothing is built, each choice's
    predicted cycles are NaN (the plan guard prices a rival's groups only where it takes them, `_guarded`)."""
    graph_nodes = [n for n in ev.mc.graph.nodes if nodes is None or n.name in nodes]
    groups = [baseline_group(n) for n in graph_nodes]
    if not priced:
        return Plan("none", tuple(GroupChoice(g, math.nan, "unfused baseline") for g in groups))
    choices = []
    for node, group, (best, _, reason) in zip(graph_nodes, groups, ev.map(lambda g: ev.best([g]), groups), strict=True):
        if best is None:
            raise EngineError(f"node {node.name!r} cannot be lowered: {reason}")
        choices.append(GroupChoice(group, best.cycles, "unfused baseline"))
    return Plan("none", tuple(choices))


def plan_static(ev: Evaluator, nodes: Collection[str] | None = None) -> Plan:
    """TVM FuseOps: the groups `fuse_ops` forms from op patterns alone, each run by the kernel library's kernels
    with their default schedules and no cost model: from a group's first uncovered node, the longest candidate
    inside the group that is legal and builds (ties by STATIC_FAMILIES' order), else the node's baseline kernel.
    With `nodes`, only the TVM groups inside them are planned (nothing else is built)."""
    mc, choices, rejected = ev.mc, [], []
    by_head: dict[str, list[Candidate]] = {}
    for c in enumerate_candidates(mc.graph):
        if c.family in STATIC_FAMILIES:
            by_head.setdefault(c.nodes[0], []).append(c)
    for tvm_group in fuse_ops(mc.graph):
        if nodes is not None and not set(nodes).issuperset(tvm_group):
            continue
        left = set(tvm_group)
        for name in tvm_group:
            if name not in left:
                continue
            inside = [c for c in by_head.get(name, []) if left.issuperset(c.nodes)]
            inside.sort(key=lambda c: (-len(c.nodes), STATIC_FAMILIES.index(c.family)))
            found = (g for c in inside if (g := _static_group(ev, c, rejected)))
            group = next(found, baseline_group(mc.graph.node(name)))
            best, _, reason = ev.best([group])
            if best is None:
                raise EngineError(f"node {name!r} cannot be lowered: {reason}")
            left -= set(group.nodes)
            why = "TVM FuseOps group " + "+".join(tvm_group)
            choices.append(GroupChoice(group, best.cycles, why))
    return Plan("static", in_execution_order(mc, choices), tuple(rejected))


def _static_group(ev: Evaluator, cand: Candidate, rejected: list) -> Group | None:
    """The candidate with its family's default schedule, when legal and built (else None, the refusal logged)."""
    group = Group(cand.nodes, STATIC_STRATEGY[cand.family])
    decision = structurally_legal(ev.mc, [ev.mc.graph.node(n) for n in cand.nodes], cand.family)
    if decision:
        built = ev.evaluate(group)
        decision = generator_accepts(built if isinstance(built, str) else None)
    if decision:
        return group
    rejected.append((cand.nodes, decision.reason))
    return None


def _narrowed(ev: Evaluator, cand: Candidate) -> list[Group]:
    """An epilogue candidate tries only the GEMM schedules that were best for its matrix node alone (the absorbed
    consumers change the tile traffic little), which keeps planning linear in the number of schedules; the
    caller adds their zero-skip twins on sparse data."""
    groups = schedules(ev.mc, cand)
    if cand.family != "epilogue":
        return groups
    head = Candidate(cand.nodes[:1], "single")
    alone = ev.with_twins([g for g in schedules(ev.mc, head) if strategy_of(g).tiled])
    ranked, _ = ev.ranked(alone, NARROW)  # on sparse data the zero-skip twins rank the schedules
    keep = {(e.group.tile_m, e.group.flatten, e.group.panels, e.group.resident_a) for e in ranked[:NARROW]}
    kept = [g for g in groups if not strategy_of(g).tiled or (g.tile_m, g.flatten, g.panels, g.resident_a) in keep]
    return kept or groups


def plan_dynamic(
    ev: Evaluator, threshold: float = 0.02, nodes: Collection[str] | None = None, guard: bool = True
) -> Plan:
    """Priority fusion: candidates by predicted gain in score (the nodes' best single-node schedules - fused),
    largest first, taking those whose gain exceeds `threshold` of the separate score (a measured one: `fusion_bar`)
    and whose nodes are still free; every remaining node gets its best single-node schedule. GEMM-led candidates
    include their zero-skip variants when the operand's live profile is sparse. With `nodes`, only those nodes are
    planned (candidates inside them; no other node is built or priced) and the plan holds their groups only: local
    re-planning. With `guard`, the plan is then checked region by region against `static` and `none` (`guard_plan`).

    Candidates are weighed (built, priced, their gain measured where uncertain) lazily, branch and bound on the
    gain (`gain_bound`, from shapes and the single-node kernels already priced): one is weighed only while its
    bound reaches the largest gain still to be decided, or when it might contest the candidate about to be taken
    (`may_rival`). A candidate whose nodes are taken before then is never weighed (resnet18 224 int8: 8 conv
    chains, layer 1's whole blocks among them; an fp32 basic block's conv + Add once its conv + Add + Relu, whose
    gain it cannot reach, is taken)."""
    mc = ev.mc
    region = frozenset(n.name for n in mc.graph.nodes) if nodes is None else frozenset(nodes)
    rejected: list[tuple[tuple[str, ...], str]] = []
    options = {
        n.name: ev.with_twins(schedules(mc, Candidate((n.name,), "single"))) for n in mc.graph.nodes if n.name in region
    }
    # the most expensive nodes first (by their schedules' lower bounds), so on a compile pool the longest searches
    # start first; each node's answer does not depend on the order
    names = sorted(options, key=lambda n: -max(map(ev.bound, options[n]), default=0.0))
    singles = ev.map(lambda name: ev.best(options[name]), names)
    alone: dict[str, tuple[Evaluated | None, list, str]] = dict(zip(names, singles, strict=True))
    cands = [c for c in enumerate_candidates(mc.graph) if c.family != "single" and region.issuperset(c.nodes)]
    bounds = [gain_bound(ev, c, [alone[n][0] for n in c.nodes]) for c in cands]

    def weigh(i: int) -> Scored | str:
        """Candidate i built and its gain priced (`fusion_gain`), or why it cannot run."""
        cand = cands[i]
        decision = structurally_legal(mc, [mc.graph.node(n) for n in cand.nodes], cand.family)
        if not decision:
            return decision.reason
        groups = ev.with_twins(_narrowed(ev, cand))
        parts = [alone[n][0] for n in cand.nodes]
        kept = within_reach(ev, groups, parts, threshold)
        if not kept:
            return "every schedule's lower bound leaves no gain past its bar"
        best, alts, reason = ev.best(kept)
        if best is None:
            return reason
        if any(p is None for p in parts):
            return Scored(float("inf"), float("inf"), best, alts, cand, threshold)
        gain, bar = fusion_gain(ev, best, parts, threshold)
        return Scored(gain, sum(p.score for p in parts), best, alts, cand, bar)

    scored: dict[int, Scored] = {}  # the candidates weighed and able to run, by index
    unweighed = set(range(len(cands)))
    rivals: dict[int, set[int]] = {}
    settled: set[int] = set()  # candidates whose gain is measured (`_measured_gain`)
    pending: list[int] = []  # weighed candidates not decided yet, largest gain first
    by_name = {n.name: n for n in mc.graph.nodes}
    planned: dict[str, tuple[Node, ...]] = {}  # the picked groups' nodes, by node
    picked: dict[str, GroupChoice] = {}

    def order(k: int) -> tuple[float, int]:
        return -scored[k].gain, k

    def weigh_all(batch: list[int]) -> None:
        nonlocal rivals
        for j, weighed in zip(batch, ev.map(weigh, batch), strict=True):
            unweighed.discard(j)
            if isinstance(weighed, str):
                rejected.append((cands[j].nodes, weighed))
            else:
                scored[j] = weighed
                pending.append(j)
        pending.sort(key=order)
        rivals = _uncertain_rivals(scored, alone)

    def free(j: int) -> bool:
        return planned.keys().isdisjoint(cands[j].nodes)

    while True:
        # branch and bound: the candidate of the largest gain bound is weighed while it reaches the largest gain
        # still to be decided (one at a time, so what is weighed does not depend on a compile pool)
        reach = max((j for j in unweighed if free(j)), key=lambda j: (bounds[j][0], -j), default=None)
        if reach is not None and (not pending or bounds[reach][0] >= scored[pending[0]].gain):
            weigh_all([reach])
            continue
        if not pending:
            break
        i = pending.pop(0)
        gain, base, best, alts, cand, bar = scored[i]
        if gain <= bar * base:
            rejected.append((best.group.nodes, f"gain {gain:.0f} (score) is at most {bar:.1%} of the separate score"))
            continue
        if not free(i):
            continue
        members = tuple(by_name[n] for n in best.group.nodes)
        ordered = no_cycle_through_outside(mc.graph, members, planned)  # the groups keep an order to run in
        if not ordered:
            rejected.append((best.group.nodes, f"with the groups taken before it: {ordered.reason}"))
            continue
        # candidates not weighed yet that might contest this one: weighed first, then it is decided again
        contenders = sorted(j for j in unweighed if free(j) and may_rival(scored[i], cands[j], bounds[j], alone))
        if contenders:
            weigh_all(contenders)
            pending = sorted([i, *pending], key=order)
            continue
        # rivals still free that might deserve the nodes first: their gains and this one's measured, then re-sorted
        contest = [j for j in rivals.get(i, ()) if j in pending and free(j)]
        unsettled = [k for k in (i, *contest) if k not in settled] if contest else []
        if unsettled:
            for k in unsettled:
                gain, bar = _measured_gain(ev, scored[k], alone, threshold)
                scored[k] = scored[k]._replace(gain=gain, bar=bar)
            settled.update(unsettled)
            pending = sorted([i, *pending], key=order)
            continue
        planned.update(dict.fromkeys(best.group.nodes, members))
        picked[best.group.nodes[0]] = _choice(ev, cand, best, alts, f"gain {gain:.0f} (score)")
    for j in sorted(unweighed):
        rejected.append((cands[j].nodes, f"not weighed: gain bound {bounds[j][0]:.0f} (score), its nodes taken"))
    for node in mc.graph.nodes:
        if node.name in planned or node.name not in region:
            continue
        best, alts, reason = alone[node.name]
        if best is None:
            raise EngineError(f"node {node.name!r} cannot be lowered: {reason}")
        picked[node.name] = _choice(ev, Candidate((node.name,), "single"), best, alts, "cheapest single-node schedule")
    plan = Plan("dynamic", in_execution_order(mc, picked.values()), tuple(rejected))
    return guard_plan(ev, plan, region) if guard else replace(plan, measured=ev.measurement())


def gain_bound(ev: Evaluator, cand: Candidate, parts: list[Evaluated | None]) -> tuple[float, float]:
    """(an upper bound on the candidate's predicted gain, a lower bound on its fused kernel's score), from what is
    known without building it: its nodes' best single kernels (priced) and, per schedule, the larger of the
    schedule's lower bound (`Evaluator.bound`) and, for a head whose drain absorbs the other nodes, the head alone
    in that schedule when priced (`Evaluator.head_floor`, a lower bound on the group's prediction). The boundary
    overlap `fusion_gain` subtracts from the parts is left out (it only lowers the gain), and every schedule is
    counted, the narrowed epilogue ones too (a bound over more schedules is lower). (inf, 0) where a node cannot
    run alone or a schedule skips zero tiles (priced by the data) or has no bound. A measured gain
    (`measured_fusion`: the parts simulated) may pass it: the planner weighs a candidate whose bound falls short
    of a rival's gain only when the rival's uncertainty leaves it a chance (`may_rival`)."""
    if any(p is None for p in parts):
        return math.inf, 0.0
    groups = ev.with_twins(schedules(ev.mc, cand))
    floors = []
    for group in groups:
        head = ev.head_floor(group)
        floor = max(ev.bound(group), head[0] if head is not None else 0.0)
        if _skips(group) or floor <= 0.0:
            return math.inf, 0.0
        floors.append(floor)
    if not floors:  # no schedule: weighed last, refused
        return -math.inf, 0.0
    least = min(floors)
    return sum(p.score for p in parts if p is not None) - least, least


def may_rival(top: Scored, cand: Candidate, bound: tuple[float, float], alone: Mapping[str, tuple]) -> bool:
    """Whether a candidate not weighed yet might contest `top` (about to be taken), the test `_uncertain_rivals`
    makes of two weighed ones with the candidate's gain at its bound: they share nodes and the expected regret of
    taking `top` first is at least REGRET_FLOOR of the smaller separate score. Nodes both hold cancel in the
    difference of the gains; the rest is uncertain by their single kernels' spreads and `top`'s fused kernel's
    (the candidate's fused score is at least its floor, simulated or predicted: no spread), and only by the
    difference in fused scores when the candidate is a head and consumers inside `top`'s (their core is one:
    `_core_spread`)."""
    inside = set(cand.nodes)
    if inside.isdisjoint(top.cand.nodes) or not math.isfinite(top.base):
        return False
    gain, floor = bound
    mine = sum(alone[n][0].sd for n in top.cand.nodes if n not in inside)
    theirs = sum(alone[n][0].sd for n in cand.nodes if n not in top.cand.nodes)
    fused = top.best
    if inside <= set(top.cand.nodes) and cand.nodes[0] == top.cand.nodes[0]:
        fused_sd = fused.sd / fused.score * abs(fused.score - floor) if fused.score else 0.0
    else:
        fused_sd = fused.sd
    regret = expected_regret(-top.gain, math.hypot(fused_sd + mine, theirs), -gain, 0.0)
    return regret >= REGRET_FLOOR * min(top.base, sum(alone[n][0].score for n in cand.nodes))


def within_reach(ev: Evaluator, groups: list[Group], parts: list[Evaluated | None], threshold: float) -> list[Group]:
    """The schedules of a fused candidate that might pass its bar, found without generating any: a schedule
    whose lower bound (`Evaluator.bound`: matrix-unit cycles and the priced compulsory traffic, which bound both
    its predicted and its simulated score) leaves a predicted gain at most `threshold` of the separate score and
    a measured one at most its bar (`fusion_gain`: the parts simulated, as it would) is dropped. resnet18 224: a
    basic block as a conv chain recomputes its halo rows, and in narrow bands re-reads its weights per band
    (layer4.0: ~1.6M cycles streamed against ~0.8M for its two convs), so those schedules are never built. A
    bound so far past the parts' predicted score that the expected regret of not fusing is under REGRET_FLOOR
    (the kernel's score, predicted or simulated, is at least its bound: E[max(0, parts - bound)] bounds that
    regret) drops the schedule without simulating the parts (the stem's conv + Relu in the band schedule: 4.6x).
    All kept for zero-skip kernels (their timing depends on the data) and strategies without a bound."""
    known = [p for p in parts if p is not None]
    if len(known) < len(parts) or any(map(_skips, (*groups, *(p.group for p in known)))):
        return groups
    share, share_sd = sum(p.score for p in known), math.hypot(*(p.sd for p in known))
    passing, low = threshold * share, fusion_bar(threshold, True) * share
    measured: tuple[float, float] | None = None
    kept = []
    for group in groups:
        cycles, score = shape_bound(ev.mc, group), ev.bound(group)
        if cycles <= 0 or share - score > passing:  # no bound, or the prediction might pass
            kept.append(group)
            continue
        if expected_regret(share, share_sd, score, 0.0) < REGRET_FLOOR * share:
            continue  # so far past the parts that `fusion_gain` would not measure it: nor are the parts here
        measured = measured or measured_separate(ev, known)
        separate, apart = measured
        traffic = score - cycles
        if cycles < separate - traffic - passing or (cycles <= apart and cycles < separate - traffic - low):
            kept.append(group)
    return kept


def fusion_bar(threshold: float, saves_cycles: bool) -> float:
    """The share of its nodes' separate score a fusion must save to be taken: `threshold` (a margin for the cost
    model's error, and for a fusion that trades cycles for DRAM bytes), at most REGRET_FLOOR for a measured one
    that saves cycles too (`saves_cycles`: simulated, its timing does not depend on the values; REGRET_FLOOR, the
    stake below which the planner measures no decision). resnet18 224: layer4.0's conv1 + Relu (gain 5,583, under
    2% of the conv's ~320k cycles) measures as many cycles as the conv alone and saves the separate 2,447-cycle
    Relu kernel; resnet50's conv3 + Add + Relu of layer4 (measured gains 1,604-2,178, under 2%) save bytes but
    cost cycles, and are not taken (taken, they cost the small resnet50 22,658 cycles)."""
    return min(threshold, REGRET_FLOOR) if saves_cycles else threshold


def fusion_gain(ev: Evaluator, fused: Evaluated, parts: list[Evaluated], threshold: float) -> tuple[float, float]:
    """The score the fused kernel saves over its nodes' best single kernels (less the overlap their boundaries
    would gain in one program, `Evaluator.overlap`), and the share of the separate score it must exceed
    (`fusion_bar`): predicted, or measured (each kernel simulated once on zero inputs, the fused one only as far as
    it could still pass its bar) when the expected regret of the
    decision the prediction makes (fuse when the gain exceeds `threshold` of the separate score) is at least
    REGRET_FLOOR of that score. The parts of the
    fused kernel's own strategy and schedule are its core (`_core_spread`): their error is the fused kernel's too
    and cancels in the gain. Zero-skip kernels, whose timing depends on the data, are never measured."""
    base = sum(p.score for p in parts) - ev.parts_overlap(parts)
    gain = base - fused.score
    core = [p for p in parts if _schedule(p.group) == _schedule(fused.group)]
    fused_sd = _core_spread(fused, sum(p.cycles for p in core)) if core else fused.sd
    base_sd = sum(p.sd for p in parts if not any(p is c for c in core))
    if gain > threshold * base:
        regret = expected_regret(fused.score, fused_sd, base, base_sd)
    else:
        regret = expected_regret(base, base_sd, fused.score, fused_sd)
    if regret < REGRET_FLOOR * base or any(_skips(e.group) for e in (fused, *parts)):
        return gain, threshold
    return measured_fusion(ev, fused, parts, threshold)


def measured_fusion(ev: Evaluator, fused: Evaluated, parts: list[Evaluated], threshold: float) -> tuple[float, float]:
    """A fused kernel's gain over its parts as separate kernels, simulated (`measured_separate`), and its bar
    (`fusion_bar`). The fused kernel is simulated only as far as it could still pass a bar: past it, it is not
    taken whatever it measures (`plan_dynamic`), so its exact cycles decide nothing, and the gain returned is then
    at most `threshold` of the separate score, with that bar: it does not pass (resnet18 224: the basic blocks as
    conv chains, ~1.2M cycles each against ~1.0M apart)."""
    separate, apart = measured_separate(ev, parts)
    share = sum(p.score for p in parts)
    passing, low = threshold * share, fusion_bar(threshold, True) * share
    traffic = ev.priced_traffic(fused.features)
    limit = max(separate - traffic - passing, min(separate - traffic - low, apart))
    if not limit > 0:  # cannot pass at any cycle count (or overlap hides everything)
        return min(separate - traffic, passing), threshold
    budget = below(limit) + 1  # + 1: float rounding, compared by the caller
    cycles = ev.measured_within(fused, budget)
    if cycles is None:
        return min(separate - traffic - budget, passing), threshold
    return separate - traffic - cycles, fusion_bar(threshold, cycles <= apart)


def _core_spread(fused: Evaluated, core_cycles: float) -> float:
    """The spread of a fused kernel's cycles beyond those of kernels of its own strategy and schedule on some of
    its nodes (its core: a conv or GEMM and the consumers its drain absorbs, against the conv or GEMM alone). The
    core's loop nest is the fused kernel's, so the model's relative error on it is the fused kernel's: it
    cancels in their difference, and only the difference in predicted cycles is uncertain (resnet18's convs
    measure the same cycles with and without the Relu in their drain, 888,707 and 507,074, while each alone is
    predicted within a 10% spread)."""
    relative = fused.sd / fused.cycles if fused.cycles else 0.0
    return relative * abs(fused.cycles - core_cycles)


def _uncertain_rivals(scored: Mapping[int, Scored], alone: Mapping[str, tuple]) -> dict[int, set[int]]:
    """Candidates sharing nodes compete (the larger gain is taken first): by candidate (its index in `scored`),
    the rivals where the expected regret of that order, from the gains' predicted spreads, is at least
    REGRET_FLOOR of the separate score. `plan_dynamic` measures both gains only when the order decides something:
    when one is about to be taken and the other is still free (a rival already beaten to its nodes, or taken,
    needs no measurement). A node both candidates hold adds its single kernel's score to both gains, so its error
    cancels in their difference: each gain's spread is its fused kernel's plus those of its nodes the other does
    not hold. Two fused kernels of one strategy and schedule, one's nodes within the other's, share their core
    the same way (`_core_spread`): only their difference in predicted cycles is uncertain."""

    def own(s: Scored, other: Scored) -> float:
        return sum(alone[n][0].sd for n in s.cand.nodes if n not in other.cand.nodes)

    def spread(a: Scored, b: Scored) -> float:
        """The spread of the difference of a's and b's gains."""
        fa, fb = a.best, b.best
        nested = set(a.cand.nodes) <= set(b.cand.nodes) or set(b.cand.nodes) <= set(a.cand.nodes)
        if nested and _schedule(fa.group) == _schedule(fb.group):
            larger, smaller = (fa, fb) if len(fa.group.nodes) >= len(fb.group.nodes) else (fb, fa)
            return math.hypot(_core_spread(larger, smaller.cycles) + own(a, b), own(b, a))
        return math.hypot(fa.sd + own(a, b), fb.sd + own(b, a))

    finite = [i for i, s in scored.items() if s.base != float("inf")]
    rivals: dict[int, set[int]] = {}
    for x, i in enumerate(finite):
        for j in finite[x + 1 :]:
            a, b = scored[i], scored[j]
            if set(a.cand.nodes).isdisjoint(b.cand.nodes):
                continue
            first, second = (a, b) if a.gain >= b.gain else (b, a)
            regret = expected_regret(-first.gain, spread(first, second), -second.gain, 0.0)
            if regret >= REGRET_FLOOR * min(a.base, b.base):
                rivals.setdefault(i, set()).add(j)
                rivals.setdefault(j, set()).add(i)
    return rivals


def measured_separate(ev: Evaluator, parts: list[Evaluated]) -> tuple[float, float]:
    """The score and the cycles of a candidate's nodes as separate kernels, simulated (each once, on zero inputs):
    their measured scores and cycles less the overlap their boundaries gain in one program
    (`Evaluator.parts_overlap`), as `fusion_gain` predicts it: what a fused kernel's measurements are compared with."""
    overlap = ev.parts_overlap(parts)
    cycles = sum(map(ev.measured_cycles, parts)) - overlap
    return cycles + sum(ev.priced_traffic(p.features) for p in parts), cycles


def _measured_gain(ev: Evaluator, s: Scored, alone: Mapping[str, tuple], threshold: float) -> tuple[float, float]:
    """A scored candidate's gain with its kernels simulated and its bar (`measured_fusion`, as `fusion_gain`
    measures them): the scored ones when a kernel is zero-skip (its timing depends on the data)."""
    parts = [alone[n][0] for n in s.cand.nodes]
    if any(_skips(e.group) for e in (s.best, *parts)):
        return s.gain, s.bar
    return measured_fusion(ev, s.best, parts, threshold)


def _regions(graph: Graph, names: Collection[str], plans: Iterable[Plan]) -> list[frozenset[str]]:
    """The finest partition of `names` in which every group of every plan lies inside one part (groups reaching
    outside `names` join the parts they touch) and no two parts read each other's values both ways (those are
    merged): the regions where the plans can be swapped for each other, whichever plan each region takes, and
    the groups still have an order to run in."""
    parent = {n: n for n in names}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def join(group: Iterable[str]) -> None:
        inside = [n for n in group if n in parent]
        for n in inside[1:]:
            parent[root(n)] = root(inside[0])

    for plan in plans:
        for choice in plan.choices:
            join(choice.group.nodes)
    # parts (by root) and the nodes outside `names` as vertices of the value graph; a strongly connected set of
    # them (parts reading each other's values, possibly through nodes outside) becomes one part
    vertex = {n.name: root(n.name) if n.name in parent else n.name for n in graph.nodes}
    successors: dict[str, set[str]] = {v: set() for v in vertex.values()}
    for node in graph.nodes:
        for value in node.outputs:
            successors[vertex[node.name]].update(vertex[c.name] for c in graph.consumers.get(value, ()))
    for component in strongly_connected(successors):
        join(component)
    parts: dict[str, set[str]] = {}
    for n in names:
        parts.setdefault(root(n), set()).add(n)
    return [frozenset(p) for p in parts.values()]


def strongly_connected(successors: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of a directed graph (Kosaraju's two passes, iterative), those of more
    than one vertex."""
    finished: list[str] = []
    seen: set[str] = set()
    for start in successors:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(successors[start]))]
        while stack:
            v, rest = stack[-1]
            w = next((w for w in rest if w not in seen), None)
            if w is None:
                stack.pop()
                finished.append(v)
            else:
                seen.add(w)
                stack.append((w, iter(successors[w])))
    predecessors: dict[str, list[str]] = {v: [] for v in successors}
    for v, ws in successors.items():
        for w in ws:
            predecessors[w].append(v)
    owner: dict[str, str] = {}
    components = []
    for start in reversed(finished):
        if start in owner:
            continue
        owner[start] = start
        component, todo = [start], [start]
        while todo:
            for w in predecessors[todo.pop()]:
                if w not in owner:
                    owner[w] = start
                    component.append(w)
                    todo.append(w)
        if len(component) > 1:
            components.append(component)
    return components


def guard_plan(ev: Evaluator, plan: Plan, region: frozenset[str]) -> Plan:
    """The dynamic plan, except in the regions (`_regions` of it, `static` and `none`) where static's or none's
    groups take fewer cycles: there the rival's groups are taken. Every region where the plans differ is measured
    (its kernels simulated once on zero inputs; most are already measured or built; a rival's only as far as it
    could still win, `Evaluator.measured_within`), whatever the cost model says: a model confidently wrong
    escapes the regret tests but not this one. A region with a zero-skip group (its timing depends on the data)
    keeps dynamic's. `region`: the nodes planned (local re-planning); rivals'
    groups reaching outside it are not candidates."""
    rivals = [plan_none(ev, region, priced=False), plan_static(ev, region)]
    choices: list[GroupChoice] = []
    for part in _regions(ev.mc.graph, region, [plan, *rivals]):
        mine = [c for c in plan.choices if part.issuperset(c.group.nodes)]
        others = [
            cs
            for p in rivals
            if (cs := [c for c in p.choices if part.issuperset(c.group.nodes)])
            and sum(len(c.group.nodes) for c in cs) == len(part)
            and {c.group for c in cs} != {c.group for c in mine}
        ]
        choices += _guarded(ev, mine, others)
    return Plan(plan.policy, in_execution_order(ev.mc, choices), plan.rejected, measured=ev.measurement())


def _guarded(ev: Evaluator, mine: list[GroupChoice], others: list[list[GroupChoice]]) -> list[GroupChoice]:
    """Dynamic's choices for one region, or a rival's when it measures fewer cycles (see `guard_plan`)."""
    if not others or any(_skips(c.group) for c in mine):
        return mine

    def priced(cs: list[GroupChoice]) -> list[Evaluated] | None:
        """The choices' groups built and priced; None when one cannot be built (a rival that cannot run)."""
        built = [ev.evaluate(c.group) for c in cs]
        return [e for e in built if isinstance(e, Evaluated)] if all(isinstance(e, Evaluated) for e in built) else None

    def within(cs: list[GroupChoice], budget: int) -> int | None:
        """The rival's measured cycles when at most `budget`; its kernels are simulated only while it can still
        come in under the budget, and not at all when their lower bounds add up past it (the plan's kernels run
        one after another: their cycles add up): first from shapes (`strategies.shape_bound`: nothing built;
        the stem's baseline Conv, 1.9M cycles at least against ~0.85M), then from the built kernels' programs
        (`Evaluator.cycle_bound`)."""
        if sum(shape_bound(ev.mc, c.group) for c in cs) > budget:  # past it from shapes alone: nothing built
            return None
        rival = priced(cs)
        if rival is None or sum(map(ev.cycle_bound, rival)) > budget:
            return None
        total = 0
        for e in rival:
            cycles = ev.measured_within(e, budget - total)
            if cycles is None:
                return None
            total += cycles
        return total

    # the best of (measured, index): a rival wins only strictly under the best so far, so it is measured only
    # as far as that budget
    own = priced(mine)
    assert own is not None, "dynamic's groups are built before the guard"
    measured = [sum(map(ev.measured_cycles, own))]
    best = 0
    for i, cs in enumerate(others, 1):
        total = within(cs, measured[best] - 1)
        measured.append(-1 if total is None else total)
        best = i if total is not None and total < measured[best] else best
    ev.count("measured")
    if best == 0:
        return mine
    ev.count("fallback")
    why = f"plan guard: measured {measured[best]} cycles here against dynamic's {measured[0]}"
    rival = priced(others[best - 1])  # all built: it was measured (the unpriced `plan_none` priced here)
    assert rival is not None
    return [
        replace(c, predicted_cycles=e.cycles, reason=f"{c.reason}; {why}")
        for c, e in zip(others[best - 1], rival, strict=True)
    ]


def below(limit: float) -> int:
    """The largest integer strictly below `limit` (a cycle budget: what a rival must measure to beat it)."""
    budget = math.ceil(limit) - 1
    return budget + 1 if budget + 1 < limit else budget


def _program_key(kernel: Kernel) -> tuple:
    """What a kernel's timing is a function of: its program text and its inputs' shapes and storage dtypes (a
    model's repeated layers generate the same programs: the same timing; zero-skip kernels are never measured)."""
    guard = kernel.guard
    return (kernel.program.text, tuple(s for _, s in guard.shapes), tuple(d for _, d in guard.dtypes))


def in_execution_order(mc: ModelContext, choices: Iterable[GroupChoice]) -> tuple[GroupChoice, ...]:
    """The groups in a topological order of the values they pass (each after every group writing a value it
    reads), the ready ones by their last node in graph order: a group storing a value an earlier node reads (side
    by side GEMMs, a chain storing an intermediate) runs before that node's group. EngineError when there is none
    (groups reading each other's values both ways: the planners never form such groups)."""
    graph, choices = mc.graph, list(choices)
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    owner = {name: i for i, c in enumerate(choices) for name in c.group.nodes}
    writer = {v: owner[n.name] for n in graph.nodes if n.name in owner for v in n.outputs}
    readers: list[set[int]] = [set() for _ in choices]
    waiting = [0] * len(choices)
    for node in graph.nodes:
        i = owner.get(node.name)
        if i is None:
            continue
        for j in {writer[v] for v in node.inputs if v in writer} - {i}:
            if i not in readers[j]:
                readers[j].add(i)
                waiting[i] += 1
    key = [order[c.group.nodes[-1]] for c in choices]
    ready = [(key[i], i) for i in range(len(choices)) if not waiting[i]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(choices[i])
        for j in readers[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (key[j], j))
    if len(out) < len(choices):
        stuck = next(c.group.nodes for c, w in zip(choices, waiting, strict=True) if w)
        raise EngineError(f"the plan's groups read each other's values both ways (one: {'+'.join(stuck)}): no order")
    return tuple(out)


def oracle_options(ev: Evaluator) -> dict[str, list[Evaluated]]:
    """Every buildable, legal group variant, by its first node."""
    mc = ev.mc
    options: dict[str, list[Evaluated]] = {}
    for cand in enumerate_candidates(mc.graph):
        if not structurally_legal(mc, [mc.graph.node(n) for n in cand.nodes], cand.family):
            continue
        groups = schedules(mc, cand)
        groups += [t for g in groups if (t := zero_skip_twin(g)) is not None]
        for built in ev.map(ev.evaluate, groups):
            if not isinstance(built, str):
                options.setdefault(cand.nodes[0], []).append(built)
    return options


def plan_oracle(ev: Evaluator, measure: Callable[[Evaluated], float]) -> Plan:
    """Every legal way to partition the graph into groups, each group with its best variant by measurement
    (every variant simulated once); group cycles add up to the plan's, so the cheapest partition is optimal.
    Refuses graphs with more than ORACLE_MAX_PLANS partitions."""
    mc = ev.mc
    best: dict[tuple[str, ...], tuple[float, Evaluated]] = {}
    for variants in oracle_options(ev).values():
        for e in variants:
            cycles = measure(e)
            if e.group.nodes not in best or cycles < best[e.group.nodes][0]:
                best[e.group.nodes] = (cycles, e)
    by_head: dict[str, list[tuple[str, ...]]] = {}
    for nodes in best:
        by_head.setdefault(nodes[0], []).append(nodes)
    names = [n.name for n in mc.graph.nodes]
    count = 0

    def search(i: int, covered: frozenset) -> tuple[float, tuple[tuple[str, ...], ...]]:
        nonlocal count
        while i < len(names) and names[i] in covered:
            i += 1
        if i == len(names):
            count += 1
            if count > ORACLE_MAX_PLANS:
                raise EngineError(f"oracle: more than {ORACLE_MAX_PLANS} legal plans; use it on small graphs")
            return 0.0, ()
        found: tuple[float, tuple[tuple[str, ...], ...]] = (float("inf"), ())
        for nodes in by_head.get(names[i], []):
            if covered & set(nodes):
                continue
            rest, plan = search(i + 1, covered | set(nodes))
            if best[nodes][0] + rest < found[0]:
                found = (best[nodes][0] + rest, (nodes, *plan))
        return found

    _, chosen = search(0, frozenset())
    choices = (GroupChoice(best[n][1].group, best[n][0], f"oracle: best of {count} plans, measured") for n in chosen)
    return Plan("oracle", in_execution_order(mc, choices))


def make_plan(policy: str, ev: Evaluator, measure: Callable[[Evaluated], float] | None = None) -> Plan:
    if policy == "none":
        return plan_none(ev)
    if policy == "static":
        return plan_static(ev)
    if policy == "dynamic":
        return plan_dynamic(ev)
    if policy == "oracle":
        if measure is None:
            raise EngineError("the oracle policy needs a measuring function")
        return plan_oracle(ev, measure)
    raise EngineError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
