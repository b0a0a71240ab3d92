"""energon's sample types, as the wizard and dataset.yaml name them, match the installed energon; the
dataset.yaml's name is checked as energon writes it."""

from __future__ import annotations

import pytest

from prep.errors import PrepError
from prep.index.dataset_yaml import check_dataset_yaml_name


def test_sample_type_table_matches_installed_energon() -> None:
    import megatron.energon

    from prep.index.format import ENERGON_FORMAT_VERSION
    from prep.index.sample_types import PROMPT_TYPES, SAMPLE_TYPES
    from tools.energon_sample_types import energon_prompt_types, energon_sample_types

    assert ENERGON_FORMAT_VERSION == megatron.energon.__version__
    assert [list(map(tuple, fields)) for _, fields in SAMPLE_TYPES] == [
        [tuple(f) for f in fields] for _, fields in energon_sample_types()
    ]
    assert [name for name, _ in SAMPLE_TYPES] == [name for name, _ in energon_sample_types()]
    assert PROMPT_TYPES == energon_prompt_types()


@pytest.mark.parametrize("name", ["./dataset.yaml", "configs//x.yaml", "configs/./x.yaml"])
def test_a_dataset_yaml_name_energon_writes_inside_nv_meta_is_taken(name):
    """energon writes `.nv-meta/./dataset.yaml` as dataset.yaml: only a name that leaves `.nv-meta`, or one
    of the index's own files however written, is refused."""
    check_dataset_yaml_name(name)
    with pytest.raises(PrepError, match="names a file of the index itself"):
        check_dataset_yaml_name("./split.yaml")
    with pytest.raises(PrepError, match="must be a file name inside"):
        check_dataset_yaml_name("configs/../../shard-000.tar")
