"""`info`, `verify` and `preview` of a dataset that lives in a bucket (moto on loopback) say what they
say of the same dataset on local disk."""

from __future__ import annotations

import json
import shutil

import pytest

from prep.errors import PrepError
from prep.inspect.preview import first_samples
from prep.inspect.remote import RemoteDataset, remote_mirror, verify_remote
from prep.storage.address import parse_address
from prep.storage.store import StorageError, open_store
from tests.support.prepare import run_shardprep
from tests.support.s3 import mixed_dataset

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--no-progress", "--crude"]


@pytest.fixture
def prepared(s3, tmp_path):
    """(local prepared dataset, its bucket address): the same files in both places."""
    local = mixed_dataset(tmp_path / "local")
    run_shardprep("prepare", str(local), *FLAGS, check=True)
    bucket = f"inspect-{tmp_path.name[-10:].lower().replace('_', '-')}"
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "ds")
    return local, f"s3://{bucket}/ds"


def test_info_of_a_bucket_dataset_is_that_of_the_local_one(prepared):
    local, address = prepared
    remote = json.loads(run_shardprep("info", address, "--json", check=True).stdout)
    here = json.loads(run_shardprep("info", str(local), "--json", check=True).stdout)
    assert remote.pop("path") == address
    here.pop("path")
    assert remote == here


def test_preview_reads_the_parts_from_the_bucket(prepared):
    local, address = prepared
    for args in (["-n", "4"], ["--key", "big-00001", "--raw", "--limit", "16"]):
        remote = run_shardprep("preview", address, *args, check=True).stdout
        assert remote == run_shardprep("preview", str(local), *args, check=True).stdout
    assert "big-00001" in remote


def test_verify_of_a_healthy_bucket_dataset_reads_little(prepared):
    _, address = prepared
    store = open_store(parse_address(address))
    report = verify_remote(address, store=store)
    assert report.healthy, report.problems
    assert report.samples > 0 and report.root == address
    total = sum(info.size for info in store.list() if info.name.endswith(".tar"))
    assert store.bytes_read < total * 0.5, f"{store.bytes_read} of {total} bytes read"
    assert run_shardprep("verify", address, "--deep").returncode == 0


def test_objects_whose_keys_energon_reads_as_others_are_left_out_of_the_mirror(s3, prepared, tmp_path):
    """A folder marker `.nv-meta/` (S3 consoles make them) would be a file where the mirror's folder is,
    and a key with `..` parts a file outside the mirror: energon reads neither as that key."""
    local, address = prepared
    bucket = parse_address(address).authority
    s3.client().put_object(Bucket=bucket, Key="ds/.nv-meta/", Body=b"")
    s3.client().put_object(Bucket=bucket, Key="ds/.nv-meta/../../../escaped.yaml", Body=b"a: 1")
    scratch = ["--tmp-path", str(tmp_path / "scratch")]
    for command in ("info", "verify", "preview"):
        remote = run_shardprep(command, address, *scratch)
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout == run_shardprep(command, str(local)).stdout.replace(str(local), address)
        assert not list((tmp_path / "scratch").iterdir()), f"{command} left a file outside its mirror"


def test_a_shard_that_is_also_the_folder_of_another_is_named_not_a_traceback(s3, tmp_path):
    """A bucket holds objects `x.tar` and `x.tar/y.tar`; the local copy info, verify and preview read
    through cannot."""
    from tests.support.shards import sample_members, write_tarfile

    s3.make_bucket("clash")
    for key, prefix in (("x.tar", "x"), ("x.tar/y.tar", "y")):
        shard = write_tarfile(tmp_path / f"{prefix}.tar", sample_members(prefix, 2))
        s3.client().put_object(Bucket="clash", Key=f"ds/{key}", Body=shard.read_bytes())
    run_shardprep("prepare", "s3://clash/ds", *FLAGS, check=True)
    for command in ("info", "verify", "preview"):
        result = run_shardprep(command, "s3://clash/ds")
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert (
            "s3://clash/ds/x.tar is an object, and the folder of s3://clash/ds/x.tar/y.tar too"
            in result.stderr
        )


