"""Launch a Triton kernel from a jitted step as a native XLA kernel.

`triton_call` compiles the kernel to Triton IR (TTIR) here, with Triton, and hands the IR to XLA's own
Triton pipeline through the custom call `__gpu$xla.gpu.triton` (the one JAX's Pallas Triton lowering
emits). XLA then compiles it with the rest of the step and launches it like one of its own fusions:
inside the step's command buffer (CUDA graph), with no per-call host work.

Why not jax-triton's `triton_call`: its custom call goes through a host handler that decompresses and
looks up the kernel on every launch and cannot be captured, measured at 8-11 µs per launch inside a step
against 2-3 µs for an XLA kernel (docs/results/h200_launch_overhead.json). A decode step launches one
kernel per layer and op, so that fixed cost decided which kernels could pay at all.

Contract (the same as jax-triton's, minus runtime scalars): the kernel's pointer arguments are the input
arrays in order, then one per output; every other argument is a compile-time constant passed by keyword
(tl.constexpr or not: a plain scalar parameter is specialised to its value).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir  # custom_call is not re-exported publicly
from jax._src.lib.mlir import ir
from jax.extend.core import Primitive

XLA_TRITON_TARGET = "__gpu$xla.gpu.triton"
COMPUTE_CAPABILITY = 90  # sm_90 (H200); XLA compiles the IR for the device it runs on

_TRITON_TYPES = {
    np.dtype(jnp.bfloat16): "bf16",
    np.dtype(np.float16): "fp16",
    np.dtype(np.float32): "fp32",
    np.dtype(np.float64): "fp64",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint64): "u64",
    np.dtype(jnp.float8_e4m3fn): "fp8e4nv",
    np.dtype(jnp.float8_e5m2): "fp8e5",
    np.dtype(np.bool_): "i1",
}


def triton_call(
    *arrays,
    kernel,
    out_shape,
    grid: Sequence[int],
    num_warps: int = 4,
    num_stages: int = 3,
    input_output_aliases: dict[int, int] | None = None,
    **constants,
):
    """arrays: the kernel's leading pointer arguments; out_shape: a ShapeDtypeStruct or a tuple of them (one
    pointer argument each, after the inputs); grid: up to 3 static ints; constants: every other argument.
    Returns one array, or a tuple when out_shape is a tuple."""
    single = not isinstance(out_shape, (tuple, list))
    outs = (out_shape,) if single else tuple(out_shape)
    aliases = dict(input_output_aliases or {})
    grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    if len(grid3) != 3 or min(grid3) < 1:
        raise ValueError(f"grid must be 1-3 positive ints, got {tuple(grid)}")
    pointer_types = tuple("*" + _triton_type(a.dtype) for a in (*arrays, *outs))
    results = _triton_p.bind(
        *arrays,
        kernel=kernel,
        pointer_types=pointer_types,
        constants=tuple(sorted((k, _hashable(v)) for k, v in constants.items())),
        out_avals=tuple(jax.core.ShapedArray(tuple(o.shape), o.dtype) for o in outs),
        grid=grid3,
        num_warps=int(num_warps),
        num_stages=int(num_stages),
        aliases=tuple(sorted(aliases.items())),
    )
    return results[0] if single else tuple(results)


def kernel_ttir(
    kernel, pointer_types: tuple[str, ...], constants: tuple[tuple[str, Any], ...], num_warps: int, num_stages: int
) -> tuple[str, str]:
    """(TTIR text, kernel name) for sm_90: the pointers (16-byte aligned, as XLA allocates) and constants
    bound. Needs only Triton (no GPU): CI checks the IR of every kernel this way."""
    return _kernel_ttir(kernel, pointer_types, constants, num_warps, num_stages)


@functools.cache
def _kernel_ttir(kernel, pointer_types, constants, num_warps, num_stages):
    from triton._C.libtriton import ir as tir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler.compiler import ASTSource

    names = list(kernel.arg_names)
    values = dict(constants)
    pointer_names = [n for n in names if n not in values]
    if len(pointer_names) != len(pointer_types):
        raise TypeError(
            f"{kernel.__name__} takes pointers {pointer_names} but was given {len(pointer_types)} "
            f"arrays and outputs; every other argument must be passed as a constant"
        )
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise TypeError(f"{kernel.__name__} has no arguments {unknown}")
    signature = {n: "constexpr" for n in values}
    signature.update(zip(pointer_names, pointer_types))
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in pointer_names}
    backend = CUDABackend(GPUTarget("cuda", COMPUTE_CAPABILITY, 32))
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
    context = tir.context()
    tir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(kernel, {n: signature[n] for n in names}, constexprs=values, attrs=attrs)
    module = source.make_ir(
        backend.target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context
    )
    module = CUDABackend.make_ttir(module, {}, options, COMPUTE_CAPABILITY)
    return str(module), kernel.__name__


def _triton_type(dtype) -> str:
    try:
        return _TRITON_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no Triton type for dtype {dtype}") from None


def _hashable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


_triton_p = Primitive("ember_triton_call")
_triton_p.multiple_results = True
_triton_p.def_abstract_eval(lambda *avals, out_avals, **_: out_avals)


def _lowering(ctx, *operands, kernel, pointer_types, constants, out_avals, grid, num_warps, num_stages, aliases):
    text, name = kernel_ttir(kernel, pointer_types, constants, num_warps, num_stages)
    backend_config = dict(
        name=ir.StringAttr.get(name),
        ir=ir.StringAttr.get(text),
        num_stages=mlir.i32_attr(num_stages),
        num_warps=mlir.i32_attr(num_warps),
        grid_x=mlir.i32_attr(grid[0]),
        grid_y=mlir.i32_attr(grid[1]),
        grid_z=mlir.i32_attr(grid[2]),
        debug=ir.BoolAttr.get(False),
    )
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in out_avals]
    row_major = lambda avals: [list(reversed(range(a.ndim))) for a in avals]  # noqa: E731
    return mlir.custom_call(
        call_target_name=XLA_TRITON_TARGET,
        result_types=result_types,
        operands=list(operands),
        backend_config=backend_config,
        api_version=4,
        operand_layouts=row_major(ctx.avals_in),
        result_layouts=row_major(out_avals),
        operand_output_aliases=dict(aliases),
    ).results


mlir.register_lowering(_triton_p, _lowering, platform="cuda")
