"""The local folder a command on a bucket dataset works in: made under `--tmp-path` (the system's
temporary folder by default) and removed when the command ends, whatever ends it.

A run killed outright (SIGKILL, a power cut) cannot remove its folder, which may hold a whole index
(gigabytes for a big dataset). So each run holds an exclusive `flock` on `SCRATCH_LOCK` in its folder for
as long as it lives; the kernel drops it when the run dies, however it dies. A run starting in the same
place removes every folder of ours whose lock nobody holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prep.errors import PrepError
from prep.storage.address import ObjectAddress

#: Every scratch folder's name starts so (then the command, then mkdtemp's letters).
PREFIX = "shardprep-"
#: The file whose lock says a scratch folder's run is alive.
SCRATCH_LOCK = ".scratch.lock"
#: A command a message tells the user to run.
_COMMAND = re.compile(r"`shardprep [^`]*`")


@contextmanager
def scratch_folder(tmp_path: str | Path | None, what: str) -> Iterator[Path]:
    """A new, empty folder `.../dataset` under `tmp_path` (made if missing), for the local side of `what`
    (e.g. "prepare"); removed with its parent when the block ends. Folders that killed runs left there
    are removed first.

    >>> with scratch_folder(None, "example") as folder:
    ...     folder.name, folder.is_dir(), folder.parent.name.startswith("shardprep-example-")
    ('dataset', True, True)
    >>> folder.parent.exists()
    False
    """
    base = Path(tmp_path) if tmp_path is not None else Path(tempfile.gettempdir())
    try:
        base.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{what}-", dir=base))
        lock = _locked_file(work / SCRATCH_LOCK)
    except OSError as error:
        raise PrepError(
            f"Cannot make a working folder in {base} ({error.strerror}): {what} on a bucket dataset keeps"
            " its local files there. Give --tmp-path a folder you can write to, with room for the index."
        ) from None
    try:
        remove_abandoned(base)
        root = work / "dataset"
        root.mkdir()
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock)


def named_by_address(text: str, folder: str | Path, address: object) -> str:
    """`text`, a message, with the local `folder` (gone when the user reads it) named by the address it
    stands for, in a command the user is told to run quoted as a shell needs it.

    >>> named_by_address("/t/x/a.tar is bad: run `shardprep prepare /t/x`.", "/t/x", "s3://b/my data")
    "s3://b/my data/a.tar is bad: run `shardprep prepare 's3://b/my data'`."
    >>> named_by_address("run `shardprep prepare '/t/a b'`.", "/t/a b", "s3://b/x")
    'run `shardprep prepare s3://b/x`.'
    """
    folder, address = str(folder), str(address)
    quoted = shlex.quote(address)

    def in_command(command: re.Match[str]) -> str:  # (where the folder needed quotes, they are in it)
        return command.group().replace(shlex.quote(folder), quoted).replace(folder, quoted)

    return _COMMAND.sub(in_command, text).replace(folder, address)


def resume_folder_for(address: ObjectAddress, tmp_path: str | Path | None, what: str = "resume") -> Path:
    """Where `--resume` keeps a bucket dataset's work for a rerun (`what`: "resume", the rows of a
    prepare's shards; "write-resume", a write's dataset and its checkpoint): a folder under `tmp_path`
    (the system's temporary folder by default) named by the user and the address, so a rerun with the
    same arguments finds it (`prep.index.checkpoint` reads it only if it is this user's alone).

    >>> from prep.storage.address import parse_address
    >>> resume_folder_for(parse_address("s3://b/ds"), "/scratch").name == f"shardprep-resume-{os.getuid()}-cc99de96d5c49b13"
    True
    """
    digest = hashlib.sha256(str(address).encode()).hexdigest()[:16]
    return Path(tmp_path or tempfile.gettempdir()) / f"{PREFIX}{what}-{os.getuid()}-{digest}"


def remove_abandoned(base: Path) -> int:
    """Remove the scratch folders under `base` whose run has died (their lock is free), and return how
    many went. Folders of other users, and of runs alive, are left alone."""
    removed = 0
    try:
        entries = [entry for entry in os.scandir(base) if entry.name.startswith(PREFIX)]
    except OSError:
        return 0
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            lock = os.open(os.path.join(entry.path, SCRATCH_LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # not a scratch folder (e.g. a resume folder), or one just being made
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)  # held: its run is alive (or this filesystem has no flock)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        os.close(lock)
        removed += 1
    return removed


def _locked_file(path: Path) -> int:
    """The descriptor of a new file at `path`, locked before it has that name (so no other run can see
    it unlocked and take this run for dead); where the filesystem has no flock, unlocked."""
    making = path.with_name(path.name + ".new")
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # nothing is then ever removed as abandoned: the others cannot lock it either
    os.rename(making, path)
    return fd
