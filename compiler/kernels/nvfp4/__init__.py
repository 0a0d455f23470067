"""NVFP4 weights (ModelOpt's layout) kept packed: the jnp reference and the Triton matmul."""

from ember.compiler.kernels.nvfp4.matmul import Nvfp4Config, nvfp4_matmul, nvfp4_plan, pick_nvfp4_config
from ember.compiler.kernels.nvfp4.reference import Nvfp4Weight, dequantize_nvfp4, nvfp4_matmul_ref, quantize_nvfp4

__all__ = [
    "Nvfp4Config",
    "Nvfp4Weight",
    "dequantize_nvfp4",
    "nvfp4_matmul",
    "nvfp4_matmul_ref",
    "nvfp4_plan",
    "pick_nvfp4_config",
    "quantize_nvfp4",
]
