"""Brace lists in split files: collapsed as energon writes them, expanded back to the same shards."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prep.index.meta import collapse, expand

shard_names = st.lists(
    st.builds(
        lambda folder, stem, number, width, tail: f"{folder}{stem}{number:0{width}d}{tail}.tar",
        st.sampled_from(["", "a/", "b.c/", "p_01/"]),
        st.sampled_from(["shard-", "s", "x2-"]),
        st.integers(0, 30),
        st.integers(1, 4),
        st.sampled_from(["", "-0", "-1"]),
    ),
    max_size=40,
)


@given(shard_names)
@settings(max_examples=300, deadline=None)
def test_collapse_expands_back_to_the_same_list(names: list[str]) -> None:
    assert expand(collapse(names)) == names


@given(shard_names)
@settings(max_examples=300, deadline=None)
def test_collapse_writes_energons_text_where_energons_is_right(names: list[str]) -> None:
    from megatron.energon.bracecollapse import collapse as energon_collapse

    theirs = energon_collapse(names, keep_order=True)
    if expand(theirs) == names:  # energon merges '00' with '000' at times, which loses shards
        assert collapse(names) == theirs