def test_the_commands_messages_tell_to_run_quote_an_address_as_a_shell_needs(s3, tmp_path):
    """`shardprep prepare s3://quoted/my data#1`, pasted, prepares `s3://quoted/my`."""
    from tests.support.shards import sample_members, write_tarfile

    s3.make_bucket("quoted")
    shard = write_tarfile(tmp_path / "a.tar", sample_members("a", 2))
    s3.client().put_object(Bucket="quoted", Key="my data#1/a.tar", Body=shard.read_bytes())
    address = "s3://quoted/my data#1"
    unprepared = run_shardprep("info", address)
    assert f"Prepare it first with `shardprep prepare '{address}'`." in unprepared.stderr
    run_shardprep(
        "prepare", address, "--non-interactive", "--split-ratio", "1,0,0", "--no-progress", check=True
    )
    no_yaml = run_shardprep("verify", address)  # prepared without a dataset.yaml
    assert f"fix: re-run `shardprep prepare '{address}'` to rebuild the index" in no_yaml.stdout, (
        no_yaml.stdout
    )


def test_the_index_of_a_bucket_dataset_is_fetched_a_part_at_a_time(prepared):
    """An `index.sqlite` of 244M samples is 30 GB: the mirror downloads it in reads of `part_size`, never
    in one GET held in memory."""
    _, address = prepared
    store = open_store(parse_address(address), part_size=4096)
    index = next(info for info in store.list() if info.name.endswith("index.sqlite"))
    assert index.size > 4 * 4096
    with remote_mirror(address, store=store) as (root, _):
        assert (root / ".nv-meta" / "index.sqlite").stat().st_size == index.size
    assert store.requests >= index.size // 4096, store.requests


def test_verify_names_a_damaged_header_in_the_bucket_as_locally(s3, prepared, tmp_path):
    local, address = prepared
    shard = local / "big-000.tar"
    data = bytearray(shard.read_bytes())
    second_header = 512 + 512 * 1024  # the big member's data ends here; its json part's header follows
    data[second_header + 10] ^= 0xFF  # a name byte: the checksum no longer matches
    shard.write_bytes(data)
    bucket = parse_address(address).authority
    s3.client().put_object(Bucket=bucket, Key="ds/big-000.tar", Body=bytes(data))
    remote = run_shardprep("verify", address)
    here = run_shardprep("verify", str(local))
    assert remote.returncode == here.returncode == 1
    assert remote.stdout.replace(address, "ROOT") == here.stdout.replace(str(local), "ROOT")
    assert "big-000.tar" in remote.stdout
    shutil.rmtree(local)


@pytest.mark.parametrize("missing", [".nv-meta/.info.json", ".nv-meta/index.sqlite"])
def test_errors_about_a_bucket_dataset_name_its_address_not_the_local_mirror(s3, prepared, missing):
    local, address = prepared
    bucket = address.split("/")[2]
    s3.client().delete_object(Bucket=bucket, Key=f"ds/{missing}")
    for command in ("info", "verify", "preview"):
        result = run_shardprep(command, address)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "shardprep-mirror" not in result.stderr, result.stderr
        if missing.endswith(".info.json"):
            assert f"{address} has not been prepared" in result.stderr
        elif command != "verify":  # (verify names it among its problems)
            assert f"{address}/{missing} is missing" in result.stderr


def test_preview_of_a_shard_replaced_after_listing_says_so_instead_of_showing_the_new_bytes(s3, prepared):
    _, address = prepared
    bucket = parse_address(address).authority
    with remote_mirror(address) as (mirror, store), RemoteDataset(mirror, store) as dataset:
        sample = next(iter(first_samples(dataset, None, 1)))
        shard = dataset.shards[sample.tar_file_id]
        body = s3.client().get_object(Bucket=bucket, Key=f"ds/{shard}")["Body"].read()
        s3.client().put_object(Bucket=bucket, Key=f"ds/{shard}", Body=body + bytes(10240))
        _, location = next(iter(dataset.index.parts_of_sample(sample.tar_file_id, sample.index)))
        with pytest.raises(StorageError, match="changed"):
            dataset.read_part(location)


def test_info_and_preview_of_a_metadataset_in_a_bucket_name_its_datasets_not_send_to_prepare(s3, tmp_path):
    from prep.write import write_dataset

    local = tmp_path / "poly"
    rows = [{"__key__": f"k{i}", "img": b"IMG%d" % i, "txt": f"caption {i}"} for i in range(4)]
    write_dataset(rows, local, media_columns=["img=jpg"], num_workers=1)
    s3.make_bucket("inspect-poly")
    s3.upload_folder(local, "inspect-poly", "poly")
    for command in ("info", "preview"):  # (verify checks it whole)
        result = run_shardprep(command, "s3://inspect-poly/poly")
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert (
            "Error: s3://inspect-poly/poly is an energon metadataset (metadataset.yaml), not a prepared dataset."
            " Give one of the datasets it names: s3://inspect-poly/poly/primary (split train); `shardprep verify`"
            " checks a metadataset whole." in result.stderr
        ), result.stderr


