"""`shardprep prepare-media s3://...` / `msc://...`: the media of a WebDataset prepared in a bucket (moto on
loopback) is described by ranged reads of its parts' headers into what a local `prepare-media` writes, and
the index goes back up whole, or not at all."""

from __future__ import annotations

import io
import shlex
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prep.index.format import META_DIR
from prep.media.filter import EXTENSION, GLOB, MediaFilter
from prep.prepare.remote import prepare_remote
from prep.prepare.remote_media import prepare_media_remote
from prep.prepare.run import PrepareOptions
from prep.storage.address import parse_address
from prep.storage.store import RetryPolicy, StorageError, open_store
from tests.prepare.test_media_matches_energon import media_dataset
from tests.prepare.test_prepare_media import same_media_tables
from tests.support.damaged_index import dataset_with_damaged_index, described_by_extension, zero_leaf_pages
from tests.support.media import assert_same_media_index, images, wav
from tests.support.prepare import run_shardprep, twin
from tests.support.s3 import Outage
from tests.support.shards import sample_members, write_tarfile

FLAGS = ["--non-interactive", "--no-progress", "--split-ratio", "1,0,0", "--crude"]
INDEX = f"{META_DIR}/index.sqlite"


def bucket_name(tmp_path) -> str:
    return f"pm-{tmp_path.name.lower().replace('_', '-')}"[:60]


@pytest.fixture
def prepared_bucket(s3, tmp_path):
    """(local copy of the shards, bucket): 2 shards with images, audio and text, uploaded under
    s3://BUCKET/ds and prepared there without media metadata."""
    local = media_dataset(tmp_path / "local", shards=2)
    bucket = bucket_name(tmp_path)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    run_shardprep("prepare", f"s3://{bucket}/ds", *FLAGS, check=True)
    return local, bucket


def test_prepare_media_on_a_bucket_writes_what_a_local_prepare_media_writes(s3, prepared_bucket, tmp_path):
    local, bucket = prepared_bucket
    scratch = tmp_path / "scratch"
    result = run_shardprep(
        "prepare-media", f"s3://{bucket}/ds", "--media-metadata-by-extension", "--tmp-path", str(scratch)
    )
    assert result.returncode == 0, result.stderr
    assert list(scratch.iterdir()) == [], "the folder under --tmp-path was not cleaned up"
    ours = twin(local, "reference")
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    expected = run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension", check=True)
    assert result.stdout == expected.stdout == "Done. Stored metadata for 60 files (webdataset dataset).\n"
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    assert_same_media_index(fetched, ours)


def test_prepare_media_reads_a_bucket_named_through_msc(s3, prepared_bucket, tmp_path, monkeypatch):
    _, bucket = prepared_bucket
    profile = f"p{tmp_path.name[-8:]}".replace("_", "")  # MSC caches clients by profile name
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", profile, bucket)))
    result = run_shardprep("prepare-media", f"msc://{profile}/ds", "--media-metadata-by-glob", "*.png")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Done. Stored metadata for ")
    assert b"GLOB" in s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read()


