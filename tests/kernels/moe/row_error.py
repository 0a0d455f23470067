"""How far a MoE kernel's bf16 output is from its reference (the GPU tests' measure)."""

import numpy as np


def row_error(got, want) -> float:
    """The largest difference in units of its row's RMS: a row's outputs all carry rounding of the same size
    (bf16 intermediates summed over f and over top-k experts), however close to zero the output itself is, so
    an elementwise relative error measures only how near zero the smallest output lands."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    rms = np.sqrt(np.mean(want**2, axis=-1, keepdims=True))
    assert np.all(rms > 0)
    return float(np.max(np.abs(got - want) / rms))


# a few bf16 steps (2**-8 each) at the row's scale; another expert's output (a routing or indexing error) is
# ~2**-3 of it
ROW_TOLERANCE = 2**-5
