"""The packed layout: positions restart per sequence, cu_seqlens agrees, no target crosses a boundary."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cookers.packed_layout import IGNORE_INDEX, flatten_packs, layout_pack

sequences_strategy = st.lists(st.lists(st.integers(0, 999), min_size=1, max_size=30), min_size=1, max_size=8)


def masks_for(sequences, data):
    return [data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s))) for s in sequences]


@settings(max_examples=150, deadline=None)
@given(
    sequences=sequences_strategy,
    labels=st.sampled_from(("unshifted", "shifted")),
    multiple=st.none() | st.integers(1, 16),
    data=st.data(),
)
def test_layout_is_consistent_and_masks_every_boundary(sequences, labels, multiple, data):
    masks = masks_for(sequences, data)
    pack = layout_pack(sequences, masks, labels=labels, pad_to_multiple_of=multiple, pad_id=7)
    real = sum(len(s) for s in sequences)
    total = len(pack.input_ids)

    assert pack.input_ids[:real].tolist() == [t for s in sequences for t in s]
    assert pack.cu_seqlens.dtype == np.int32
    assert pack.cu_seqlens[0] == 0 and pack.cu_seqlens[-1] == total
    if multiple:
        assert total % multiple == 0 and total - real < multiple
    # Positions restart exactly at the boundaries and count up by one inside a sequence.
    starts = set(pack.cu_seqlens[:-1].tolist())
    for t in range(total):
        expected = 0 if t in starts else pack.position_ids[t - 1] + 1
        assert pack.position_ids[t] == expected
    assert pack.max_seqlen == int(np.diff(pack.cu_seqlens).max())
    assert (pack.labels[real:] == IGNORE_INDEX).all() and (pack.seq_ids[real:] == -1).all()

    supervised = np.concatenate([np.asarray(m, dtype=bool) for m in masks])
    for t in range(real):
        if labels == "unshifted":
            target_ok = t not in starts and supervised[t]
            expected = pack.input_ids[t] if target_ok else IGNORE_INDEX
        else:
            target_ok = t + 1 < real and (t + 1) not in starts and supervised[t + 1]
            expected = pack.input_ids[t + 1] if target_ok else IGNORE_INDEX
        assert pack.labels[t] == expected


@settings(max_examples=50, deadline=None)
@given(groups=st.lists(sequences_strategy, min_size=1, max_size=4), multiple=st.none() | st.integers(1, 8))
def test_flattened_packs_keep_every_boundary_and_megatron_offsets(groups, multiple):
    packs = [layout_pack(g, pad_to_multiple_of=multiple) for g in groups]
    flat = flatten_packs(packs)
    assert len(flat.input_ids) == sum(len(p.input_ids) for p in packs)
    assert flat.cu_seqlens[-1] == len(flat.input_ids)
    params = flat.megatron_packed_seq_params()
    real_lengths = [len(s) for g in groups for s in g]
    assert np.diff(params["cu_seqlens_q"]).tolist() == real_lengths
    assert params["cu_seqlens_q_padded"][-1] == len(flat.input_ids)
    assert (np.diff(params["cu_seqlens_q_padded"]) >= np.diff(params["cu_seqlens_q"])).all()
    assert sorted(set(flat.seq_ids.tolist()) - {-1}) == list(range(len(real_lengths)))


def test_prompt_tokens_are_not_supervised():
    pack = layout_pack([[1, 2, 3, 4]], loss_masks=[[False, False, True, True]], labels="unshifted")
    assert pack.labels.tolist() == [IGNORE_INDEX, IGNORE_INDEX, 3, 4]
    shifted = layout_pack([[1, 2, 3, 4]], loss_masks=[[False, False, True, True]], labels="shifted")
    assert shifted.labels.tolist() == [IGNORE_INDEX, 3, 4, IGNORE_INDEX]


def test_padding_is_its_own_trailing_segment_and_belongs_to_the_last_sequence_for_megatron():
    pack = layout_pack([[5, 6, 7], [8, 9]], pad_to_multiple_of=8, pad_id=0)
    assert pack.cu_seqlens.tolist() == [0, 3, 5, 8]
    assert pack.cu_seqlens_unpadded.tolist() == [0, 3, 5]
    params = pack.megatron_packed_seq_params()
    assert params["cu_seqlens_q_padded"].tolist() == [0, 3, 8]
    assert params["max_seqlen_q"] == 5


def test_a_loss_mask_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="loss mask 0 has 2 entries for a sequence of 3 tokens"):
        layout_pack([[1, 2, 3]], loss_masks=[[True, False]])
