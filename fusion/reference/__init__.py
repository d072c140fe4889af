"""The numpy reference interpreter: the independent oracle. It imports only the IR and quantization parameters."""
