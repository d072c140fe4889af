"""The dataflow-graph IR: operators as nodes, tensors as edges, with shapes, costs, hashing and views."""
