"""Object storage on a server that keeps its connections open between requests, as S3 does: Ceph's
object gateway (`tests.support.ceph`). moto's server, the other tests', closes each connection after one
answer, so there a process can never share a connection with another. Here it can: a process forked
while its connection pool holds an open connection, and a child that goes on using it, read answers
meant for each other, of the right length and wrong content (energon's prepare, whose workers do, writes
indexes with samples missing; see README). Each test here would show that, and shows that our clients
work with a gateway of Ceph 16, which predates S3's newer checksums.

Skipped where Ceph's daemons are not installed; `.ci/run` installs them.
"""

from __future__ import annotations

import json
import os

import pytest

from prep.prepare import remote
from prep.prepare.remote import prepare_remote
from prep.prepare.run import PrepareOptions
from prep.storage.address import parse_address
from prep.storage.store import open_store
from tests.support.ceph import INSTALL, CephS3Server, available
from tests.support.prepare import prepared_outputs, run_shardprep, sqlite_contents, tar_indexes, twin
from tests.support.shards import sample_members, write_tarfile

pytestmark = pytest.mark.skipif(not available(), reason=f"Ceph's daemons are not installed ({INSTALL})")


@pytest.fixture(scope="module")
def s3_server(early_ceph, tmp_path_factory):
    """This module's server: Ceph's gateway in moto's place (conftest's `s3` points each test at it),
    the one the run started early (tests/conftest.py) if it did."""
    pytest.importorskip("boto3", reason="boto3 is needed for the object-storage tests")
    if early_ceph is not None:
        try:
            yield early_ceph.server()
        finally:
            early_ceph.stop()
        return
    with CephS3Server(tmp_path_factory.mktemp("ceph")) as server:
        yield server


def test_forked_children_of_a_store_read_their_own_answers(s3, tmp_path):
    """The parent reads first (its pool keeps the connection open), then forks 4 children, which start
    together and each read another object through the store they inherited. Had they the parent's
    client, two of them would read on one connection and get each other's bytes (with one client shared
    by all processes: 7 rounds in 12 failed, so 6 rounds miss it about once in 100 runs)."""
    s3.make_bucket("forked")
    store = open_store(parse_address("s3://forked/objects"))
    objects = {f"o{i}.bin": bytes([i]) * (1 << 20) + os.urandom(4096) for i in range(4)}
    for name, data in objects.items():
        store.put(name, data)
    for round in range(6):
        assert store.read("o0.bin", 0, 16) == objects["o0.bin"][:16]  # an open connection in the pool
        gate, release = os.pipe()
        children = {}
        for name, data in objects.items():
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's exit status is the result
                try:
                    os.close(release)
                    os.read(gate, 1)  # returns when the parent closes `release`: all start at once
                    os._exit(0 if store.get(name) == data else 1)
                except BaseException:
                    os._exit(2)
            children[pid] = name
        os.close(gate)
        os.close(release)
        results = {children[pid]: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children}
        assert results == dict.fromkeys(objects, 0), f"round {round}: 1 = other bytes, 2 = an error"


def test_worker_processes_index_every_shard_right(s3, tmp_path, monkeypatch):
    """prepare's scan in 2 worker processes, forked after the listing and the first shard's probe have
    left connections open: the index equals a local prepare's."""
    monkeypatch.setattr(remote, "MIN_BYTES_FOR_WORKERS", 0)  # workers for a small dataset too
    local = tmp_path / "local"
    for shard in range(16):
        members = sample_members(f"s{shard:02d}-", 400, {"txt": b"a few words", "json": b'{"n": 1}'})
        write_tarfile(local / f"shard-{shard:03d}.tar", members)
    s3.make_bucket("workers")
    s3.upload_folder(local, "workers", "ds")
    options = PrepareOptions(split_ratio="8,1,1", sample_type="CrudeWebdataset", num_workers=2)
    counts = prepare_remote("s3://workers/ds", options, tmp_path=tmp_path / "scratch")
    assert counts is not None and sum(counts.values()) == 16 * 400
    fetched = tmp_path / "fetched"
    s3.download_prefix("workers", "ds", fetched)
    reference = twin(local, "reference")
    run_shardprep(
        "prepare", str(reference), "--non-interactive", "--split-ratio", "8,1,1", "--no-progress",
        "--sample-type", "CrudeWebdataset", check=True,
    )  # fmt: skip
    assert prepared_outputs(fetched) == prepared_outputs(reference)


def test_a_written_dataset_goes_up_whole(s3, tmp_path):
    """`write` to the gateway: what a local write makes, which `verify --deep` reads back whole."""
    source = tmp_path / "rows.jsonl"
    rows = [{"text": f"{i} " + "x" * (i * 7919 % 40_000)} for i in range(600)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    s3.make_bucket("written")
    args = ["--maxcount", "400", "--split-ratio", "8,1,1", "--part", "text=txt", "--no-progress"]
    result = run_shardprep("write", str(source), "s3://written/out", *args)
    assert result.returncode == 0, result.stderr
    local = tmp_path / "local"
    run_shardprep("write", str(source), str(local), *args, check=True)
    fetched = tmp_path / "fetched"
    s3.download_prefix("written", "out", fetched)
    assert tar_indexes(fetched) == tar_indexes(local)
    assert {path.name: path.read_bytes() for path in fetched.glob("*.tar")} == {
        path.name: path.read_bytes() for path in local.glob("*.tar")
    }
    assert sqlite_contents(fetched / ".nv-meta" / "index.sqlite") == sqlite_contents(
        local / ".nv-meta" / "index.sqlite"
    )
    verified = run_shardprep("verify", "s3://written/out", "--deep")
    assert verified.returncode == 0 and "healthy" in verified.stdout, verified.stdout + verified.stderr
