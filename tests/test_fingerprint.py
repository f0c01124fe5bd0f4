"""Checkpoint fingerprints of large tensors: every tensor of a real model can be fingerprinted, and the fingerprints
of the tensors checkpoints already hold do not change."""

from __future__ import annotations

import torch

from comlrl_lab.trainers.preference.runtime.fingerprint import tensors_fingerprint


def test_a_tensor_past_float32s_exact_integers_is_sampled_up_to_its_last_value():
    count = 49152 * 576  # SmolLM2-135M's embedding, 28311552 values
    assert int(torch.tensor(count - 1, dtype=torch.float32)) == count  # the last index, as float32 rounds it
    zeros = torch.zeros(count, dtype=torch.uint8)
    last = zeros.clone()
    last[-1] = 1
    assert tensors_fingerprint([("w", zeros)]) != tensors_fingerprint([("w", last)])


def test_fingerprints_of_smaller_tensors_are_the_ones_earlier_checkpoints_hold():
    # Computed with the code before the large-tensor fix (main at 2067528).
    assert tensors_fingerprint([("w", torch.arange(100_003, dtype=torch.float32))]) == "353c714cb0479fb08f14bc38"
    assert tensors_fingerprint([("w", torch.arange(16_777_000, dtype=torch.int32))]) == "2800ad288fc7946cf1e5199c"
