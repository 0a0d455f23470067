"""The quantized GEMM over GGUF-packed weights for steps of many rows (README.md)."""

from ember.compiler.kernels.gguf_gemm.gemm import CONFIGS, PLANES, GemmConfig, gemm_plan, pick_gemm_config, quant_gemm

__all__ = ["CONFIGS", "PLANES", "GemmConfig", "gemm_plan", "pick_gemm_config", "quant_gemm"]
