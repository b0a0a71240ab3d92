"""Brace lists in split files: collapsed as energon writes them, expanded back to the same shards; meta files
that cannot be read or parsed are errors naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import PrepError
from prep.index.meta import collapse, expand, read_dataset_yaml, read_splits

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


def test_split_file_that_is_not_utf8_is_an_error_naming_the_file_and_byte(tmp_path: Path) -> None:
    split_yaml = tmp_path / "split.yaml"
    split_yaml.write_bytes(b"split_parts:\n  train:\n  - \xff.tar\n")
    with pytest.raises(PrepError, match=r"split\.yaml is not UTF-8 text \(byte 26 is 0xff\)"):
        read_splits(split_yaml)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b"sample_type: {\n  bad: [\n", "is not valid"),
        (b"- CrudeWebdataset\n", "holds a YAML list, not a mapping"),
        (b"", "is empty, not a mapping"),
        (b"\xff\xfe garbage", "is not UTF-8 text (byte 0 is 0xff)"),
    ],
)
def test_dataset_yaml_that_energon_cannot_load_is_an_error_naming_the_file(
    tmp_path: Path, text: bytes, problem: str
) -> None:
    dataset_yaml = tmp_path / "dataset.yaml"
    dataset_yaml.write_bytes(text)
    with pytest.raises(PrepError) as error:
        read_dataset_yaml(dataset_yaml)
    assert str(error.value).startswith(f"{dataset_yaml} {problem}")


def test_dataset_yaml_that_cannot_be_read_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "dataset.yaml").mkdir()
    with pytest.raises(PrepError, match=r"dataset\.yaml cannot be read \(Is a directory\)"):
        read_dataset_yaml(tmp_path / "dataset.yaml")
