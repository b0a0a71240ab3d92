"""The endpoint goes away in the middle of a bucket prepare: a short outage is retried and the run ends
as if nothing happened; a lasting one ends the run with an error naming the object and byte range, and
the bucket gets no `.nv-meta` either way until the index is whole."""

from __future__ import annotations

import tarfile
import threading
import time

import pytest

from prep.prepare import remote
from prep.prepare.remote import prepare_remote
from prep.prepare.run import PrepareOptions
from prep.storage.address import parse_address
from prep.storage.store import RetryPolicy, StorageError, open_store
from tests.support.prepare import prepared_outputs, run_shardprep
from tests.support.s3 import Outage
from tests.support.shards import sample_members, write_tarfile

SHARDS = 24
OPTIONS = PrepareOptions(split_ratio="8,1,1", sample_type="CrudeWebdataset", num_workers=2)


@pytest.fixture(params=["threads", "workers"])
def outage(s3, tmp_path, monkeypatch, request):
    """A bucket dataset of shards of big members (so many ranged GETs), reached through a relay, scanned
    in this process's threads or in two worker processes."""
    if request.param == "workers":
        monkeypatch.setattr(remote, "MIN_BYTES_FOR_WORKERS", 0)
    local = tmp_path / "local"
    parts = {"bin": b"\x02" * 400_000, "json": b'{"i": %d}'}
    for shard in range(SHARDS):
        write_tarfile(
            local / f"shard-{shard:03d}.tar", sample_members(f"s{shard}-", 10, parts), tarfile.GNU_FORMAT
        )
    bucket = f"outage-{tmp_path.name[-12:].lower().replace('_', '-')}"
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    relay = Outage(s3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    yield relay, local, bucket
    relay.close()


def cut_when_under_way(relay: Outage, down_for: float | None) -> threading.Thread:
    """Cut the relay once some shards have been read; bring it back after `down_for` s (None: never)."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while relay.relayed < 60_000 and time.monotonic() < deadline:
            time.sleep(0.002)
        relay.cut()
        if down_for is not None:
            time.sleep(down_for)
            relay.restore()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_short_outage_is_retried_and_the_index_is_whole(s3, outage, tmp_path):
    relay, local, bucket = outage
    thread = cut_when_under_way(relay, down_for=1.0)
    counts = prepare_remote(f"s3://{bucket}/ds", OPTIONS)
    thread.join()
    assert counts is not None and sum(counts.values()) == SHARDS * 10
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    run_shardprep(
        "prepare",
        str(local),
        "--non-interactive",
        "--no-progress",
        "--split-ratio",
        "8,1,1",
        "--crude",
        check=True,
    )
    assert prepared_outputs(fetched) == prepared_outputs(local)


def test_a_lasting_outage_names_the_object_and_leaves_the_bucket_as_it_was(s3, outage):
    relay, _, bucket = outage
    before = s3.keys(bucket)
    store = open_store(parse_address(f"s3://{bucket}/ds"), retry=RetryPolicy(attempts=3, first_delay=0.1))
    thread = cut_when_under_way(relay, down_for=None)
    started = time.monotonic()
    with pytest.raises(StorageError) as raised:
        prepare_remote(f"s3://{bucket}/ds", OPTIONS, store=store)
    thread.join()
    assert time.monotonic() - started < 20
    message = str(raised.value)
    assert f"s3://{bucket}/ds/shard-" in message and " bytes " in message and "after 3 attempts" in message
    assert s3.keys(bucket) == before, "a failed prepare changed the bucket"
    assert not any(".nv-meta" in key for key in s3.keys(bucket))
