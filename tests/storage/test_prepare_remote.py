"""`shardprep prepare s3://...` / `msc://...`: a dataset that lives only in a bucket (moto on loopback) is
indexed by ranged reads into exactly what a local prepare writes, uploaded with `.info.json` last, and
read back by energon's loader through `msc://`."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import warnings

import pytest

from prep.errors import PrepError
from prep.index.format import META_DIR, tar_index_name
from prep.media.filter import EXTENSION, MediaFilter
from prep.prepare import remote
from prep.prepare.media import prepare_media
from prep.prepare.remote import prepare_remote, shard_rows_from_bucket
from prep.prepare.run import PrepareOptions, Unattended, prepare_dataset
from prep.storage.address import parse_address
from prep.storage.scratch import resume_folder_for, scratch_folder
from prep.storage.store import ObjectStore, open_store
from tests.prepare.test_media_matches_energon import media_dataset
from tests.support.damaged_index import described_by_extension, zero_leaf_pages
from tests.support.media import assert_same_media_index
from tests.support.prepare import prepared_outputs, run_shardprep, sqlite_contents, twin
from tests.support.ray import local_ray
from tests.support.s3 import BIG, mixed_dataset
from tests.support.shards import sample_members, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--no-progress", "--sample-type", "CrudeWebdataset"]


@pytest.fixture
def bucket_dataset(s3, tmp_path):
    """(local copy of the shards, bucket name): the shards uploaded under s3://BUCKET/ds."""
    local = mixed_dataset(tmp_path / "local")
    bucket = f"ds-{tmp_path.name.lower().replace('_', '-')}"[:60]
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    return local, bucket


def assert_as_local(s3, bucket, local, tmp_path) -> None:
    """The dataset prepared under s3://BUCKET/ds, downloaded, equals a local prepare of its shards `local`,
    and its `.nv-meta` holds the same files."""
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    ours = twin(local, "reference")
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    assert prepared_outputs(fetched) == prepared_outputs(ours)
    assert sorted(path.name for path in (fetched / META_DIR).iterdir()) == sorted(
        path.name for path in (ours / META_DIR).iterdir()
    )


def test_bucket_prepare_writes_what_a_local_prepare_writes(s3, bucket_dataset, tmp_path):
    local, bucket = bucket_dataset
    result = run_shardprep("prepare", f"s3://{bucket}/ds", *FLAGS, "--tmp-path", str(tmp_path / "scratch"))
    assert result.returncode == 0, result.stderr
    assert "Done: indexed" in result.stdout
    assert not list((tmp_path / "scratch").iterdir()), "the scratch folder was not cleaned up"
    assert_as_local(s3, bucket, local, tmp_path)


def test_a_bucket_prepare_describes_media_as_a_local_prepare_does(s3, tmp_path):
    local = media_dataset(tmp_path / "local", shards=2)
    s3.make_bucket("media-prepare")
    s3.upload_folder(local, "media-prepare", "ds")
    flags = [*FLAGS, "--media-metadata-by-extension"]
    result = run_shardprep(
        "prepare", "s3://media-prepare/ds", *flags, "--tmp-path", str(tmp_path / "scratch")
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "scratch").iterdir()) == []
    ours = twin(local, "reference")
    expected = run_shardprep("prepare", str(ours), *flags, check=True)
    assert result.stderr == expected.stderr  # the audio/video parts without a row, said once
    fetched = tmp_path / "fetched"
    s3.download_prefix("media-prepare", "ds", fetched)
    assert_same_media_index(fetched, ours)


def test_big_members_cost_only_their_headers(s3, bucket_dataset):
    _, bucket = bucket_dataset
    store = open_store(parse_address(f"s3://{bucket}/ds"))
    size = next(info.size for info in store.list() if info.name == "big-000.tar")
    fetched = [0]
    rows = shard_rows_from_bucket(store, "big-000.tar", size, 0, fetched)
    assert rows.count == 12
    assert fetched[0] < size * 0.05, f"{fetched[0]} of {size} bytes read"
    text_size = next(info.size for info in store.list() if info.name == "text-000.tar")
    small = [0]
    shard_rows_from_bucket(store, "text-000.tar", text_size, 0, small)
    assert small[0] <= text_size * 1.1, "a shard of small members costs about its size"


def test_a_shard_of_small_then_big_members_is_not_read_whole(s3, tmp_path, monkeypatch):
    """Small first members make a shard look cheap to read whole; past WHOLE_SHARD_BYTES it is walked by
    ranged reads all the same, so neither memory nor bytes read grow with its big members."""
    monkeypatch.setattr(remote, "WHOLE_SHARD_BYTES", 1 << 20)
    members = sample_members("a-", 16) + sample_members("b-", 4, {"bin": b"\x01" * 2_000_000})
    write_tarfile(tmp_path / "src" / "mixed.tar", members)
    s3.make_bucket("mixed")
    s3.upload_folder(tmp_path / "src", "mixed", "ds")
    store = open_store(parse_address("s3://mixed/ds"))
    size = next(info.size for info in store.list() if info.name == "mixed.tar")
    fetched = [0]
    rows = shard_rows_from_bucket(store, "mixed.tar", size, 0, fetched)
    assert rows.count == 20
    assert fetched[0] < size * 0.1, f"{fetched[0]} of {size} bytes read"


