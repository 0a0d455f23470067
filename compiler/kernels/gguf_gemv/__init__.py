"""GGUF-quantized weights kept quantized on the device: layouts, jnp references, GEMV kernels.

layout.py          device layouts (Q4_K, Q6_K, Q8_0, Q5_0) and the host repacking from GGUF bytes
ref.py             jnp dequantization (bit-equal to gguf) and the reference matmul
gguf_gemv/split_kernel.py  Triton GEMV kernels (imported only by the "triton" backend), "split" variant
gguf_gemv/rows_*.py    the "rows" variant's kernels (float activations, m <= 4)
gguf_gemv/act_quant.py       int8 activations for the dp4a kernels, and their jnp reference
dp4a.py            the "dp4a" variant: plans and launches (gguf_gemv/act_quant_kernel.py; gguf_gemv/dp4a_kernel.py, its
                   kernels, on gguf_gemv/dp4a_body.py)
config.py          tuned launch configurations per format and shape class
matmul.py          quant_matmul(x, w, backend=...)
"""

from ember.compiler.kernels.gguf_gemv.config import CONFIG_TABLE, QuantMatmulConfig, pick_config
from ember.compiler.kernels.gguf_gemv.layout import (
    FORMATS,
    GGML_TYPE_FORMATS,
    Q4_K,
    Q5_0,
    Q6_K,
    Q8_0,
    SCALE_OFFSETS,
    DenseBacked,
    QuantizedWeight,
    WeightGroup,
    pack,
    pack_q4_k,
    pack_q5_0,
    pack_q6_k,
    pack_q8_0,
    random_gguf_bytes,
)
from ember.compiler.kernels.gguf_gemv.matmul import BACKENDS, launch_plan, quant_matmul
from ember.compiler.kernels.gguf_gemv.reference import (
    dequantize,
    dequantize_q4_k,
    dequantize_q5_0,
    dequantize_q6_k,
    dequantize_q8_0,
    quant_matmul_ref,
)

__all__ = [
    "BACKENDS",
    "CONFIG_TABLE",
    "DenseBacked",
    "FORMATS",
    "GGML_TYPE_FORMATS",
    "Q4_K",
    "Q5_0",
    "Q6_K",
    "Q8_0",
    "QuantMatmulConfig",
    "QuantizedWeight",
    "SCALE_OFFSETS",
    "WeightGroup",
    "dequantize",
    "dequantize_q4_k",
    "dequantize_q5_0",
    "dequantize_q6_k",
    "dequantize_q8_0",
    "launch_plan",
    "pack",
    "pack_q4_k",
    "pack_q5_0",
    "pack_q6_k",
    "pack_q8_0",
    "pick_config",
    "quant_matmul",
    "quant_matmul_ref",
    "random_gguf_bytes",
]
