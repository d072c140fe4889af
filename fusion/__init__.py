"""Dynamic fusion engine: dataflow-graph IR, ONNX import, clean-up passes, numpy reference, int8 quantization.

Public API (what the lowering and the fusion planner build on):
- IR: `fusion.graph.ir` (Graph, Node, TensorType, DataType, make_node), `fusion.graph.ops` (OpType, OpKind,
  OP_KIND), `fusion.graph.assemble` (assemble, rebuild), `fusion.graph.builder.GraphBuilder`,
  `fusion.graph.shapes` (infer, verify; IR attribute conventions are in its docstring).
- Metadata: `fusion.graph.cost` (node_cost, group_cost, graph_costs, NodeCost), `fusion.graph.metadata` (node_info,
  graph_info), `fusion.graph.hashing` (structural_hash, subgraph_hash, extract_subgraph).
- Views: `fusion.graph.dump.dump`, `fusion.graph.dot.to_dot`; CLI `dynfuse graph MODEL.onnx`.
- Import: `fusion.onnx_import.importer.import_model`; conformance: `fusion.onnx_import.conformance`.
- Passes: `fusion.passes.pipeline.cleanup` and the single passes it lists (CLEANUP_PASSES).
- Oracle: `fusion.reference.interpreter` (run, evaluate), `fusion.reference.quantized` (run_quantized).
- Quantization: `fusion.quant.params` (QuantParams, requant_params, quantize_tensor, quantize_bias),
  `fusion.quant.plan` (plan_quantization -> QuantPlan: int8 scale per value, MatrixQuant per matrix node),
  `fusion.quant.calibrate.calibrate`.
"""