def test_only_the_first_shard_is_probed_and_shards_like_it_cost_one_request(s3, tmp_path, monkeypatch):
    """Finding out that a shard's members are small costs requests of its own before the shard is read
    whole; only the first shard is probed, and when its members are small every other shard is read whole
    in one request (one with big members too, indexed the same). When the first has big members, the
    others are probed and walked as before."""
    source = tmp_path / "src"
    for shard in range(4):
        write_tarfile(source / f"a-{shard}.tar", sample_members(f"a{shard}-", 40), tarfile.GNU_FORMAT)
    write_tarfile(source / "b-big.tar", sample_members("b-", 3, {"bin": b"\x01" * 300_000}))
    s3.make_bucket("probed")
    s3.upload_folder(source, "probed", "small-first")
    (source / "b-big.tar").rename(source / "0-big.tar")
    s3.upload_folder(source, "probed", "big-first")
    reads: list[str] = []
    read = ObjectStore.read
    monkeypatch.setattr(ObjectStore, "read", lambda self, *args: reads.append(args[0]) or read(self, *args))
    options = PrepareOptions(split_ratio="8,1,1", sample_type="CrudeWebdataset")

    prepare_remote("s3://probed/small-first", options, tmp_path=tmp_path / "scratch")
    assert reads.count("a-0.tar") > 1
    assert {name: reads.count(name) for name in set(reads) - {"a-0.tar"}} == dict.fromkeys(
        ["a-1.tar", "a-2.tar", "a-3.tar", "b-big.tar"], 1
    )
    fetched = tmp_path / "fetched"
    s3.download_prefix("probed", "small-first", fetched)
    (source / "0-big.tar").rename(source / "b-big.tar")
    run_shardprep("prepare", str(source), *FLAGS, check=True)
    assert prepared_outputs(fetched) == prepared_outputs(source)

    reads.clear()
    prepare_remote("s3://probed/big-first", options, tmp_path=tmp_path / "scratch")
    assert all(reads.count(f"a-{shard}.tar") > 1 for shard in range(4)), "a shard of small members not probed"


class InterruptedAtDatasetYaml(Unattended):
    """A user who presses Ctrl-C at the dataset.yaml question, after the shards were indexed."""

    def dataset_definition(self, staged):
        raise KeyboardInterrupt


def test_a_run_stopped_after_indexing_leaves_the_bucket_as_it_was(s3, tmp_path):
    """The `.tar.idx` files go up once every shard is indexed, where the bucket holds no index: a run
    stopped after that deletes them again. Over a prepared dataset they wait for the upload, so its old
    `.tar.idx` files are untouched until its markers are withdrawn."""
    source = tmp_path / "src"
    for shard in range(3):
        write_tarfile(source / f"s-{shard}.tar", sample_members(f"s{shard}-", 20))
    s3.make_bucket("stopped")
    s3.upload_folder(source, "stopped", "ds")
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", force_overwrite=True)
    with pytest.raises(KeyboardInterrupt):
        prepare_remote("s3://stopped/ds", options, InterruptedAtDatasetYaml(options))
    assert s3.keys("stopped") == ["ds/s-0.tar", "ds/s-1.tar", "ds/s-2.tar"]

    def index_objects() -> dict[str, bytes]:
        """Every object of the bucket but the shards, with its bytes."""
        get = s3.client().get_object
        return {
            key: get(Bucket="stopped", Key=key)["Body"].read()
            for key in s3.keys("stopped")
            if not key.endswith(".tar")
        }

    prepare_remote("s3://stopped/ds", options)
    before = index_objects()
    write_tarfile(source / "s-0.tar", sample_members("s0-", 7))  # a changed shard: a different .tar.idx
    s3.upload_folder(source, "stopped", "ds")
    with pytest.raises(KeyboardInterrupt):
        prepare_remote("s3://stopped/ds", options, InterruptedAtDatasetYaml(options))
    assert index_objects() == before


