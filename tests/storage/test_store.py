"""The bucket client against a real S3 server (moto on loopback): listing, ranged and whole reads,
downloads in parts, uploads in one piece and in parts, deletes, and a clear error once retries run out."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from prep.errors import PrepError
from prep.processes import in_child
from prep.storage.address import parse_address
from prep.storage.store import _CLIENTS, PART_THREADS, ObjectStore, RetryPolicy, StorageError, open_store


def test_objects_are_listed_read_by_range_written_and_deleted(s3, tmp_path):
    s3.make_bucket("store")
    store = open_store(parse_address("s3://store/data/set"))
    payload = bytes(range(256)) * 40
    store.put("a/shard-0.tar", payload)
    store.put("b.txt", b"hello")
    listed = {info.name: info for info in store.list()}
    assert sorted(listed) == ["a/shard-0.tar", "b.txt"]
    assert listed["a/shard-0.tar"].size == len(payload) and listed["a/shard-0.tar"].etag
    assert store.read("a/shard-0.tar", 1000, 24) == payload[1000:1024]
    assert store.read("a/shard-0.tar", len(payload) - 4, 100) == payload[-4:]
    assert store.get("b.txt") == b"hello"
    assert store.exists("b.txt") and not store.exists("c.txt")
    store.delete("b.txt")
    assert [info.name for info in store.list()] == ["a/shard-0.tar"]
    with pytest.raises(StorageError, match=r"s3://store/data/set/c\.txt.*does not exist"):
        store.get("c.txt")


def test_a_big_file_goes_up_in_parts(s3, tmp_path):
    """More parts than go up at once (PART_THREADS), each different: they must be joined in order."""
    s3.make_bucket("parts")
    store = open_store(parse_address("s3://parts/x"), part_size=5 * 1024 * 1024, multipart_threshold=6 << 20)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(251)) * (27 * 1024 * 1024 // 251))
    store.upload_file("big.bin", big)
    assert store.get("big.bin") == big.read_bytes()
    head = s3.client().head_object(Bucket="parts", Key="x/big.bin")
    assert head["ETag"].strip('"').endswith("-6"), "not a multipart upload in 6 parts"


def test_msc_profile_addresses_the_bucket_under_its_base_path(s3, tmp_path, monkeypatch):
    s3.make_bucket("profiled")
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "prof", "profiled")))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name)  # the profile alone says where and who
    store = open_store(parse_address("msc://prof/ds"))
    store.put("one.tar", b"x" * 10)
    assert s3.keys("profiled") == ["ds/one.tar"]
    with pytest.raises(PrepError, match="no profile 'other'"):
        open_store(parse_address("msc://other/ds"))


def test_an_msc_profile_reaches_the_keys_msc_does_whatever_the_slashes_of_its_base_path(
    s3, tmp_path, monkeypatch
):
    """MSC joins a base_path to a path as `os.path.join` does: `b/ds/` and `/b/ds` reach `ds/x`, but
    `b//ds` reaches `/ds/x`, and `b/ds//` `ds//x`; energon reads what MSC reaches."""
    msc = pytest.importorskip("multistorageclient")
    s3.make_bucket("slashes")
    for number, base_path in enumerate(["slashes/ds/", "/slashes/ds", "slashes//ds", "slashes/ds//"]):
        profile = f"slashes{number}{tmp_path.name[-6:]}".replace("_", "")  # MSC keeps clients by profile
        monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / f"{profile}.yaml", profile, base_path)))
        client, _ = msc.resolve_storage_client(f"msc://{profile}/")
        client.write(f"by-msc-{number}.tar", b"m")
        store = open_store(parse_address(f"msc://{profile}"))
        store.put(f"by-us-{number}.tar", b"u")
        by_msc, by_us = (
            [key for key in s3.keys("slashes") if key.endswith(f"{who}-{number}.tar")]
            for who in ("msc", "us")
        )
        assert [key.replace("by-msc", "by-us") for key in by_msc] == by_us, base_path
        assert [info.name for info in store.list()] == [f"by-msc-{number}.tar", f"by-us-{number}.tar"]
        s3.delete_keys("slashes", by_msc + by_us)


def test_an_msc_config_that_cannot_be_read_or_is_not_there_is_named_with_what_to_do(tmp_path, monkeypatch):
    pytest.importorskip("multistorageclient")
    not_yaml, not_a_mapping = tmp_path / "broken.yaml", tmp_path / "list.yaml"
    not_yaml.write_text("profiles: [unclosed\n  : : {\n")
    not_a_mapping.write_text("- a\n")
    for config, saying in [
        (not_yaml, f"malformed MSC config file: {not_yaml}"),
        (not_a_mapping, f"{not_a_mapping}: 'list' object has no attribute 'get'"),
    ]:
        monkeypatch.setenv("MSC_CONFIG", str(config))
        with pytest.raises(PrepError, match="msc://prof/: the MSC config cannot be read") as raised:
            open_store(parse_address("msc://prof/ds"))
        assert saying in str(raised.value) and "set MSC_CONFIG to the path of another" in str(raised.value)
    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "gone.yaml"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no config in MSC's default places either
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with pytest.raises(PrepError, match=f"MSC_CONFIG names {tmp_path / 'gone.yaml'}, which does not exist"):
        open_store(parse_address("msc://prof/ds"))


def test_an_msc_config_not_of_msc_shape_names_the_place_not_the_value_there(tmp_path, monkeypatch):
    """jsonschema's message quotes the value it refuses, which in a credentials_provider is a secret key:
    the error names where the value is instead."""
    pytest.importorskip("multistorageclient")
    config = tmp_path / "msc.yaml"
    config.write_text(
        "profiles:\n  prof:\n    storage_provider: {type: s3, options: {base_path: bucket/ds}}\n"
        "    credentials_provider: [AKIAEXAMPLE, wJalrXUtnFEMI]\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    with pytest.raises(PrepError, match="msc://prof/: the MSC config cannot be read") as raised:
        open_store(parse_address("msc://prof/ds"))
    assert "profiles/prof/credentials_provider is not of type 'object'" in str(raised.value)
    assert "wJalrXUtnFEMI" not in str(raised.value)


def test_a_profile_whose_base_path_is_an_address_is_refused_saying_what_to_write(s3, tmp_path, monkeypatch):
    config = s3.msc_config(tmp_path / "msc.yaml", "prof", "s3://bucket/ds")
    monkeypatch.setenv("MSC_CONFIG", str(config))
    with pytest.raises(PrepError, match=r"base_path, 's3://bucket/ds', does not begin with a bucket name"):
        open_store(parse_address("msc://prof/x"))


def test_unreachable_endpoint_is_retried_then_named_with_the_byte_range(s3, monkeypatch):
    from tests.support.s3 import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    store = open_store(parse_address("s3://gone/ds"), retry=RetryPolicy(attempts=3, first_delay=0.05))
    started = time.monotonic()
    with pytest.raises(StorageError) as raised:
        store.read("shard.tar", 512, 1024)
    message = str(raised.value)
    assert "s3://gone/ds/shard.tar bytes 512-1535" in message and "after 3 attempts" in message
    assert time.monotonic() - started < 5


def test_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "botocore", None)  # as if the s3 extra were not installed
    with pytest.raises(PrepError, match=r"shardprep\[s3\]"):
        open_store(parse_address("s3://bucket/ds"))


def _read_here(store: ObjectStore) -> tuple[int, list[int], bytes]:
    data = store.read("x.bin", 2, 3)
    return os.getpid(), [pid for pid, spec in _CLIENTS if spec == store.spec], data


def test_a_store_sent_to_a_forked_worker_makes_its_own_client(s3):
    s3.make_bucket("forked")
    store = open_store(parse_address("s3://forked/ds"), retry=RetryPolicy(attempts=2))
    store.put("x.bin", b"0123456789")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.retry == store.retry and copy.spec == store.spec and "client" not in vars(copy)
    child, pids, data = in_child(_read_here, store, what="reading in a child")
    assert data == b"234" and child != os.getpid()
    assert child in pids and os.getpid() in pids, "the child used its parent's client"
    assert store.read("x.bin", 0, 2) == b"01"  # the parent's client still works after the fork


def test_an_object_shorter_than_its_listing_is_a_clear_error() -> None:
    """Replaced or cut between the listing and the read: a StorageError naming it, not an IndexError."""
    from prep.storage.ranged import RangedObject
    from prep.storage.store import StorageError

    data = bytes(1000)
    shard = RangedObject(lambda offset, length: data[offset : offset + length], 2000, name="s.tar")
    with pytest.raises(StorageError, match=r"s\.tar changed while it was read: it was listed at 2,000 bytes"):
        shard[1500:1512]


def test_files_going_up_together_hold_few_parts_in_memory(s3, tmp_path):
    """Each multipart file reads PART_THREADS (4) parts ahead, and an upload sends 16 files at once: across
    them no more than PARTS_IN_MEMORY (8) parts are held, 40 MiB here, not 12 files x 4 parts x 5 MiB."""
    import time
    import tracemalloc

    from prep.storage.upload import upload_dataset

    s3.make_bucket("held")
    part = 5 << 20
    store = open_store(parse_address("s3://held/x"), part_size=part, multipart_threshold=part + 1)
    # (the client is this process's for the spec, which later tests share: the hook goes after the upload)
    event, slow = "before-parameter-build.s3.UploadPart", lambda **_: time.sleep(0.1)
    names = [f"s{i}.tar" for i in range(12)]
    block = os.urandom(1 << 20)
    for name in names:
        (tmp_path / name).write_bytes(block * 20)
    store.client.meta.events.register(event, slow)
    tracemalloc.start()
    try:
        upload_dataset(store, tmp_path, names)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        store.client.meta.events.unregister(event, slow)
    assert store.get("s11.tar") == (tmp_path / "s11.tar").read_bytes()
    assert peak < 120 << 20, f"{peak / 2**20:.0f} MiB of parts held at once"


def test_a_request_the_server_does_not_implement_is_not_retried() -> None:
    """501 NotImplemented (an S3-compatible server without ListMultipartUploads, say) will not change on
    another try; 500 and 503 may."""
    from botocore.exceptions import ClientError

    from prep.storage.store import _transient

    def answer(status: int, code: str) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")

    assert not _transient(answer(501, "NotImplemented"))
    assert _transient(answer(500, "InternalError")) and _transient(answer(503, "SlowDown"))


def self_signed_tls_server(folder) -> tuple[str, list[int]]:
    """An https endpoint on loopback whose certificate no CA vouches for (it only shakes hands), and the
    list it counts its connections in."""
    import datetime
    import socket
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (folder / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[int] = []

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            connections.append(1)
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (OSError, ssl.SSLError):
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"https://127.0.0.1:{listener.getsockname()[1]}", connections


def test_a_server_certificate_not_trusted_is_named_at_once_with_what_to_do(tmp_path, monkeypatch):
    """A certificate the client does not trust fails every try alike: it is not retried, and the error
    says to give the CA that signed it (AWS_CA_BUNDLE), not to check that the endpoint is up."""
    pytest.importorskip("botocore")
    endpoint, connections = self_signed_tls_server(tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    store = open_store(parse_address("s3://tls/ds"), retry=RetryPolicy(attempts=3, first_delay=0.05))
    with pytest.raises(StorageError) as raised:
        store.list()
    message = str(raised.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message and "AWS_CA_BUNDLE" in message
    assert "attempts" not in message and "is up and reachable" not in message
    assert len(connections) <= 2  # one try (its connection pool opens two); three tries opened six


@contextmanager
def each_get(store: ObjectStore, seen: Callable[[str], None]) -> Iterator[None]:
    """`seen(range)` before each ranged GET `store` sends (in the thread that sends it), for the block."""
    event = "before-parameter-build.s3.GetObject"

    def hook(params: dict, **_: object) -> None:
        seen(params.get("Range", ""))

    store.client.meta.events.register(event, hook)
    try:
        yield
    finally:
        store.client.meta.events.unregister(event, hook)


PART = 4096


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 5 * PART + 3])
def test_a_download_is_the_object_in_one_request_per_part(s3, tmp_path, size):
    s3.make_bucket("fetched")
    store = open_store(parse_address("s3://fetched/ds"), part_size=PART)
    data = os.urandom(size)
    store.put("index.sqlite", data)
    ranges: list[str] = []
    before = store.requests, store.bytes_read
    with each_get(store, ranges.append):
        store.download("index.sqlite", tmp_path / "index.sqlite", size)
    assert (tmp_path / "index.sqlite").read_bytes() == data
    parts = range(0, size, PART)
    assert sorted(ranges) == sorted(f"bytes={at}-{min(at + PART, size) - 1}" for at in parts)
    assert (store.requests, store.bytes_read) == (before[0] + len(parts), before[1] + size)


def test_a_download_fetches_a_few_parts_at_once_in_bounded_memory(s3, tmp_path):
    """Parts are fetched by PART_THREADS threads at most (each held in memory until written at its place),
    not one after the other: never the whole object in memory."""
    import tracemalloc

    s3.make_bucket("parallel")
    part = 256 * 1024
    store = open_store(parse_address("s3://parallel/ds"), part_size=part)
    data = os.urandom(32 * part)
    store.put("index.sqlite", data)
    threads: set[int] = set()
    with each_get(store, lambda _: threads.add(threading.get_ident())):
        tracemalloc.start()
        try:
            store.download("index.sqlite", tmp_path / "index.sqlite", len(data))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (tmp_path / "index.sqlite").read_bytes() == data
    assert 1 < len(threads) <= PART_THREADS, f"parts fetched by {len(threads)} threads"
    assert peak < 3 * PART_THREADS * part, f"{peak / part:.1f} parts held at once"


@pytest.mark.parametrize("parts", [9, 8], ids=["another-size", "same-size"])
def test_an_object_replaced_during_a_download_is_refused_and_leaves_no_file(s3, tmp_path, parts):
    """Replaced by one of another size, or of its own (a re-prepared index.sqlite often has the old one's
    size: whole pages): the parts fetched before and after the replacement would make a file that is
    neither."""
    bucket = f"replaced-{parts}"
    s3.make_bucket(bucket)
    store = open_store(parse_address(f"s3://{bucket}/ds"), part_size=PART)
    store.put("index.sqlite", os.urandom(8 * PART))
    size = store.list()[0].size

    def replace_at_third_part(byte_range: str) -> None:
        if byte_range.startswith(f"bytes={2 * PART}-"):
            s3.client().put_object(Bucket=bucket, Key="ds/index.sqlite", Body=os.urandom(parts * PART))

    target = tmp_path / "index.sqlite"
    with each_get(store, replace_at_third_part), pytest.raises(StorageError) as raised:
        store.download("index.sqlite", target, size)
    assert "index.sqlite changed while it was read" in str(raised.value)
    if parts != 8:
        assert f"it was listed at {size:,} bytes" in str(raised.value)
    assert not target.exists(), "a file that is not the object was left where the object goes"


def test_ctrl_c_during_a_download_stops_it_with_no_thread_running_and_no_file(s3, tmp_path):
    s3.make_bucket("interrupted")
    store = open_store(parse_address("s3://interrupted/ds"), part_size=PART)
    store.put("index.sqlite", os.urandom(64 * PART))
    main = threading.main_thread().ident
    assert main is not None

    interrupted = threading.Event()

    def ctrl_c_at_third_part(byte_range: str) -> None:
        if byte_range.startswith(f"bytes={2 * PART}-"):
            interrupted.set()
            signal.pthread_kill(main, signal.SIGINT)
        elif interrupted.is_set():
            # The main thread runs the handler when it next gets the GIL: on a loaded machine that took
            # longer than the 4 threads took to fetch the 32 parts of 4 KiB this test allows.
            time.sleep(0.2)

    target = tmp_path / "index.sqlite"
    before = store.requests
    with each_get(store, ctrl_c_at_third_part), pytest.raises(KeyboardInterrupt):
        store.download("index.sqlite", target, 64 * PART)
    assert store.requests - before < 64 // 2, "the download went on after Ctrl-C"
    assert not [
        thread.name for thread in threading.enumerate() if thread.name.startswith("shardprep-download")
    ]
    assert not target.exists()
