"""GGUF-quantized weights kept quantized on the device: layouts, jnp references, GEMV kernels.

layout.py          device layouts (Q4_K, Q6_K, Q8_0, Q5_0) and the host repacking from GGUF bytes
ref.py             jnp dequantization (bit-equal to gguf) and the reference matmul
triton_kernels.py  Triton GEMV kernels (imported only by the "triton" backend), "split" variant
triton_gemv*.py    the "rows" variant's kernels (float activations, m <= 4)
act_quant.py       int8 activations for the dp4a kernels, and their jnp reference
dp4a.py            the "dp4a" variant: plans and launches (triton_act_quant.py; triton_gemv_dp4a.py, its
                   kernels, on triton_gemv_dp4a_body.py)
config.py          tuned launch configurations per format and shape class
matmul.py          quant_matmul(x, w, backend=...)
"""

from ember.compiler.ops.quant.config import CONFIG_TABLE, QuantMatmulConfig, pick_config
from ember.compiler.ops.quant.layout import (
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
from ember.compiler.ops.quant.matmul import BACKENDS, launch_plan, quant_matmul
from ember.compiler.ops.quant.ref import (
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