def test_ctrl_c_while_a_resumed_scan_stops_its_workers_stops_the_run(s3, tmp_path, monkeypatch):
    """With --resume the scan is closed once every shard has come, not run to its end: closing it ends its
    workers (with `--engine ray`, ray.shutdown: a second or two), and a Ctrl-C then stops the run. Left to
    the garbage collector, the close printed 'Exception ignored' with the KeyboardInterrupt's traceback,
    and the run went on to upload the index and exit 0."""
    source = tmp_path / "src"
    for shard in range(3):
        write_tarfile(source / f"s-{shard}.tar", sample_members(f"s{shard}-", 20))
    s3.make_bucket("ctrl-c-at-close")
    s3.upload_folder(source, "ctrl-c-at-close", "ds")
    scan = remote.BucketShards.scan

    def interrupted_when_closed(self, tasks, workers):
        try:
            yield from scan(self, tasks, workers)
        finally:
            raise KeyboardInterrupt  # the Ctrl-C that reaches Python while the workers are being stopped

    monkeypatch.setattr(remote.BucketShards, "scan", interrupted_when_closed)
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", resume=True)
    with pytest.raises(KeyboardInterrupt):
        prepare_remote("s3://ctrl-c-at-close/ds", options, tmp_path=tmp_path / "scratch")
    assert s3.keys("ctrl-c-at-close") == ["ds/s-0.tar", "ds/s-1.tar", "ds/s-2.tar"]
    kept = resume_folder_for(parse_address("s3://ctrl-c-at-close/ds"), tmp_path / "scratch")
    assert list((tmp_path / "scratch").iterdir()) == [kept], "only the rows kept for a rerun may stay"


def test_shard_errors_name_the_shard_and_offset_as_locally(s3, tmp_path):
    s3.make_bucket("broken")
    good = write_tarfile(tmp_path / "src" / "good.tar", sample_members("g-", 5))
    cut = tmp_path / "src" / "cut.tar"
    cut.write_bytes(good.read_bytes()[:2000])
    s3.upload_folder(tmp_path / "src", "broken", "ds")
    result = run_shardprep("prepare", "s3://broken/ds", *FLAGS)
    assert result.returncode != 0
    local = run_shardprep("prepare", str(tmp_path / "src"), *FLAGS)
    assert result.stderr == local.stderr and "cut.tar at byte" in result.stderr
    assert s3.keys("broken") == ["ds/cut.tar", "ds/good.tar"], "a failed prepare wrote to the bucket"


def test_energon_loads_a_bucket_prepared_dataset_through_msc(s3, bucket_dataset, tmp_path, monkeypatch):
    pytest.importorskip("megatron.energon")
    from tests.support.write import load_parts

    local, bucket = bucket_dataset
    profile = f"p{tmp_path.name[-8:]}".replace("_", "")  # MSC caches clients by profile name
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", profile, bucket)))
    flags = ["--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--crude"]
    run_shardprep("prepare", f"msc://{profile}/ds", *flags, check=True)
    reference = twin(local, "reference")
    run_shardprep("prepare", str(reference), *flags, check=True)
    loaded = load_parts(f"msc://{profile}/ds")  # type: ignore[arg-type]
    assert loaded == load_parts(reference)
    assert loaded["big-00003"]["bin"] == b"\x01" * BIG


def test_no_shards_under_an_msc_profile_names_the_keys_it_stands_for(s3, tmp_path, monkeypatch):
    """A base_path `bucket//ds` (templated from `$BUCKET/$PREFIX` with PREFIX=/ds) reaches keys `/ds/...`,
    not the shards under `ds/`: the error shows which keys were looked at."""
    s3.make_bucket("based")
    s3.client().put_object(
        Bucket="based",
        Key="ds/a.tar",
        Body=write_tarfile(tmp_path / "a.tar", sample_members("a", 2)).read_bytes(),
    )
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "based", "based//ds")))
    result = run_shardprep("prepare", "msc://based", *FLAGS)
    assert result.returncode == 1
    assert "No shards found under msc://based/ (bucket based, keys beginning '/ds/')" in result.stderr


def test_an_address_in_another_unicode_form_than_the_buckets_keys_is_named_so(s3, tmp_path):
    """`café` pasted from macOS is NFD (`e` and a combining accent), the bucket's keys NFC (`é`): S3 keys
    are bytes, so nothing is below the one address, and the other looks the same."""
    s3.make_bucket("unicode")
    shard = write_tarfile(tmp_path / "a.tar", sample_members("a", 2))
    s3.client().put_object(Bucket="unicode", Key="caf\u00e9/a.tar", Body=shard.read_bytes())
    result = run_shardprep("prepare", "s3://unicode/cafe\u0301", *FLAGS)
    assert result.returncode == 1
    assert (
        "Objects are below s3://unicode/caf\u00e9, which looks the same but writes its characters in Unicode's NFC form"
        in result.stderr
    )


def test_a_prepared_bucket_dataset_is_kept_unless_forced_and_tar_index_only_keeps_its_split(
    s3, bucket_dataset
):
    _, bucket = bucket_dataset
    address = f"s3://{bucket}/ds"
    run_shardprep("prepare", address, *FLAGS, check=True)
    split = s3.client().get_object(Bucket=bucket, Key="ds/.nv-meta/split.yaml")["Body"].read()
    again = run_shardprep("prepare", address, *FLAGS)
    assert again.returncode != 0 and f"{address} has already been prepared" in again.stderr
    run_shardprep("prepare", address, "--tar-index-only", "--non-interactive", "--no-progress", check=True)
    assert s3.client().get_object(Bucket=bucket, Key="ds/.nv-meta/split.yaml")["Body"].read() == split


