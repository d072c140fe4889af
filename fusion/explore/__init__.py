"""Design-space exploration with fusion in the loop: machine configurations x models x plan policies, each point
compiled, fused and simulated (`dynfuse explore`), its figures in Parquet, the Pareto front plotted."""
