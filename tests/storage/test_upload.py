"""An upload over a dataset already in the bucket withdraws the old markers first: a failure in the middle
leaves a dataset energon calls not prepared, never an old `.info.json` beside new shards and a new index."""

from __future__ import annotations

import pytest

from prep.index.format import INFO_JSON, META_DIR
from prep.prepare.run import prepare_dataset
from prep.storage.address import parse_address
from prep.storage.store import open_store
from prep.storage.upload import upload_dataset
from tests.support.shards import sample_members, write_tarfile


def dataset_files(root):
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def prepared(root, shards: int, prefix: str):
    for shard in range(shards):
        write_tarfile(root / f"shard-{shard}.tar", sample_members(f"{prefix}{shard}-", 5))
    prepare_dataset(root, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    return root


def test_a_failure_mid_upload_over_an_old_dataset_leaves_it_unprepared_not_mixed(s3, tmp_path):
    s3.make_bucket("over")
    store = open_store(parse_address("s3://over/ds"))
    old = prepared(tmp_path / "old", 3, "a")
    upload_dataset(store, old, dataset_files(old))
    assert store.exists(f"{META_DIR}/{INFO_JSON}")

    new = prepared(tmp_path / "new", 2, "b")
    names = dataset_files(new)
    (new / META_DIR / "split.yaml").unlink()  # the upload fails on `.nv-meta`, after shards and .tar.idx
    with pytest.raises(OSError):
        upload_dataset(store, new, names)
    assert store.get("shard-0.tar") == (new / "shard-0.tar").read_bytes()  # the new shards went up
    assert not store.exists(f"{META_DIR}/{INFO_JSON}")  # and no old .info.json says they are prepared

    (new / META_DIR / "split.yaml").write_text("fixed")
    upload_dataset(store, new, names)  # run again: the whole new dataset
    assert store.get(f"{META_DIR}/{INFO_JSON}") == (new / META_DIR / INFO_JSON).read_bytes()
