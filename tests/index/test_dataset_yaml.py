"""energon's sample types, as the wizard and dataset.yaml name them, match the installed energon."""

from __future__ import annotations


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
