"""Ember's dequantizers must equal gguf.quants.dequantize bit for bit, for every type."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_test_data import assert_bitwise_equal, byte_shape, random_tensor_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.runtime.loading.formats import dequant
from ember.runtime.loading.formats.dequant import BLOCK_SIZES, SUPPORTED_TYPES, dequantize

Q = gguf.GGMLQuantizationType
ALL_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def reference(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """gguf's numpy dequantizer, fed the byte layout its own reader produces."""
    return gguf.quants.dequantize(raw.reshape(byte_shape(shape, ggml_type)), Q(ggml_type))


@st.composite
def tensor_shapes(draw: st.DrawFn, ggml_type: int) -> tuple[int, ...]:
    """1-D to 3-D shapes whose rows are whole blocks."""
    block_elems = BLOCK_SIZES[ggml_type][0]
    row = draw(st.integers(1, 6 if block_elems > 1 else 300)) * block_elems
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    return (*lead, row)


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: Q(t).name)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_matches_gguf_with_finite_scales(ggml_type: int, data: st.DataObject, seed: int) -> None:
    shape = data.draw(tensor_shapes(ggml_type))
    raw = random_tensor_bytes(np.random.default_rng(seed), ggml_type, int(np.prod(shape)))
    ours = dequantize(raw, ggml_type, shape)
    assert not np.isnan(ours).any()
    assert_bitwise_equal(ours, reference(raw, ggml_type, shape))


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: Q(t).name)
@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_matches_gguf_on_arbitrary_bytes(ggml_type: int, data: st.DataObject, seed: int) -> None:
    # Any byte pattern, so inf/NaN scales too: NaN positions must agree, all else bit for bit.
    shape = data.draw(tensor_shapes(ggml_type))
    raw = random_tensor_bytes(np.random.default_rng(seed), ggml_type, int(np.prod(shape)), finite=False)
    with np.errstate(invalid="ignore"):
        expected = reference(raw, ggml_type, shape)
    assert_bitwise_equal(dequantize(raw, ggml_type, shape), expected)


@pytest.mark.parametrize("ggml_type", [Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda t: Q(t).name)
def test_chunked_decoding_of_a_large_tensor_matches(ggml_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Force many small chunks (including a ragged last one) through the chunk loop.
    monkeypatch.setattr(dequant, "_CHUNK_ELEMENTS", 3 * 256)
    shape = (7, 5 * 256)
    raw = random_tensor_bytes(np.random.default_rng(7), ggml_type, int(np.prod(shape)))
    assert_bitwise_equal(dequantize(raw, ggml_type, shape), reference(raw, ggml_type, shape))


def test_block_sizes_agree_with_ggml() -> None:
    assert SUPPORTED_TYPES == set(ALL_TYPES)
    for ggml_type in ALL_TYPES:
        assert BLOCK_SIZES[ggml_type] == gguf.GGML_QUANT_SIZES[Q(ggml_type)]


def test_q8_0_known_values() -> None:
    # d = 0.5 (fp16 0x3800), codes -16..15 -> -8.0 .. 7.5
    codes = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.array([0x00, 0x38], np.uint8), codes.view(np.uint8)])
    np.testing.assert_array_equal(dequantize(block, Q.Q8_0, (32,)), codes.astype(np.float32) * 0.5)


def test_q4_0_known_values() -> None:
    # d = 2.0 (fp16 0x4000); byte i holds code i (low nibble) and 15 - i (high nibble).
    low = np.arange(16, dtype=np.uint8)
    block = np.concatenate([np.array([0x00, 0x40], np.uint8), low | ((15 - low) << 4)])
    expected = np.concatenate([low, 15 - low]).astype(np.float32) - 8.0
    np.testing.assert_array_equal(dequantize(block, Q.Q4_0, (32,)), 2.0 * expected)


def test_q5_0_high_bits_come_from_the_little_endian_word() -> None:
    # d = 1.0, all low nibbles 0, only bit 31 of qh set: element 31 is 16 - 16 = 0, the rest -16.
    block = np.zeros(22, np.uint8)
    block[0:2] = [0x00, 0x3C]
    block[5] = 0x80
    expected = np.full(32, -16.0, np.float32)
    expected[31] = 0.0
    np.testing.assert_array_equal(dequantize(block, Q.Q5_0, (32,)), expected)


def test_bf16_is_the_top_half_of_f32() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    raw = (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    np.testing.assert_array_equal(dequantize(raw, Q.BF16, (4,)), values)


def test_result_is_a_fresh_writable_array() -> None:
    raw = np.arange(8, dtype="<f4").view(np.uint8)
    raw.flags.writeable = False
    out = dequantize(raw, Q.F32, (2, 4))
    assert out.flags.writeable and not np.shares_memory(out, raw)
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32).reshape(2, 4))


def test_wrong_byte_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs 34 bytes, got 33"):
        dequantize(np.zeros(33, np.uint8), Q.Q8_0, (32,))


def test_row_not_a_whole_number_of_blocks_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a multiple of the Q4_K block size 256"):
        dequantize(np.zeros(144, np.uint8), Q.Q4_K, (2, 128))


def test_unsupported_type_is_rejected_with_the_supported_list() -> None:
    with pytest.raises(ValueError, match="unsupported ggml type 16.*Q6_K"):
        dequantize(np.zeros(66, np.uint8), Q.IQ2_XXS, (256,))