def test_resume_reuses_the_shards_an_earlier_run_finished_and_redoes_a_changed_one(s3, tmp_path):
    """A prepare that stopped on a bad shard, rerun with --resume once the shard is replaced: the other
    shards' rows come from the local checkpoint (keyed by size and ETag), the replaced one is scanned,
    and the result is what a clean prepare writes."""
    local = tmp_path / "local"
    for shard in range(6):
        write_tarfile(local / f"shard-{shard}.tar", sample_members(f"s{shard}-", 20))
    good = (local / "shard-4.tar").read_bytes()
    (local / "shard-4.tar").write_bytes(good[:3000])  # cut inside a member
    s3.make_bucket("resumed")
    s3.upload_folder(local, "resumed", "ds")
    scratch = ["--tmp-path", str(tmp_path / "scratch")]
    failed = run_shardprep("prepare", "s3://resumed/ds", *FLAGS, "--resume", *scratch)
    assert failed.returncode != 0 and "shard-4.tar" in failed.stderr
    (local / "shard-4.tar").write_bytes(good)
    s3.upload_folder(local, "resumed", "ds")  # the same bytes for the others: the same ETags
    resumed = run_shardprep("prepare", "s3://resumed/ds", *FLAGS, "--resume", *scratch, check=True)
    assert "5 of 6 shards were indexed by an earlier run and are reused" in resumed.stdout
    assert list((tmp_path / "scratch").iterdir()) == [], "the checkpoint stays after the upload"
    fetched = tmp_path / "fetched"
    s3.download_prefix("resumed", "ds", fetched)
    reference = twin(local, "reference")
    run_shardprep("prepare", str(reference), *FLAGS, check=True)
    assert prepared_outputs(fetched) == prepared_outputs(reference)


@pytest.fixture
def in_workers(monkeypatch):
    """Every bucket scan in worker processes, two shards per batch, however small the dataset."""
    monkeypatch.setattr(remote, "MIN_BYTES_FOR_WORKERS", 0)
    monkeypatch.setattr(remote, "WORKER_THREADS", 2)
    return PrepareOptions(split_ratio="8,1,1", sample_type="CrudeWebdataset", num_workers=2)


def test_worker_processes_write_what_a_local_prepare_writes(s3, bucket_dataset, in_workers, tmp_path):
    local, bucket = bucket_dataset
    counts = prepare_remote(f"s3://{bucket}/ds", in_workers)
    assert counts is not None
    assert_as_local(s3, bucket, local, tmp_path)


def broken_dataset(s3, tmp_path, bucket: str, shards: int, broken: int):
    """`shards` shards, shard `broken` cut short, uploaded under s3://BUCKET/ds; their local folder."""
    s3.make_bucket(bucket)
    source = tmp_path / "src"
    for shard in range(shards):
        write_tarfile(source / f"s{shard}.tar", sample_members(f"s{shard}-", 5))
    cut = source / f"s{broken}.tar"
    cut.write_bytes(cut.read_bytes()[:2000])
    s3.upload_folder(source, bucket, "ds")
    return source


