"""The hardware performance model (HPM): a cost model learned from the simulator's counters.

`dynfuse hpm calibrate` sweeps candidate kernels through the simulator into a dataset, `train` fits
gradient-boosted trees correcting the analytic model, `eval` measures them on held-out kernels and a held-out
machine. `load_cost_model("hpm")` gives the planner the trained model; `OnlineHpm` keeps learning from dispatch.
"""
