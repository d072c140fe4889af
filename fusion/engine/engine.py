"""The runtime: profile -> plan -> compile (worker pool) -> dispatch (guards, dispatch table) -> validate -> record.

`FusionEngine(model, config, dtype).run(inputs)` simulates the model kernel by kernel under the chosen plan
policy and returns the outputs with one `KernelRecord` per dispatched kernel (predicted vs measured cycles, the
learned model's training signal, also fed to an online-learning cost model's `record`). Between calls it watches
the data: a drifted graph input makes the `dynamic` policy re-plan the groups reading it on the new profiles
(zero-skip variants priced at the live zero-tile fraction; int8 range drift re-calibrates and re-plans all), and
per call the dispatch table switches a GEMM group between its dense and zero-skip kernels by the live operand's
sparsity class and zero-tile fraction.

Concurrency: a call takes one consistent snapshot under the engine's lock (the calibration's `_State`, the plan
and the evaluator that made it) after observing drift, re-calibrating and re-planning, and dispatches on that
snapshot only; a re-calibration swaps in a new `_State` whole, so calls in flight finish on the old one.

Faults: a fused kernel that traps, or runs past its cycle budget (`cycle_budget`: a multiple of its predicted
cycles, bounded by the machine's watchdog), fails validation like a wrong result: the unfused path runs instead,
and the kernel is evicted, its signature blocked and the event logged. When shadow validation finds a fused kernel
and the (possibly cached) baseline kernels disagreeing, the baseline is rebuilt from scratch before anything is
judged: a poisoned cache entry cannot make a correct fused kernel look wrong.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from fusion.cost.analytic import AnalyticCostModel
from fusion.cost.interface import CostModel, KernelFeatures
from fusion.engine.cache import KernelCache, kernel_key, schedule_key
from fusion.engine.context import ModelContext
from fusion.engine.drift import Drift, DriftThresholds, detect_drift, outgrew_calibration
from fusion.engine.errors import CodegenError, EngineError
from fusion.engine.execute import KernelRun, run_kernel, to_real
from fusion.engine.features import kernel_features
from fusion.engine.footprint import check_fits_dram
from fusion.engine.guards import check_guard
from fusion.engine.kernel import Kernel, build_kernel, expected_guard, group_subgraph
from fusion.engine.pairing import plan_pipelines
from fusion.engine.pipelined import build_pipelined, pair_schedule
from fusion.engine.plan import Group, GroupChoice, PipelinedPair, Plan, baseline_group
from fusion.engine.planner import Evaluated, Evaluator, in_execution_order, make_plan, plan_dynamic
from fusion.engine.profile import TensorProfile, data_class, profile_tensor
from fusion.engine.program import LinkedProgram
from fusion.engine.program_run import EXECUTIONS, ProgramCall, host_launches, planning_overlap, run_as_program
from fusion.engine.strategies import strategy_of
from fusion.engine.validation import ValidationPolicy, compare
from fusion.engine.workers import CompilePool, capped, default_workers
from fusion.errors import ShapeError
from fusion.graph.hashing import structural_hash
from fusion.graph.ir import Graph
from fusion.graph.shapes import with_input_shapes
from fusion.lower.compiler import check_inputs, check_supported, load_graph
from fusion.lower.errors import LoweringError
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantParams
from simulator.config import MachineConfig, load_config
from simulator.errors import SimulatorTrap

Builder = Callable[[ModelContext, Group, str], Kernel]

CYCLE_BUDGET_FACTOR = 16  # a fused kernel may run this many times its predicted cycles before it counts as hung
MIN_CYCLE_BUDGET = 200_000  # ... and at least this many cycles (a cost model may predict far too few)


def cycle_budget(predicted: float, watchdog: int) -> int:
    """The cycles a fused kernel may run: CYCLE_BUDGET_FACTOR x its prediction, at least MIN_CYCLE_BUDGET, never
    past the machine's watchdog. Past it the kernel is a validation failure, not a ten-minute hang."""
    return int(min(watchdog, max(MIN_CYCLE_BUDGET, CYCLE_BUDGET_FACTOR * predicted)))


