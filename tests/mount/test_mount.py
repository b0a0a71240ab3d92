"""`shardprep mount`: a real FUSE mount of datasets prepared by energon and by shardprep."""

from __future__ import annotations

import errno
import io
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from prep.index.group import key_and_part
from prep.mount.device import fuse_problem, mounted_here
from prep.mount.failures import FULL_PER_KIND
from prep.mount.wire import NAME_MAX
from tests.support.datasets import (
    BIG_PART_BYTES,
    PREPARERS,
    expected_files,
    prepared_dataset,
    tar_members,
    writable_copy,
)
from tests.support.leftovers import end_process, unmount_quietly
from tests.support.prepare import REPO, run_shardprep
from tests.support.shards import hostile_shard

FUSE_MISSING = fuse_problem()
pytestmark = pytest.mark.skipif(FUSE_MISSING is not None, reason=f"FUSE unavailable: {FUSE_MISSING}")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mount-datasets")


class Mounted:
    def __init__(self, dataset: Path, mountpoint: Path, *args: str) -> None:
        self.mountpoint = mountpoint
        result = run_shardprep("mount", str(dataset), str(mountpoint), *args, check=True)
        self.said = result.stdout
        self.warned = result.stderr
        match = re.search(r"mounted at (.+) \(pid (\d+)\)", result.stdout)
        assert match, result.stdout
        self.pid = int(match.group(2))

    def __enter__(self) -> Mounted:
        return self

    def __exit__(self, *exc_info) -> None:
        unmount_quietly(self.mountpoint, self.pid)


def files_under(mountpoint: Path) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(mountpoint):
        for name in names:
            path = Path(folder, name)
            found[str(path.relative_to(mountpoint))] = path.read_bytes()
    return found


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("view", ["flat", "sample", "shard"])
def test_every_file_read_through_the_mount_equals_the_tar_member(base, tmp_path, preparer, view):
    dataset = prepared_dataset(base, preparer)
    with Mounted(dataset, tmp_path / "mnt", "--view", view) as mounted:
        assert files_under(mounted.mountpoint) == expected_files(dataset, view)


def test_names_from_the_tar_never_escape_the_mount(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt", "--view", "sample") as mounted:
        for folder, dirs, names in os.walk(mounted.mountpoint):
            for name in dirs + names:
                assert "/" not in name and name not in (".", "..")
                real = os.path.realpath(os.path.join(folder, name))
                assert real.startswith(str(mounted.mountpoint) + os.sep)
        assert (mounted.mountpoint / "..%2Fescape" / "txt").read_bytes() == b"must stay inside the mount\n"
        assert not (tmp_path / "escape").exists()
        assert not (mounted.mountpoint / ".." / "escape").exists()


def test_ranged_reads_of_a_big_part_return_exactly_the_requested_bytes(base, tmp_path):
    dataset = prepared_dataset(base, "shardprep")
    expected = tar_members(dataset)["shard-001.tar"]["s1_002.bin"]
    assert len(expected) == BIG_PART_BYTES
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        path = mounted.mountpoint / "s1_002.bin"
        assert path.stat().st_size == BIG_PART_BYTES
        with open(path, "rb", buffering=0) as part:
            for offset, size in [
                (0, 1),
                (1, 4095),
                (131071, 300000),
                (BIG_PART_BYTES - 10, 100),
                (BIG_PART_BYTES, 5),
            ]:
                part.seek(offset)
                assert part.read(size) == expected[offset : offset + size]
        with open(path, "rb") as part:
            assert part.read() == expected


def test_concurrent_readers_all_get_the_right_bytes(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    expected = expected_files(dataset, "flat")
    with Mounted(dataset, tmp_path / "mnt") as mounted:

        def read(name: str) -> bytes:
            return (mounted.mountpoint / name).read_bytes()

        names = sorted(expected) * 4
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, names))
    assert results == [expected[name] for name in names]


