"""How far a MoE kernel's bf16 output is from its reference (the GPU tests' measure)."""

import numpy as np

# in units of the row's RMS: a few bf16 steps (2**-8 each) of rounding, against ~2**-3 for another expert's
# output in a row (a routing or indexing error). The largest single element grows with the element count (an
# H100 run: 0.034 over 2048 x 2048 outputs of pure rounding), the RMS of the error does not.
ROW_RMS_TOLERANCE = 2**-6
ELEMENT_TOLERANCE = 2**-4


def row_error(got, want) -> tuple[float, float]:
    """(largest RMS of a row's error, largest single difference), both in units of their row's RMS: a row's
    outputs all carry rounding of the same size (bf16 intermediates summed over f and over the top-k
    experts), however close to zero the output itself lands, so an elementwise relative error would measure
    only how near zero the smallest output fell."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    rms = np.sqrt(np.mean(want**2, axis=-1, keepdims=True))
    assert np.all(rms > 0)
    error = np.abs(got - want) / rms
    return float(np.sqrt(np.mean(error**2, axis=-1)).max()), float(error.max())


def assert_rows_close(got, want) -> None:
    rms_error, largest = row_error(got, want)
    assert rms_error <= ROW_RMS_TOLERANCE and largest <= ELEMENT_TOLERANCE, (rms_error, largest)