def test_a_bad_shard_in_a_worker_is_named_as_locally(s3, in_workers, tmp_path):
    source = broken_dataset(s3, tmp_path, "broken-workers", shards=4, broken=2)
    with pytest.raises(PrepError) as raised:
        prepare_remote("s3://broken-workers/ds", in_workers)
    local = run_shardprep("prepare", str(source), *FLAGS)
    assert "s2.tar at byte" in str(raised.value) and str(raised.value) in local.stderr
    assert len(s3.keys("broken-workers")) == 4, "a failed prepare wrote to the bucket"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray instance with 2 CPUs for the module's Ray tests; yields its address. Started after
    the S3 server, so its workers have none of the AWS_* variables: what they read the bucket with comes
    with their tasks."""
    for ray in local_ray(tmp_path_factory):
        yield ray.get_runtime_context().gcs_address


def test_ray_tasks_scan_a_bucket_into_what_a_local_prepare_writes(s3, bucket_dataset, ray_cluster, tmp_path):
    local, bucket = bucket_dataset
    store = open_store(parse_address(f"s3://{bucket}/ds"))
    shards = sum(info.size for info in store.list() if info.name.endswith(".tar"))
    options = PrepareOptions(
        split_ratio="8,1,1", sample_type="CrudeWebdataset", engine="ray", ray_address=ray_cluster
    )
    counts = prepare_remote(f"s3://{bucket}/ds", options, store=store)
    assert counts is not None
    # This process probed the first shard and sent the index up; the shards were read by Ray's workers.
    assert store.bytes_read < shards / 10, f"{store.bytes_read:,} of {shards:,} bytes read by the driver"
    assert_as_local(s3, bucket, local, tmp_path)


def test_a_bad_shard_scanned_by_ray_is_named_as_locally(s3, ray_cluster, tmp_path):
    source = broken_dataset(s3, tmp_path, "broken-ray", shards=9, broken=6)
    ray = ["--engine", "ray", "--ray-address", ray_cluster]
    result = run_shardprep("prepare", "s3://broken-ray/ds", *FLAGS, *ray)
    local = run_shardprep("prepare", str(source), *FLAGS)
    assert result.returncode == 1 and "s6.tar at byte" in result.stderr
    assert result.stderr.splitlines()[-1] in local.stderr
    assert len(s3.keys("broken-ray")) == 9, "a failed prepare wrote to the bucket"


def test_messages_name_the_bucket_not_the_local_folder_the_index_is_built_in(s3, tmp_path):
    source = tmp_path / "src"
    write_tarfile(source / "s-0.tar", sample_members("s0-", 5))
    s3.make_bucket("named")
    s3.upload_folder(source, "named", "ds")
    address = "s3://named/ds"
    never = run_shardprep("prepare", address, "--tar-index-only", "--non-interactive", "--no-progress")
    assert never.returncode != 0 and f"{address} has not been prepared yet" in never.stderr
    flags = [
        "--non-interactive",
        "--no-progress",
        "--split-ratio",
        "1,0,0",
        "--sample-type",
        "CaptioningSample",
    ]
    made = run_shardprep("prepare", address, *flags, check=True)
    assert f"Created {address}/.nv-meta/sample_loader.py." in made.stdout
    assert "ds/.nv-meta/sample_loader.py" in s3.keys("named")


def test_a_shard_replaced_by_a_longer_one_while_it_is_read_is_an_error(s3, tmp_path):
    """A shard rewritten between the listing and its read is not indexed as far as its listed size: the
    read sees the object's new size and says it changed."""
    source = tmp_path / "src"
    for shard in range(3):
        write_tarfile(source / f"s-{shard}.tar", sample_members(f"s{shard}-", 80))
    longer = write_tarfile(tmp_path / "new" / "s-2.tar", sample_members("s2-", 100))
    s3.make_bucket("replaced")
    s3.upload_folder(source, "replaced", "ds")
    store = open_store(parse_address("s3://replaced/ds"))
    listed = store.list

    def list_then_replace() -> list:
        found = listed()
        s3.client().upload_file(str(longer), "replaced", "ds/s-2.tar")
        return found

    store.list = list_then_replace  # type: ignore[method-assign]
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", force_overwrite=True)
    with pytest.raises(
        PrepError, match=r"s3://replaced/ds/s-2.tar changed while it was read: it was listed at"
    ):
        prepare_remote("s3://replaced/ds", options, store=store, tmp_path=tmp_path / "scratch")
    assert not any(key.startswith("ds/.nv-meta") for key in s3.keys("replaced"))


def test_a_shard_replaced_by_one_of_its_size_while_it_is_walked_is_an_error(s3, tmp_path):
    """A shard of big members is walked by several ranged GETs: one rewritten in the middle (a same-size
    shard is common, tars being padded to 10 KiB records) gave rows of both versions, the first members'
    names from the old and the rest from the new, and the run succeeded."""
    parts = {"bin": b"\x01" * BIG, "json": b'{"i": %d}'}
    write_tarfile(tmp_path / "src" / "big.tar", sample_members("old-", 12, parts))
    other = write_tarfile(tmp_path / "new" / "big.tar", sample_members("new-", 12, parts))
    assert other.stat().st_size == (tmp_path / "src" / "big.tar").stat().st_size
    s3.make_bucket("rewritten")
    s3.upload_folder(tmp_path / "src", "rewritten", "ds")
    store = open_store(parse_address("s3://rewritten/ds"))
    gets: list[str] = []

    def replace_after_the_third_read(params: dict, **_: object) -> None:
        gets.append(params.get("Range", ""))
        if len(gets) == 3:
            s3.client().upload_file(str(other), "rewritten", "ds/big.tar")

    event = "before-parameter-build.s3.GetObject"
    store.client.meta.events.register(event, replace_after_the_third_read)
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset")
    try:
        with pytest.raises(PrepError, match=r"s3://rewritten/ds/big.tar changed while it was read"):
            prepare_remote("s3://rewritten/ds", options, store=store, tmp_path=tmp_path / "scratch")
    finally:
        store.client.meta.events.unregister(event, replace_after_the_third_read)
    assert len(gets) >= 3, "the shard was read in fewer requests than the test needs"
    assert s3.keys("rewritten") == ["ds/big.tar"]


