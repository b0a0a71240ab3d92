"""An upload over a dataset already in the bucket withdraws the old markers first: a failure in the middle
leaves a dataset energon calls not prepared, never an old `.info.json` beside new shards and a new index."""

from __future__ import annotations

import random

import pytest

from prep.index.format import INFO_JSON, META_DIR
from prep.prepare.run import prepare_dataset
from prep.storage.address import parse_address
from prep.storage.store import StorageError, open_store
from prep.storage.upload import GrowingUpload, upload_dataset, upload_early
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
    early = upload_early(store, present=[])
    assert early is not None
    for name, path in offsets.items():
        early.send(name, path)
    with pytest.raises(OSError):
        upload_dataset(store, new, names, early)
    assert not store.exists(f"{META_DIR}/{INFO_JSON}")

    assert upload_early(store, present=[f"{META_DIR}/{INFO_JSON}"]) is None  # a prepared dataset


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


PART = 5 << 20  # S3's smallest part


def growing_file(path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def streaming(s3, bucket: str, path, name: str = "index.sqlite"):
    """(store, upload): an 11 MiB file at `path` whose part 2 (of 5 MiB parts) is on its way to `bucket`."""
    s3.make_bucket(bucket)
    store = open_store(parse_address(f"s3://{bucket}/ds"), part_size=PART, multipart_threshold=PART + 1)
    growing_file(path, 11 << 20, seed=len(bucket))
    upload = GrowingUpload(store, name, path)
    upload.settled(4096, 9 << 20)
    assert upload.streamed_parts == 0  # part 2 ends at 10 MiB
    upload.settled(4096, 11 << 20)
    assert upload.streamed_parts == 1
    return store, upload


def test_a_file_still_growing_goes_up_part_by_part_and_whole(s3, tmp_path):
    """`index.sqlite` of a bucket prepare goes up while it is written: each part the file holds for good
    is sent at once, the first (whose head is written over at the end) and the last ones at `finish`; the
    object is the finished file, under its name only once finished."""
    path = tmp_path / "index.sqlite"
    store, upload = streaming(s3, "growing", path, ".nv-meta/index.sqlite")
    assert s3.incomplete_uploads("growing") == ["ds/.nv-meta/index.sqlite"]
    assert not store.exists(".nv-meta/index.sqlite")
    with path.open("r+b") as file:  # the head written over, more pages appended; then renamed
        file.write(b"\xff" * 4096)
        file.seek(0, 2)
        file.write(b"tail" * 300_000)
    final = path.read_bytes()
    path.rename(tmp_path / "committed.sqlite")
    upload.finish(tmp_path / "committed.sqlite")
    assert store.get(".nv-meta/index.sqlite") == final
    assert s3.incomplete_uploads("growing") == []


def test_a_file_no_longer_final_drops_the_parts_sent_and_goes_up_whole(s3, tmp_path):
    path = tmp_path / "index.sqlite"
    store, upload = streaming(s3, "unsettled", path)
    upload.unsettled()  # sqlite took over: the part sent may change
    assert s3.incomplete_uploads("unsettled") == []
    upload.settled(4096, 11 << 20)  # (nothing more is sent)
    final = growing_file(path, 12 << 20, seed=3)
    upload.finish(path)
    assert upload.streamed_parts == 1
    assert store.get("index.sqlite") == final
    assert s3.incomplete_uploads("unsettled") == []


def test_a_growing_upload_not_finished_leaves_nothing_in_the_bucket(s3, tmp_path):
    _, upload = streaming(s3, "unfinished", tmp_path / "index.sqlite")
    upload.close()  # the run failed, or was interrupted
    assert s3.incomplete_uploads("unfinished") == [] and s3.keys("unfinished") == []


def test_a_growing_upload_stopped_at_its_finish_sends_no_further_part(s3, tmp_path):
    """An interruption (or another file failing) while the upload batch reaches `index.sqlite`: its parts
    not yet sent stay here, and the upload is dropped, not completed."""
    import threading

    path = tmp_path / "index.sqlite"
    _, upload = streaming(s3, "stopfinish", path)
    stop = threading.Event()
    stop.set()
    with pytest.raises(StorageError, match="stopped before its part"):
        upload.finish(path, stop)
    assert s3.incomplete_uploads("stopfinish") == [] and s3.keys("stopfinish") == []