def big_images(count: int) -> list[tuple[str, bytes]]:
    """(extension, bytes) of `count` images of noise, of 0.6 to 1.2 MB, PNG and JPEG in turn."""
    made = []
    generator = np.random.default_rng(7)
    for number in range(count):
        pixels = generator.integers(0, 256, (640, 640, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        if number % 2:
            Image.fromarray(pixels).save(buffer, "JPEG", quality=98)
        else:
            Image.fromarray(pixels).save(buffer, "PNG", compress_level=1)
        made.append(("jpg" if number % 2 else "png", buffer.getvalue()))
    return made


def test_big_images_cost_only_their_headers_to_describe(s3, tmp_path):
    local, bucket = tmp_path / "local", bucket_name(tmp_path)
    pictures = big_images(4)
    for shard in range(2):
        members = []
        for sample in range(6):
            extension, data = pictures[(shard + sample) % len(pictures)]
            members += [(f"s{shard}-{sample:03d}.{extension}", data), (f"s{shard}-{sample:03d}.txt", b"x")]
        write_tarfile(local / f"shard-{shard}.tar", members)
    shards_size = sum(path.stat().st_size for path in local.glob("*.tar"))
    assert shards_size > 10 << 20
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    # prepare with --media-metadata-by-extension: the headers of the members, then those of the images
    store = open_store(parse_address(f"s3://{bucket}/ds"))
    options = PrepareOptions(
        split_ratio="1,0,0", sample_type="CrudeWebdataset", media_filter=MediaFilter(EXTENSION)
    )
    prepare_remote(f"s3://{bucket}/ds", options, store=store)
    assert 0 < store.bytes_read < shards_size * 0.05, f"{store.bytes_read} of {shards_size} bytes read"
    # prepare-media: the index down and up again, and the headers of the PNG images
    store = open_store(parse_address(f"s3://{bucket}/ds"))
    listed = {info.name: info.size for info in store.list()}
    prepared = prepare_media_remote(f"s3://{bucket}/ds", MediaFilter(GLOB, ("*.png",)), store=store)
    assert prepared.summary.rows == 6
    meta = sum(size for name, size in listed.items() if name.startswith(META_DIR))
    described = store.bytes_read - meta
    assert 0 < described < shards_size * 0.05, f"{described} of {shards_size} bytes read"
    ours = twin(local, "reference")
    run_shardprep("prepare", str(ours), *FLAGS, "--media-metadata-by-extension", check=True)
    run_shardprep("prepare-media", str(ours), "--media-metadata-by-glob", "*.png", check=True)
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    assert_same_media_index(fetched, ours)


def test_a_broken_image_header_is_named_as_locally_and_the_index_stays_as_it_was(s3, tmp_path):
    local, bucket = tmp_path / "local", bucket_name(tmp_path)
    good = images()["rgb33.png"]
    members = [("a.png", good), ("b.gif", images()["p33.gif"][:11]), ("c.png", good)]
    write_tarfile(local / "shard-0.tar", members)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    run_shardprep("prepare", f"s3://{bucket}/ds", *FLAGS, check=True)
    index = s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read()
    keys = s3.keys(bucket)
    ours = twin(local, "reference")
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    expected = run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension")
    scratch = tmp_path / "scratch"
    result = run_shardprep(
        "prepare-media", f"s3://{bucket}/ds", "--media-metadata-by-extension", "--tmp-path", str(scratch)
    )
    assert result.returncode == expected.returncode == 1
    assert "shard-0.tar at byte " in result.stderr and "logical screen" in result.stderr
    assert result.stderr == expected.stderr
    assert s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read() == index
    assert s3.keys(bucket) == keys
    assert list(scratch.iterdir()) == []


def test_an_upload_that_fails_leaves_the_buckets_index_as_it_was(s3, prepared_bucket, tmp_path, monkeypatch):
    _, bucket = prepared_bucket
    index = s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read()
    relay = Outage(s3)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
        store = open_store(
            parse_address(f"s3://{bucket}/ds"), retry=RetryPolicy(attempts=2, first_delay=0.05)
        )

        def cut_after_the_last_shard(done: int, total: int) -> None:
            if done == total:  # the media described: the endpoint goes before the index goes up
                relay.cut()

        with pytest.raises(StorageError) as raised:
            prepare_media_remote(
                f"s3://{bucket}/ds",
                MediaFilter(GLOB, ("*.png",)),
                store=store,
                progress=cut_after_the_last_shard,
                tmp_path=tmp_path / "scratch",
            )
    finally:
        relay.close()
    assert f"s3://{bucket}/ds/{INDEX} is as it was; run again." in str(raised.value)
    assert s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read() == index
    assert s3.incomplete_uploads(bucket) == []
    assert list((tmp_path / "scratch").iterdir()) == []


def test_an_interrupted_run_leaves_the_buckets_index_as_it_was(s3, prepared_bucket, tmp_path):
    _, bucket = prepared_bucket
    index = s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read()

    def interrupted(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_media_remote(
            f"s3://{bucket}/ds", MediaFilter(GLOB, ("*.png",)), progress=interrupted, tmp_path=tmp_path / "t"
        )
    assert s3.client().get_object(Bucket=bucket, Key=f"ds/{INDEX}")["Body"].read() == index
    assert list((tmp_path / "t").iterdir()) == []


def test_an_interrupted_run_leaves_no_thread_reading_the_bucket(s3, tmp_path):
    # The threads describing the shards after the interrupted one went on, and stayed, for as long as
    # the interrupt's traceback was held (a Ctrl-C's process waited for them to end).
    local, bucket = tmp_path / "local", bucket_name(tmp_path)
    for shard in range(40):
        write_tarfile(
            local / f"shard-{shard:02d}.tar", sample_members(f"s{shard}-", 2, {"png": images()["rgb1.png"]})
        )
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    run_shardprep("prepare", f"s3://{bucket}/ds", *FLAGS, check=True)

    def interrupted(done: int, total: int) -> None:
        raise KeyboardInterrupt

    try:
        prepare_media_remote(f"s3://{bucket}/ds", MediaFilter(EXTENSION), progress=interrupted)
    except KeyboardInterrupt:
        held = sys.exc_info()  # as the command line's handler holds it while it ends the run
        assert [
            thread.name for thread in threading.enumerate() if thread.name.startswith("shardprep-bucket")
        ] == []
        del held
    else:
        pytest.fail("not interrupted")


def test_a_bucket_dataset_not_prepared_is_named_with_what_to_run(s3, tmp_path):
    local, bucket = media_dataset(tmp_path / "local", shards=1), bucket_name(tmp_path)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "shards")
    result = run_shardprep("prepare-media", f"s3://{bucket}/shards", "--media-metadata-by-extension")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == (
        f"Error: s3://{bucket}/shards is not a prepared dataset: it has no .nv-meta/.info.json. Prepare it"
        f" and describe its media in one run with `shardprep prepare s3://{bucket}/shards"
        " --media-metadata-by-extension`.\n"
    )
    s3.client().put_object(Bucket=bucket, Key="texts/a.txt", Body=b"not media")
    texts = run_shardprep("prepare-media", f"s3://{bucket}/texts", "--media-metadata-by-extension")
    assert texts.returncode == 1
    assert texts.stderr == (
        f"Error: No media files found under s3://{bucket}/texts with the extension filter; nothing was"
        " written.\n"
    )
    nothing = run_shardprep("prepare-media", f"s3://{bucket}/nothing", "--media-metadata-by-extension")
    assert nothing.returncode == 1
    assert f"Error: Nothing is stored below s3://{bucket}/nothing: " in nothing.stderr
    assert s3.keys(bucket) == sorted([*(f"shards/{p.name}" for p in local.glob("*.tar")), "texts/a.txt"])


def test_an_address_in_another_unicode_form_than_the_buckets_keys_is_named_so(s3, tmp_path):
    # As prepare's and info's errors name it: `café` pasted from macOS (NFD) finds nothing below it.
    bucket = bucket_name(tmp_path)
    s3.make_bucket(bucket)
    s3.client().put_object(Bucket=bucket, Key="caf\u00e9/a.png", Body=images()["rgb33.png"])
    result = run_shardprep("prepare-media", f"s3://{bucket}/cafe\u0301", "--media-metadata-by-extension")
    assert result.returncode == 1 and f"Nothing is stored below s3://{bucket}/cafe\u0301" in result.stderr
    assert f"Objects are below s3://{bucket}/caf\u00e9, which looks the same" in result.stderr


def test_the_prepare_command_for_shards_not_prepared_quotes_the_address_for_the_shell(s3, tmp_path):
    local, bucket = media_dataset(tmp_path / "local", shards=1), bucket_name(tmp_path)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "my shards")
    result = run_shardprep("prepare-media", f"s3://{bucket}/my shards", "--media-metadata-by-extension")
    assert result.returncode == 1
    command = result.stderr.split("`")[1]  # pasted as it is given
    assert shlex.split(command) == [
        "shardprep", "prepare", f"s3://{bucket}/my shards", "--media-metadata-by-extension"
    ]  # fmt: skip


def media_folder(root: Path) -> Path:
    """Images in the folder, a sub-folder and a hidden one, a WAV, and a text file."""
    for number, (name, data) in enumerate(sorted(images().items())):
        folder = root / ("", "sub", ".hidden/deep")[number % 3]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (root / "sub" / "clip.wav").write_bytes(wav(8000, 1, 2, 800))
    (root / "notes.txt").write_text("not media")
    return root


def test_a_folder_dataset_in_a_bucket_gets_what_a_local_prepare_media_writes(s3, tmp_path):
    local, bucket = media_folder(tmp_path / "folder"), bucket_name(tmp_path)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "aux")
    ours = tmp_path / "reference"
    shutil.copytree(local, ours)
    for flags in (["--media-metadata-by-extension"], ["--media-metadata-by-glob", "*.png"]):  # rows kept
        result = run_shardprep(
            "prepare-media", f"s3://{bucket}/aux", *flags, "--tmp-path", str(tmp_path / "t")
        )
        assert result.returncode == 0, result.stderr
        expected = run_shardprep("prepare-media", str(ours), *flags, check=True)
        assert result.stdout == expected.stdout and "(folder dataset)" in result.stdout
    assert list((tmp_path / "t").iterdir()) == []
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "aux", fetched)
    same_media_tables(fetched, ours)

    index = s3.client().get_object(Bucket=bucket, Key=f"aux/{INDEX}")["Body"].read()
    s3.client().put_object(Bucket=bucket, Key="aux/sub/cut.gif", Body=images()["p33.gif"][:11])
    broken = run_shardprep("prepare-media", f"s3://{bucket}/aux", "--media-metadata-by-extension")
    assert broken.returncode == 1
    assert broken.stderr.startswith(
        f"Error: s3://{bucket}/aux/sub/cut.gif at byte 11: looks like an image but its header cannot be read:"
    )
    assert s3.client().get_object(Bucket=bucket, Key=f"aux/{INDEX}")["Body"].read() == index