def test_split_option_shows_only_the_shards_of_that_split(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    split_yaml = (dataset / ".nv-meta" / "split.yaml").read_text()
    with Mounted(dataset, tmp_path / "mnt", "--view", "shard", "--split", "train") as mounted:
        shown = set(os.listdir(mounted.mountpoint))
    assert shown and all(name in split_yaml or name.startswith("shard-00") for name in shown)
    from prep.index.dataset import PreparedDataset

    with PreparedDataset(dataset) as prepared:
        assert shown == set(prepared.split_shards("train"))


def test_mount_is_read_only(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        with pytest.raises(OSError):
            open(mounted.mountpoint / "s0_000.txt", "r+b")
        with pytest.raises(OSError):
            (mounted.mountpoint / "new.txt").write_bytes(b"x")


def test_umount_unmounts_and_ends_the_mount_process(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        assert os.path.ismount(mounted.mountpoint)
        result = run_shardprep("umount", str(mounted.mountpoint), check=True)
        assert "unmounted" in result.stdout
        assert not os.path.ismount(mounted.mountpoint)
        assert end_process(mounted.pid), "the server did not exit within 5 s of its unmount"
        again = run_shardprep("umount", str(mounted.mountpoint))
        assert again.returncode != 0 and "not a mount point" in again.stderr


def mount_in_the_foreground(dataset: Path, mountpoint: Path, *flags: str) -> subprocess.Popen:
    """`shardprep mount DATASET MOUNTPOINT FLAGS` (a foreground flag among them) as a child, once it says
    it is mounted; the caller ends it and unmounts."""
    process = subprocess.Popen(
        [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().startswith(f"mounted at {mountpoint}")
    except BaseException:
        process.kill()
        process.wait()
        unmount_quietly(mountpoint)
        raise
    return process


def ctrl_c_after_one_read(dataset: Path, mountpoint: Path, flag: str, name: str, data: bytes):
    """Mount in the foreground with `flag`, read `name` (it must hold `data`), press Ctrl-C.

    Returns the finished process and its stdout and stderr; nothing stays mounted.
    """
    process = mount_in_the_foreground(dataset, mountpoint, flag)
    try:
        assert (mountpoint / name).read_bytes() == data
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
        unmount_quietly(mountpoint)
    return process, out, err


def test_ctrl_c_in_the_foreground_unmounts_cleanly(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    mountpoint = tmp_path / "mnt"
    process, out, err = ctrl_c_after_one_read(
        dataset, mountpoint, "--foreground", "s0_000.txt", b"sample 0\n"
    )
    assert process.returncode == 0, err
    assert "unmounted" in out
    assert not os.path.ismount(mountpoint)


def test_ctrl_c_while_a_file_is_open_serves_it_until_closed_and_says_so(base, tmp_path):
    dataset = prepared_dataset(base, "shardprep")
    big = "shard-001.tar/s1_002/bin"
    data = expected_files(dataset, "shard")[big]
    mountpoint = tmp_path / "mnt"
    process = mount_in_the_foreground(dataset, mountpoint, "--view", "shard", "-f")
    try:
        fd = os.open(mountpoint / big, os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, 0) == data[:4096]
            process.send_signal(signal.SIGINT)
            said = process.stderr.readline()
            assert "open" in said and "Ctrl-C again" in said, said
            assert not os.path.ismount(mountpoint)  # detached: no new file opens there
            assert os.pread(fd, 4096, len(data) // 2) == data[len(data) // 2 : len(data) // 2 + 4096]
            assert process.poll() is None
        finally:
            os.close(fd)
        out, err = process.communicate(timeout=10)  # the last file closed: the session ends
        assert process.returncode == 0 and "unmounted" in out, err
    finally:
        if process.poll() is None:
            process.kill()
        unmount_quietly(mountpoint)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="hiding /dev/fuse needs root and unshare"
)
def test_without_the_fuse_device_mount_fails_and_says_what_to_install(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    # A private mount namespace whose /dev holds only /dev/null: a machine (or container) without FUSE.
    hide_fuse = 'mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && exec "$@"'
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide_fuse, "sh", "true"]
    )
    if probe.returncode != 0:
        pytest.skip("this sandbox cannot make a private mount namespace")
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide_fuse, "sh"]
        + [sys.executable, "-m", "prep", "mount", str(dataset), str(tmp_path / "mnt")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "no /dev/fuse" in result.stderr and "apt-get install fuse3" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def test_mounting_onto_a_mount_point_in_use_is_refused(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        result = run_shardprep("mount", str(dataset), str(mounted.mountpoint))
    assert result.returncode != 0 and "already a mount point" in result.stderr


@pytest.mark.parametrize("where", ["the dataset", "a folder above it"])
def test_a_mount_point_over_the_dataset_is_refused_before_mounting(base, tmp_path, where):
    """The mount would hide the index and shards its own server reads: it would wait on itself for ever."""
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "above" / "dataset")
    mountpoint = dataset if where == "the dataset" else dataset.parent
    try:
        result = subprocess.run(
            [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint)],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        unmount_quietly(mountpoint)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"The mount point {mountpoint} holds files of the dataset it would serve" in result.stderr
    assert not os.path.ismount(mountpoint)


def test_a_part_whose_shard_went_missing_is_an_io_error_not_a_missing_file(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    expected = expected_files(dataset, "flat")
    first = sorted(dataset.glob("*.tar"))[0]
    with tarfile.open(first) as tar:
        name = next(member.name for member in tar if member.isfile())
    first.unlink()
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        path = mounted.mountpoint / name
        assert path.stat().st_size == len(expected[name])  # listed from the index
        with pytest.raises(OSError) as raised:
            path.read_bytes()
        assert raised.value.errno == errno.EIO


def test_a_shard_replaced_while_mounted_is_an_io_error_not_another_files_bytes(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    expected = expected_files(dataset, "shard")
    with Mounted(dataset, tmp_path / "mnt", "--view", "shard") as mounted:
        served = "shard-000.tar/s0_000/txt"
        assert (mounted.mountpoint / served).read_bytes() == expected[served]
        # Nothing of shard-001 looked up yet: a lookup reads a small file at once, from the file of then.
        path = mounted.mountpoint / "shard-001.tar" / "s1_000" / "txt"
        shutil.copy(dataset / "shard-002.tar", dataset / "new.tar")
        os.replace(dataset / "new.tar", dataset / "shard-001.tar")
        with pytest.raises(OSError) as raised:
            path.read_bytes()
        assert raised.value.errno == errno.EIO


def test_a_shard_replaced_under_a_background_mount_is_said_once_in_its_log_file(base, tmp_path):
    # The background server's stderr is /dev/null: the reader saw EIO and nobody saw why.
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    log = tmp_path / "mount.log"
    with Mounted(dataset, tmp_path / "mnt", "--view", "shard", "--log-file", str(log)) as mounted:
        assert mounted.said.splitlines()[1] == f"Its messages go to {log}."
        path = mounted.mountpoint / "shard-001.tar" / "s1_000" / "txt"
        os.replace(shutil.copy(dataset / "shard-002.tar", dataset / "new.tar"), dataset / "shard-001.tar")
        for _ in range(2):
            with pytest.raises(OSError) as raised:
                path.read_bytes()
            assert raised.value.errno == errno.EIO
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines  # said once
    assert f"{dataset / 'shard-001.tar'} changed (replaced or rewritten) while mounted" in lines[0]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_shard_changed_before_mounting_is_named_at_mount_and_its_files_are_io_errors(base, tmp_path):
    # Only a change while mounted was caught: a shard changed between prepare and mount (here another,
    # shorter shard copied over it) was read at the index's offsets, and its files had other bytes.
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    expected = expected_files(dataset, "shard")
    shutil.copy(dataset / "shard-004.tar", dataset / "shard-001.tar")
    log = tmp_path / "mount.log"
    with Mounted(dataset, tmp_path / "mnt", "--view", "shard", "--log-file", str(log)) as mounted:
        with pytest.raises(OSError) as raised:
            (mounted.mountpoint / "shard-001.tar/s1_000/txt").read_bytes()
        assert raised.value.errno == errno.EIO
        served = "shard-000.tar/s0_000/txt"
        assert (mounted.mountpoint / served).read_bytes() == expected[served]
    warning = "1 shard changed after the dataset was prepared (shorter than its index says"
    assert warning in mounted.warned and f"{dataset / 'shard-001.tar'} (" in mounted.warned, mounted.warned
    assert "shardprep prepare" in mounted.warned
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and warning in lines[0], lines  # and no more of it when read


@pytest.mark.parametrize("where", ["in a missing folder", "a planted link"])
def test_a_log_file_that_cannot_be_opened_is_refused_before_mounting(base, tmp_path, where):
    dataset = prepared_dataset(base, "energon")
    log = tmp_path / "missing" / "mount.log"
    if where == "a planted link":
        log = tmp_path / "mount.log"
        log.symlink_to(tmp_path / "elsewhere")
    result = run_shardprep("mount", str(dataset), str(tmp_path / "mnt"), "--log-file", str(log))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"The log file {log} cannot be opened" in result.stderr
    assert not os.path.ismount(tmp_path / "mnt") and not (tmp_path / "elsewhere").exists()


def test_requests_failing_under_a_background_mount_are_told_in_its_log_file_a_few_times_then_counted(
    base, tmp_path
):
    # The index moved away while mounted: the server's first query opens it and fails (a PrepError, no
    # OSError), so each lookup is an I/O error. Only --debug, in the foreground, said why; in the
    # background the reader saw EIO and the log file stayed empty.
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    log = tmp_path / "mount.log"
    attempts = FULL_PER_KIND + 4
    with Mounted(dataset, tmp_path / "mnt", "--log-file", str(log)) as mounted:
        os.replace(dataset / ".nv-meta" / "index.sqlite", tmp_path / "index.sqlite")
        for _ in range(attempts):
            with pytest.raises(OSError) as raised:
                (mounted.mountpoint / "s0_000.txt").read_bytes()
            assert raised.value.errno == errno.EIO
    lines = log.read_text().splitlines()
    told = [line for line in lines if "LOOKUP of /s0_000.txt answered as an I/O error: PrepError:" in line]
    assert len(told) == FULL_PER_KIND, lines
    assert f"{dataset / '.nv-meta' / 'index.sqlite'} is missing" in told[0]
    assert lines[-1].endswith(f"{attempts - FULL_PER_KIND} more LOOKUP requests failed with PrepError."), (
        lines
    )


def test_an_index_truncated_in_place_under_a_background_mount_is_an_io_error_said_in_its_log_file(
    many_samples, tmp_path
):
    # The server read index.sqlite through a memory mapping: the next lookup past the truncation was a
    # SIGBUS, which killed it without a word, and every reader got ENOTCONN.
    dataset = writable_copy(many_samples, tmp_path / "dataset")
    index = dataset / ".nv-meta" / "index.sqlite"
    expected = expected_files(dataset, "flat")
    first, last = min(expected), max(expected)  # on index pages far apart
    log = tmp_path / "mount.log"
    with Mounted(dataset, tmp_path / "mnt", "--log-file", str(log)) as mounted:
        assert (mounted.mountpoint / first).read_bytes() == expected[first]
        os.truncate(index, 4096)
        with pytest.raises(OSError) as raised:
            (mounted.mountpoint / last).read_bytes()
        assert raised.value.errno == errno.EIO
        assert (mounted.mountpoint / first).read_bytes() == expected[first]  # the mount goes on
    told = log.read_text()
    assert f"{index} changed while it was read (truncated or rewritten in place" in told, told


@pytest.mark.parametrize("log_was_there", [False, True], ids=["created", "there before"])
def test_a_mount_that_fails_removes_the_log_file_it_created_and_keeps_one_it_did_not(
    base, tmp_path, log_was_there
):
    # The log file is opened before the mount is tried: a mount that then failed left it behind, empty.
    dataset = prepared_dataset(base, "energon")
    log = tmp_path / "mount.log"
    if log_was_there:
        log.write_bytes(b"")
        log.chmod(0o640)
    (tmp_path / "a-file").write_text("not a folder")
    result = run_shardprep("mount", str(dataset), str(tmp_path / "a-file"), "--log-file", str(log))
    assert result.returncode == 1 and "is a file" in result.stderr, result.stderr
    assert log.exists() == log_was_there
    if log_was_there:
        assert stat.S_IMODE(log.stat().st_mode) == 0o640 and log.read_bytes() == b""


def test_a_background_mount_without_a_log_file_says_where_its_messages_go(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        said = mounted.said.splitlines()[1]
    if os.path.exists("/dev/log"):
        assert said == "Its messages go to syslog (journalctl -t shardprep-mount).", said
    else:
        assert said.startswith("Its messages are not kept") and "--log-file" in said and "-f" in said, said


def test_a_dataset_of_more_shards_than_the_server_may_open_files_reads_every_part(tmp_path):
    # The server kept every shard it had read open: past its limit of open files (a soft limit of 1,024
    # is common) each part of a further shard was an I/O error.
    dataset = tmp_path / "shards"
    dataset.mkdir()
    for shard in range(40):
        with tarfile.open(dataset / f"s{shard:02d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            member = tarfile.TarInfo(f"k{shard:02d}.txt")
            member.size = 2
            tar.addfile(member, io.BytesIO(b"%02d" % shard))
    run_shardprep(
        "prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True
    )
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        room = len(os.listdir(f"/proc/{mounted.pid}/fd")) + 12
        resource.prlimit(mounted.pid, resource.RLIMIT_NOFILE, (room, room))
        for shard in range(40):
            assert (mounted.mountpoint / f"k{shard:02d}.txt").read_bytes() == b"%02d" % shard


@pytest.fixture(scope="module")
def many_samples(base) -> Path:
    """3,000 samples of two parts in three shards: every view's listing takes many kernel requests."""
    folder = base / "many"
    folder.mkdir()
    for shard in range(3):
        with tarfile.open(folder / f"part-{shard}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(1000):
                for part, data in (("txt", f"{shard}/{index}".encode()), ("cls", str(index % 7).encode())):
                    member = tarfile.TarInfo(f"k{shard}_{index:04d}_{'y' * (index % 40)}.{part}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
    run_shardprep(
        "prepare", str(folder), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True
    )
    return folder


@pytest.mark.parametrize("view", ["flat", "sample", "shard"])
def test_listings_of_thousands_of_entries_are_complete_and_in_order(many_samples, tmp_path, view):
    expected = expected_files(many_samples, view)
    with Mounted(many_samples, tmp_path / "mnt", "--view", view) as mounted:
        found = files_under(mounted.mountpoint)
        if view == "flat":
            shown = os.listdir(mounted.mountpoint)
            assert shown == [name for names in tar_members(many_samples).values() for name in names]
    assert found == expected and len(found) == 6000


def test_sample_folders_list_the_same_in_any_order(many_samples, tmp_path):
    # Folders listed in index order are read ahead in batches, others one by one: list them backwards
    # first (every listing reaches the mount), then scattered and in order (the kernel may have kept some).
    expected: dict[str, list[str]] = {}
    for relative in expected_files(many_samples, "sample"):
        folder, part = relative.split("/")
        expected.setdefault(folder, []).append(part)
    folders = sorted(expected)
    shuffled = folders[::-1] + [folders[(index * 7919) % len(folders)] for index in range(len(folders))]
    with Mounted(many_samples, tmp_path / "mnt", "--view", "sample") as mounted:
        for folder in shuffled + folders:
            assert sorted(os.listdir(mounted.mountpoint / folder)) == sorted(expected[folder]), folder


def test_files_looked_up_long_before_they_are_read_get_their_own_bytes(many_samples, tmp_path):
    # A lookup reads a small file ahead into one of a few dozen reused slots: look up thousands of
    # names first (no listing, so each stat is a LOOKUP), then read them all, and some twice.
    expected = expected_files(many_samples, "flat")
    names = sorted(expected)[:2000]
    with Mounted(many_samples, tmp_path / "mnt") as mounted:
        for name in names:
            assert os.stat(mounted.mountpoint / name).st_size == len(expected[name])
        for name in names + names[::-7]:
            assert (mounted.mountpoint / name).read_bytes() == expected[name], name


def test_parts_not_in_the_page_cache_are_read_from_the_disk(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "dataset")
    expected = expected_files(dataset, "flat")
    for shard in dataset.glob("*.tar"):  # drop the shards' pages, so reads must wait for the disk
        descriptor = os.open(shard, os.O_RDONLY)
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(descriptor)
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        assert files_under(mounted.mountpoint) == expected


def test_file_sizes_and_folder_attributes_come_from_the_index(base, tmp_path):
    dataset = prepared_dataset(base, "shardprep")
    expected = expected_files(dataset, "sample")
    with Mounted(dataset, tmp_path / "mnt", "--view", "sample") as mounted:
        for relative, data in expected.items():
            info = os.stat(mounted.mountpoint / relative)
            assert stat.S_ISREG(info.st_mode) and info.st_size == len(data)
            assert info.st_mode & 0o777 == 0o444
        folder = os.stat(mounted.mountpoint / "s0_000")
        assert stat.S_ISDIR(folder.st_mode) and folder.st_mode & 0o777 == 0o555
        usage = os.statvfs(mounted.mountpoint)
        assert usage.f_files == len(expected) and usage.f_namemax == NAME_MAX
        assert 0 <= usage.f_blocks * usage.f_frsize - sum(map(len, expected.values())) < usage.f_frsize


def test_debug_traces_each_request_in_the_foreground(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    _, _, err = ctrl_c_after_one_read(dataset, tmp_path / "mnt", "--debug", "s0_001.txt", b"sample 1\n")
    assert "fuse: INIT" in err and "fuse: LOOKUP" in err and "fuse: READ" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) without fusermount3 needs root")
def test_root_mounts_without_fusermount3(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    mountpoint = tmp_path / "mnt"
    result = subprocess.run(
        [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path / "no-tools")},  # no fusermount3 to be found
    )
    try:
        assert result.returncode == 0, result.stderr
        assert files_under(mountpoint) == expected_files(dataset, "flat")
    finally:
        unmount_quietly(mountpoint)


def test_a_name_that_is_not_utf8_is_absent_and_the_mount_goes_on(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(os.fsencode(mounted.mountpoint), b"s0_000.\xff\xfe"))
        assert (mounted.mountpoint / "s0_000.txt").read_bytes() == b"sample 0\n"


def test_flat_lookups_find_every_part_of_a_sample_and_nothing_outside_the_split(base, tmp_path):
    # A flat-view lookup fetches all parts of the sample and remembers them, so most of these lookups
    # (no listing first) are answered from what a sibling's lookup found.
    from prep.index.dataset import PreparedDataset

    dataset = prepared_dataset(base, "energon")
    with PreparedDataset(dataset) as prepared:
        train = set(prepared.split_shards("train"))
    everything = expected_files(dataset, "flat")
    inside = expected_files(dataset, "flat", train)
    outside = sorted(set(everything) - set(inside))
    assert inside and outside
    keys = {key_and_part(name)[0] for name in inside if "%" not in name}
    with Mounted(dataset, tmp_path / "mnt", "--split", "train") as mounted:
        for name in sorted(inside, reverse=True):
            assert (mounted.mountpoint / name).read_bytes() == inside[name], name
        for name in outside:
            assert not (mounted.mountpoint / name).exists(), name
        for key in keys:
            assert not (mounted.mountpoint / f"{key}.no-such-part").exists(), key


@pytest.mark.parametrize("view", ["sample", "shard"])
def test_files_opened_by_path_without_a_listing_have_their_bytes(base, tmp_path, view):
    # Every part is found by lookups alone; a sample's parts are looked up in reverse, so all but the
    # first come from what the first lookup in that folder found.
    dataset = prepared_dataset(base, "shardprep")
    expected = expected_files(dataset, view)
    with Mounted(dataset, tmp_path / "mnt", "--view", view) as mounted:
        for relative in sorted(expected, reverse=True):
            assert (mounted.mountpoint / relative).read_bytes() == expected[relative], relative
        some_folder = Path(sorted(expected)[0]).parent
        assert not (mounted.mountpoint / some_folder / "no-such-part").exists()


def test_hostile_names_stay_inside_the_mount_in_every_view(tmp_path):
    dataset = tmp_path / "hostile"
    hostile_shard(dataset / "a.tar")
    run_shardprep(
        "prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True
    )
    for view in ("flat", "sample", "shard"):
        with Mounted(dataset, tmp_path / f"mnt-{view}", "--view", view) as mounted:
            top = os.path.realpath(mounted.mountpoint)
            for folder, dirs, names in os.walk(mounted.mountpoint):
                for name in dirs + names:
                    assert "/" not in name and "\0" not in name and name not in (".", "..")
                    assert os.path.realpath(os.path.join(folder, name)).startswith(top + os.sep)
            files = files_under(mounted.mountpoint)
            assert files, f"the {view} view is empty"


@pytest.mark.parametrize("view", ["flat", "sample"])
def test_a_name_too_long_for_the_kernel_hides_no_other_entry_of_its_folder(tmp_path, view):
    # A listing entry whose name is longer than the kernel takes (FUSE_NAME_MAX) made it fail the
    # listing with EIO, or (too long for the reply) end it early as if the folder ended there.
    dataset = tmp_path / "long"
    dataset.mkdir()
    keys = ["a0", "e" * 5000, "b1", "n" * 1100, "c2", "x" * 70_000, "d3"]
    with tarfile.open(dataset / "a.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for key in keys:
            member = tarfile.TarInfo(f"{key}.txt")
            member.size = 2
            tar.addfile(member, io.BytesIO(key[:2].encode()))
    run_shardprep(
        "prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True
    )
    shown = {"flat": [f"{key}.txt" for key in keys], "sample": keys}[view]
    with Mounted(dataset, tmp_path / "mnt", "--view", view) as mounted:
        listed = os.listdir(mounted.mountpoint)
    assert listed == [name for name in shown if len(name) <= NAME_MAX]


def dead_fuse_mount(mountpoint: Path, subtype: str) -> None:
    """Mount an unserved FUSE filesystem of `subtype` at `mountpoint` and drop its device: the mount a
    killed server leaves where nothing unmounts it (or, of another subtype, one `shardprep mount` did not
    make, as sshfs's would be). No access waits on it: each fails at once."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        subprocess.run(
            ["fusermount3", "-o", f"ro,subtype={subtype},fsname={subtype}", "--", str(mountpoint)],
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
            pass_fds=(theirs.fileno(),), check=True,
        )  # fmt: skip
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    for fd in fds:
        os.close(fd)


def gone_within(mountpoint: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while mounted_here(str(mountpoint)) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["SIGKILL of the background server", "SIGHUP of the foreground mount"])
def test_a_killed_server_leaves_no_dead_mount_and_a_new_mount_works(base, tmp_path, how):
    dataset = prepared_dataset(base, "energon")
    mountpoint = tmp_path / "mnt"
    if how.endswith("background server"):
        with Mounted(dataset, mountpoint) as mounted:
            assert os.listdir(mountpoint)  # a folder opened: the kernel knows how the server opens them
            os.kill(mounted.pid, signal.SIGKILL)
            assert end_process(mounted.pid)
            assert gone_within(mountpoint, 5), "the killed server's mount is still there"
    else:  # a terminal closed under `mount --foreground` (SIGHUP's default action, even if this run ignores it)
        process = subprocess.Popen(
            [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint), "--foreground"],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
        )  # fmt: skip
        try:
            assert process.stdout.readline().startswith(f"mounted at {mountpoint}")
            assert os.listdir(mountpoint)
            process.send_signal(signal.SIGHUP)
            process.wait(10)
            assert gone_within(mountpoint, 5), "the mount of the hung-up process is still there"
        finally:
            process.kill()
            process.communicate()
            unmount_quietly(mountpoint)
    with Mounted(dataset, mountpoint) as mounted:
        assert files_under(mounted.mountpoint) == expected_files(dataset, "flat")


@pytest.mark.skipif(shutil.which("fusermount3") is None, reason="making a dead mount needs fusermount3")
def test_a_dead_mount_is_refused_by_mount_cleaned_by_umount_and_a_new_mount_works(base, tmp_path):
    # As root without fusermount3 (mount(2)), nothing unmounts the mount of a killed server.
    dataset = prepared_dataset(base, "energon")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    dead_fuse_mount(mountpoint, "shardprep")
    try:
        with pytest.raises(OSError) as raised:
            os.stat(mountpoint)
        assert raised.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)  # the latter via fusermount3
        again = run_shardprep("mount", str(dataset), str(mountpoint))
        assert again.returncode != 0 and "server has died" in again.stderr and "umount" in again.stderr
        result = run_shardprep("umount", str(mountpoint), check=True)
        assert "its server had died" in result.stdout
    finally:
        unmount_quietly(mountpoint)
    with Mounted(dataset, mountpoint) as mounted:
        assert files_under(mounted.mountpoint) == expected_files(dataset, "flat")


def test_umount_of_a_busy_mount_says_so_and_lazy_detaches_it(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    with Mounted(dataset, tmp_path / "mnt") as mounted:
        reader = open(mounted.mountpoint / "s0_000.txt", "rb")  # noqa: SIM115 - held open on purpose
        try:
            busy = run_shardprep("umount", str(mounted.mountpoint))
            assert busy.returncode != 0 and "busy" in busy.stderr.lower(), busy.stderr
            assert "shardprep umount --lazy" in busy.stderr
            assert os.path.ismount(mounted.mountpoint)
            run_shardprep("umount", "--lazy", str(mounted.mountpoint), check=True)
            assert not os.path.ismount(mounted.mountpoint)
            assert reader.read() == b"sample 0\n"  # an open file goes on working after a lazy unmount
        finally:
            reader.close()
        assert end_process(mounted.pid), "the server did not end once the last file closed"


@pytest.mark.skipif(
    shutil.which("fusermount3") is None, reason="mounting another FUSE type needs fusermount3"
)
def test_umount_refuses_a_mount_that_shardprep_did_not_make(tmp_path):
    mountpoint = tmp_path / "other"
    mountpoint.mkdir()
    dead_fuse_mount(mountpoint, "other")
    try:
        result = run_shardprep("umount", str(mountpoint))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "is a fuse.other mount, not a dataset mounted with `shardprep mount`" in result.stderr
        assert mounted_here(str(mountpoint)) == "fuse.other"
    finally:
        unmount_quietly(mountpoint)


def test_a_mount_point_that_cannot_be_created_is_one_message_not_a_traceback(base, tmp_path):
    dataset = prepared_dataset(base, "energon")
    (tmp_path / "a-file").write_text("not a folder")
    mountpoint = tmp_path / "a-file" / "mnt"
    result = run_shardprep("mount", str(dataset), str(mountpoint))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"The mount point {mountpoint} cannot be made a folder: Not a directory" in result.stderr


@pytest.mark.parametrize("through", ["a link to the folder", "a linked folder above it"])
def test_a_mount_point_reached_through_a_link_mounts_and_unmounts_by_that_path(base, tmp_path, through):
    dataset = prepared_dataset(base, "energon")
    (tmp_path / "real" / "mnt").mkdir(parents=True)
    if through == "a link to the folder":
        (tmp_path / "link").symlink_to(tmp_path / "real" / "mnt")
        mountpoint = tmp_path / "link"
    else:
        (tmp_path / "link").symlink_to(tmp_path / "real")
        mountpoint = tmp_path / "link" / "mnt"
    try:
        mounted = run_shardprep("mount", str(dataset), str(mountpoint))
        assert mounted.returncode == 0, mounted.stderr
        assert (mountpoint / "s0_000.txt").read_bytes() == b"sample 0\n"
        result = run_shardprep("umount", str(mountpoint))
        assert result.returncode == 0, result.stderr
        assert mounted_here(str(tmp_path / "real" / "mnt")) is None
    finally:
        unmount_quietly(tmp_path / "real" / "mnt")


@pytest.mark.parametrize("view", ["flat", "sample", "shard"])
def test_a_part_a_sample_holds_twice_is_one_file_with_the_member_energon_loads(tmp_path, view):
    # energon's loader keeps the last member of a part name (each replaces the one before).
    dataset = tmp_path / "twice"
    dataset.mkdir()
    with tarfile.open(dataset / "a.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in [("a.txt", b"first"), ("a.txt", b"second!"), ("a.cls", b"1"), ("b.txt", b"b")]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    run_shardprep(
        "prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True
    )
    folder = {"flat": "", "sample": "a/", "shard": "a.tar/a/"}[view]
    name = folder + ("a.txt" if view == "flat" else "txt")
    with Mounted(dataset, tmp_path / "mnt", "--view", view) as mounted:
        assert (mounted.mountpoint / name).read_bytes() == b"second!"  # looked up, never listed
        listed = os.listdir(mounted.mountpoint / folder)
        assert sorted(listed) == sorted(set(listed)), listed
        found = files_under(mounted.mountpoint)
        assert found[name] == b"second!" and len(found) == 3
        assert os.statvfs(mounted.mountpoint).f_files == 3


# A server with no one to unmount after it: the device mounted and served, nothing else.
BARE_SERVER = """
import sys, threading
from prep.index.dataset import PreparedDataset
from prep.mount.device import mount_device
from prep.mount.session import FuseSession, Owner
from prep.mount.tree import MountTree
device = mount_device(sys.argv[2], "shardprep:bare")
session = FuseSession(device, MountTree(PreparedDataset(sys.argv[1])), Owner(0, 0, 0, 0))
session.start()
session.initialised.wait(30)
print("ready", flush=True)
threading.Event().wait()
"""


def test_a_dead_mount_is_named_dead_after_its_attributes_were_cached(base, tmp_path):
    # The kernel answers a stat of the mount point from what it cached while the server lived.
    dataset = prepared_dataset(base, "energon")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-c", BARE_SERVER, str(dataset), str(mountpoint)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline() == "ready\n"
        assert os.listdir(mountpoint) and os.stat(mountpoint)
        server.kill()
        server.wait(10)
        again = run_shardprep("mount", str(dataset), str(mountpoint))
        assert again.returncode != 0 and "whose server has died" in again.stderr, again.stderr
        result = run_shardprep("umount", str(mountpoint), check=True)
        assert "its server had died" in result.stdout
    finally:
        server.kill()
        server.communicate()
        unmount_quietly(mountpoint)


@pytest.mark.parametrize("address", ["s3://bucket/dataset", "msc://profile/dataset"])
def test_a_dataset_in_a_bucket_is_refused_by_its_address(tmp_path, address):
    result = run_shardprep("mount", address, str(tmp_path / "mnt"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{address} is in object storage; `shardprep mount` serves a dataset in a local folder" in (
        result.stderr
    )
    assert not (tmp_path / "mnt").exists()


def test_the_background_server_and_its_watcher_keep_no_folder_busy(base, tmp_path):
    # Started in a folder on another filesystem, they must not keep it from being unmounted.
    dataset = prepared_dataset(base, "energon")
    (tmp_path / "work").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "prep", "mount", str(dataset), str(tmp_path / "mnt")],
        cwd=tmp_path / "work", env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    server = int(re.search(r"\(pid (\d+)\)", result.stdout).group(1))
    try:
        children = [int(pid) for pid in Path(f"/proc/{server}/task/{server}/children").read_text().split()]
        assert children, "the server started no watcher"
        for pid in [server, *children]:
            assert os.readlink(f"/proc/{pid}/cwd") == "/", pid
    finally:
        unmount_quietly(tmp_path / "mnt", server)
