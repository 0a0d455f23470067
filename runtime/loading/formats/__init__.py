"""Checkpoint file formats: GGUF and safetensors readers, dequantization, the loaders' error type."""