@pytest.mark.parametrize("aux_format", ["folder", "tar"])
def test_verify_of_a_metadataset_in_a_bucket_verifies_each_dataset_it_names_as_locally(
    s3, tmp_path, aux_format
):
    """Each dataset a bucket `write --media-column` makes is verified, its problems named under its path;
    an auxiliary dataset or folder gone from the bucket is named as locally."""
    from prep.inspect.verify import AUX_FILES_IN_STORAGE, verify_metadataset
    from tests.inspect.test_verify import polylithic

    local = polylithic(tmp_path / "poly", aux_format)
    bucket = f"meta-{aux_format}"
    s3.make_bucket(bucket)
    s3.upload_folder(local, bucket, "poly")
    address = f"s3://{bucket}/poly"
    result = run_shardprep("verify", address)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy"), result.stdout
    here = verify_metadataset(local / "metadataset.yaml")
    assert f"{here.shards:,} shards, {here.samples:,} samples, {here.parts:,} parts" in result.stdout
    assert f"; {AUX_FILES_IN_STORAGE})" in result.stdout
    client = s3.client()
    client.delete_object(Bucket=bucket, Key="poly/primary/shard-000000.tar.idx")
    for key in [
        entry["Key"] for entry in client.list_objects_v2(Bucket=bucket, Prefix="poly/media/")["Contents"]
    ]:
        client.delete_object(Bucket=bucket, Key=key)
    problems = verify_remote(address).problems
    assert [(problem.where, problem.what) for problem in problems] == [
        ("primary/shard-000000.tar", "has no offset file shard-000000.tar.idx; energon's loader needs it."),
        (
            "metadataset.yaml",
            "split 'train' joins auxiliary dataset 'media' from"
            f" '{'filesystem://media' if aux_format == 'folder' else 'media'}', which is {address}/media: it"
            " does not exist."
            + (" energon's loader skips every sample that reads it." if aux_format == "folder" else ""),
        ),
    ]
    assert problems[1].fix.startswith(f"move it back to {address}/media, or correct the path in ")


