"""The dynamic fusion engine: profile the data, plan fused groups with a cost model, generate specialised
fused kernels, dispatch them behind guards from a kernel cache, validate them against the unfused operators,
and re-plan when the data drifts. See docs/fusion.md."""
