"""The mount's tree of views, walked without FUSE: every name, listing page and byte, against tarfile.

The tree remembers what it read in one bounded cache with one read-ahead; these walks shrink both so
that evictions and read-aheads happen all the time, in every order a kernel may ask in.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

import pytest
import yaml

from prep.index import dataset as dataset_module
from prep.index.dataset import PreparedDataset
from prep.mount import tree as mount_tree
from prep.mount.tree import ROOT, MountTree, View
from tests.support.datasets import PREPARERS, expected_files, prepared_dataset, writable_copy


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tree-datasets")


@pytest.fixture
def small_cache(monkeypatch):
    monkeypatch.setattr(mount_tree, "CACHED_SAMPLES", 6)
    monkeypatch.setattr(mount_tree, "SAMPLES_AHEAD", 2)


def walk(tree: MountTree, folder: int = ROOT, prefix: str = "", page: int = 3) -> dict[str, bytes]:
    """Every file under `folder` by listing (a few entries per page), each read in two pieces."""
    files: dict[str, bytes] = {}
    after = 0
    while True:
        listing = tree.list_dir(folder, after, page)
        if not listing.entries:
            return files
        for name, node, size, cookie in listing.entries:
            if listing.is_dir:
                files.update(walk(tree, node, f"{prefix}{name}/", page))
            else:
                assert tree.node(node).size == size
                files[f"{prefix}{name}"] = tree.read(node, 0, size // 2) + tree.read(node, size // 2, size)
            after = cookie


def look_up(tree: MountTree, path: str) -> bytes | None:
    """A file's bytes found by name alone, folder by folder, as `open` finds it without a listing."""
    node = ROOT
    for name in path.split("/"):
        found = tree.lookup(node, name)
        if found is None:
            return None
        node = found.id
    return tree.read(node, 0, tree.node(node).size)


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("view", list(View))
def test_listing_every_folder_page_by_page_finds_every_file_with_its_bytes(base, small_cache, preparer, view):
    dataset = prepared_dataset(base, preparer)
    tree = MountTree(PreparedDataset(dataset), view)
    try:
        assert walk(tree) == expected_files(dataset, view)
    finally:
        tree.close()


@pytest.mark.parametrize("view", list(View))
def test_files_found_by_name_in_any_order_have_their_bytes_and_others_are_absent(base, small_cache, view):
    dataset = prepared_dataset(base, "shardprep")
    expected = expected_files(dataset, view)
    tree = MountTree(PreparedDataset(dataset), view)
    try:
        for order in (sorted(expected), sorted(expected, reverse=True), sorted(expected)[::3]):
            for path in order:
                assert look_up(tree, path) == expected[path], path
        for path in sorted(expected)[:5]:
            assert look_up(tree, path + "x") is None
    finally:
        tree.close()


@pytest.mark.parametrize("view", list(View))
def test_every_node_names_the_path_it_is_found_at(base, view):
    # The path a failed request is told with (`prep.mount.failures`): the one the user opened.
    dataset = prepared_dataset(base, "shardprep")
    tree = MountTree(PreparedDataset(dataset), view)
    try:
        assert tree.path(ROOT) == "/"
        for path in sorted(expected_files(dataset, view))[::7]:
            node, walked = ROOT, ""
            for name in path.split("/"):
                node, walked = tree.lookup(node, name).id, f"{walked}/{name}"
                assert tree.path(node) == walked
        assert (
            tree.path(ROOT + 4 * 10**6) is None
            and tree.path(mount_tree.node_id(mount_tree.PART, 10**6)) is None
        )
    finally:
        tree.close()


def test_a_split_shows_only_its_shards_samples(base, small_cache):
    dataset = prepared_dataset(base, "energon")
    with PreparedDataset(dataset) as prepared:
        train = set(prepared.split_shards("train"))
    inside = expected_files(dataset, "flat", train)
    outside = set(expected_files(dataset, "flat")) - set(inside)
    tree = MountTree(PreparedDataset(dataset), View.FLAT, "train")
    try:
        assert walk(tree) == inside
        assert all(look_up(tree, path) is None for path in outside)
        assert tree.usage() == (sum(len(data) for data in inside.values()), len(inside))
    finally:
        tree.close()