def test_a_bucket_dataset_whose_key_is_too_long_for_a_local_file_is_verified_shown_and_previewed(
    s3, tmp_path
):
    """A bucket key may have a path part longer than a local file name: the mirror holds such a shard and
    its index under the name a bucket prepare builds them under (`local_path`), as the dataset says."""
    from prep.prepare.remote import prepare_remote
    from prep.prepare.run import PrepareOptions
    from tests.support.shards import sample_members, write_tarfile

    keys = {"a.tar": "a.tar", "b.tar": "L" * 250 + ".tar", "c.tar": "x" + "é" * 150 + "/c.tar"}
    s3.make_bucket("inspect-long")
    for name, key in keys.items():
        shard = write_tarfile(tmp_path / name, sample_members(name[0], 3))
        s3.client().put_object(Bucket="inspect-long", Key=f"ds/{key}", Body=shard.read_bytes())
    address = "s3://inspect-long/ds"
    prepare_remote(address, PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset"))
    for deep in (False, True):
        report = verify_remote(address, deep=deep)
        assert report.healthy and not report.warnings, (report.problems, report.warnings)
        assert (report.shards, report.samples) == (3, 9)
    info = run_shardprep("info", address, "--json", check=True).stdout
    assert json.loads(info)["samples"] == 9
    shown = run_shardprep("preview", address, "-n", "9", check=True).stdout
    assert all(f"{prefix}0000" in shown for prefix in "abc"), shown
    s3.client().delete_object(Bucket="inspect-long", Key=f"ds/{keys['b.tar']}.idx")
    problems = verify_remote(address).problems
    assert [(problem.where, problem.what) for problem in problems] == [
        (keys["b.tar"], f"has no offset file {keys['b.tar']}.idx; energon's loader needs it.")
    ]


#: The head of a metadataset YAML naming one dataset for split train (its path follows).
METADATASET_NAMING = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: "


def test_verify_of_a_bucket_metadataset_naming_a_nested_one_verifies_the_nested_ones_datasets(s3, tmp_path):
    """A `path` that is a metadataset YAML in the bucket is read in turn, as energon reads it: its datasets,
    relative to its own folder, are mirrored and verified (they were not, and the YAML was called gone)."""
    from prep.inspect.verify import verify_metadataset
    from tests.inspect.test_verify import polylithic

    local = polylithic(tmp_path / "poly", "tar")
    s3.make_bucket("meta-nested")
    s3.upload_folder(local, "meta-nested", "top/poly")
    client = s3.client()
    yaml = METADATASET_NAMING + "poly/metadataset.yaml\n"
    client.put_object(Bucket="meta-nested", Key="top/metadataset.yaml", Body=yaml.encode())
    report = verify_remote("s3://meta-nested/top")
    assert report.healthy, report.problems
    here = verify_metadataset(local / "metadataset.yaml")
    assert (
        (report.shards, report.samples, report.parts) == (here.shards, here.samples, here.parts) != (0, 0, 0)
    )
    client.delete_object(Bucket="meta-nested", Key="top/poly/primary/shard-000000.tar.idx")
    assert [(problem.where, problem.what) for problem in verify_remote("s3://meta-nested/top").problems] == [
        (
            "poly/primary/shard-000000.tar",
            "has no offset file shard-000000.tar.idx; energon's loader needs it.",
        )
    ]


def test_verify_of_a_bucket_metadataset_verifies_the_datasets_it_names_by_address(s3, tmp_path, monkeypatch):
    """A dataset named by an `msc://` or `s3://` address (of another bucket here) is mirrored and verified,
    its problems named by its address; an `s3://` address is a problem of its own: energon 7.4.1 reads
    object storage only through `msc://`, and takes `s3://...` for a local path."""
    from tests.inspect.test_verify import polylithic

    local = polylithic(tmp_path / "poly", "tar")
    for bucket in ("meta-naming", "meta-named"):
        s3.make_bucket(bucket)
    s3.upload_folder(local, "meta-named", "poly")
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "named", "meta-named")))
    yaml = (
        METADATASET_NAMING
        + "msc://named/poly/metadataset.yaml\n  val:\n    path: s3://meta-named/poly/primary\n    split_part: train\n"
    )
    client = s3.client()
    client.put_object(Bucket="meta-naming", Key="m/metadataset.yaml", Body=yaml.encode())
    unloadable = (
        "metadataset.yaml",
        "split 'val' reads the dataset 's3://meta-named/poly/primary', an s3:// address, which energon's"
        " loader does not read: it reads object storage through msc:// addresses only, and takes this one for"
        " a local path.",
    )
    report = verify_remote("s3://meta-naming/m")
    assert [(problem.where, problem.what) for problem in report.problems] == [unloadable]
    assert not report.warnings and report.shards == 2 * 2 + 2  # primary and media by msc://, primary by s3://
    client.delete_object(Bucket="meta-named", Key="poly/primary/shard-000000.tar.idx")
    assert [(problem.where, problem.what) for problem in verify_remote("s3://meta-naming/m").problems] == [
        unloadable,
        *(
            (
                f"{address}/shard-000000.tar",
                "has no offset file shard-000000.tar.idx; energon's loader needs it.",
            )
            for address in ("msc://named/poly/primary", "s3://meta-named/poly/primary")
        ),
    ]


def test_a_metadataset_naming_a_dataset_by_an_address_with_dot_dot_is_verified_where_energon_reads_it(
    s3, prepared, tmp_path, monkeypatch
):
    """energon reads `msc://p/x/../ds` as `msc://p/ds`, whether or not anything is below `x`; the mirror
    had it as a path through a folder `x` that is not there, and verify called the dataset missing."""
    _, address = prepared
    bucket = parse_address(address).authority
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "dotted", bucket)))
    yaml = METADATASET_NAMING + "msc://dotted/nothing/../ds\n"
    s3.client().put_object(Bucket=bucket, Key="m/metadataset.yaml", Body=yaml.encode())
    report = verify_remote(f"s3://{bucket}/m")
    assert report.healthy, report.problems
    assert report.shards == verify_remote(address).shards


