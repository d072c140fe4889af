"""Cost models: predict a candidate kernel's cycles and energy on a machine configuration.

The planner takes any `CostModel`, so the analytic model (from the simulator's timing rules) and the learned
hardware performance model (trained on simulator counters) swap without touching the planner.
"""

from fusion.cost.analytic import AnalyticCostModel, roofline_cycles
from fusion.cost.interface import CostEstimate, CostModel, KernelFeatures

__all__ = ["AnalyticCostModel", "CostEstimate", "CostModel", "KernelFeatures", "roofline_cycles"]
