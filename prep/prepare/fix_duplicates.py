"""`prepare --fix-duplicates`: make sample keys unique across shards by renaming members in place, journaled.

energon 7.4.1 needs every sample key to be unique in the dataset. Its `--fix-duplicates` puts each
shard's path and a slash in front of every member name of every shard (`a/0001.jpg` in `x/shard-3.tar`
becomes `x/shard-3.tar/a/0001.jpg`), rewriting the tar headers in place (`prep.tar.patch`), and only
when some key is in more than one shard. This module does the same to the byte, so the index made after
it equals energon's, and makes it safe to interrupt:

1. finish a fix an earlier run left unfinished (`finish_interrupted_fix`), if `DATASET/.shardprep-fix`
   is there;
2. survey every shard in a worker (`survey_shard`): its keys by energon's patcher rule (`patcher_keys`),
   and the first obstacle to renaming it in place;
3. decide: no key in two shards, nothing is touched; otherwise every shard must be renameable, writable
   and reachable by one path only, or nothing is touched and every obstacle is reported;
4. write the plan (`.shardprep-fix/plan.json`: the shards and their sizes), synced, before any shard;
5. rename each shard in a worker (`rename_shard`): the original header blocks of the members it renames
   go to `.shardprep-fix/<shard>.journal` (offset and 512 bytes each, behind a header naming the shard,
   its size (its mtime too, for a person reading it: the rename itself changes it) and the checksum
   of the journal), synced, with every folder up to `.shardprep-fix`; then the new blocks are written and the
   shard synced; then `<shard>.done` is made and the journal removed;
6. the folder removed: the fix is finished.

An interrupted fix is completed, never rolled back: a shard journaled whole gets every journaled block
renamed (each block must still be its original or its renamed form, else nothing is written and the
shard is named), a torn journal means its shard was not touched yet, and the plan's shards not done yet
are renamed as in step 5. So the next `--fix-duplicates` run ends with every shard renamed once, as an
uninterrupted run would, and then goes on as usual. A prepare without `--fix-duplicates` refuses to index
while the folder is there (`refuse_unfinished_fix`). All of it runs under the dataset's lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prep.errors import PrepError, ShardError, errors_report
from prep.processes import in_child, ordered_map, worker_count
from prep.tar.fields import BLOCK

if TYPE_CHECKING:  # numpy and the tar walk: imported where they run, in the workers
    import numpy as np

FIX_FOLDER = ".shardprep-fix"
PLAN = "plan.json"
JOURNAL_SUFFIX = ".journal"
DONE_SUFFIX = ".done"
_JOURNAL_MAGIC = b"shardprep-fix-journal 1\n"
_OFFSET_BYTES = 8
_DIGEST_BYTES = 16
#: `say(line)`: one line of what the stage does, for the user.
Say = Callable[[str], None]


def shard_prefix(shard: str) -> bytes:
    """What goes in front of every member name of `shard` (its path in the dataset, then a slash).

    >>> shard_prefix("parts/shard-003.tar")
    b'parts/shard-003.tar/'
    """
    return f"{shard}/".encode()


def patcher_keys(paths: np.ndarray) -> np.ndarray:
    """The sample key energon's patcher sees in each member name of `paths` (a bytes array; b"" for
    none): the name up to the first dot after its last slash.

    It decides whether a dataset has duplicates, so it is energon's `TarPatcher` rule, not the index's
    (`prep.index.group.key_and_part`): it also counts `__meta__` members, folders and links, and a name
    without a slash is searched from its second byte.

    >>> import numpy as np
    >>> patcher_keys(np.array([b"a.b/0001.seg.json", b"README", b".x.txt", b"/y.z"])).tolist()
    [b'a.b/0001', b'', b'.x', b'/y']
    """
    import numpy as np

    width = paths.dtype.itemsize
    chars = np.ascontiguousarray(paths).view(np.uint8).reshape(len(paths), width)
    column = np.arange(width)
    start = np.maximum(np.where(chars == ord("/"), column, -1).max(axis=1, initial=-1), 0) + 1
    dots = (chars == ord(".")) & (column >= start[:, None])
    dot = np.where(dots.any(axis=1), dots.argmax(axis=1), 0)
    keys = np.where(column < dot[:, None], chars, 0)
    return np.ascontiguousarray(keys).view(f"S{width}").ravel()


def _with_given_names(paths: np.ndarray, given: dict[int, bytes]) -> np.ndarray:
    """`paths` with the names a GNU long name or PAX record gives some members. Such a name stops the
    rename (an obstacle), but it is the name the index sees: duplicates are judged by it, so that the user
    hears why they cannot be fixed."""
    if not given:
        return paths
    paths = paths.astype(f"S{max(paths.dtype.itemsize, *(len(name) for name in given.values()))}")
    for row, name in given.items():
        paths[row] = name
    return paths


def _key_runs(paths: np.ndarray) -> np.ndarray:
    """The keys of consecutive members, each run of one key once (members without a key skipped)."""
    import numpy as np

    keys = patcher_keys(paths)
    keys = keys[keys != b""]
    if not len(keys):
        return keys
    return keys[np.r_[True, keys[1:] != keys[:-1]]]


@dataclass(frozen=True, slots=True)
class ShardSurvey:
    """What renaming one shard in place would meet: its keys (as sorted 16-byte digests of the distinct
    ones), and the first obstacle, if any."""

    shard: str
    digests: bytes
    obstacle: ShardError | None


@dataclass(frozen=True, slots=True)
class ShardRenamed:
    """One shard renamed: how many sample keys changed and how many headers were rewritten."""

    shard: str
    keys: int
    headers: int


@dataclass(frozen=True, slots=True)
class FixSummary:
    """What a `--fix-duplicates` stage did: keys found in more than one shard, and the shards renamed."""

    duplicate_keys: int
    renamed: tuple[ShardRenamed, ...]


def refuse_unfinished_fix(root: Path) -> None:
    """A PrepError if an interrupted `--fix-duplicates` left its journal folder in `root`: its shards are
    partly renamed, and an index of them would be neither the old names nor the new ones. What a finished
    fix left (no plan: it was stopped while removing the folder) is removed instead."""
    if (root / FIX_FOLDER).exists() and not (root / FIX_FOLDER / PLAN).exists():
        _finish(root)
    if (root / FIX_FOLDER).exists():
        raise PrepError(
            f"{root} holds an unfinished --fix-duplicates ({root / FIX_FOLDER}): a run that renamed its"
            " shards' members in place was interrupted, so some shards are renamed and some are not."
            f" Run `shardprep prepare {root} --fix-duplicates` to finish it (it completes the renaming from"
            " the journal, then prepares as usual)."
        )


def fix_duplicates(root: Path, shards: list[str], num_workers: int | None, say: Say) -> FixSummary:
    """Make every sample key of the dataset at `root` unique, as `energon prepare --fix-duplicates` does.

    An unfinished earlier fix is finished first. Then nothing is touched unless a key is in two shards;
    if one is, every shard's members are renamed (`shard_prefix`), or none are and a PrepError names each
    shard that stops it.
    """
    if (root / FIX_FOLDER).exists():
        finish_interrupted_fix(root, num_workers, say)
    workers = worker_count(num_workers, len(shards))
    tasks = [(str(root), shard) for shard in shards]
    surveys = list(ordered_map(survey_shard, tasks, workers, what="surveying shards for duplicate keys"))
    unreadable = [survey for survey in surveys if isinstance(survey, ShardError)]
    if unreadable:  # its keys are unknown, so whether there are duplicates is too
        raise errors_report(
            unreadable, "shards cannot be read to look for duplicate keys, so none was changed:"
        )
    found = [survey for survey in surveys if isinstance(survey, ShardSurvey)]
    duplicates, example = _duplicates(root, found)
    if not duplicates:
        say("No duplicate keys found, continuing.")
        return FixSummary(0, ())
    say(
        f"The dataset contains duplicate keys: {_count(duplicates, 'key')} in more than one shard, {example}."
    )
    obstacles: list[PrepError] = [s.obstacle for s in found if s.obstacle is not None]
    obstacles += _not_renameable(root, shards)
    if obstacles:
        raise errors_report(
            obstacles, "shards cannot be renamed in place, so none was changed (fix these first):"
        )
    say("Fixing the dataset now.")
    _write_plan(root, shards)
    keys = {survey.shard: len(survey.digests) // _DIGEST_BYTES for survey in found}
    renamed = _rename_planned(root, shards, workers, say, keys)
    _finish(root)
    total = sum(shard.keys for shard in renamed)
    say(
        f"Duplicate keys fixed successfully: {_count(total, 'key')} renamed in {_count(len(renamed), 'shard')}."
    )
    return FixSummary(duplicates, tuple(renamed))


def finish_interrupted_fix(root: Path, num_workers: int | None, say: Say) -> list[ShardRenamed]:
    """Complete the fix an interrupted run left in `root/.shardprep-fix` (see the module's docstring)."""
    folder = root / FIX_FOLDER
    if not (folder / PLAN).is_file():
        _finish(root)  # the plan goes first when a fix ends: what is left is from a finished fix
        return []
    try:
        plan = json.loads((folder / PLAN).read_text())
        planned = {entry["shard"]: entry["size"] for entry in plan["shards"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PrepError(
            f"The plan of an interrupted --fix-duplicates, {folder / PLAN}, cannot be read ({error}). Check"
            f" the shards by hand (`shardprep verify {root}`), then remove {folder}."
        ) from None
    left = [shard for shard in planned if not _marker(root, shard, DONE_SUFFIX).exists()]
    say(
        f"Finishing the --fix-duplicates an earlier run left unfinished: {len(left)} of {len(planned)}"
        " shards still to rename."
    )
    for shard in left:
        size = _size(root, shard)
        if size != planned[shard]:
            raise PrepError(
                f"{root / shard} was {planned[shard]} bytes when an interrupted --fix-duplicates planned to"
                f" rename it and is {'missing' if size is None else f'{size} bytes'} now: it was changed"
                " since, and is left alone. Restore it, or"
                f" remove {folder} if you replaced the shards yourself."
            )
        journal = _marker(root, shard, JOURNAL_SUFFIX)
        recorded = read_journal(journal) if journal.exists() else None
        if recorded is not None:  # checked here, before any shard is written
            _check_journaled(root, shard, recorded)
    renamed = _rename_planned(root, left, worker_count(num_workers, len(left)), say)
    _finish(root)
    return renamed


def survey_shard(root: str, shard: str) -> ShardSurvey | ShardError:
    """Worker task: one shard's keys and what stops renaming it. Errors come back as values, so that the
    main process can report every shard at once."""
    import numpy as np

    from prep.tar.patch import header_paths, prefixed_blocks, renameable_headers
    from prep.tar.scan import check_not_compressed, open_shard

    try:
        buf = open_shard(os.path.join(root, shard), shard)
        check_not_compressed(shard, bytes(buf[:BLOCK]))
        headers = renameable_headers(shard, buf)
    except ShardError as error:
        return error
    paths = header_paths(headers.blocks)
    obstacle = headers.obstacle
    if obstacle is None:
        prefix = shard_prefix(shard)
        _, fits = prefixed_blocks(headers.blocks, prefix)
        if not fits.all():
            row = int(fits.argmin())
            path = paths[row]
            obstacle = ShardError(
                shard,
                f"the member {path.decode(errors='replace')!r} renamed to"
                f" {(prefix + path).decode(errors='replace')!r} ({len(prefix) + len(path)} bytes) fits no"
                " header name field (100 bytes, or 155 and 100 split at a slash in a ustar header).",
                offset=int(headers.offsets[row]),
                advice="Move or rename the shard to a shorter path, or re-pack it with shorter member names.",
            )
    paths = _with_given_names(paths, headers.given_names)
    keys = _key_runs(paths)
    distinct = np.unique(keys)
    if obstacle is None and len(distinct) != len(keys):
        again = _first_repeated(keys.tolist())
        obstacle = ShardError(
            shard,
            f"the key {again.decode(errors='replace')!r} is there twice, apart: renaming keeps keys"
            " unique across shards, not inside one (energon's --fix-duplicates refuses it too).",
            advice="Re-pack the shard with each sample's members together.",
        )
    digests = sorted(_digest(key) for key in distinct.tolist())
    return ShardSurvey(shard, b"".join(digests), obstacle)


def rename_shard(root: str, shard: str, keys: int | None = None) -> ShardRenamed:
    """Worker task: rename one shard's members in place, journaled (step 5 of the module's docstring).
    `keys` is how many keys it holds, if known (they are counted otherwise)."""
    from prep.tar.patch import prefixed_blocks, renameable_headers
    from prep.tar.scan import open_shard

    path = os.path.join(root, shard)
    journal = _marker(Path(root), shard, JOURNAL_SUFFIX)
    if journal.exists():
        recorded = read_journal(journal)
        if recorded is not None:
            return _complete_from_journal(Path(root), shard, recorded, keys)
        journal.unlink()  # torn while it was written: the shard was not touched yet
    headers = renameable_headers(shard, open_shard(path, shard))
    if headers.obstacle is not None:
        raise headers.obstacle
    renamed, fits = prefixed_blocks(headers.blocks, shard_prefix(shard))
    if not fits.all():  # the survey refused such shards
        raise ShardError(
            shard, "a member's new name fits no header field.", offset=int(headers.offsets[fits.argmin()])
        )
    write_journal(journal, Path(path), shard, headers.offsets, headers.blocks)
    return _apply(Path(root), shard, Journal(shard, 0, headers.offsets, headers.blocks), renamed, keys)


@dataclass(frozen=True)
class Journal:
    """A shard's journal: the shard, its size then, and the original header blocks (rows) at their offsets."""

    shard: str
    size: int
    offsets: np.ndarray
    blocks: np.ndarray


def write_journal(journal: Path, path: Path, shard: str, offsets: np.ndarray, blocks: np.ndarray) -> None:
    """Write the original `blocks` at `offsets` of `shard` to `journal`, and sync it (and its folder)."""
    import numpy as np

    body = np.empty((len(offsets), _OFFSET_BYTES + BLOCK), dtype=np.uint8)
    body[:, :_OFFSET_BYTES] = offsets.astype("<u8").view(np.uint8).reshape(-1, _OFFSET_BYTES)
    body[:, _OFFSET_BYTES:] = blocks
    data = body.tobytes()
    info = path.stat()
    head = {
        "shard": shard,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "prefix": shard_prefix(shard).decode(),
        "blocks": len(offsets),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    journal.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(_JOURNAL_MAGIC + json.dumps(head).encode() + b"\n" + data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    # Every folder from the journal's up to the fix's own (one per folder in the shard's path): a folder
    # made here for a nested shard must survive a power cut as surely as the journal in it, or the next
    # run would find no journal and rename the shard's renamed headers again.
    for level in range(shard.count("/") + 1):
        _sync_folder(journal.parents[level])


def read_journal(journal: Path) -> Journal | None:
    """The journal at `journal`, or None if it is torn (cut short or not matching its checksum): then the
    run that wrote it was stopped before it touched the shard."""
    import numpy as np

    data = journal.read_bytes()
    if not data.startswith(_JOURNAL_MAGIC):
        return None
    line_end = data.find(b"\n", len(_JOURNAL_MAGIC))
    try:
        head = json.loads(data[len(_JOURNAL_MAGIC) : line_end])
        body = data[line_end + 1 :]
        if line_end < 0 or hashlib.sha256(body).hexdigest() != head["sha256"]:
            return None
        if len(body) != head["blocks"] * (_OFFSET_BYTES + BLOCK):
            return None
    except (ValueError, KeyError, TypeError):
        return None
    rows = np.frombuffer(body, dtype=np.uint8).reshape(-1, _OFFSET_BYTES + BLOCK)
    offsets = rows[:, :_OFFSET_BYTES].copy().view("<u8").ravel().astype(np.int64)
    return Journal(head["shard"], head["size"], offsets, rows[:, _OFFSET_BYTES:])


def _complete_from_journal(root: Path, shard: str, journal: Journal, keys: int | None) -> ShardRenamed:
    """Rename the blocks an interrupted run journaled: each must be its original or its renamed form."""
    return _apply(root, shard, journal, _check_journaled(root, shard, journal), keys)


def _check_journaled(root: Path, shard: str, journal: Journal) -> np.ndarray:
    """The renamed form of each journaled block, once the shard is checked to hold, at each journaled
    offset, the original or the renamed form (else a PrepError: the shard was changed since)."""
    import numpy as np

    from prep.tar.patch import prefixed_blocks

    path = root / shard
    if journal.shard != shard or _size(root, shard) != journal.size:
        raise PrepError(
            f"{path} does not match the journal of an interrupted --fix-duplicates"
            f" ({_marker(root, shard, JOURNAL_SUFFIX)}): it was replaced or changed since, and is left alone."
            f" Restore it, or remove {root / FIX_FOLDER} if you replaced the shards yourself."
        )
    renamed, _ = prefixed_blocks(journal.blocks, shard_prefix(shard))
    with open(path, "rb") as file:
        now = np.frombuffer(
            b"".join(os.pread(file.fileno(), BLOCK, at) for at in journal.offsets.tolist()), dtype=np.uint8
        )
    now = now.reshape(-1, BLOCK)
    # Byte by byte: a run killed inside one block's write leaves it part renamed, part original.
    either = ((now == journal.blocks) | (now == renamed)).all(axis=1)
    if not either.all():
        raise ShardError(
            shard,
            "the header there is neither its original nor its renamed form: the shard was changed"
            " after an interrupted --fix-duplicates began, and is left alone.",
            offset=int(journal.offsets[either.argmin()]),
            advice=f"Restore the shard, or remove {root / FIX_FOLDER} if you replaced it yourself.",
        )
    return renamed


def _apply(root: Path, shard: str, journal: Journal, renamed: np.ndarray, keys: int | None) -> ShardRenamed:
    """Write the renamed blocks, sync the shard, mark it done and remove its journal."""
    from prep.tar import patch  # the module, not its function: a test stops a run inside write_blocks
    from prep.tar.patch import header_paths

    fd = os.open(root / shard, os.O_RDWR | os.O_CLOEXEC)
    try:
        patch.write_blocks(fd, journal.offsets, renamed)
        os.fsync(fd)
    finally:
        os.close(fd)
    done = _marker(root, shard, DONE_SUFFIX)
    done.touch()
    _sync_folder(done.parent)
    _marker(root, shard, JOURNAL_SUFFIX).unlink()
    if keys is None:
        keys = len(set(_key_runs(header_paths(journal.blocks)).tolist()))
    return ShardRenamed(shard, keys, len(journal.offsets))


def _rename_planned(
    root: Path, shards: list[str], workers: int, say: Say, keys: dict[str, int] | None = None
) -> list[ShardRenamed]:
    """Rename `shards` in the workers, one line said per shard; an error says the fix is half done and
    how to finish it (the journal and the plan stay for that)."""
    renamed: list[ShardRenamed] = []
    tasks = [(str(root), shard, keys.get(shard) if keys else None) for shard in shards]
    try:
        for shard in ordered_map(rename_shard, tasks, workers, what="renaming members"):
            renamed.append(shard)
            say(
                f"[{len(renamed)}/{len(tasks)}] {shard.shard}: {_count(shard.keys, 'key')} now start with"
                f" {shard_prefix(shard.shard).decode()!r} ({_count(shard.headers, 'header')} rewritten)"
            )
    except (OSError, PrepError) as error:
        cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
        raise PrepError(
            f"--fix-duplicates stopped after renaming {len(renamed)} of {_count(len(tasks), 'shard')}:"
            f" {cause}{where}. Every shard is either renamed or journaled in {root / FIX_FOLDER}; once"
            f" the cause is fixed, run `shardprep prepare {root} --fix-duplicates` to finish the renaming"
            " (a prepare without it refuses until then)."
        ) from None
    return renamed


def _duplicates(root: Path, surveys: list[ShardSurvey]) -> tuple[int, str]:
    """How many keys are in more than one shard, and an example naming the key and its shards.

    The digests are counted in a short-lived child (numpy sorts them), so this process does not carry
    numpy into the workers it forks later."""
    if len(surveys) < 2:
        return 0, ""
    joined = b"".join(s.digests for s in surveys)
    repeated, first = in_child(repeated_digests, joined, what="finding duplicate keys")
    if not repeated:
        return 0, ""
    holders = [s.shard for s in surveys if _holds(s.digests, first)]
    key = in_child(_key_with_digest, root, holders[0], first, what="naming a duplicate key")
    more = " and more" if len(holders) > 3 else ""
    return repeated, f"e.g. {key!r} in {' and '.join(holders[:3])}{more}"


def repeated_digests(joined: bytes) -> tuple[int, bytes]:
    """How many distinct digests occur more than once in `joined` (16-byte records), and the first one."""
    import numpy as np

    values, counts = np.unique(np.frombuffer(joined, dtype=f"S{_DIGEST_BYTES}"), return_counts=True)
    repeated = values[counts > 1]
    return len(repeated), repeated[:1].tobytes()  # raw bytes: an element would drop trailing NULs


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=_DIGEST_BYTES).digest()


def _holds(digests: bytes, digest: bytes) -> bool:
    """Whether `digests` (16-byte records) holds `digest` as one of its records."""
    at = digests.find(digest)
    while at >= 0 and at % _DIGEST_BYTES:
        at = digests.find(digest, at + 1)
    return at >= 0


def _key_with_digest(root: Path, shard: str, digest: bytes) -> str:
    """The key of `shard` whose digest is `digest` (for the message; the shard is walked again)."""
    from prep.tar.patch import header_paths, renameable_headers
    from prep.tar.scan import open_shard

    headers = renameable_headers(shard, open_shard(str(root / shard), shard))
    paths = header_paths(headers.blocks)
    paths = _with_given_names(paths, headers.given_names)
    for key in _key_runs(paths).tolist():
        if _digest(key) == digest:
            return key.decode(errors="replace")
    return "?"


def _not_renameable(root: Path, shards: list[str]) -> list[PrepError]:
    """Shards this process cannot write, and shards reachable by two paths (each path would add its own
    prefix to the one file)."""
    problems: list[PrepError] = []
    seen: dict[tuple[int, int], str] = {}
    for shard in shards:
        try:
            fd = os.open(root / shard, os.O_RDWR | os.O_CLOEXEC)
        except OSError as error:
            problems.append(
                ShardError(
                    shard,
                    f"cannot be renamed in place: it cannot be opened for writing ({error.strerror}).",
                    advice="Make every shard writable for the user running prepare (e.g. `chmod u+w`), or"
                    " run without --fix-duplicates.",
                )
            )
            continue
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        other = seen.setdefault((info.st_dev, info.st_ino), shard)
        if other != shard:
            problems.append(
                ShardError(
                    shard,
                    f"is the same file as {other} (reached through a link): renaming would give it two prefixes.",
                    advice="Exclude one of the two paths with --exclude.",
                )
            )
    return problems


def _write_plan(root: Path, shards: list[str]) -> None:
    folder = root / FIX_FOLDER
    if folder.exists():  # what a finished fix could not remove: its `.done` markers must not count now
        shutil.rmtree(folder)
    folder.mkdir()
    plan = {"format": 1, "shards": [{"shard": shard, "size": _size(root, shard)} for shard in shards]}
    temp = folder / (PLAN + ".tmp")
    with open(temp, "w") as file:
        json.dump(plan, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, folder / PLAN)
    _sync_folder(folder)
    _sync_folder(root)


def _finish(root: Path) -> None:
    """Remove the fix's folder, the plan first: once it is gone the fix counts as finished."""
    folder = root / FIX_FOLDER
    try:
        (folder / PLAN).unlink()
        _sync_folder(folder)
    except FileNotFoundError:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def _marker(root: Path, shard: str, suffix: str) -> Path:
    return root / FIX_FOLDER / (shard + suffix)


def _size(root: Path, shard: str) -> int | None:
    try:
        return (root / shard).stat().st_size
    except OSError:
        return None


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"


def _first_repeated(keys: list[bytes]) -> bytes:
    seen: set[bytes] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return b""
