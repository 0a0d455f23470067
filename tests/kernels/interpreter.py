"""Triton's CPU interpreter, made to behave like the GPU for the kernel tests marked `interpret`.

Those tests run in their own pytest process with TRITON_INTERPRET=1 (./tools/test starts it; the variable
must be set before any kernel is decorated). tests/kernels/conftest.py calls `patch_interpreter()` once there.

The patches close gaps of Triton 3.6's interpreter on a torch-less machine:
- arguments are numpy buffers (`HostBuffer`): its torch copy-in/out is skipped;
- bf16, which it stores as raw uint16 bits, is cast and multiplied through fp32;
- fp32 -> bf16 rounds to nearest even, as the GPU does (the interpreter truncates), so a sum can be
  compared exactly with the reference's;
- fp32/bf16 -> float8 e4m3 rounds to nearest even and saturates at +-448, as the GPU's `cvt ... satfinite`
  (the interpreter rounds ties away from zero and flushes small values): an FP8 KV pool's writes;
- numpy >= 2.5 refuses int() on 1-element arrays: tensors get an `__index__`.
"""

from __future__ import annotations

import numpy as np

from ember.compiler.kernels.gguf_gemv.act_quant import FACTORS


def patch_interpreter() -> None:
    import ml_dtypes
    import triton.language as tl
    import triton.runtime.interpreter as ti

    ti.GridExecutor._init_args_hst = lambda self, args_dev, kwargs: (args_dev, kwargs)
    ti.GridExecutor._restore_args_dev = lambda self, *args: None
    patch_tensor = ti._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    ti._patch_lang_tensor = _patch_lang_tensor
    builder = ti.InterpreterBuilder
    cast, dot, fp_to_fp = builder.cast_impl, builder.create_dot, builder.create_fp_to_fp
    wide = (tl.bfloat16, tl.float32)

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:
            return ti.TensorHandle(src.data.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar not in wide:
            return cast(self, ti.TensorHandle(src.data.astype(np.float32), tl.float32), dst_type)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar not in wide:
            return cast(self, cast(self, src, tl.float32), dst_type)
        return cast(self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a, b = cast(self, a, tl.float32), cast(self, b, tl.float32)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def fp_to_fp_rne(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in wide:
            values = src.data.view(ml_dtypes.bfloat16) if src.dtype.scalar == tl.bfloat16 else src.data
            values = np.clip(values.astype(np.float32), -448.0, 448.0)
            return ti.TensorHandle(values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), tl.float8e4nv)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl = cast_impl
    builder.create_si_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_ui_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_dot = create_dot
    builder.create_fp_to_fp = fp_to_fp_rne


class HostBuffer:
    """What the interpreter needs of a tensor argument: a data pointer and a Triton dtype name."""

    NAMES = {
        "uint32": "u32",
        "int32": "i32",
        "int8": "i8",
        "uint8": "u8",
        "float16": "fp16",
        "float32": "fp32",
        "bfloat16": "bf16",
        "float8_e4m3fn": "fp8e4nv",
    }

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = self.NAMES[self.array.dtype.name]

    def data_ptr(self) -> int:
        return self.array.ctypes.data


# The int8 activations the dp4a GEMVs read, as their producers write them (quantizer, norms, attention combine).
def activation_buffers(m: int, k: int):
    """Host buffers for x [m, k]'s int8 activations as the producers write them (act_quant.packed_shapes)."""
    from ember.compiler.kernels.gguf_gemv.act_quant import packed_shapes

    qa, da = packed_shapes(m, k)
    return HostBuffer(np.zeros(qa.shape, np.int32)), HostBuffer(np.full(da.shape, np.nan, np.float32))


def compare_activations(
    qa: np.ndarray,
    da: np.ndarray,
    qa_ref: np.ndarray,
    da_ref: np.ndarray,
    *,
    tol: float = 1e-5,
    code_slack: int = 0,
    min_same: float = 1.0,
) -> tuple[bool, str]:
    """A producer's int8 activations (qa [m, T k/4], da [m, k/32, 4 T]) against act_quant.quantize_activations':
    (failed, note). The first term: its codes within code_slack of the reference's (min_same of its words
    equal) and its (dx, sx, s0, s1) within tol of the largest. A second term rounds the first one's residual,
    so a last-bit difference in dx (the reference's division) may move one of its codes by one: its codes
    within one, at most 0.1% of its words (or two) unequal, dx' within 1e-3 and its code sums within 2."""
    terms = da.shape[-1] // FACTORS
    words = qa.shape[1] // terms
    codes = lambda a: a.view(np.int8).astype(np.int32)  # noqa: E731
    first, first_ref = qa[:, :words], qa_ref[:, :words]
    same = float((first == first_ref).mean())
    code_diff = int(np.abs(codes(first) - codes(first_ref)).max())
    err = float(np.abs(da[..., :FACTORS] - da_ref[..., :FACTORS]).max() / np.abs(da_ref[..., :FACTORS]).max())
    failed = not (code_diff <= code_slack and same >= min_same and err < tol)
    note = f"words equal {same:.4f} max code diff {code_diff} (dx, sx, s0, s1) rel_err={err:.1e}"
    if terms > 1:
        second, second_ref = qa[:, words:], qa_ref[:, words:]
        unequal = int((second != second_ref).sum())
        diff2 = int(np.abs(codes(second) - codes(second_ref)).max())
        dx_err = float(np.abs(da[..., 4] - da_ref[..., 4]).max() / max(np.abs(da_ref[..., 4]).max(), 1e-30))
        sums = float(np.abs(da[..., 6:] - da_ref[..., 6:]).max())
        failed = failed or not (diff2 <= 1 and unequal <= max(2, second.size // 1000) and dx_err < 1e-3 and sums <= 2)
        note += (
            f"; second term: {unequal} of {second.size} words unequal, max code diff {diff2}, dx' rel_err={dx_err:.1e}"
        )
    return failed, note