@dataclass(frozen=True)
class EngineOptions:
    policy: str = "dynamic"
    validation: ValidationPolicy = field(default_factory=ValidationPolicy)
    drift: DriftThresholds = field(default_factory=DriftThresholds)
    workers: int = field(default_factory=default_workers)  # compile processes (1: none; capped at the cores)
    allow_rounding_change: bool = False
    checked: bool = False  # run the simulator's race checker on every kernel
    pipeline: bool = True  # dynamic: run complementary consecutive groups as one pipelined program
    execution: str = "program"  # program: the plan as one program; host: kernel by kernel, launches priced

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise EngineError(f"execution must be one of {', '.join(EXECUTIONS)}, got {self.execution!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise EngineError(f"workers must be an integer >= 1, got {self.workers!r}")


@dataclass(frozen=True)
class KernelRecord:
    """One dispatched kernel in one call."""

    nodes: tuple[str, ...]
    schedule: str
    data_class: str
    predicted_cycles: float
    measured_cycles: int
    dram_bytes: int
    unfused_dram_bytes: int  # the same nodes' kernels, counted from their programs
    energy_pj: float
    cache_hit: bool
    validated: bool
    fallback: str  # why the unfused path ran instead ("" when the planned kernel ran)
    features: KernelFeatures | None
    learned: bool = False  # already passed to the cost model's `record` (an online-learning model)
    pipelined_with: tuple[str, ...] = ()  # a pipelined pair's record: the consumer's nodes (also in `nodes`)


@dataclass(frozen=True)
class ValidationEvent:
    call: int
    nodes: tuple[str, ...]
    schedule: str
    value: str
    max_abs_diff: float
    action: str


@dataclass(frozen=True)
class CallResult:
    outputs: dict[str, np.ndarray]
    records: tuple[KernelRecord, ...]
    drifts: tuple[Drift, ...]
    replanned: tuple[tuple[str, ...], ...]
    dispatch_seconds: float  # host time spent dispatching (profiling, keys, cache, guards), simulation excluded
    params: QuantParams | None = None  # the int8 calibration this call ran with (None for fp32)
    launch_cycles: int = 0  # the host's kernel launches (`MachineConfig.launch_cycles` each; program: one)
    program: ProgramCall | None = None  # execution="program": the one program's run

    @property
    def cycles(self) -> int:
        """The accelerator's cycles: the program's, or (host) the kernels' sum."""
        return self.program.cycles if self.program is not None else sum(r.measured_cycles for r in self.records)

    @property
    def model_cycles(self) -> int:
        """The model's cycles with its launches: what the two execution models are compared on."""
        return self.cycles + self.launch_cycles

    @property
    def dram_bytes(self) -> int:
        return sum(r.dram_bytes for r in self.records)

    @property
    def energy_pj(self) -> float:
        return sum(r.energy_pj for r in self.records)


def load_model(model: Graph | onnx.ModelProto | str | Path) -> Graph:
    """The model's graph; an UnsupportedOpError listing every node the accelerator cannot run."""
    graph = load_graph(model)
    check_supported(graph)
    return graph


@dataclass(eq=False)
class _State:
    """One calibration of the model: its context and what is memoised from it (signatures, cache keys, feature
    rows, unfused traffic). Replaced whole on re-calibration, never cleared in place, so a call dispatching on
    a state sees one calibration throughout."""

    mc: ModelContext
    calibrated: dict[str, TensorProfile]  # graph inputs' profiles when calibrated (int8 range drift is from these)
    signatures: dict[Group, str] = field(default_factory=dict)
    keys: dict[tuple[Group, str], str] = field(default_factory=dict)
    pair_keys: dict[tuple[Group, Group], str] = field(default_factory=dict)
    unfused: dict[Group, int] = field(default_factory=dict)
    features: dict[str, KernelFeatures] = field(default_factory=dict)


@dataclass(frozen=True)
class _Target:
    """A kernel being dispatched: its cache key, blocking signature, the group it computes (shadow validation's
    reference) and schedule."""

    key: str
    signature: str
    reference: Group
    schedule: str


@dataclass(frozen=True)
class _Call:
    """What one call dispatches on, taken under the lock: the state, the plan and the evaluator that made it."""

    state: _State
    plan: Plan
    evaluator: Evaluator | None
    index: int


class FusionEngine:
    def __init__(
        self,
        model: Graph | onnx.ModelProto | str | Path,
        config: MachineConfig | str = "base",
        dtype: str = "fp32",
        options: EngineOptions | None = None,
        cost_model: CostModel | None = None,
        cache: KernelCache | None = None,
        samples: Sequence[Mapping[str, np.ndarray]] | None = None,
        builder: Builder = build_kernel,
    ) -> None:
        self.graph = load_model(model)
        self.config = load_config(config)
        check_fits_dram(self.graph, self.config)
        self.config_hash = self.config.config_hash()
        self.dtype = dtype
        self.options = options or EngineOptions()
        self.cost_model = cost_model or AnalyticCostModel()
        self.cache = cache if cache is not None else KernelCache()  # (an empty cache is falsy)
        if builder is not build_kernel and self.options.execution == "program":
            raise EngineError(
                "builder= replaces host-dispatched kernels: a program is linked from the generators, "
                "use EngineOptions(execution='host')"
            )
        self.builder = builder
        self._state: _State | None = None
        self._predictions: dict[KernelFeatures, float] = {}
        self.plan: Plan | None = None
        self.plan_seconds = 0.0
        self.plan_evaluations: Counter[tuple[str, ...]] = Counter()
        self.compile_seconds = 0.0  # JIT wall time: the plan's kernels through the cache on the worker pool
        self.codegen_seconds = 0.0  # cold codegen + link time of those kernels (summed over kernels)
        self.events: list[ValidationEvent] = []
        self.blocked: set[str] = set()
        self.profiles: dict[str, TensorProfile] = {}
        self.calls = 0
        self._runs: dict[str, int] = {}
        self._oracle_values: dict[str, np.ndarray] | None = None  # live values the oracle measures kernels on
        self._zero_fraction: dict[str, float] = {}  # live zero-tile fraction of each GEMM group's operand
        self._evaluator: Evaluator | None = None
        self._costs: object = None  # the cost model's `generation` the plan was made with (online learning)
        self._pool: CompilePool | None = None  # compile workers of the current model context
        self._unions: dict[PipelinedPair, Group] = {}  # a pipelined pair's nodes as one group (`_union`)
        self._by_shape: dict[tuple, FusionEngine] = {}  # specialisations for other input shapes (`for_inputs`)
        self._last_engine: FusionEngine | None = None  # the specialisation of the previous call (shape drift)
        # execution="program": linked plans per calibration state (`program_run`), dropped with the state
        self.programs: weakref.WeakKeyDictionary[_State, dict[tuple, LinkedProgram]] = weakref.WeakKeyDictionary()
        # An online-learning cost model (duck-typed, e.g. `OnlineHpm`): fed every simulated kernel's counters.
        self._learner: Callable[[KernelFeatures, MachineConfig, Mapping[str, float]], None] | None = getattr(
            self.cost_model, "record", None
        )
        self._lock = threading.RLock()
        if dtype == "fp32" or samples:
            self._set_context(self._params(samples), self._widest(samples or ()))

    @property
    def mc(self) -> ModelContext | None:
        """The current calibration's model context (None for int8 before the first call or samples)."""
        return None if self._state is None else self._state.mc

    # --- setup ------------------------------------------------------------------------------

    def _params(self, samples: Sequence[Mapping[str, np.ndarray]] | None) -> QuantParams | None:
        if self.dtype == "fp32":
            return None
        if self.dtype != "int8":
            raise EngineError(f"dtype must be fp32 or int8, got {self.dtype!r}")
        return calibrate(self.graph, [check_inputs(self.graph, s) for s in samples or ()])

    def _set_context(self, params: QuantParams | None, calibrated: Mapping[str, TensorProfile] | None = None) -> None:
        """A new state (a new calibration); calls in flight keep dispatching on theirs."""
        with self._lock:
            self.close()
            mc = ModelContext(self.graph, self.config, self.dtype, params, self.options.allow_rounding_change)
            self._state = _State(mc, dict(calibrated or {}))
            self.plan = None
            self._evaluator = None

    def close(self) -> None:
        """Stop the compile workers (a later plan starts new ones); also done when the engine is collected."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _compile_pool(self) -> CompilePool | None:
        """The current context's worker processes, started on first use (from the calling thread, before any
        planning thread exists)."""
        assert self.mc is not None
        if self._pool is None and capped(self.options.workers) > 1:
            self._pool = CompilePool(self.mc, self.options.workers)
            weakref.finalize(self, self._pool.close)
        return self._pool

    def _signature(self, st: _State, group: Group) -> str:
        """Op signature of a group: its subgraph's structural hash plus the int8 scales of its values and its
        matrix nodes' quantization (a bias correction is calibrated data the scales do not determine)."""
        if group not in st.signatures:
            sub = group_subgraph(self.graph, group)
            values = [*sub.inputs, *(v for n in sub.nodes for v in n.outputs)]
            scales = tuple(st.mc.scale(v) for v in values)
            matrix = () if st.mc.qplan is None else tuple(st.mc.qplan.matrix.get(n.name) for n in sub.nodes)
            st.signatures[group] = hashlib.sha256(repr((structural_hash(sub), scales, matrix)).encode()).hexdigest()
        return st.signatures[group]

    def make_plan(self, policy: str | None = None) -> Plan:
        """Plan with the current profiles; the oracle measures each candidate kernel on the simulator."""
        with self._lock:
            assert self._state is not None
            st, env = self._state, self._oracle_values
            return self._planned(
                lambda ev: make_plan(policy or self.options.policy, ev, lambda e: self._measure(st, e, env))
            )

    def replan_region(self, region: frozenset[str]) -> Plan:
        """Local re-planning: the `dynamic` planner on the current profiles restricted to `region` (a union of
        the current plan's groups); every other group keeps its `GroupChoice` (the same object: nothing of it is
        built or priced again)."""
        with self._lock:
            assert self.mc is not None and self.plan is not None
            mc, old = self.mc, self.plan

            def plan(ev: Evaluator) -> Plan:
                fresh = plan_dynamic(ev, nodes=region)
                kept = [c for c in old.choices if region.isdisjoint(c.group.nodes)]
                rejected = (*(r for r in old.rejected if region.isdisjoint(r[0])), *fresh.rejected)
                new = Plan(old.policy, in_execution_order(mc, [*kept, *fresh.choices]), rejected)
                return plan_pipelines(ev, new, region, old.pipelined) if self.options.pipeline else new

            return self._planned(plan, pipelines=False)

    def _planned(self, policy: Callable[[Evaluator], Plan], pipelines: bool = True) -> Plan:
        """Run a planning function with a fresh evaluator (the current profiles), then (dynamic) pick the pipelined
        pairs (`pipelines`: the function did not) and compile the plan. Called under the lock."""
        assert self._state is not None
        start = time.perf_counter()
        self._costs = getattr(self.cost_model, "generation", None)
        overlap = planning_overlap(self._state.mc, self.options.execution)  # a program's boundaries, priced
        ev = Evaluator(self._state.mc, self.cost_model, self.profiles, pool=self._compile_pool(), overlap=overlap)
        plan = policy(ev)
        if plan.policy == "dynamic" and self.options.pipeline and pipelines:
            plan = plan_pipelines(ev, plan)
        self._evaluator = ev
        self.plan_evaluations = Counter(ev.evaluations)  # the planning work, by group nodes (before compiling)
        self.plan_seconds = time.perf_counter() - start
        self._compile_plan(self._state, ev, plan)
        return plan

    def _measure(self, st: _State, e: Evaluated, env: Mapping[str, np.ndarray] | None) -> float:
        if env is None:
            raise EngineError("the oracle measures kernels on real data: call run() with inputs")
        return float(run_kernel(st.mc, e.kernel, env).cycles)

    def _compile_plan(self, st: _State, ev: Evaluator, plan: Plan) -> None:
        """JIT: every planned kernel through the cache, on a worker pool, most expensive first."""
        start = time.perf_counter()
        choices = sorted(plan.choices, key=lambda c: -c.predicted_cycles)
        with ThreadPoolExecutor(max_workers=capped(self.options.workers)) as pool:
            kernels = list(pool.map(lambda c: self._kernel(st, c.group, "any", ev, build=True)[0], choices))
            kernels += list(pool.map(lambda p: self._pair_kernel(st, p)[0], plan.pipelined))
        self.compile_seconds = time.perf_counter() - start
        self.codegen_seconds = sum(k.compile_seconds for k in kernels)

    def _key(self, st: _State, group: Group, sparsity: str) -> str:
        """The cache key of a group's kernel for a data class (memoised: dispatch must stay cheap)."""
        memo = (group, sparsity)
        if memo not in st.keys:
            guard = expected_guard(st.mc, group_subgraph(self.graph, group), group, sparsity)
            st.keys[memo] = kernel_key(self._signature(st, group), group, guard)
        return st.keys[memo]

    def _kernel(
        self, st: _State, group: Group, sparsity: str, ev: Evaluator | None = None, build: bool = False
    ) -> tuple[Kernel, bool, str]:
        """A group's kernel through the cache. An unfused kernel the planner already built is taken from its
        evaluator (`build`: the evaluator may build it, on its worker pool: planning only, under the lock)."""
        key = self._key(st, group, sparsity)
        fused = group.fused or not strategy_of(group).baseline
        builder = self.builder if fused else build_kernel

        def make() -> Kernel:
            if builder is build_kernel and ev is not None and not strategy_of(group).skips_zero_tiles:
                done = ev.evaluate(group) if build else next(iter(ev.priced([group])), None)
                if done is not None and not isinstance(done, str):
                    return done.kernel
            return builder(st.mc, group, sparsity)

        kernel, hit = self.cache.get_or_build(key, make)
        return kernel, hit, key

    def _pair_kernel(self, st: _State, pair: PipelinedPair) -> tuple[Kernel, bool, str]:
        """A pipelined pair's program through the cache: its key is the union's signature, guard and both
        schedules."""
        producer, consumer = pair.producer, pair.consumer
        key = st.pair_keys.get((producer, consumer))
        if key is None:
            union = self._union(pair)
            guard = expected_guard(st.mc, group_subgraph(self.graph, union), producer, "any")
            key = schedule_key(self._signature(st, union), pair_schedule(producer, consumer), guard)
            st.pair_keys[(producer, consumer)] = key
        kernel, hit = self.cache.get_or_build(key, lambda: build_pipelined(st.mc, producer, consumer))
        return kernel, hit, key

    def _union(self, pair: PipelinedPair) -> Group:
        """The pair's nodes in graph order, as a group (its signature and shadow validation); memoised (dispatch
        asks on every call)."""
        union = self._unions.get(pair)
        if union is None:
            union = Group(self.graph.in_order((*pair.producer.nodes, *pair.consumer.nodes)), "unfused")
            self._unions[pair] = union
        return union

    # --- running ----------------------------------------------------------------------------
    def for_inputs(self, inputs: Mapping[str, np.ndarray]) -> FusionEngine:
        """The engine that runs these inputs: this one at the model's input shapes; for other shapes (another
        batch size) an engine for the graph re-typed to them, made on first use and kept. It shares this engine's
        options, cost model, kernel cache and (int8) calibration, and plans and profiles on its own: a shape is a
        specialisation, so switching back and forth re-plans nothing and dispatches cached kernels."""
        return self._for_shapes(self._shapes(inputs))

    def _shapes(self, inputs: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        return {v: tuple(np.shape(inputs[v])) for v in self.graph.inputs if v in inputs}

    def _for_shapes(self, shapes: dict[str, tuple[int, ...]]) -> FusionEngine:
        if len(shapes) != len(self.graph.inputs) or all(s == self.graph.types[v].shape for v, s in shapes.items()):
            return self  # the model's own shapes (or missing inputs, which `check_inputs` reports)
        key = tuple(sorted(shapes.items()))
        with self._lock:
            engine = self._by_shape.get(key)
            if engine is None:
                try:
                    graph = with_input_shapes(self.graph, shapes)
                except ShapeError as err:
                    raise EngineError(f"the model cannot run at input shapes {dict(shapes)}: {err}") from None
                engine = FusionEngine(
                    graph, self.config, self.dtype, self.options, self.cost_model, self.cache, builder=self.builder
                )
                if self._state is not None and self.mc.params is not None:
                    engine._set_context(self.mc.params, self._state.calibrated)
                self._by_shape[key] = engine
        return engine

    def run(self, inputs: Mapping[str, np.ndarray]) -> CallResult:
        shapes = self._shapes(inputs)
        engine = self._for_shapes(shapes)
        with self._lock:
            moved = self._last_engine is not None and self._last_engine is not engine
            self._last_engine = engine
        result = engine._run(inputs)
        if not moved:
            return result
        shape_drift = Drift(", ".join(self.graph.inputs), f"shapes -> {[list(s) for s in shapes.values()]}")
        return replace(result, drifts=(shape_drift, *result.drifts))

    def _run(self, inputs: Mapping[str, np.ndarray]) -> CallResult:
        checked_inputs = check_inputs(self.graph, inputs)
        with self._lock:  # observe, re-calibrate, re-plan and take the call's snapshot as one step
            live = {v: checked_inputs[v] for v in self.graph.inputs}
            if self._state is None:
                self._set_context(self._params([checked_inputs]), self._profiles(live))
            drifts = self._observe(live)
            drifts = (*drifts, *self._outgrown(drifts))
            replanned = (*self._replan_for_costs(), *self._replan(drifts, checked_inputs))
            if self.plan is None:
                self._oracle_values = self._oracle_env(checked_inputs)
                self.plan = self.make_plan()
            assert self._state is not None
            c = _Call(self._state, self.plan, self._evaluator, self.calls)
            self.calls += 1
        if self.options.execution == "program":
            return run_as_program(self, c, checked_inputs, drifts, replanned)
        env: dict[str, np.ndarray] = dict(checked_inputs)
        records = []
        dispatch = 0.0
        choices = list(c.plan.choices)
        while choices:
            choice = choices.pop(0)
            pair = c.plan.pair_from(choice.group)
            if pair is not None and choices and choices[0].group == pair.consumer:
                done, seconds = self._dispatch_pair(c, pair, choice, choices.pop(0), env)
            else:
                done, seconds = self._dispatch(c, choice, env)
                done = [done]
            records.extend(done)
            dispatch += seconds
        mc = c.state.mc
        outputs = {v: to_real(mc, v, env[v]) for v in self.graph.outputs}
        launches = host_launches(self.graph, records) * self.config.launch_cycles
        return CallResult(outputs, tuple(records), drifts, replanned, dispatch, mc.params, launches)

    def _oracle_env(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Live values for the oracle's measurements: the unfused plan's run on these inputs."""
        if self.options.policy != "oracle":
            return None
        assert self.mc is not None
        env = dict(inputs)
        for node in self.graph.nodes:
            group = baseline_group(node)
            env.update(run_kernel(self.mc, build_kernel(self.mc, group), env).outputs)
        return env

    def _widest(self, samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, TensorProfile]:
        """Each input's profile over calibration samples: the one of largest range (the scales cover it)."""
        found = [self._profiles({v: s[v] for v in self.graph.inputs if v in s}) for s in samples]
        return {
            v: max((p[v] for p in found if v in p), key=lambda t: t.max_abs)
            for v in self.graph.inputs
            if any(v in p for p in found)
        }

    def _profiles(self, values: Mapping[str, np.ndarray]) -> dict[str, TensorProfile]:
        return {k: profile_tensor(v, self.config.array_size) for k, v in values.items()}

    def _observe(self, values: Mapping[str, np.ndarray]) -> tuple[Drift, ...]:
        new = self._profiles(values)
        drifts = detect_drift(self.profiles, new, self.options.drift)
        self.profiles.update(new)
        return drifts

    def _outgrown(self, drifts: tuple[Drift, ...]) -> tuple[Drift, ...]:
        """int8: inputs whose live range outgrew the calibration's (`outgrew_calibration`), as range drifts, unless
        this call's drift already says so. Measured from the calibration, so a range creeping call by call, or
        changing together with the sparsity class (which `detect_drift` reports instead), is caught."""
        st = self._state
        if st is None or not st.mc.int8:
            return ()
        said = {d.tensor for d in drifts if d.reason.startswith("range")}
        return tuple(
            Drift(v, f"range max|x| {cal.max_abs:.3g} at calibration -> {self.profiles[v].max_abs:.3g}")
            for v, cal in st.calibrated.items()
            if v not in said and outgrew_calibration(cal, self.profiles[v], self.options.drift)
        )

    def _replan_for_costs(self) -> tuple[tuple[str, ...], ...]:
        """An online-learning cost model swapped in a retrained model (its `generation` moved since the plan was
        made): plan again with the new predictions. Returns the groups whose choice changed."""
        if self.plan is None or getattr(self.cost_model, "generation", None) == self._costs:
            return ()
        old = {c.group for c in self.plan.choices}
        self.plan = self.make_plan()
        return tuple(c.group.nodes for c in self.plan.choices if c.group not in old)

    def _replan(self, drifts: tuple[Drift, ...], inputs: Mapping[str, np.ndarray]) -> tuple[tuple[str, ...], ...]:
        """Re-plan on drift. int8 range drift re-calibrates: new scales change every kernel downstream of the
        input (its value's scale and each derived one), so the whole plan is made again. The range is measured
        from the calibration's profiles, not the previous call's, so a range creeping call by call still
        re-calibrates. Otherwise the `dynamic` policy re-plans locally (`replan_region`): only the groups reading
        a drifted tensor (the only profiles the planner reads are the graph inputs', so no other group's
        candidates or prices changed) are planned again, on the new profiles (new zero-tile fractions, zero-skip
        variants); every other group keeps its choice. Returns the re-planned groups (all of them after a
        re-calibration)."""
        st = self._state
        if self.plan is None or st is None:
            return ()
        if st.mc.int8 and any(d.reason.startswith("range") for d in drifts):
            everything = tuple(c.group.nodes for c in self.plan.choices)
            self._set_context(self._params([inputs]), {v: self.profiles[v] for v in self.graph.inputs})
            return everything
        if not drifts:
            return ()
        drifted = {d.tensor for d in drifts}
        affected = [c for c in self.plan.choices if drifted & set(group_subgraph(self.graph, c.group).inputs)]
        if self.options.policy != "dynamic" or not affected:
            return tuple(c.group.nodes for c in affected)
        region = frozenset(n for c in affected for n in c.group.nodes)
        self.plan = self.replan_region(region)
        return tuple(c.group.nodes for c in self.plan.choices if region.issuperset(c.group.nodes))

    def _variant(self, c: _Call, choice: GroupChoice, env: Mapping[str, np.ndarray]) -> tuple[Group, str]:
        """The dispatch table: by the GEMM operand's live data class, the zero-skip kernel on sparse data when
        the cost model (at the live zero-tile fraction) prefers it, else the dense kernel."""
        if choice.zero_skip is None:
            return choice.group, "any"
        head = self.graph.node(choice.group.nodes[0]).inputs[0]
        live = env[head] if head in env else self.graph.constants[head]  # a constant left operand (W @ x)
        sparsity, fraction = data_class(live, self.config.array_size)
        self._zero_fraction[head] = fraction
        dense = choice.dense or choice.group
        if sparsity != "sparse":
            return dense, "dense"
        if dense is choice.zero_skip:
            return dense, "sparse"
        if not self.variant_builds(c, choice.zero_skip, "sparse"):
            return dense, "sparse"
        twin, _, key = self._kernel(c.state, choice.zero_skip, "sparse", c.evaluator)
        dense_cycles = choice.predicted_cycles if choice.group is dense else self._predicted(c, dense)
        if self._predict(self._feature_row(c.state, key, twin, choice.zero_skip)) < dense_cycles:
            return choice.zero_skip, "sparse"
        return dense, "sparse"

    def variant_builds(self, c: _Call, group: Group, sparsity: str) -> bool:
        """Whether a dispatch-table variant can be generated. The planner names a zero-skip twin (or a dense
        alternative) without building it (`planner._dispatch_variants`); one its generator refuses leaves the table
        with the planned kernel only, rather than failing the call."""
        try:
            self._kernel(c.state, group, sparsity, c.evaluator)
        except (CodegenError, LoweringError):
            return False
        return True

    def _predicted(self, c: _Call, group: Group) -> float:
        kernel, _, key = self._kernel(c.state, group, "any", c.evaluator)
        return self._predict(self._feature_row(c.state, key, kernel, group))

    def _dispatch(self, c: _Call, choice: GroupChoice, env: dict[str, np.ndarray]) -> tuple[KernelRecord, float]:
        st = c.state
        start = time.perf_counter()
        group, data_class = self._variant(c, choice, env)
        sparsity = "sparse" if strategy_of(group).skips_zero_tiles else "any"
        fallback = ""
        signature = self._signature(st, group)
        if signature in self.blocked:
            fallback = "fusion blocked for this signature after a failed validation"
        else:
            kernel, hit, key = self._kernel(st, group, sparsity, c.evaluator)
            decision = check_guard(kernel.guard, env, data_class if sparsity != "any" else "any", self.config_hash)
            if not decision:
                fallback = f"guard failed: {decision.reason}"
        seconds = time.perf_counter() - start
        if fallback:
            return self._run_unfused(c, choice.group, env, fallback), seconds
        fused = group.fused or not strategy_of(group).baseline
        feats = self._feature_row(st, key, kernel, group)
        predicted = self._predict(feats)
        target = _Target(key, signature, group, group.schedule)
        run = self._run_checked(c, target, kernel, env, fused, predicted)
        failure = run if isinstance(run, str) else ""
        if not failure:
            assert isinstance(run, KernelRun)
            validated, failure = self._validate(c, target, run, env, fused)
        if failure:
            return self._run_unfused(c, group, env, failure), seconds
        assert isinstance(run, KernelRun)
        env.update(run.outputs)
        learned = self._learn(feats, run)
        record = KernelRecord(
            group.nodes,
            group.schedule,
            data_class,
            predicted,
            run.cycles,
            run.dram_read_bytes + run.dram_write_bytes,
            self._unfused_bytes(c, group),
            run.energy_pj,
            hit,
            validated,
            "",
            feats,
            learned,
        )
        return record, seconds

    def _dispatch_pair(
        self, c: _Call, pair: PipelinedPair, first: GroupChoice, second: GroupChoice, env: dict[str, np.ndarray]
    ) -> tuple[list[KernelRecord], float]:
        """A pipelined pair as one kernel, under the same guard and shadow validation as a group; the two groups
        are dispatched apart when the dispatch table picks another variant for either, the guard fails, the pair
        is blocked, or it traps, overruns or fails validation (then it is evicted and blocked)."""
        st = c.state
        start = time.perf_counter()
        union = self._union(pair)
        signature = f"{self._signature(st, union)}|pipelined"  # blocking the pair blocks no fused group of its nodes
        planned = self._variant(c, first, env)[0] == first.group  # (the planner pairs no consumer with a table)
        kernel, hit, key = self._pair_kernel(st, pair)
        if not planned or signature in self.blocked or not check_guard(kernel.guard, env, "any", self.config_hash):
            return self._apart(c, first, second, env, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        schedule = pair_schedule(pair.producer, pair.consumer)
        predicted = sum(self._predicted(c, g.group) for g in (first, second))
        target = _Target(key, signature, union, schedule)
        run = self._run_checked(c, target, kernel, env, True, predicted)
        if isinstance(run, str):
            return self._apart(c, first, second, env, seconds)
        tolerance = max((self._tolerance(st, g.group) for g in (first, second)), key=lambda p: (p.atol, p.rtol))
        validated, failure = self._validate(c, target, run, env, True, tolerance)
        if failure:
            return self._apart(c, first, second, env, seconds)
        env.update(run.outputs)
        record = KernelRecord(
            (*pair.producer.nodes, *pair.consumer.nodes),
            schedule,
            "any",
            predicted,
            run.cycles,
            run.dram_read_bytes + run.dram_write_bytes,
            self._unfused_bytes(c, first.group) + self._unfused_bytes(c, second.group),
            run.energy_pj,
            hit,
            validated,
            "",
            None,
            pipelined_with=pair.consumer.nodes,
        )
        return [record], seconds

    def _run_checked(
        self, c: _Call, t: _Target, kernel: Kernel, env: Mapping[str, np.ndarray], fused: bool, predicted: float
    ) -> KernelRun | str:
        """Run a kernel; a fused one within its cycle budget. A fused kernel's trap or overrun is a failure
        (evicted, blocked, logged; returns why the unfused path runs instead); an unfused kernel's propagates."""
        budget = cycle_budget(predicted, self.config.max_cycles) if fused else None
        try:
            return run_kernel(c.state.mc, kernel, env, checked=self.options.checked, max_cycles=budget)
        except SimulatorTrap as trap:
            if not fused:
                raise
            what = f"over its cycle budget of {budget}" if "watchdog" in trap.reason else "trapped"
            return self._reject(c, t, "", float("inf"), f"{what}: {trap}")

    def _reject(self, c: _Call, t: _Target, value: str, diff: float, reason: str) -> str:
        """A fused kernel failed: evict it, block its signature, log the event; returns the fallback reason."""
        self.cache.evict(t.key)
        with self._lock:
            self.blocked.add(t.signature)
            event = ValidationEvent(c.index, t.reference.nodes, t.schedule, value, diff, f"evicted, blocked: {reason}")
            self.events.append(event)
        return f"validation failed ({reason})"

    def _validate(
        self,
        c: _Call,
        t: _Target,
        run: KernelRun,
        env: Mapping[str, np.ndarray],
        fused: bool,
        tolerance: ValidationPolicy | None = None,
    ) -> tuple[bool, str]:
        """Count a kernel's run and, when the policy says so, shadow-validate it against its reference group's
        nodes run unfused (tolerance: the reference's). When they disagree, the unfused kernels are rebuilt from
        scratch (a cached one may be wrong: it is replaced) and the fused result is judged against the fresh
        ones. Returns (validated, failure): on failure the kernel is evicted, its signature blocked and the event
        recorded, and `failure` says why the unfused path runs instead."""
        with self._lock:
            count = self._runs.get(t.key, 0)
            self._runs[t.key] = count + 1
        if not (fused and self.options.validation.should_validate(count)):
            return False, ""
        policy = tolerance or self._tolerance(c.state, t.reference)
        if compare(run.outputs, self._unfused_outputs(c, t.reference, env), policy).ok:
            return True, ""
        cmp = compare(run.outputs, self._unfused_outputs(c, t.reference, env, rebuild=True), policy)
        if cmp.ok:
            return True, ""
        return True, self._reject(c, t, cmp.value, cmp.max_abs_diff, f"max |diff| {cmp.max_abs_diff:.3g}")

    def _apart(
        self, c: _Call, first: GroupChoice, second: GroupChoice, env: dict[str, np.ndarray], seconds: float
    ) -> tuple[list[KernelRecord], float]:
        a, more = self._dispatch(c, first, env)
        b, most = self._dispatch(c, second, env)
        return [a, b], seconds + more + most

    def _learn(self, feats: KernelFeatures | None, run: KernelRun) -> bool:
        """Feed a simulated kernel's measured counters to an online-learning cost model (a list append: its
        retraining runs on its own thread, dispatch never waits). True when the kernel was recorded."""
        if self._learner is None or feats is None or run.cycles <= 0:
            return False
        counters = {
            "cycle": float(run.cycles),
            "energy_total_pj": run.energy_pj,
            "dram_read_bytes": float(run.dram_read_bytes),
            "dram_write_bytes": float(run.dram_write_bytes),
        }
        self._learner(feats, self.config, counters)
        return True

    def _tolerance(self, st: _State, group: Group) -> ValidationPolicy:
        """A rounding-changing int8 fusion may differ from the unfused kernels by the skipped requantization's
        rounding: up to one step of the skipped value's scale (plus float rounding)."""
        policy = self.options.validation
        mc = st.mc
        head = self.graph.node(group.nodes[0])
        if not (mc.int8 and mc.allow_rounding_change and group.fused and head.name in mc.qplan.matrix):
            return policy
        step = mc.qplan.matrix[head.name].output_scale
        return replace(policy, atol=max(policy.atol, step), rtol=max(policy.rtol, 1e-4))

    def _predict(self, feats: KernelFeatures | None) -> float:
        """Memoised prediction; a learning model is asked every time (it swaps in retrained models)."""
        if feats is None:
            return 0.0
        if self._learner is not None:
            return self.cost_model.predict(feats, self.config).cycles
        if feats not in self._predictions:
            self._predictions[feats] = self.cost_model.predict(feats, self.config).cycles
        return self._predictions[feats]

    def _feature_row(self, st: _State, key: str, kernel: Kernel, group: Group) -> KernelFeatures | None:
        if kernel.program is None:
            return None
        zf = round(self._zero_fraction.get(self.graph.node(group.nodes[0]).inputs[0], 0.0), 2)
        cache_key = f"{key}:{zf}"
        if cache_key not in st.features:
            st.features[cache_key] = self._counted(st, kernel, zf)
        return st.features[cache_key]

    def _counted(self, st: _State, kernel: Kernel, zero_fraction: float) -> KernelFeatures:
        """`kernel_features` of a kernel: the planner's count when it built this very kernel (only the zero-tile
        fraction it was priced at may differ; counting a large program again takes ~0.1 s)."""
        ev = self._evaluator
        if ev is not None and ev.mc is st.mc:
            for done in ev.priced([kernel.group]):
                if done.kernel is kernel:
                    return replace(done.features, zero_tile_fraction=zero_fraction)
        return kernel_features(st.mc, kernel, zero_fraction)

    def _unfused_bytes(self, c: _Call, group: Group) -> int:
        st = c.state
        if group in st.unfused:
            return st.unfused[group]
        total = 0
        for name in group.nodes:
            single = baseline_group(self.graph.node(name))
            kernel, _, key = self._kernel(st, single, "any", c.evaluator)
            feats = self._feature_row(st, key, kernel, single)
            total += 0 if feats is None else feats.dram_read_bytes + feats.dram_write_bytes
        st.unfused[group] = total
        return total

    def _unfused_outputs(
        self, c: _Call, group: Group, env: Mapping[str, np.ndarray], rebuild: bool = False
    ) -> dict[str, np.ndarray]:
        """The group's nodes as separate baseline kernels on the same inputs (shadow validation). `rebuild`:
        each kernel generated afresh, and a cached copy that differs from it replaced (in memory and on disk)."""
        st = c.state
        local = dict(env)
        for name in group.nodes:
            single = baseline_group(self.graph.node(name))
            kernel, _, key = self._kernel(st, single, "any", c.evaluator)
            if rebuild:
                fresh = build_kernel(st.mc, single)
                if fresh.program != kernel.program or fresh.guard != kernel.guard:
                    self.cache.replace(key, fresh)
                kernel = fresh
            local.update(run_kernel(st.mc, kernel, local).outputs)
        sub = group_subgraph(self.graph, group)
        return {v: local[v] for v in sub.outputs}

    def _run_unfused(self, c: _Call, group: Group, env: dict[str, np.ndarray], reason: str) -> KernelRecord:
        st = c.state
        cycles = dram = 0
        energy = 0.0
        for name in group.nodes:
            single = baseline_group(self.graph.node(name))
            kernel, _, key = self._kernel(st, single, "any", c.evaluator)
            run = run_kernel(st.mc, kernel, env)
            env.update(run.outputs)
            self._learn(self._feature_row(st, key, kernel, single), run)
            cycles += run.cycles
            dram += run.dram_read_bytes + run.dram_write_bytes
            energy += run.energy_pj
        unfused = self._unfused_bytes(c, group)
        return KernelRecord(
            group.nodes, "unfused", "any", 0.0, cycles, dram, unfused, energy, False, False, reason, None
        )