def test_a_bucket_metadataset_naming_what_cannot_be_read_or_opened_says_so(s3, tmp_path, monkeypatch):
    """An address the credentials cannot read is a problem naming it and why; one whose MSC profile verify
    cannot open is a warning that it was not checked; neither is passed over in silence."""
    s3.make_bucket("meta-unread")
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "known", "meta-unread")))
    yaml = (
        METADATASET_NAMING
        + "msc://unknown/ds\n  val:\n    path: msc://known/ds\n    aux:\n      media: msc://unknown/media\n"
    )
    yaml += "  test:\n    path: s3://meta-no-such-bucket/ds\n"
    s3.client().put_object(Bucket="meta-unread", Key="m/metadataset.yaml", Body=yaml.encode())
    report = verify_remote("s3://meta-unread/m")
    not_checked = f"which was not checked: msc://unknown/: the MSC config ({tmp_path / 'msc.yaml'}) has no profile 'unknown'."
    assert [(warning.where, warning.what) for warning in report.warnings] == [
        ("metadataset.yaml", f"split 'train' reads the dataset 'msc://unknown/ds', {not_checked}"),
        (
            "metadataset.yaml",
            f"split 'val' joins auxiliary dataset 'media' from 'msc://unknown/media', {not_checked}",
        ),
    ]
    assert [problem.what for problem in report.problems][-2:] == [
        "split 'test' reads the dataset 's3://meta-no-such-bucket/ds', which cannot be read: Could not list the"
        " objects of s3://meta-no-such-bucket/ds: the bucket does not exist.",
        "split 'val' reads the dataset 'msc://known/ds', which is msc://known/ds: it does not exist.",
    ]


def test_an_unreadable_metadataset_yaml_in_a_bucket_is_named_by_its_address_not_the_mirror(s3):
    """A YAML that is not a metadataset, or metadatasets that name each other, stop verify with an error
    naming the YAML's address (it named the local mirror, gone by the time the user reads it)."""
    s3.make_bucket("meta-broken")
    client = s3.client()
    for key, text in {
        "loop/metadataset.yaml": METADATASET_NAMING + "metadataset.yaml\n",
        "nest/metadataset.yaml": METADATASET_NAMING + "inner.yaml\n",
        "nest/inner.yaml": "not: a metadataset\n",
    }.items():
        client.put_object(Bucket="meta-broken", Key=key, Body=text.encode())
    for folder, said in [
        ("loop", "loop/metadataset.yaml names metadatasets more than 16 deep (a loop?)."),
        ("nest", "nest/inner.yaml is not an energon metadataset (a YAML mapping with `splits`)"),
    ]:
        with pytest.raises(PrepError) as raised:
            verify_remote(f"s3://meta-broken/{folder}")
        assert str(raised.value).startswith(f"s3://meta-broken/{said}"), raised.value


def test_verify_of_a_local_metadataset_verifies_what_it_names_in_object_storage(s3, tmp_path, monkeypatch):
    """A local YAML naming datasets by `msc://` or `s3://` address: each is mirrored and verified as for a
    YAML in a bucket, its problems named by its address (verify left them out without a word and said
    healthy of 0 shards); an `s3://` address is a problem of its own, a profile not opened here a warning."""
    from tests.inspect.test_verify import polylithic

    local = polylithic(tmp_path / "poly", "tar")
    s3.make_bucket("meta-local")
    s3.upload_folder(local, "meta-local", "poly")
    s3.client().delete_object(Bucket="meta-local", Key="poly/primary/shard-000000.tar.idx")
    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "named", "meta-local")))
    metadataset = tmp_path / "m.yaml"
    metadataset.write_text(
        METADATASET_NAMING
        + "msc://named/poly/primary\n    aux:\n      media: msc://named/poly/media\n"
        + "  val:\n    path: s3://meta-local/poly/primary\n    split_part: train\n"
        + "  test:\n    path: msc://unknown/ds\n"
    )
    result = run_shardprep("verify", str(metadataset), "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["root"] == str(metadataset) and report["shards"] == 2 * 2 + 2  # media by msc:// only
    assert [(problem["where"], problem["what"]) for problem in report["problems"]] == [
        (
            "m.yaml",
            "split 'val' reads the dataset 's3://meta-local/poly/primary', an s3:// address, which energon's"
            " loader does not read: it reads object storage through msc:// addresses only, and takes this one"
            " for a local path.",
        ),
        *(
            (
                f"{address}/shard-000000.tar",
                "has no offset file shard-000000.tar.idx; energon's loader needs it.",
            )
            for address in ("msc://named/poly/primary", "s3://meta-local/poly/primary")
        ),
    ]
    assert [(warning["where"], warning["what"]) for warning in report["warnings"]] == [
        (
            "m.yaml",
            "split 'test' reads the dataset 'msc://unknown/ds', which was not checked: msc://unknown/: the MSC"
            f" config ({tmp_path / 'msc.yaml'}) has no profile 'unknown'.",
        )
    ]