def test_the_command_a_reprepare_gives_for_lost_media_runs(s3, tmp_path):
    # A re-prepare of a bucket dataset whose media tables cannot be read says to run prepare-media on
    # its address; that command was refused (prepare-media was for local datasets).
    local, bucket = tmp_path / "local", bucket_name(tmp_path)
    write_tarfile(local / "shard-000.tar", sample_members("sample-", 10, {"png": images()["rgb33.png"]}))
    run_shardprep("prepare", str(local), *FLAGS, check=True)
    described_by_extension(local / INDEX)
    zero_leaf_pages(local / INDEX, "media_metadata")
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    again = run_shardprep("prepare", f"s3://{bucket}/ds", *FLAGS, "--force-overwrite", check=True)
    command = again.stderr.split("run `", 1)[1].split("`", 1)[0]
    assert command == f"shardprep prepare-media s3://{bucket}/ds --media-metadata-by-extension"
    result = run_shardprep(*shlex.split(command)[1:])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Done. Stored metadata for 10 files (webdataset dataset).\n"
    ours = twin(local, "reference")
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension", check=True)
    fetched = tmp_path / "fetched"
    s3.download_prefix(bucket, "ds", fetched)
    assert_same_media_index(fetched, ours)


def test_a_command_the_error_of_a_damaged_index_gives_is_quoted_for_the_shell(s3, tmp_path):
    # The scratch folder in the error was replaced by the address as it is: pasted, `shardprep
    # prepare-media s3://b/my data ...` described s3://b/my.
    local, bucket = dataset_with_damaged_index(tmp_path / "local", "sample_parts"), bucket_name(tmp_path)
    described_by_extension(local / INDEX)
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "my data")
    result = run_shardprep("prepare-media", f"s3://{bucket}/my data", "--media-metadata-by-extension")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"Error: s3://{bucket}/my data/{INDEX} cannot be read" in result.stderr
    assert (
        f"run `shardprep prepare-media 's3://{bucket}/my data' --media-metadata-by-extension`"
        in result.stderr
    )