@pytest.mark.parametrize("view", list(View))
def test_a_split_leaves_out_the_samples_and_shards_its_exclude_list_names(base, small_cache, tmp_path, view):
    # energon's loader never gives a sample `exclude` names (`SHARD/KEY`) for any split; a whole shard
    # named there is in no split. A mount without --split shows them all, as the index has them.
    dataset = writable_copy(prepared_dataset(base, "energon"), tmp_path / "dataset")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    split = yaml.safe_load(split_yaml.read_text())
    split["exclude"] = ["shard-000.tar/s0_001", "shard-002.tar/s2_005", "shard-001.tar"]
    split_yaml.write_text(yaml.safe_dump(split))
    with PreparedDataset(dataset) as prepared:
        train = set(prepared.split_shards("train"))
    assert train == {"shard-000.tar", "shard-002.tar", "shard-003.tar"}
    everything = expected_files(dataset, view)

    def sample_of(path: str) -> str:
        return path.split("/")[-2] if view != View.FLAT else path.split(".")[0]

    inside = {
        path: data
        for path, data in expected_files(dataset, view, train).items()
        if sample_of(path) not in ("s0_001", "s2_005")
    }
    excluded = {path for path in everything if sample_of(path) in ("s0_001", "s2_005")}
    assert excluded
    tree = MountTree(PreparedDataset(dataset), view, "train")
    try:
        assert walk(tree) == inside
        assert all(look_up(tree, path) is None for path in excluded)
        if view == View.FLAT:
            assert tree.usage() == (sum(len(data) for data in inside.values()), len(inside))
    finally:
        tree.close()
    whole = MountTree(PreparedDataset(dataset), view)
    try:
        assert walk(whole) == everything
    finally:
        whole.close()


def test_a_shard_replaced_or_rewritten_after_the_mount_started_reads_as_an_io_error_named_once(
    base, tmp_path, capfd
):
    # The index's offsets are those of the shards as prepared: a shard file that is no longer the one the
    # mount started with must not be read at them. A descriptor opened before keeps its own (old) file.
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    expected = expected_files(dataset, View.SHARD)
    tree = MountTree(PreparedDataset(dataset), View.SHARD)
    try:
        opened = "shard-000.tar/s0_000/txt"
        assert look_up(tree, opened) == expected[opened]
        for replaced in ("shard-000.tar", "shard-001.tar"):  # renamed over, once open and once not
            shutil.copy(dataset / "shard-002.tar", dataset / "new.tar")
            os.replace(dataset / "new.tar", dataset / replaced)
        rewritten = dataset / "shard-003.tar"  # same size, other bytes
        rewritten.write_bytes(rewritten.read_bytes().replace(b"sample 30", b"sample 99"))
        assert look_up(tree, opened) == expected[opened]
        for path in ("shard-001.tar/s1_000/txt", "shard-001.tar/s1_001/json", "shard-003.tar/s3_000/txt"):
            with pytest.raises(OSError) as raised:
                look_up(tree, path)
            assert raised.value.errno == errno.EIO, path
        assert look_up(tree, "shard-002.tar/s2_000/txt") == expected["shard-002.tar/s2_000/txt"]
    finally:
        tree.close()
    printed = capfd.readouterr().err
    assert printed.count("shard-001.tar") == 1 and printed.count("shard-003.tar") == 1, printed
    assert "shardprep prepare" in printed


def test_shard_files_open_at_once_stay_within_their_bound(base, small_cache, monkeypatch):
    monkeypatch.setattr(dataset_module, "OPEN_SHARD_FILES", 2)
    dataset = prepared_dataset(base, "shardprep")

    def open_shards() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
                link = os.readlink(f"/proc/self/fd/{fd}")
                count += link.startswith(str(dataset)) and link.endswith(".tar")
        return count

    tree = MountTree(PreparedDataset(dataset), View.SHARD)
    try:
        expected = expected_files(dataset, View.SHARD)
        for path in sorted(expected, key=lambda path: path.split("/")[1]):  # shard after shard, over and over
            assert look_up(tree, path) == expected[path], path
            assert open_shards() <= 2
    finally:
        tree.close()
