"""A write's commit is one, across its parts (the aux dataset, the primary, the rejects and metadataset
beside them, and with --overwrite the old contents): when any step fails or is cut short, OUT_DIR is as
it was, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.staging import Staging
from prep.write import write_dataset
from tests.support.immutable import immutable
from tests.support.prepare import snapshot

POLYLITHIC = {"media_columns": ["jpg"], "aux_format": "tar", "maxcount": 2}


def rows(caption: str) -> list[dict]:
    return [{"__key__": f"{i:03d}", "jpg": bytes([i]) * (10 + i), "txt": f"{caption} {i}"} for i in range(6)]


def staged_names(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if ".shardprep-" in path.name]


@pytest.mark.parametrize("in_the_way", ["primary/shard-000001.tar", "metadataset.yaml"])
def test_a_part_that_cannot_be_put_in_place_undoes_the_parts_put_before_it(
    tmp_path: Path, in_the_way: str
) -> None:
    """A folder holding only folders leaves OUT_DIR 'empty' to a write, but no file can replace it: the
    aux dataset (and for the metadataset the primary too) was in place when that rename failed."""
    out = tmp_path / "out"
    (out / in_the_way / "sub").mkdir(parents=True)
    before = snapshot(out)
    with pytest.raises(PrepError) as raised:
        write_dataset(rows("new"), out, **POLYLITHIC)
    assert str(raised.value) == (
        f"Could not put {out / in_the_way} in place: Is a directory. Every file moved before it was put"
        f" back: {out} is as it was before the run."
    )
    assert snapshot(out) == before


def test_an_overwrite_that_fails_leaves_the_old_dataset_byte_for_byte(tmp_path: Path) -> None:
    """--overwrite removed the old contents before the commit, so a failure left them half gone."""
    out = tmp_path / "out"
    write_dataset(rows("old"), out, **POLYLITHIC)
    (out / "notes.txt").write_text("a file of the user's, which --overwrite replaces with the rest")
    before = snapshot(out)
    with immutable(out / "primary" / "shard-000001.tar"):
        with pytest.raises(PrepError, match="shard-000001.tar aside: Operation not permitted") as raised:
            write_dataset(rows("new"), out, overwrite=True, **POLYLITHIC)
    assert f"{out} is as it was before the run" in str(raised.value)
    assert snapshot(out) == before
    write_dataset(rows("new"), out, overwrite=True, **POLYLITHIC)
    assert not (out / "notes.txt").exists() and not staged_names(out)
    assert b"new 2" in (out / "primary" / "shard-000001.tar").read_bytes()


def test_an_interrupt_while_the_primary_is_put_in_place_restores_the_old_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (SIGTERM is turned into the same KeyboardInterrupt) after the old contents went aside and
    the aux dataset and the primary's shards were put in place, before the primary's index."""
    out = tmp_path / "out"
    write_dataset(rows("old"), out, **POLYLITHIC)
    before = snapshot(out)
    swap_meta = Staging._swap_meta

    def interrupted(staging: Staging) -> None:
        if staging.root == out / "primary":
            raise KeyboardInterrupt
        swap_meta(staging)

    monkeypatch.setattr(Staging, "_swap_meta", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(rows("new"), out, overwrite=True, **POLYLITHIC)
    assert snapshot(out) == before
