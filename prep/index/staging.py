"""All-or-nothing runs: write every output under a temporary name beside its final place, then put them in
place together.

    with Staging(root) as staging:
        write(staging.temp_path(root / "shard-000000.tar"))     # any file or folder the run makes
        write(staging.meta_file("index.sqlite"))                  # the new .nv-meta, built beside the old
        staging.commit()

`temp_path(final)` is the one rule for staged names (`NAME.shardprep-TOKEN.tmp`, beside the final path),
and the staging remembers every name it gave. `commit` renames them into place in the order they were
given and swaps the new `.nv-meta` in last (atomically where the kernel offers RENAME_EXCHANGE), so a
dataset never looks complete before it is. Commit is all-or-nothing too: an old file in the way is first
moved aside (`NAME.shardprep-TOKEN.old`) and removed only once the `.nv-meta` swap is done; if a rename
fails (a folder or an immutable file in the way, a read-only filesystem), every rename done so far is
undone in reverse and `CommitError` says which path failed. Leaving the `with` block without `commit` (an
error, Ctrl-C, SIGTERM turned into KeyboardInterrupt), also midway through one, undoes what the commit
moved, removes every staged file and every folder the run created, and leaves what was there before
exactly as it was.

`commit_together` commits several stagings as one (a write's datasets and the files beside them): if
one fails or is cut short, the renames of all are undone, last first, and old versions are removed only
once every one is done. `retire` names an old file or folder that nothing new replaces (what a write
with --overwrite clears): the commit moves it aside first, and so puts it back on a failure too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import re
import shutil
import stat
import uuid
from collections.abc import Sequence
from pathlib import Path

from prep.errors import PrepError
from prep.index.format import INDEX_SQLITE, META_DIR, tar_index_name

#: Files a prepare always rebuilds; the rest of an existing `.nv-meta` (dataset.yaml, sample_loader.py,
#: the user's own files and folders) is carried over unless the run writes a new version.
_REBUILT = frozenset({INDEX_SQLITE})
#: What `Staging._staged_name` makes, and nothing a user would name a file.
_STAGED_NAME = re.compile(r".+\.shardprep-[0-9a-f]{12}\.(tmp|old)")
#: The longest file name (bytes) of Linux's filesystems: a staged name of a long final name is cut to fit.
NAME_MAX = 255
_RENAME_EXCHANGE = 2
#: What a commit's rename did: put a staged file in place, moved an old version aside, swapped two.
_PLACED, _ASIDE, _SWAPPED = "placed", "aside", "swapped"
_AT_FDCWD = -100


def fitted_name(name: str, room: int = NAME_MAX) -> str:
    """`name`, or where it has more than `room` bytes, its start, `~` and a digest of the whole, `room` bytes
    in all: the one way a name too long for a file is cut to fit.

    >>> fitted_name("a.tar.idx"), len(os.fsencode(fitted_name("é" * 130))), fitted_name("é" * 130)[-13:]
    ('a.tar.idx', 255, '~07f0a36cf979')
    """
    encoded = os.fsencode(name)
    if len(encoded) <= room:
        return name
    digest = "~" + hashlib.sha1(encoded).hexdigest()[:12]
    return os.fsdecode(encoded[: room - len(digest)] + digest.encode())


def local_path(name: str) -> str:
    """Where a file of the dataset named `name` (a relative path) is built or read in a local folder: the
    same path, each part longer than a file name may be cut by `fitted_name`. A bucket's keys have parts of
    any length, and a prepare of a bucket dataset builds its index locally first.

    >>> local_path("a/b.tar.idx") == "a/b.tar.idx", local_path("x" * 300 + "/b.tar.idx")[240:]
    (True, 'xx~02fd68253071/b.tar.idx')
    """
    return "/".join(fitted_name(part) for part in name.split("/"))


class CommitError(PrepError):
    """A commit that could not put `path` in place (`reason`: the OS's word). Its renames were undone,
    but for those listed in `stuck` ("what is where", one a line), when undoing them failed too.

    >>> print(CommitError(Path("d"), Path("d/a.tar.idx"), "Is a directory", []))
    Could not put d/a.tar.idx in place: Is a directory. Every file moved before it was put back: d is as it was before the run.
    >>> print(CommitError(Path("d"), Path("d/old"), "Operation not permitted", [], retiring=True))
    Could not move d/old aside: Operation not permitted. Every file moved before it was put back: d is as it was before the run.
    >>> print(CommitError(Path("d"), Path("d/b"), "Is a directory", ["d/a holds this run's new version (...)"]))
    Could not put d/b in place: Is a directory. Undoing the files moved before it failed too, so d is half-replaced:
      - d/a holds this run's new version (...)
    Old versions are kept under names ending in .old: move them back by hand before running again, which removes them.
    """

    def __init__(self, root: Path, path: Path, reason: str, stuck: list[str], retiring: bool = False) -> None:
        self.root = root
        self.path = path
        self.reason = reason
        self.stuck = stuck
        self.retiring = retiring
        step = f"move {path} aside" if retiring else f"put {path} in place"
        text = f"Could not {step}: {reason}."
        if stuck:
            text += f" Undoing the files moved before it failed too, so {root} is half-replaced:"
            text += "".join(f"\n  - {line}" for line in stuck)
            text += (
                "\nOld versions are kept under names ending in .old: move them back by hand before running"
                " again, which removes them."
            )
        else:
            text += f" Every file moved before it was put back: {root} is as it was before the run."
        super().__init__(text)

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.root, self.path, self.reason, self.stuck, self.retiring))


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0


class Staging:
    """One run's staged outputs under dataset `root` (made if missing); a context manager that discards
    them unless committed.

    `meta=True` stages a new `.nv-meta` folder (made with `meta_mode` if given), holding copies of the old
    one's files when `carry_over` (a prepare keeps the user's dataset.yaml; a write replaces everything).
    """

    def __init__(
        self, root: Path, *, meta: bool = True, meta_mode: int | None = None, carry_over: bool = True
    ) -> None:
        self.root = root
        self.token = uuid.uuid4().hex[:12]
        self.meta = root / META_DIR
        self._moves: list[tuple[Path, Path]] = []
        #: The renames (source, destination, what it did) a commit has done, undone in reverse if it fails.
        self._renamed: list[tuple[Path, Path, str]] = []
        #: Old paths the commit moves aside first (`retire`), and whether undoing a rename ever failed.
        self._retiring: list[Path] = []
        self._undo_failed = False
        self._created: list[Path] = []
        self._committed = False
        self._make_folder(root)
        self.staged_meta: Path | None = None
        if meta:
            self.staged_meta = self._staged_name(self.meta)
            self.staged_meta.mkdir()
            if meta_mode is not None:
                os.chmod(self.staged_meta, meta_mode)
            if carry_over and self.meta.is_dir():
                for entry in self.meta.iterdir():
                    if entry.name in _REBUILT:
                        continue
                    target = self.staged_meta / entry.name
                    if entry.is_dir() and not entry.is_symlink():  # the user's own sub-folders too
                        shutil.copytree(entry, target, symlinks=True)
                    elif entry.is_symlink() or entry.is_file():  # a symbolic link stays a link
                        shutil.copy2(entry, target, follow_symlinks=False)

    def _staged_name(self, final: Path, tag: str = "tmp") -> Path:
        """`final`'s staged name: `NAME.shardprep-TOKEN.tmp`, with NAME cut to fit (`fitted_name`: a
        shard's name can take all of NAME_MAX).

        >>> staging = Staging.__new__(Staging); staging.token = "0" * 12
        >>> staging._staged_name(Path("a.tar.idx")).name
        'a.tar.idx.shardprep-000000000000.tmp'
        >>> long = staging._staged_name(Path("x" * 240 + ".tar.idx")).name
        >>> len(long), long[:3], long[-40:]
        (255, 'xxx', '~a336c432bc6a.shardprep-000000000000.tmp')
        """
        suffix = f".shardprep-{self.token}.{tag}"
        return final.with_name(fitted_name(final.name, NAME_MAX - len(suffix)) + suffix)

    def temp_path(self, final: Path) -> Path:
        """Where to write `final` (a file or a folder) during the run; it is moved there at commit.

        Folders on the way to `final` are made now, and removed again on abort if they are left empty.
        """
        self._make_folder(final.parent)
        staged = self._staged_name(final)
        self._moves.append((staged, final))
        return staged

    def _make_folder(self, folder: Path) -> None:
        """Make `folder` and its missing parents, remembering which were made (abort removes them)."""
        missing = [folder, *folder.parents]
        missing = missing[: next((i for i, path in enumerate(missing) if path.exists()), len(missing))]
        folder.mkdir(parents=True, exist_ok=True)
        self._created += reversed(missing)

    def tar_index_file(self, shard: str, *, fitted: bool = False) -> Path:
        """Where to write a shard's `.tar.idx` during the run: beside the shard, or with `fitted` (an index
        built for a bucket) at its `local_path`."""
        name = tar_index_name(shard)
        return self.temp_path(self.root / (local_path(name) if fitted else name))

    def meta_file(self, name: str) -> Path:
        """Where to write `.nv-meta/NAME` during the run."""
        if self.staged_meta is None:
            raise ValueError("this staging builds no .nv-meta")
        return self.staged_meta / name

    def staged_paths(self) -> set[Path]:
        """Every path this run writes under a temporary name (what a cleanup of the old contents keeps)."""
        staged = {path for path, _ in self._moves}
        if self.staged_meta is not None:
            staged.add(self.staged_meta)
        return staged

    @property
    def committed(self) -> bool:
        return self._committed

    def retire(self, path: Path) -> None:
        """Have the commit move `path` (an old file or folder that nothing new replaces) aside before it puts
        anything in place: put back if the commit fails, removed once it is done."""
        self._retiring.append(path)

    def commit(self) -> None:
        """Move every staged file into place in the order they were named; the `.nv-meta` swap is last.
        All or nothing: a CommitError, naming the path that failed, once every rename done is undone."""
        commit_together([self])

    def _place(self) -> None:
        """The commit's renames: retired paths aside, staged files in place, the `.nv-meta` swap. A
        CommitError naming the path that failed; the renames done stay journalled, for `_undo`."""
        final, retiring = self.root, True
        try:
            for final in self._retiring:
                self._rename(final, self._staged_name(final, "old"), _ASIDE)
            retiring = False
            for staged, final in self._moves:
                self._put_in_place(staged, final)
            final = self.meta
            self._swap_meta()
        except OSError as error:
            raise CommitError(self.root, final, error.strerror or str(error), [], retiring) from None

    def _finish(self) -> None:
        """The commit is done: forget the journal and remove the old versions it moved aside."""
        self._committed = True
        self._moves.clear()
        self._retiring.clear()
        for source, destination, done in self._renamed:
            try:  # the dataset is complete: an old version left here goes with the next run's leftovers
                if done == _ASIDE:
                    _remove(destination)
                elif done == _SWAPPED:
                    _remove(source)  # which holds the old index now
            except OSError:
                pass
        self._renamed.clear()

    def _rename(self, source: Path, destination: Path, done: str = _PLACED) -> None:
        """Rename `source` to `destination` (replacing a file there), remembered to be undone."""
        os.replace(source, destination)
        self._renamed.append((source, destination, done))

    def _put_in_place(self, staged: Path, final: Path) -> None:
        """Move `staged` to `final`, moving what is at `final` aside first. A folder at `final` stays, to
        fail the move as os.replace fails it, unless it is empty and `staged` is a folder too."""
        try:
            mode = os.lstat(final).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and (
            not stat.S_ISDIR(mode)
            or (staged.is_dir() and not staged.is_symlink() and not any(final.iterdir()))
        ):
            self._rename(final, self._staged_name(final, "old"), _ASIDE)
        self._rename(staged, final)

    def _swap_meta(self) -> None:
        """Put the staged `.nv-meta` in place of the old one: in one step where the kernel can swap them."""
        if self.staged_meta is None:
            return
        if not self.meta.exists():
            self._rename(self.staged_meta, self.meta)
        elif _rename_exchange(self.staged_meta, self.meta):
            self._renamed.append((self.staged_meta, self.meta, _SWAPPED))
        else:
            self._rename(self.meta, self._staged_name(self.meta, "old"), _ASIDE)
            self._rename(self.staged_meta, self.meta)

    def _undo(self, stuck: dict[Path, list[str]]) -> None:
        """Undo the commit's renames, last first; add to `stuck` what is where for each path that could not
        be put back (a new version that could not go back is dropped if its old one then takes its place)."""
        for source, destination, done in reversed(self._renamed):
            try:
                if done == _SWAPPED:
                    if not _rename_exchange(source, destination):
                        self._undo_failed = True
                        stuck[destination] = [f"{destination} holds the new index, {source} the old one"]
                    continue
                os.replace(destination, source)
            except OSError as error:
                self._undo_failed = True
                if done == _ASIDE:
                    line = f"the old version of {source} is at {destination}"
                    stuck.setdefault(source, []).append(f"{line} ({error.strerror or error})")
                else:
                    line = f"{destination} holds this run's new version"
                    stuck.setdefault(destination, []).append(f"{line} ({error.strerror or error})")
                continue
            if done == _ASIDE:
                stuck.pop(source, None)  # the old version is back, over a new one that was stuck there
        self._renamed.clear()

    def abort(self) -> None:
        """Undo what a commit cut short moved, remove everything this run staged and the folders it made;
        the dataset stays as it was."""
        self._undo({})  # an error here must not hide the one that ended the run
        for staged, _ in self._moves:
            try:
                _remove(staged)
            except OSError:
                pass
        self._moves.clear()
        if self.staged_meta is not None and not self._undo_failed:  # else it may hold the old index
            shutil.rmtree(self.staged_meta, ignore_errors=True)
        for folder in reversed(self._created):
            try:
                folder.rmdir()  # only if nothing else was put there meanwhile
            except OSError:
                pass
        self._created.clear()

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._committed:
            self.abort()


def commit_together(stagings: Sequence[Staging]) -> None:
    """Commit `stagings` as one, in order, all or nothing: when one fails (a CommitError naming the path,
    the folder the stagings share said to be as it was), or the commit is cut short (Ctrl-C, SIGTERM),
    the renames of every one are undone, last first, as one staging undoes its own. Old versions are
    removed only once all are in place."""
    try:
        for staging in stagings:
            staging._place()
    except BaseException as error:
        stuck: dict[Path, list[str]] = {}
        for staging in reversed(stagings):
            staging._undo(stuck)
        if not isinstance(error, CommitError):
            raise
        root = Path(os.path.commonpath([staging.root for staging in stagings]))
        lines = [line for lines in stuck.values() for line in lines]
        raise CommitError(root, error.path, error.reason, lines, error.retiring) from None
    for staging in stagings:
        staging._finish()


def _remove(path: Path) -> None:
    """Remove a file, a link or a folder with all it holds; already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_leftovers(root: Path) -> int:
    """Remove what runs killed before they could clean up (SIGKILL, a power cut) staged under `root`, and
    return how many files and folders went. Only safe while holding the dataset's lock
    (`prep.index.lock`): then no other run is staging there."""
    if not root.is_dir():
        return 0
    removed = 0
    for folder, dirs, files in os.walk(root):
        for name in [name for name in dirs if _STAGED_NAME.fullmatch(name)]:
            dirs.remove(name)
            path = os.path.join(folder, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
            removed += 1
        for name in files:
            if _STAGED_NAME.fullmatch(name):
                os.unlink(os.path.join(folder, name))
                removed += 1
    return removed
