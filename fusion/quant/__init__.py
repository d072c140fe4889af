"""Symmetric per-tensor int8 post-training quantization: scales, requantization multipliers, calibration."""