def test_a_killed_runs_folder_under_tmp_path_is_removed_by_the_next_run(s3, tmp_path):
    """SIGKILL leaves a bucket prepare's local folder (staged index and all) under --tmp-path; the next run
    there removes it, and keeps what is not ours or is alive."""
    source = tmp_path / "src"
    write_tarfile(source / "s-0.tar", sample_members("s0-", 20))
    s3.make_bucket("killed")
    s3.upload_folder(source, "killed", "ds")
    scratch = tmp_path / "scratch"
    asking = subprocess.Popen(
        [sys.executable, "-m", "prep", "prepare", "s3://killed/ds", "--split-ratio", "1,0,0", "--no-progress",
         "--tmp-path", str(scratch)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        shown = ""
        while "dataset.yaml interactively" not in shown:  # the index is staged: the run asks its questions
            shown += asking.stdout.read(1) or pytest.fail(f"the prepare ended early: {shown}")
    finally:
        asking.kill()
        asking.wait()
    (left,) = scratch.iterdir()
    assert any(left.rglob("index.sqlite")), "the killed run had staged its index there"
    assert not [key for key in s3.keys("killed", "ds") if key.endswith(".info.json")], (
        "energon sees no dataset"
    )
    (scratch / "shardprep-other").mkdir()  # not a run's folder: kept
    with scratch_folder(scratch, "prepare") as alive:
        run_shardprep("prepare", "s3://killed/ds", *FLAGS, "--tmp-path", str(scratch), check=True)
        assert alive.is_dir()
    assert sorted(path.name for path in scratch.iterdir()) == ["shardprep-other"]


def test_a_prepare_aborts_the_incomplete_uploads_a_killed_run_left_for_its_index(s3, tmp_path):
    """A prepare killed mid-upload leaves its multipart uploads (`index.sqlite` above 64 MiB goes up in
    parts) on the server; the next prepare of the dataset aborts those of the index files it writes, says
    so in one line, and leaves the rest alone: a shard's (prepare writes no shard), another prefix's."""
    write_tarfile(tmp_path / "src" / "s-0.tar", sample_members("s0-", 5))
    s3.make_bucket("leftover")
    s3.upload_folder(tmp_path / "src", "leftover", "ds")
    ours = ["ds/.nv-meta/index.sqlite", "ds/s-0.tar.idx"]
    others = ["ds/s-0.tar", "ds-old/.nv-meta/index.sqlite"]
    for key in ours + others:
        s3.leave_incomplete_upload("leftover", key)
    result = run_shardprep("prepare", "s3://leftover/ds", *FLAGS, "--tmp-path", str(tmp_path / "scratch"))
    assert result.returncode == 0, result.stderr
    assert s3.incomplete_uploads("leftover") == sorted(others)
    assert (
        "Aborted 2 incomplete uploads an earlier run left: s-0.tar.idx, .nv-meta/index.sqlite"
        in result.stderr.splitlines()
    ), result.stderr


def test_a_tmp_path_that_cannot_be_made_is_named(s3, tmp_path):
    (tmp_path / "file").write_text("")
    result = run_shardprep("prepare", "s3://any/ds", *FLAGS, "--tmp-path", str(tmp_path / "file" / "tmp"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"Cannot make a working folder in {tmp_path / 'file' / 'tmp'} (Not a directory)" in result.stderr


def test_a_shard_whose_index_file_name_is_too_long_for_a_local_file_gets_its_index_beside_it(s3, tmp_path):
    """S3 keys have no limit on a path part's length, and energon writes each `.tar.idx` straight to the
    bucket: the index, built in a local folder under names cut to fit, goes up under the keys energon uses."""
    source = tmp_path / "src"
    keys = {  # local name: bucket key
        "a.tar": "a.tar",
        "b.tar": "L" * 250 + ".tar",  # its index file's name: 258 bytes
        "c.tar": "x" + "é" * 150 + "/c.tar",  # in a folder of 301 bytes, cut inside a character
    }
    s3.make_bucket("long")
    for name, key in keys.items():
        write_tarfile(source / name, sample_members(name[0], 5))
        s3.client().put_object(Bucket="long", Key=f"ds/{key}", Body=(source / name).read_bytes())
    counts = prepare_remote(
        "s3://long/ds", PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset")
    )
    assert counts == dict.fromkeys(keys.values(), 5)
    meta = [".info.json", "dataset.yaml", "index.sqlite", "index.uuid", "split.yaml"]
    names = [*keys.values(), *map(tar_index_name, keys.values()), *(f"{META_DIR}/{name}" for name in meta)]
    assert s3.keys("long") == sorted(f"ds/{name}" for name in names)
    prepare_dataset(source, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    for name, key in keys.items():
        uploaded = s3.client().get_object(Bucket="long", Key=f"ds/{tar_index_name(key)}")["Body"].read()
        assert uploaded == (source / tar_index_name(name)).read_bytes()


def test_keys_energon_reads_as_other_keys_are_refused_as_shards_and_never_land_outside_the_run(s3, tmp_path):
    """energon's loader folds a key's `//` (and drops `.`, resolves `..`): `ds//b.tar` is a shard it reads
    as `ds/b.tar`, and its index, built at its name below the run's folder, was built at /b.tar.idx. A
    folder marker `.nv-meta/` (S3 consoles make them) and a `..` key are no files of the index."""
    s3.make_bucket("slashed")
    for name in ("a.tar", "b.tar"):
        write_tarfile(tmp_path / "src" / name, sample_members(name[0], 3))
    client = s3.client()
    client.upload_file(str(tmp_path / "src" / "a.tar"), "slashed", "ds/a.tar")
    client.upload_file(str(tmp_path / "src" / "b.tar"), "slashed", "ds//b.tar")
    client.put_object(Bucket="slashed", Key="ds/.nv-meta/", Body=b"")
    client.put_object(Bucket="slashed", Key="ds/.nv-meta/../../../escaped.yaml", Body=b"a: 1")
    before = s3.keys("slashed")
    scratch = ["--tmp-path", str(tmp_path / "scratch")]
    refused = run_shardprep("prepare", "s3://slashed/ds", *FLAGS, *scratch)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "Shard '/b.tar' in s3://slashed/ds: energon's loader reads" in refused.stderr
    assert s3.keys("slashed") == before
    run_shardprep("prepare", "s3://slashed/ds", *FLAGS, *scratch, "--exclude", "^/", check=True)
    assert not list((tmp_path / "scratch").iterdir()), "a file landed outside the run's folder"
    assert [key for key in s3.keys("slashed") if key not in before] == [
        f"ds/{META_DIR}/{name}"
        for name in (".info.json", "dataset.yaml", "index.sqlite", "index.uuid", "split.yaml")
    ] + ["ds/a.tar.idx"]


def test_a_folder_of_shards_named_as_a_shards_index_file_is_named_by_its_address(s3, tmp_path):
    """A bucket holds `x.tar.idx` beside a folder `x.tar.idx/` (energon writes the one beside the other); the
    local folder the index is built in cannot: the error named that folder, gone when the user reads it."""
    s3.make_bucket("idxfolder")
    for key in ("x.tar", "x.tar.idx/y.tar"):
        shard = write_tarfile(tmp_path / "shard.tar", sample_members(key[-5], 2))
        s3.client().put_object(Bucket="idxfolder", Key=f"ds/{key}", Body=shard.read_bytes())
    result = run_shardprep("prepare", "s3://idxfolder/ds", *FLAGS)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "s3://idxfolder/ds/x.tar.idx is a folder, where prepare writes the index file" in result.stderr
    assert s3.keys("idxfolder") == ["ds/x.tar", "ds/x.tar.idx/y.tar"]


def test_an_endpoint_or_credentials_in_the_bucket_part_of_an_address_are_named_as_such(s3):
    for address, saying in [
        ("s3://localhost:9000/ds", "An endpoint (host:port) goes in AWS_ENDPOINT_URL"),
        ("s3://KEY:SECRET@bucket/ds", "Credentials go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ("s3://my bucket/ds", "write the address as s3://BUCKET/PATH."),
    ]:
        result = run_shardprep("prepare", address, *FLAGS)
        assert result.returncode != 0 and "is not a bucket name" in result.stderr
        assert saying in result.stderr and "regex" not in result.stderr, result.stderr


def test_credentials_written_into_an_address_are_not_echoed_back(s3):
    """A secret key in an address (one with a `/` in it too, as AWS secrets may have) is masked in the
    error, whatever the command, scheme or misspelling; the user's terminal and logs keep that text."""
    secret = "wJalrXUtn/K7MDENG+bPxRfiCY"
    for args in [
        ("prepare", f"s3://AKIAEXAMPLE:{secret}@bucket/ds", *FLAGS),
        ("info", f"S3://AKIAEXAMPLE:{secret}@bucket/ds"),
        ("verify", f"msc://AKIAEXAMPLE:{secret}@profile/ds"),
    ]:
        result = run_shardprep(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert "***@" in result.stderr, result.stderr
        for part in secret.split("/"):
            assert part not in result.stderr + result.stdout, result.stderr


def test_a_dataset_yaml_in_a_sub_folder_of_nv_meta_goes_up_and_is_read_back(s3, tmp_path):
    """`--dataset-yaml-name configs/x.yaml` writes into a sub-folder of `.nv-meta`: it is uploaded with the
    rest (only the files at the top went up), and verify of the bucket dataset reads it."""
    from prep.inspect.remote import verify_remote

    write_tarfile(tmp_path / "src" / "a.tar", sample_members("a-", 3))
    s3.make_bucket("configs")
    s3.upload_folder(tmp_path / "src", "configs", "ds")
    options = PrepareOptions(
        split_ratio="1,0,0", sample_type="CrudeWebdataset", dataset_yaml_name="configs/x.yaml"
    )
    prepare_remote("s3://configs/ds", options)
    assert "ds/.nv-meta/configs/x.yaml" in s3.keys("configs")
    report = verify_remote("s3://configs/ds", dataset_config="configs/x.yaml", tmp_path=tmp_path / "scratch")
    assert report.healthy, report.problems


def test_index_sqlite_goes_up_while_it_is_written_and_equals_a_local_prepares(s3, tmp_path, monkeypatch):
    """A bucket prepare sends `index.sqlite` up part by part while the shards are still scanned (on a
    dataset of 10M samples it is 1.2 GB); the object is the index a local prepare writes. Keys of 900
    bytes make a 12 MB index of a few thousand samples, for parts of S3's smallest size."""
    streams = []

    class Watched(remote.GrowingUpload):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            streams.append(self)

    monkeypatch.setattr(remote, "GrowingUpload", Watched)
    local = tmp_path / "local"
    for shard in range(4):
        write_tarfile(local / f"s-{shard}.tar", sample_members(f"{shard}{'k' * 880}", 1600, {"txt": b"x"}))
    s3.make_bucket("streamed")
    s3.upload_folder(local, "streamed", "ds")
    store = open_store(parse_address("s3://streamed/ds"), part_size=5 << 20, multipart_threshold=6 << 20)
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset")
    prepare_remote("s3://streamed/ds", options, store=store)
    assert [stream.streamed_parts for stream in streams] == [1]
    assert s3.incomplete_uploads("streamed") == []
    fetched = tmp_path / "fetched"
    s3.download_prefix("streamed", "ds", fetched)
    assert (fetched / META_DIR / "index.sqlite").stat().st_size > 10 << 20
    prepare_dataset(local, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    ours, reference = prepared_outputs(fetched), prepared_outputs(local)
    assert ours["sqlite"] == reference["sqlite"] and ours["tar.idx"] == reference["tar.idx"]


@pytest.fixture
def described_bucket(s3, tmp_path):
    """(local copy, bucket): 2 shards with images, prepared and described by `prepare-media` on the local
    copy, then all of it uploaded under s3://BUCKET/ds."""
    local = media_dataset(tmp_path / "local", shards=2)
    prepare_dataset(local, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    prepare_media(local, MediaFilter(EXTENSION))
    bucket = f"media-{tmp_path.name.lower().replace('_', '-')}"[:60]
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    return local, bucket


AGAIN = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", force_overwrite=True)


def test_preparing_a_bucket_again_keeps_the_media_tables_as_a_local_prepare_does(
    s3, described_bucket, tmp_path
):
    # The bucket's new index.sqlite had only samples and sample_parts, without a word; energon's prepare
    # of a remote dataset copies its index.sqlite down and rebuilds only those two tables in it.
    local, bucket = described_bucket
    described = sqlite_contents(local / META_DIR / "index.sqlite")
    assert (local / META_DIR / "index.sqlite").stat().st_size > 3 * 4096  # downloaded in 4 KiB reads
    store = open_store(parse_address(f"s3://{bucket}/ds"), part_size=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare_remote(f"s3://{bucket}/ds", AGAIN, store=store, tmp_path=tmp_path / "scratch")
    prepare_dataset(local, split_ratio="1,0,0", sample_type="CrudeWebdataset", force_overwrite=True)
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    kept = sqlite_contents(fetched / META_DIR / "index.sqlite")
    assert kept["media_filters"] == described["media_filters"] and kept["media_metadata"]["rows"]
    assert kept == sqlite_contents(local / META_DIR / "index.sqlite")
    assert list((tmp_path / "scratch").iterdir()) == []


def test_an_old_bucket_index_without_media_costs_only_its_first_bytes(s3, tmp_path):
    """Whether the old index has media tables is read from its first 64 KiB: an index of megabytes without
    them is not downloaded."""
    local = tmp_path / "local"
    write_tarfile(local / "s-0.tar", sample_members(f"{'k' * 300}-", 3000, {"txt": b"x"}))
    prepare_dataset(local, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    s3.make_bucket("plain")
    s3.upload_folder(local, "plain", "ds")
    store = open_store(parse_address("s3://plain/ds"))
    sizes = {info.name: info.size for info in store.list()}
    assert sizes[f"{META_DIR}/index.sqlite"] > 2 << 20
    prepare_remote("s3://plain/ds", AGAIN, store=store, tmp_path=tmp_path / "scratch")
    others = sum(size for name, size in sizes.items() if name != f"{META_DIR}/index.sqlite")
    # (besides the objects once: the old index's first 64 KiB, the first shard's probe of a few headers)
    assert store.bytes_read - others < 80 << 10


def test_unreadable_media_tables_in_a_bucket_index_get_the_local_warning(s3, tmp_path):
    # The same warning as a local prepare's, naming the bucket dataset (whose command then runs:
    # tests/storage/test_prepare_media_remote.py).
    local, bucket = tmp_path / "local", "damaged"
    write_tarfile(local / "shard-000.tar", sample_members("sample-", 10))
    prepare_dataset(local, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    described_by_extension(local / META_DIR / "index.sqlite")
    zero_leaf_pages(local / META_DIR / "index.sqlite", "media_metadata")
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    with pytest.warns(UserWarning) as caught:
        prepare_remote(f"s3://{bucket}/ds", AGAIN, tmp_path=tmp_path / "scratch")
    assert [str(warning.message) for warning in caught] == [
        "the media metadata of the old index could not be read (database disk image is malformed) and is"
        f" gone: run `shardprep prepare-media s3://{bucket}/ds --media-metadata-by-extension` to describe"
        " the media again."
    ]
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    assert "media_metadata" not in sqlite_contents(fetched / META_DIR / "index.sqlite")
