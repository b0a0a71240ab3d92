"""`shardprep info`: per-split statistics from the index, for crude and field-map datasets alike; meta files it
cannot read are one clear error."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import yaml

from prep.index.group import key_and_part
from tests.support.damaged_index import dataset_with_damaged_index
from tests.support.datasets import PREPARERS, prepared_dataset, writable_copy
from tests.support.prepare import run_shardprep
from tests.support.shards import sample_members, write_tarfile


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("info-datasets")


def split_truth(dataset: Path, split: str) -> tuple[list[str], dict[str, list[int]]]:
    """The split's shards (from split.yaml via energon's own reader) and part sizes from tarfile."""
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    names = WebdatasetMeta.from_config(dataset, split_part=split).split_part_files
    sizes: dict[str, list[int]] = {}
    for name in names:
        with tarfile.open(dataset / name) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    sizes.setdefault(key_and_part(member.name)[1], []).append(member.size)
    return names, sizes


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("field_map", [False, True])
def test_json_statistics_match_the_tars(base, preparer, field_map):
    if preparer == "shardprep" and field_map:
        pytest.skip("covered with energon; the index is the same")
    dataset = prepared_dataset(base, preparer, field_map=field_map)
    stats = json.loads(run_shardprep("info", str(dataset), "--json", check=True).stdout)
    assert stats["kind"] == ("field_map" if field_map else "crude")
    assert stats["samples"] == 28 and stats["shards"] == 5
    train = next(split for split in stats["splits"] if split["split"] == "train")
    names, sizes = split_truth(dataset, "train")
    assert train["shards"] == len(names)
    assert train["bytes"] == sum((dataset / name).stat().st_size for name in names)
    by_part = {part["part"]: part for part in train["parts"]}
    assert set(by_part) == set(sizes)
    for part, values in sizes.items():
        assert by_part[part]["count"] == len(values)
        assert by_part[part]["total_bytes"] == sum(values)
        assert by_part[part]["max"] == max(values)
        assert by_part[part]["p50"] == pytest.approx(float(np.percentile(values, 50)))
    assert train["largest_samples"][0]["key"] == "s1_002"  # the sample with the big part


def test_field_map_is_shown_from_dataset_yaml(base):
    dataset = prepared_dataset(base, "energon", field_map=True)
    field_map = yaml.safe_load((dataset / ".nv-meta" / "dataset.yaml").read_text())["field_map"]
    text = run_shardprep("info", str(dataset), check=True).stdout
    assert "CaptioningSample (field map)" in text
    for field, part in field_map.items():
        assert f"{field} <- {part}" in text


def test_text_report_lists_every_split_and_the_largest_samples(base):
    dataset = prepared_dataset(base, "energon")
    text = run_shardprep("info", str(dataset), check=True).stdout
    splits = yaml.safe_load((dataset / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    for split in splits:
        assert f"split {split}:" in text
    assert "largest samples:" in text and "s1_002  (shard-001.tar)" in text


def test_plot_writes_a_png(base, tmp_path):
    pytest.importorskip("matplotlib")
    output = tmp_path / "sizes.png"
    run_shardprep("info", str(prepared_dataset(base, "shardprep")), "--plot", str(output), check=True)
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_names_the_file_it_wrote_and_refuses_a_format_matplotlib_cannot_write(base, tmp_path):
    """A name without a suffix gets `.png` (matplotlib adds it), and the message names that file; a suffix
    naming no format matplotlib writes is one clear error, not matplotlib's traceback."""
    pytest.importorskip("matplotlib")
    dataset = prepared_dataset(base, "shardprep")
    result = run_shardprep("info", str(dataset), "--plot", str(tmp_path / "sizes"), check=True)
    assert f"plot written to {tmp_path / 'sizes.png'}" in result.stdout
    assert (tmp_path / "sizes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "sizes").exists()
    result = run_shardprep("info", str(dataset), "--plot", str(tmp_path / "sizes.foo"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        f"Cannot write the plot to {tmp_path / 'sizes.foo'}: matplotlib writes no '.foo' files"
        in result.stderr
    )
    assert not (tmp_path / "sizes.foo").exists()


def test_missing_dataset_gets_one_clear_error(tmp_path):
    result = run_shardprep("info", str(tmp_path / "nowhere"))
    assert result.returncode == 1 and "is not a folder" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("damage", ["not UTF-8", "unreadable"])
def test_dataset_yaml_that_cannot_be_read_is_one_clear_error(base, tmp_path, damage):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    dataset_yaml = dataset / ".nv-meta" / "dataset.yaml"
    if damage == "not UTF-8":
        dataset_yaml.write_bytes(b"\xff\xfe garbage")
    else:
        dataset_yaml.chmod(0)
    result = run_shardprep("info", str(dataset), honour_permissions=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    expected = "is not UTF-8 text (byte 0 is 0xff)" if damage == "not UTF-8" else "cannot be read (Permission"
    assert f"Error: {dataset_yaml} {expected}" in result.stderr


@pytest.mark.parametrize("command", ["info", "verify", "preview"])
def test_split_yaml_that_is_not_utf8_is_named_not_a_traceback(base, tmp_path, command):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    (dataset / ".nv-meta" / "split.yaml").write_bytes(b"split_parts:\n  train:\n  - \xff.tar\n")
    result = run_shardprep(command, str(dataset))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "split.yaml is not UTF-8 text (byte 26 is 0xff)" in result.stdout + result.stderr


def test_a_negative_largest_is_refused_by_name(base):
    """`--largest -1` listed every sample but the smallest of the largest, as a slice counted from the end."""
    result = run_shardprep("info", str(prepared_dataset(base, "shardprep")), "--largest", "-1")
    assert result.returncode == 2 and "Invalid value for '--largest'" in result.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_an_index_sqlite_of_other_shards_is_said_and_the_command_fails(base, tmp_path, as_json):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:  # one shard's rows gone
        db.execute("DELETE FROM sample_parts WHERE tar_file_id = 1")
        db.execute("DELETE FROM samples WHERE tar_file_id = 1")
        db.commit()
    shard = json.loads((dataset / ".nv-meta" / ".info.json").read_text())["shard_counts"]
    name = list(shard)[1]
    result = run_shardprep("info", str(dataset), *(["--json"] if as_json else []))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        f"index.sqlite does not hold the samples .info.json counts for 1 shard(s) ({name})" in result.stderr
    )
    if as_json:
        assert json.loads(result.stdout)["index_disagrees"] == [name]
    else:
        assert "WARNING: index.sqlite does not hold" in result.stdout
    healthy = run_shardprep("info", str(prepared_dataset(base, "shardprep")), "--json", check=True)
    assert json.loads(healthy.stdout)["index_disagrees"] == []


@pytest.mark.parametrize("command", ["info", "verify", "preview"])
@pytest.mark.parametrize("unreadable", [".nv-meta", ".nv-meta/.info.json", ".nv-meta/split.yaml"])
def test_an_unreadable_index_folder_or_file_is_named_with_make_it_readable(
    base, tmp_path, command, unreadable
):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    (dataset / unreadable).chmod(0)
    try:
        result = run_shardprep(command, str(dataset), honour_permissions=True)
    finally:
        (dataset / unreadable).chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    said = result.stdout + result.stderr
    assert f"{dataset / unreadable} cannot be read (Permission denied)" in said, said
    assert "make it readable (check its owner and mode)" in said and "prepare" not in said, said


def test_samples_excluded_in_split_yaml_are_not_counted_in_their_split(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    splits = yaml.safe_load(split_yaml.read_text())
    before = json.loads(run_shardprep("info", str(dataset), "--json", check=True).stdout)
    train = next(split for split in before["splits"] if split["split"] == "train")
    largest = train["largest_samples"][0]
    splits["exclude"] = [f"{largest['shard']}/{largest['key']}", "no-such.tar/x"]
    split_yaml.write_text(yaml.dump(splits))
    after = json.loads(run_shardprep("info", str(dataset), "--json", check=True).stdout)
    now = next(split for split in after["splits"] if split["split"] == "train")
    # energon's loader skips the excluded sample: one sample fewer, and none of its parts
    assert now["samples"] == train["samples"] - 1
    assert sum(part["count"] for part in now["parts"]) < sum(part["count"] for part in train["parts"])
    assert largest["key"] not in [sample["key"] for sample in now["largest_samples"]]
    assert after["samples"] == before["samples"]  # the dataset still holds it


def test_shards_in_a_folder_that_cannot_be_searched_are_listed_not_a_traceback(tmp_path):
    root = tmp_path / "d"
    write_tarfile(root / "parts" / "a.tar", sample_members("a-", 2))
    write_tarfile(root / "b.tar", sample_members("b-", 2))
    run_shardprep("prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True)
    (root / "parts").chmod(0)
    try:
        result = run_shardprep("info", str(root), honour_permissions=True)
    finally:
        (root / "parts").chmod(0o755)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "missing or unreadable shard files: parts/a.tar (run `shardprep verify`)" in result.stdout


def test_split_yaml_is_parsed_once_per_info(base, monkeypatch):
    """Its `exclude` list may hold millions of samples: parsing it took seconds, and info parsed it for the
    splits and again for the samples excluded one by one."""
    from prep.index import dataset as dataset_module
    from prep.index.dataset import PreparedDataset
    from prep.inspect.info import dataset_info

    parsed = []
    read_splits = dataset_module.read_splits
    monkeypatch.setattr(dataset_module, "read_splits", lambda path: parsed.append(path) or read_splits(path))
    with PreparedDataset(prepared_dataset(base, "shardprep")) as dataset:
        assert dataset_info(dataset).samples == 28
    assert len(parsed) == 1


def test_sample_indexes_are_read_only_when_split_yaml_excludes_samples(base, tmp_path, monkeypatch):
    """They find the samples excluded one by one; without any, reading them was a tenth of info's time."""
    from prep.index.dataset import PreparedDataset
    from prep.index.sqlite import IndexReader
    from prep.inspect.info import dataset_info

    read = []
    columns = IndexReader.columns
    monkeypatch.setattr(
        IndexReader,
        "columns",
        lambda self, table, wanted, *a, **k: (
            read.extend(wanted.values()) or columns(self, table, wanted, *a, **k)
        ),
    )
    with PreparedDataset(prepared_dataset(base, "shardprep")) as dataset:
        dataset_info(dataset)
    assert read and "sample_index" not in read


def test_a_shard_split_yaml_excludes_is_not_said_to_be_in_no_split(base, tmp_path):
    """The user's `exclude` put it in no split; "in no split" is for shards split.yaml forgot."""
    from prep.index.dataset import PreparedDataset
    from prep.inspect.info import dataset_info

    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    splits = yaml.safe_load(split_yaml.read_text())
    shard = json.loads((dataset / ".nv-meta" / ".info.json").read_text())["shard_counts"]
    splits["exclude"] = [next(iter(shard))]
    split_yaml.write_text(yaml.dump(splits))
    with PreparedDataset(dataset) as prepared:
        stats = dataset_info(prepared)
    assert stats.unsplit_shards == [] and all(next(iter(shard)) not in s.split for s in stats.splits)


@pytest.mark.parametrize("table", ["samples", "sample_parts"])
def test_an_index_with_a_damaged_page_is_named_with_what_to_do_not_a_traceback(tmp_path, table):
    # Reading every row of a column raised sqlite's own "database disk image is malformed".
    dataset = dataset_with_damaged_index(tmp_path / "d", table)
    result = run_shardprep("info", str(dataset))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(
        f"Error: {dataset / '.nv-meta' / 'index.sqlite'} cannot be read (database disk image is malformed)."
        " Re-run `shardprep prepare`"
    ), result.stderr
