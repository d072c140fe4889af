"""Plans as data: which nodes run together, with which kernel strategy and schedule, and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusion.graph.ir import Node
from fusion.lower.compiler import ALIAS_OPS


@dataclass(frozen=True)
class Group:
    """Nodes (graph order) compiled into one kernel. `tile_m` 0 means "largest that fits"; `flatten` runs a
    batched MatMul over a shared weight as one GEMM."""

    nodes: tuple[str, ...]
    strategy: str
    tile_m: int = 0
    flatten: bool = False
    panels: int = 1  # weight-column panels per GEMM step (0: as many as fit)
    resident_a: bool = False  # A-stationary loop order (A loaded once, weight panels streamed)

    def __post_init__(self) -> None:
        # imported here: the registry's schedule rules build Groups (a module-level import would be circular)
        from fusion.engine.strategies import strategy_of

        strategy_of(self.strategy)  # a ValueError naming the known ones (e.g. a corrupt cache entry)

    @property
    def schedule(self) -> str:
        parts = [self.strategy]
        if self.tile_m:
            parts.append(f"tm={self.tile_m}")
        if self.flatten:
            parts.append("flat")
        if self.panels != 1:
            parts.append(f"panels={self.panels or 'max'}")
        if self.resident_a:
            parts.append("a-stationary")
        return ",".join(parts)

    @property
    def fused(self) -> bool:
        return len(self.nodes) > 1


def baseline_group(node: Node) -> Group:
    """A node alone, as the unfused baseline runs it: a host-side alias for pure layout ops, else its kernel."""
    return Group((node.name,), "alias" if node.op in ALIAS_OPS else "unfused")


@dataclass(frozen=True)
class GroupChoice:
    """A planned group with the cost model's view of it and the reasons behind the choice."""

    group: Group
    predicted_cycles: float
    reason: str
    alternatives: tuple[tuple[str, float], ...] = ()  # (schedule, predicted cycles) of the other candidates
    zero_skip: Group | None = None  # the zero-skip kernel the dispatch table switches to on sparse data
    dense: Group | None = None  # for a group planned zero-skip: the kernel the table switches to on dense data


@dataclass(frozen=True)
class PipelinedPair:
    """Two consecutive planned groups run as one program (`fusion.engine.pipelined`): the consumer's independent
    loads overlap the producer's compute. Cycles measured on the simulator when the planner chose the pair."""

    producer: Group
    consumer: Group
    bounds: tuple[str, str]  # "memory" / "compute" of producer and consumer (the cost model's unit times)
    separate_cycles: int  # the two kernels, each ending in a fence
    pipelined_cycles: int


@dataclass(frozen=True)
class Measurement:
    """What the planner simulated instead of trusting the cost model (`planner.Evaluator.settle`, the plan guard,
    pipelined pairs), and what it cost in planning time."""

    kernels: int = 0  # kernels simulated on zero inputs (each at most once per plan)
    seconds: float = 0.0  # host time of those simulations (part of the plan's planning time)
    regions: int = 0  # plan regions the guard measured against `static` and `none`
    fallbacks: int = 0  # of those, regions where static's or none's groups measured fewer cycles and were taken


@dataclass(frozen=True)
class Plan:
    policy: str
    choices: tuple[GroupChoice, ...]
    rejected: tuple[tuple[tuple[str, ...], str], ...] = field(default=())  # (nodes, reason) of refused fusions
    pipelined: tuple[PipelinedPair, ...] = field(default=())  # consecutive groups run as one program
    measured: Measurement = field(default=Measurement())  # what planning simulated (dynamic)

    def pair_from(self, producer: Group) -> PipelinedPair | None:
        """The pipelined pair a group produces for, if any."""
        return next((p for p in self.pipelined if p.producer == producer), None)

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(c.group for c in self.choices)
