"""Fused-kernel generators, one module per family. Each turns a group of graph nodes into pipeline steps
(`fusion.lower.emitter.Step`) that use the ISA's fusion extension; `fusion.engine.kernel` wraps them into a
`.kernel` block with guard metadata."""
