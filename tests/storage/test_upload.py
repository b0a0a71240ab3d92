"""An upload over a dataset already in the bucket withdraws the old markers first: a failure in the middle
leaves a dataset energon calls not prepared, never an old `.info.json` beside new shards and a new index."""

from __future__ import annotations

import pytest

from prep.index.format import INFO_JSON, META_DIR
from prep.prepare.run import prepare_dataset
from prep.storage.address import parse_address
from prep.storage.store import open_store
from prep.storage.upload import upload_dataset, upload_early
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


def test_offsets_going_up_early_are_waited_for_before_the_markers(s3, tmp_path):
    """`.tar.idx` files sent up ahead of the rest (a bucket prepare's, while it writes the index) must all
    be up before `.info.json` says the dataset is prepared: one that fails leaves no marker."""
    s3.make_bucket("early")
    store = open_store(parse_address("s3://early/ds"))
    new = prepared(tmp_path / "new", 3, "c")
    names = dataset_files(new)
    offsets = {name: new / name for name in names if name.endswith(".tar.idx")}
    offsets["shard-2.tar.idx"] = tmp_path / "gone.tar.idx"  # this one cannot go up
    early = upload_early(store, offsets, present=[])
    assert early is not None
    early.start()
    with pytest.raises(OSError):
        upload_dataset(store, new, names, early)
    assert not store.exists(f"{META_DIR}/{INFO_JSON}")

    assert upload_early(store, offsets, present=[f"{META_DIR}/{INFO_JSON}"]) is None  # a prepared dataset


def test_an_interrupted_upload_sends_no_further_file_or_part(s3, tmp_path):
    """Ctrl-C (or SIGTERM, which the command line turns into it) in the middle of a batch: the files not
    begun stay here, a multipart upload under way sends no further part and is aborted, and the run ends
    then, not once the whole batch (every shard of the dataset) has gone up."""
    import gc
    import os
    import signal
    import threading
    import time

    s3.make_bucket("stopped")
    part = 5 << 20
    store = open_store(parse_address("s3://stopped/x"), part_size=part, multipart_threshold=part + 1)
    store.client.meta.events.register("before-parameter-build.s3.UploadPart", lambda **_: time.sleep(0.2))
    (tmp_path / "big.tar").write_bytes(bytes(8 * part))
    small = [f"s-{number:03d}.tar" for number in range(300)]
    for name in small:
        (tmp_path / name).write_bytes(name.encode())

    def interrupt() -> None:
        while len(s3.keys("stopped")) < 10:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    # A KeyboardInterrupt raised inside a gc callback (hypothesis keeps one for the session) is lost as
    # "Exception ignored": none runs while this test's Ctrl-C may land.
    callbacks, gc.callbacks[:] = gc.callbacks[:], []
    try:
        with pytest.raises(KeyboardInterrupt):
            upload_dataset(store, tmp_path, ["big.tar", *small])
    finally:
        gc.callbacks[:] = callbacks
    sent = s3.keys("stopped")
    assert "x/big.tar" not in sent and len(sent) < 100, f"{len(sent)} of 301 files went up after Ctrl-C"
    assert not s3.client().list_multipart_uploads(Bucket="stopped").get("Uploads"), "parts left behind"
