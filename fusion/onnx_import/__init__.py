"""ONNX import: an onnx.ModelProto (opset >= 13) to a typed fusion Graph specialised to concrete input shapes."""
