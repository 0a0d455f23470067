"""tools/dev/profile_step.py's context_batch: the plan-alone decode rows at a chosen context (each row its own
blocks, the step's token written after the context's last one), so the attention does that context's work."""

from __future__ import annotations

import numpy as np
import pytest

from ember.runtime.execution.step_inputs import StepShape, padding_batch
from ember.tools.dev.profile_step import context_batch


def test_rows_see_the_context_in_blocks_of_their_own():
    shape = StepShape(2, 0, 8, 1)
    batch = context_batch(shape, 40, block_size=16, num_blocks=16)
    np.testing.assert_array_equal(batch.dec_block_tables[0], [[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.dec_ctx_lens, [40, 40])
    np.testing.assert_array_equal(batch.positions, [39, 39])
    # position 39 is offset 7 of each row's third block
    np.testing.assert_array_equal(batch.slots[0], [3 * 16 + 7, 6 * 16 + 7])


def test_one_token_is_the_padding_batch_and_too_long_a_context_is_refused():
    shape = StepShape(3, 0, 4, 2)
    for got, want in zip(context_batch(shape, 1, 16, 8), padding_batch(shape)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="table width"):
        context_batch(shape, 5 * 16, 16, 1000)  # 5 blocks per row, 4 in the table
    with pytest.raises(ValueError, match="in the pool"):
        context_batch(shape, 64, 16, 12)  # 3 rows x 4 blocks + the padding block
