"""Check that a prepared dataset's index agrees with itself and with its tars.

The default check reads the index (`.info.json`, the split file, `dataset.yaml`, every `.tar.idx`,
both sqlite tables read whole as numpy columns by `IndexReader.columns`) and one 512-byte header per
indexed member, gathered with numpy from a memory map: every indexed offset must hold a valid header of the
named member with the indexed size, each shard must end where its index says (nothing appended,
nothing cut off), and no split may name a missing shard. Samples whose headers do not match in bulk
(long names in extra headers, or damage) are walked header by header. `--deep` also re-walks every
header of every shard, compares the result row by row with the index, and decodes
each member's content by its extension.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import shlex
import stat
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from prep.codecs import content_problem
from prep.errors import PrepError, ShardError
from prep.index.columns import TextColumn, segment_gather
from prep.index.dataset import PreparedDataset, SplitFilesRead
from prep.index.dataset_yaml import TEMPLATE_FIELD, field_map_parts
from prep.index.format import (
    AUX_NAME,
    AUX_PART,
    DATASET_YAML,
    INDEX_SQLITE,
    INDEX_UUID,
    META_DIR,
    SPLIT_YAML,
    tar_index_name,
)
from prep.index.group import key_and_part, shard_rows
from prep.index.meta import MAKE_READABLE as READABLE
from prep.index.meta import SPLIT_FILE_PARSERS, read_splits, split_file_name, unreadable_reason
from prep.index.metadataset import AuxReference, DatasetReference, metadataset_file, read_metadataset
from prep.index.sqlite import DamagedIndexError, IndexChangedError, NullRowsError, media_commands
from prep.index.yaml_reader import UnresolvedAliasError
from prep.inspect.aux_references import dataset_files, folder_files, loaded_references
from prep.tar.fields import BLOCK, NAME, PREFIX_START, REGULAR_TYPES, SIZE, TYPEFLAG
from prep.tar.header import checksums_match, octal_fields
from prep.tar.scan import HeaderWalker, check_not_compressed, first_nonzero, repack_command

REPREPARE = "re-run `shardprep prepare {root}` to rebuild the index"
#: The fix of an index that another program rewrote while verify read it.
VERIFY_AGAIN = "run verify again once what writes the index is done"


def reprepare(root: str | Path, *flags: str) -> str:
    """REPREPARE for the dataset at `root`, with `flags` after it, each quoted as a shell needs it."""
    return REPREPARE.format(root=" ".join(shlex.quote(str(word)) for word in (root, *flags)))


RESTORE = "restore the shard from its source (shardprep never modifies tars), then " + REPREPARE
#: Headers per shard and problem kind that are described one by one before "and N more".
MAX_EXAMPLES = 3
#: What a verify of a metadataset leaves unchecked of a dataset it names in object storage.
AUX_FILES_IN_STORAGE = (
    "the files the aux.json parts of samples in object storage name were not checked (that takes a GET per"
    " sample; verify a local copy to check them)"
)
REGULAR_TYPEFLAGS = np.array(sorted(REGULAR_TYPES), dtype=np.uint8)
#: The fix of a member that does not decode.
FIX_SOURCE = "fix the source data and re-write the shard"
#: ... in an auxiliary dataset, which energon reads by name: its split.yaml `exclude` drops nothing.
FIX_AUX_SOURCE = (
    f"{FIX_SOURCE} (energon reads an auxiliary dataset's members by name, so its split.yaml `exclude`"
    " does not drop them)"
)
#: Part names listed when a field map names none of them.
MAX_PART_NAMES = 12
#: Headers gathered and checked at a time (bounds the copies: 16 MB of headers).
CHUNK = 32768
#: The ustar name field's width: member names that fit are compared in bulk, longer ones walked exactly.
NAME_WIDTH = NAME.stop


@dataclass(frozen=True)
class Problem:
    """One disagreement: where it is, what is wrong, and what to do about it."""

    where: str
    what: str
    fix: str


@dataclass
class VerifyReport:
    root: str
    deep: bool
    #: The dataset's size as energon counts it (.info.json's shards and samples, index.sqlite's parts),
    #: whether or not each shard could be checked.
    shards: int = 0
    samples: int = 0
    parts: int = 0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    #: With `--load` (`prep.inspect.load`): the samples loaded through dataset.yaml.
    load: bool = False
    loaded: int = 0
    #: The dataset config in `.nv-meta` the dataset was checked (and loaded) with.
    dataset_config: str = DATASET_YAML
    #: What was left unchecked, and why, for the report's first line ("" when nothing was).
    unchecked: str = ""

    @property
    def healthy(self) -> bool:
        return not self.problems


def _blocks(buffer: np.ndarray) -> np.ndarray:
    """The shard as rows of 512-byte blocks (a view, no copy)."""
    return buffer[: len(buffer) // BLOCK * BLOCK].reshape(-1, BLOCK)


def _checksums_ok(headers: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each gathered header (a row of 512 bytes read at `offsets`), whether it is where a header can
    be (every tar header starts on a block boundary) and its checksum matches."""
    return (offsets % BLOCK == 0) & checksums_match(headers)


def _headers_ok(buffer: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each header offset, whether its stored checksum matches the header's bytes."""
    ok = np.empty(len(offsets), dtype=bool)
    for start in range(0, len(offsets), CHUNK):
        chunk = offsets[start : start + CHUNK]
        ok[start : start + CHUNK] = _checksums_ok(_blocks(buffer)[chunk // BLOCK], chunk)
    return ok


class _ShardChecker:
    """Checks one shard against its rows; appends to the report. What the shard as a whole is (another
    tar than the indexed one, or the indexed one with data after it) is said in `finish`, once its
    samples have been checked, before their problems."""

    def __init__(self, report: VerifyReport, root: str, shard: str) -> None:
        self.report, self.root, self.shard = report, root, shard
        self.counts: dict[str, int] = defaultdict(int)
        self.fixes: dict[str, str] = {}
        self.first = len(report.problems)
        #: Data past the indexed samples: (its byte, the byte where they end).
        self.unindexed: tuple[int, int] | None = None
        #: A sample found at an indexed sample's offset with another key, said as where and what.
        self.other_sample: str | None = None

    def problem(self, what: str, fix: str = REPREPARE, *, kind: str | None = None) -> None:
        if kind is not None:
            self.counts[kind] += 1
            self.fixes[kind] = fix
            if self.counts[kind] > MAX_EXAMPLES:
                return
        self.report.problems.append(Problem(self.shard, what, self._fix(fix)))

    def _fix(self, fix: str) -> str:
        """`fix` with the dataset's folder in place of `{root}` (REPREPARE's): only that, since a fix may
        name a shard or a key, which may hold braces (`y{1..2}.tar`)."""
        return fix.replace("{root}", shlex.quote(self.root))

    def finish(self) -> None:
        lead = self._whole_shard()
        if lead is not None:
            self.report.problems.insert(self.first, Problem(self.shard, lead[0], self._fix(lead[1])))
        for kind, count in self.counts.items():
            if count > MAX_EXAMPLES:
                self.report.problems.append(
                    Problem(
                        self.shard,
                        f"... and {count - MAX_EXAMPLES} more {kind}",
                        self._fix(self.fixes[kind]),
                    )
                )

    def _whole_shard(self) -> tuple[str, str] | None:
        """(what, fix) of the shard as a whole, if anything: another tar in its place, or data after
        its indexed samples."""
        if self.other_sample is not None:
            past = ""
            if self.unindexed is not None:
                past = f", and it holds data at byte {self.unindexed[0]:,}, past where its index ends"
            return (
                f"is not the tar its index describes ({self.other_sample}{past}): it was replaced by"
                " another tar of the same name, or rewritten, since prepare.",
                "if the new shard is the one to use, " + REPREPARE + "; otherwise " + RESTORE,
            )
        if self.unindexed is not None:
            return _unindexed_data(os.path.join(self.root, self.shard), *self.unindexed)
        return None


def _load_sqlite(dataset: PreparedDataset, deep: bool) -> tuple[dict, dict]:
    """Samples and parts from sqlite, grouped by tar_file_id, as numpy arrays (plus keys and part names).

    The samples' byte sizes are read only for the deep check, the one that compares them.
    """
    index = dataset.index
    columns = {"tar": "tar_file_id", "index": "sample_index", "offset": "byte_offset"}
    if deep:
        columns["size"] = "byte_size"
    samples = _group(*index.columns("samples", columns, "sample_key", null_is_error=True), "key")
    columns = {
        "tar": "tar_file_id",
        "index": "sample_index",
        "offset": "content_byte_offset",
        "size": "content_byte_size",
    }
    parts = _group(*index.columns("sample_parts", columns, "part_name", null_is_error=True), "name")
    return samples, parts


def _group(columns: dict[str, np.ndarray], text: TextColumn, text_name: str) -> dict[int, dict]:
    """Rows sorted by (tar, index, offset) and grouped by tar: {tar_file_id: {column: array, text_name: text}}."""
    order = [columns["tar"], columns["index"], columns["offset"]]
    if not len(order[0]):
        return {}
    in_order = np.ones(len(order[0]) - 1, dtype=bool)
    tied = np.ones(len(order[0]) - 1, dtype=bool)
    for column in order:  # lexicographic "each row <= the next", one column at a time
        step = np.diff(column)
        in_order &= ~tied | (step >= 0)
        tied &= step == 0
    if not in_order.all():  # rows stored out of order (neither shardprep nor energon does that): sort them
        permutation = np.lexsort(order[::-1])
        columns = {name: column[permutation] for name, column in columns.items()}
        text = text.take(permutation)
    tar = columns.pop("tar")
    bounds = np.flatnonzero(np.diff(tar)) + 1
    starts = np.concatenate([[0], bounds]).tolist()
    ends = np.concatenate([bounds, [len(tar)]]).tolist()
    grouped = {}
    for start, end in zip(starts, ends, strict=True):
        group = {name: column[start:end] for name, column in columns.items()}
        group[text_name] = text.take(slice(start, end))
        grouped[int(tar[start])] = group
    return grouped


def _check_tail(checker: _ShardChecker, fd: int, end: int, file_size: int) -> bool:
    """The bytes after the last sample: the end-of-archive marker and zero padding, nothing else; or
    nothing at all, for a shard that ends right after its last member (prepare indexes such a shard, as
    GNU tar, tarfile and energon read it, and warns).

    Returns False for a truncated shard, whose other complaints would only repeat this one.
    """
    if file_size == end:
        checker.report.warnings.append(
            Problem(
                checker.shard,
                "ends right after its last sample, without the end-of-archive marker; energon reads it, but"
                " it may have been cut short at a member boundary.",
                "check that its last samples are complete, or re-write the shard with a tar writer",
            )
        )
        return True
    if file_size < end + 2 * BLOCK:
        checker.problem(
            f"the shard is {file_size:,} bytes but its index says its samples end at byte {end:,}, followed by"
            " the 1,024-byte end-of-archive marker: the shard was truncated after prepare.",
            RESTORE,
        )
        return False
    with mmap.mmap(fd, file_size, access=mmap.ACCESS_READ) as mapped:
        at = first_nonzero(mapped, end, file_size)
    if at is not None:  # said when the samples have told what the shard is (`_ShardChecker.finish`)
        checker.unindexed = (at, end)
    return True


def _unindexed_data(path: str, at: int, end: int) -> tuple[str, str]:
    """(what, fix) of data at byte `at` of the shard at `path`, past the indexed samples that end at byte
    `end`, in a shard whose indexed samples are there.

    Inside the end-of-archive marker, members were most likely appended after prepare (`tar -r` writes over
    the marker), which prepare indexes when run again. After the marker, no reader sees it (energon, tarfile
    and GNU tar without `-i` stop at the marker), so preparing again cannot help: it was written there after
    prepare, or archives were joined end to end (`cat a.tar b.tar`), whose members one archive must hold.
    """
    if at < end + 2 * BLOCK:
        return (
            f"holds data at byte {at:,}, where its index puts the end-of-archive marker (byte {end:,}): the"
            " shard was changed after prepare (members appended with `tar -r` are written over the marker),"
            " and energon will not see what the index does not cover.",
            "if the new data belongs in the dataset, " + REPREPARE + "; otherwise " + RESTORE,
        )
    repack = repack_command(path)
    return (
        f"holds data at byte {at:,}, after its end-of-archive marker at byte {end:,}, which the index does"
        " not cover and no reader sees (energon, shardprep and GNU tar without -i stop at the marker). Either"
        " it was written after prepare, or archives were joined end to end (`cat a.tar b.tar`).",
        f"for joined archives, put their members into one archive and replace the shard with it, e.g. with GNU"
        f" tar: `{repack}`; for anything else, restore the shard from its source (shardprep never modifies"
        " tars); then " + REPREPARE,
    )


def _check_parts(
    checker: _ShardChecker, buffer: np.ndarray, samples: dict, parts: dict, end: int, start_ok: np.ndarray
) -> None:
    """Every indexed part offset holds a valid header of the named member with the indexed size.

    `start_ok` says for each sample whether the header at its start offset has a valid checksum.
    """
    file_size = len(buffer)
    sample_starts = samples["offset"]
    sample_ends = np.append(sample_starts[1:], end)
    where = np.searchsorted(samples["index"], parts["index"])
    where = np.minimum(where, len(samples["index"]) - 1)
    orphan = samples["index"][where] != parts["index"]
    for position in np.flatnonzero(orphan)[:MAX_EXAMPLES].tolist():
        checker.problem(
            f"sqlite lists part {parts['name'][position]!r} of a sample index that has no sample row."
        )
    header_at = parts["offset"] - BLOCK
    inside = (header_at >= sample_starts[where]) & (parts["offset"] + parts["size"] <= sample_ends[where])
    inside &= parts["offset"] + parts["size"] <= file_size
    for position in np.flatnonzero(~inside & ~orphan)[:MAX_EXAMPLES].tolist():
        checker.problem(
            f"part {parts['name'][position]!r} of sample index {int(parts['index'][position])} is indexed at"
            f" bytes {int(parts['offset'][position]):,}+{int(parts['size'][position]):,}, outside its sample's"
            " range or past the end of the shard.",
            kind="parts outside their sample",
        )
    check = np.flatnonzero(inside & ~orphan)
    if check.size == 0:
        return
    offsets = header_at[check]
    # a sample's first part header is often its sample header, whose checksum is already known
    at_start = np.minimum(np.searchsorted(sample_starts, offsets), len(sample_starts) - 1)
    is_start = sample_starts[at_start] == offsets
    mismatched = []
    for chunk_start in range(0, len(check), CHUNK):
        rows = check[chunk_start : chunk_start + CHUNK]
        chunk = offsets[chunk_start : chunk_start + CHUNK]
        headers = _blocks(buffer)[chunk // BLOCK]
        known = is_start[chunk_start : chunk_start + CHUNK]
        valid = np.empty(len(rows), dtype=bool)
        valid[known] = start_ok[at_start[chunk_start : chunk_start + CHUNK][known]]
        valid[~known] = _checksums_ok(headers[~known], chunk[~known])
        sizes, sizes_ok = octal_fields(headers[:, SIZE])
        typeflag_ok = np.isin(headers[:, TYPEFLAG], REGULAR_TYPEFLAGS)
        names = member_name_fields(samples["key"].take(where[rows]), parts["name"].take(rows), NAME_WIDTH)
        name_ok = (headers[:, NAME] == names).all(axis=1) & (headers[:, PREFIX_START] == 0)  # no ustar prefix
        good = valid & typeflag_ok & sizes_ok & (sizes == parts["size"][rows]) & name_ok
        mismatched.append(where[rows[~good]])
    # long names (PAX, GNU) and damage: walk those samples' headers exactly
    for sample in sorted(set(np.concatenate(mismatched).tolist())):  # np.unique would import numpy.ma
        _check_sample_exactly(checker, buffer, samples, parts, sample, int(sample_ends[sample]))


def member_name_fields(keys: TextColumn, parts: TextColumn, width: int = NAME_WIDTH) -> np.ndarray:
    """The ustar name field of each member `KEY.PART` (row i joins keys[i] and parts[i]), as bytes.

    One row of `width` bytes per member: the UTF-8 name, NUL-padded, cut at `width` bytes — what the
    header of a member with that name holds when the name fits (longer names go in extra headers).
    """
    rows = len(keys)
    fields = np.zeros((rows, width), dtype=np.uint8)
    if rows == 0:
        return fields
    columns = np.arange(width)
    key_bytes = np.minimum(keys.lengths, width)
    dot_at = keys.lengths
    part_bytes = np.clip(width - 1 - dot_at, 0, parts.lengths)
    fields[columns < key_bytes[:, None]] = segment_gather(keys.buffer, keys.starts, key_bytes)
    with_dot = np.flatnonzero(dot_at < width)
    fields[with_dot, dot_at[with_dot]] = ord(".")
    after_dot = (columns > dot_at[:, None]) & (columns <= (dot_at + part_bytes)[:, None])
    fields[after_dot] = segment_gather(parts.buffer, parts.starts, part_bytes)
    return fields


def _check_sample_exactly(
    checker: _ShardChecker, buffer: np.ndarray, samples: dict, parts: dict, sample: int, sample_end: int
) -> None:
    """Walk one sample's headers the way prepare does (long names, PAX) and compare with its part rows."""
    start = int(samples["offset"][sample])
    key = samples["key"][sample]
    data = buffer[start:sample_end].tobytes() + bytes(2 * BLOCK)
    walker = HeaderWalker(checker.shard, data)
    try:
        found = [(m.name, m.offset_data + start, m.size) for m in walker.members()]
        walker.verify_checksums()
    except PrepError as error:
        checker.problem(
            f"sample {key!r} (byte {start:,}): {getattr(error, 'problem', str(error))}",
            RESTORE,
            kind="damaged samples",
        )
        return
    rows = np.flatnonzero(parts["index"] == samples["index"][sample]).tolist()
    indexed = [
        (f"{key}.{parts['name'][row]}", int(parts["offset"][row]), int(parts["size"][row])) for row in rows
    ]
    found = [member for member in found if key_and_part(member[0]) is not None]  # what energon indexes
    others = sorted({key_and_part(name)[0] for name, _, _ in found} - {key})
    if others and checker.other_sample is None:
        checker.other_sample = (
            f"at byte {start:,}, where its index has sample {key!r}, it holds {others[0]!r}"
        )
    if found != indexed:
        checker.problem(
            f"sample {key!r} at byte {start:,} does not hold the members its index names: the index has"
            f" {indexed[:3]}, the shard has {found[:3]}.",
            RESTORE,
            kind="damaged samples",
        )


def _deep_check_shard(
    checker: _ShardChecker,
    dataset: PreparedDataset,
    buffer: np.ndarray,
    samples: dict,
    parts: dict,
    tar_file_id: int,
    auxiliary: bool,
    split_files: Sequence[str],
) -> None:
    """Re-index the whole shard from its headers, compare with the index, and decode every member; one
    that does not decode may be dropped with `exclude` in each of `split_files` (those energon loads the
    dataset's splits from), except in an `auxiliary` dataset of a metadataset, read by member name."""
    try:
        rows = shard_rows(str(dataset.shard_path(checker.shard)), checker.shard, tar_file_id)
    except PrepError as error:
        checker.problem(getattr(error, "problem", str(error)), RESTORE)
        return
    fresh_samples, fresh_parts = rows.sample_rows(), rows.part_rows()
    indexed_samples = [
        (tar_file_id, key, int(i), int(o), int(s))
        for key, i, o, s in zip(
            samples["key"], samples["index"], samples["offset"], samples["size"], strict=False
        )
    ]
    if fresh_samples != indexed_samples:
        first = next((a, b) for a, b in itertools.zip_longest(fresh_samples, indexed_samples) if a != b)
        checker.problem(
            f"re-reading every header gives {len(fresh_samples)} samples, the index has {len(indexed_samples)};"
            f" first difference: shard has {first[0]}, index has {first[1]}."
        )
    indexed_parts = [
        (tar_file_id, int(i), name, int(o), int(s))
        for i, name, o, s in zip(parts["index"], parts["name"], parts["offset"], parts["size"], strict=False)
    ]
    if sorted(fresh_parts) != sorted(indexed_parts):
        missing = sorted(set(fresh_parts) - set(indexed_parts))[:MAX_EXAMPLES]
        extra = sorted(set(indexed_parts) - set(fresh_parts))[:MAX_EXAMPLES]
        checker.problem(
            f"the members in the shard differ from the index: not indexed {missing}, indexed but absent {extra}."
        )
    keys = dict(zip(samples["index"].tolist(), samples["key"], strict=False))
    for index, name, offset, size in zip(
        parts["index"].tolist(), parts["name"], parts["offset"].tolist(), parts["size"].tolist(), strict=False
    ):
        if offset + size > len(buffer):
            continue  # already reported as outside the shard
        problem = content_problem(name, buffer[offset : offset + size].tobytes())
        if problem is not None:
            drop = f"`{checker.shard}/{keys.get(index, '?')}` to `exclude` in {' and '.join(split_files)}"
            checker.problem(
                f"member {keys.get(index, '?')}.{name} at byte {offset:,} cannot be decoded as {name.rsplit('.', 1)[-1]} ({problem}).",
                FIX_AUX_SOURCE if auxiliary else f"{FIX_SOURCE}, or drop the sample by adding {drop}",
                kind="undecodable members",
            )


def _check_shard(
    report: VerifyReport,
    dataset: PreparedDataset,
    tar_file_id: int,
    samples: dict | None,
    parts: dict | None,
    deep: bool,
    *,
    indexed: bool = True,
    auxiliary: bool = False,
    split_files: Sequence[str] = (SPLIT_YAML,),
) -> None:
    """Check one shard against its `.tar.idx` and, when `indexed` (index.sqlite could be read), against
    its rows in index.sqlite; `auxiliary`: the shard of a metadataset's auxiliary dataset; `split_files`:
    those energon loads its splits from."""
    shard = dataset.shards[tar_file_id]
    count = dataset.shard_counts[shard]
    checker = _ShardChecker(report, str(dataset.root), shard)
    path = dataset.shard_path(shard)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO named like a shard must not block us
    except FileNotFoundError:
        checker.problem(
            "is listed in .info.json but the file is missing.",
            "restore the shard, or if it is gone for good, " + REPREPARE + " without it",
        )
        return
    except OSError as error:
        checker.problem(f"cannot be opened ({error.strerror}).", READABLE)
        return
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            kind = "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"
            checker.problem(f"is {kind}, not a tar file.", RESTORE)
            return
        file_size = status.st_size
        try:  # a shard compressed after prepare would otherwise read as one cut short
            check_not_compressed(shard, os.pread(fd, BLOCK, 0))
        except ShardError as error:
            checker.problem(error.problem, error.advice)
            return
        index_path = dataset.tar_index_path(shard)
        index_name = PurePosixPath(tar_index_name(shard)).name  # not the name a mirror may cut to fit
        if not index_path.exists():
            checker.problem(f"has no offset file {index_name}; energon's loader needs it.")
            return
        if index_path.is_dir():  # prepare cannot put its offset file in place of a folder
            checker.problem(f"{index_name} is a folder, not an offset file.", "remove it, then " + REPREPARE)
            return
        index_bytes = index_path.stat().st_size
        if index_bytes % 8:
            checker.problem(f"{index_name} is {index_bytes} bytes, not a whole number of 8-byte offsets.")
            return
        try:
            offsets = dataset.read_tar_index(shard)
        except OSError as error:
            checker.problem(
                f"{index_name} cannot be read ({error.strerror}).", READABLE + ", or " + REPREPARE
            )
            return
        if len(offsets) == 0:
            checker.problem(f"{index_name} is empty but .info.json counts {count} samples.")
            return
        if len(offsets) != count + 1:
            checker.problem(
                f"{index_name} holds {len(offsets) - 1} sample offsets but .info.json counts {count} samples."
            )
            return
        if np.any(np.diff(offsets) <= 0) and count:
            checker.problem(f"{index_name} offsets do not increase; the file is damaged.")
            return
        end = int(offsets[-1])
        if not _check_tail(checker, fd, end, file_size) or not indexed:
            return  # without index.sqlite there are no rows to compare (its problem is reported once)
        if samples is None:
            samples = {
                "index": np.zeros(0, np.int64),
                "offset": np.zeros(0, np.int64),
                "size": np.zeros(0, np.int64),
                "key": [],
            }
        if len(samples["index"]) != count:
            checker.problem(
                f"sqlite has {len(samples['index'])} samples for the shard but .info.json counts {count}."
            )
            return
        if count == 0:
            return
        if not np.array_equal(samples["index"], np.arange(count)):
            checker.problem("sqlite's sample indexes for the shard are not 0, 1, 2, ... in order.")
            return
        differ = np.flatnonzero(samples["offset"] != offsets[:-1])
        if differ.size:
            first = int(differ[0])
            checker.problem(
                f"sqlite and {index_path.name} disagree on where {differ.size} sample(s) start (first: sample"
                f" {samples['key'][first]!r}, sqlite byte {int(samples['offset'][first]):,}, .tar.idx byte"
                f" {int(offsets[first]):,})."
            )
            return
        if parts is None:
            checker.problem("sqlite lists no parts for the shard's samples.")
            return
        if file_size == 0:
            return
        with mmap.mmap(fd, file_size, access=mmap.ACCESS_READ) as mapped:
            buffer = np.frombuffer(mapped, dtype=np.uint8)
            starts = offsets[:-1]
            readable = starts + BLOCK <= file_size
            start_ok = np.zeros(len(starts), dtype=bool)
            start_ok[readable] = _headers_ok(buffer, starts[readable])
            for sample in np.flatnonzero(~start_ok)[:MAX_EXAMPLES].tolist():
                checker.problem(
                    f"sample {samples['key'][sample]!r}: byte {int(starts[sample]):,}, where the index says it"
                    " starts, does not hold a valid tar header.",
                    RESTORE,
                    kind="bad sample headers",
                )
            _check_parts(checker, buffer, samples, parts, end, start_ok)
            if deep:
                _deep_check_shard(
                    checker, dataset, buffer, samples, parts, tar_file_id, auxiliary, split_files
                )
            del buffer
    finally:
        os.close(fd)
        checker.finish()


#: The keys of dataset.yaml that name a function of a Python module in `.nv-meta` (`MODULE.py:FUNCTION`).
MODULE_KEYS = ("sample_loader", "part_filter")


def _module_problems(dataset: PreparedDataset, config: dict | None, config_name: str) -> list[Problem]:
    """A problem for each module dataset.yaml's `sample_loader` or `part_filter` names that is not there
    (energon then cannot build the dataset at all), and for a `sample_loader.py` that is still prepare's
    template (every sample fails). The modules are read as text, never imported."""
    problems = []
    for key in MODULE_KEYS:
        value = config.get(key) if config is not None else None
        if not isinstance(value, str):
            continue
        module = value.rsplit(":", 1)[0]
        path = dataset.meta / module
        if not path.is_file():
            problems.append(
                Problem(
                    f"{META_DIR}/{config_name}",
                    f"its {key} is {value!r}, but {META_DIR}/{module} does not exist: energon cannot build"
                    " the dataset.",
                    f"put {module} back in {META_DIR}/, or re-run prepare to write a new {config_name}"
                    + (f" (--dataset-yaml-name {config_name})" if config_name != DATASET_YAML else ""),
                )
            )
        elif key == "sample_loader" and _holds(path, TEMPLATE_FIELD):
            problems.append(
                Problem(
                    f"{META_DIR}/{module}",
                    f"is still the template prepare wrote: its sample_loader reads {TEMPLATE_FIELD}, so every"
                    " sample fails to load.",
                    "edit it to build each field of the sample type from the sample's parts, or re-run"
                    " prepare with --field-map",
                )
            )
    return problems


def _holds(path: Path, text: str) -> bool:
    """Whether the file holds `text` (read as text, never run); False if it cannot be read."""
    try:
        return text in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


#: What energon's loader puts in every raw sample beside its parts (`FilteredSample`): a field map may read them.
LOADER_KEYS = frozenset({"__key__", "__shard__", "__restore_key__", "__sources__"})


def _unread_fields(config: dict | None, parts: dict[int, dict], config_name: str) -> list[Problem]:
    """A problem for each field of dataset.yaml's field map that reads only parts no sample has: energon's
    loader fails on every sample for it, so it is the field map to fix, not the samples."""
    field_map = config.get("field_map") if config is not None else None
    if not isinstance(field_map, dict):
        return []
    present = set().union(*(group["name"].distinct() for group in parts.values()))
    problems = []
    for field_name, names in field_map_parts(field_map).items():
        if not any(name in present or name in LOADER_KEYS for name in names):
            wanted = " or ".join(repr(name) for name in names)
            shown = sorted(present)[:MAX_PART_NAMES] + (["..."] if len(present) > MAX_PART_NAMES else [])
            problems.append(
                Problem(
                    f"{META_DIR}/{config_name}",
                    f"the field map reads field {field_name!r} from part {wanted}, which no sample has"
                    f" (the samples' parts are {', '.join(shown)}): energon's loader fails on"
                    " every sample.",
                    f"correct `field_map` in {META_DIR}/{config_name} to name a part the samples have",
                )
            )
    return problems


#: What energon's loader raises on loading a split that names no shard (`exclude` may drop every one).
EMPTY_SPLIT_ERROR = "EmptyDatasetError, 'No shards found in split part'"
#: The splits energon's validation loader (`get_val_dataset`) is given, which ends on an empty one; any
#: other split may be trained on, whose loader waits for ever on a split with no sample to load.
EVALUATION_SPLITS = ("val", "test")
#: The split energon's training loader (`get_train_dataset`) loads unless told another.
TRAIN_SPLIT = "train"


@dataclass(frozen=True)
class _SplitCount:
    """How many of a split's named shards are indexed, and their samples: held, and left in by `exclude`."""

    shards: int = 0
    held: int = 0
    loadable: int = 0


def _split_counts(
    dataset: PreparedDataset, split_file: str, splits: dict[str, list[str]], samples: dict[int, dict]
) -> dict[str, _SplitCount]:
    """Each split's `_SplitCount` (of `split_file`). `samples` (index.sqlite's, by tar_file_id) tells which
    excluded keys are samples of their shard."""
    excluded = dataset.excluded_samples(split_file)
    counts = {}
    for split, names in splits.items():
        shards = held = loadable = 0
        for name in names:
            if name not in dataset.shard_counts:
                continue  # named as not indexed, where the split is checked
            tar_file_id = dataset.tar_file_id(name)
            count, dropped = dataset.shard_counts[name], excluded.get(tar_file_id, set())
            if len(dropped) >= count and tar_file_id in samples:  # a key not in the shard drops nothing
                dropped = dropped & samples[tar_file_id]["key"].distinct()
            shards += 1
            held += count
            loadable += max(count - len(dropped), 0)
        counts[split] = _SplitCount(shards, held, loadable)
    return counts


def _split_problems(
    dataset: PreparedDataset,
    split_file: str,
    splits: dict[str, list[str]],
    samples: dict[int, dict],
    root: str,
) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of the splits of `split_file` with no sample for energon to load.

    No split with a sample is one problem (`_no_split_problem`). With some split to load, a split that
    names shards but loads none of their samples (`exclude` drops each, or they hold none) is a problem,
    as energon's training loader on it waits for ever (or stops: 'Cannot repeat empty dataset
    indefinitely'), and a warning for val and test, whose validation loader yields no sample without
    saying why. A split that names no shard is left alone: energon raises EMPTY_SPLIT_ERROR only when it
    is loaded, and prepare leaves val and test so unless asked; a metadataset reference that loads one is
    a problem of the reference (`_split_file_problems`). Only where `train` names none and only val or
    test have samples, a warning says that training on the dataset fails (`_untrainable_warning`).
    """
    counts = _split_counts(dataset, split_file, splits, samples)
    if not any(count.loadable for count in counts.values()):
        return [_no_split_problem(split_file, splits, counts, root)], []
    problems, warnings = [], []
    untrainable = _untrainable_warning(split_file, splits, counts, root)
    if untrainable is not None:
        warnings.append(untrainable)
    for split, count in counts.items():
        if not count.shards or count.loadable:
            continue
        shards = ", ".join(splits[split][:MAX_EXAMPLES]) + (
            ", ..." if len(splits[split]) > MAX_EXAMPLES else ""
        )
        if count.held:
            what = f"`exclude` drops every sample of the {count.shards} shard(s) split {split!r} names ({shards})"
            fix = f"remove some of the samples of split {split!r} from `exclude` in {split_file}"
        else:
            what = f"the {count.shards} shard(s) split {split!r} names ({shards}) hold no sample"
            fix = f"add shards that hold samples (members named KEY.PART) to split {split!r} in {split_file}"
        problem = Problem(
            f"{META_DIR}/{split_file}",
            what
            + ", so energon loads none from it: its validation loader yields no sample from it, without an"
            " error (a split that names no shard raises EmptyDatasetError), and a training loader on it"
            + (" waits for ever." if count.held else " stops ('Cannot repeat empty dataset indefinitely')."),
            fix + f", or, if it is meant to be empty, name no shard under {split!r} in `split_parts`",
        )
        (warnings if split in EVALUATION_SPLITS else problems).append(problem)
    return problems, warnings


def _untrainable_warning(
    split_file: str, splits: dict[str, list[str]], counts: dict[str, _SplitCount], root: str
) -> Problem | None:
    """The warning for splits where `train` names no shard and only evaluation splits have samples (an
    evaluation-only dataset, as `--split-ratio 0,1,0` makes): energon's get_train_dataset fails on it."""
    with_samples = {split: count.loadable for split, count in counts.items() if count.loadable}
    if counts.get(TRAIN_SPLIT, _SplitCount()).shards or not set(with_samples) <= set(EVALUATION_SPLITS):
        return None
    error = EMPTY_SPLIT_ERROR if TRAIN_SPLIT in splits else "AssertionError, 'Invalid split part'"
    having = " and ".join(f"{split!r} ({count:,})" for split, count in with_samples.items())
    fix = f"to train on it, name shards under {TRAIN_SPLIT!r} in `split_parts` in {split_file}"
    if split_file == SPLIT_YAML:  # the split file prepare writes
        fix += f", or re-run `shardprep prepare {shlex.quote(root)}` with a --split-ratio that gives train a share"
    return Problem(
        f"{META_DIR}/{split_file}",
        f"split {TRAIN_SPLIT!r} names no shard, so training on this dataset fails (energon's"
        f" get_train_dataset raises {error}); only {having} {'has' if len(with_samples) == 1 else 'have'}"
        " samples, which is fine for evaluation.",
        fix,
    )


def _no_split_problem(
    split_file: str, splits: dict[str, list[str]], counts: dict[str, _SplitCount], root: str
) -> Problem:
    """The problem of a split file that leaves no split a sample to load. energon's loader cannot load a
    split that names no shard (it raises EMPTY_SPLIT_ERROR), and one
    whose every sample `exclude` drops yields none (its training loader waits for ever, or stops when
    the shards hold none)."""
    named = ", ".join(f"{split!r} ({len(names)} shard(s))" for split, names in splits.items()) or "none"
    fix = f"name the shards of each split under `split_parts` in {split_file} and exclude only the samples not to load"
    if split_file == SPLIT_YAML:  # the split file prepare writes
        fix += f", or re-run `shardprep prepare {shlex.quote(root)}` to put every shard in a split again"
    if not any(splits.values()):
        what = (
            f"no split names a shard that `exclude` leaves in (splits: {named}): energon's loader cannot load"
            f" any of them (it raises {EMPTY_SPLIT_ERROR})."
        )
    elif not any(count.held for count in counts.values()):
        what = (
            f"the shards the splits name hold no sample (splits: {named}): energon's loader finds none in"
            " any split (a training loader stops: 'Cannot repeat empty dataset indefinitely')."
        )
        fix = (
            "add shards that hold samples (members named KEY.PART), then re-run"
            f" `shardprep prepare {shlex.quote(root)}`"
        )
    else:
        what = (
            f"`exclude` drops every sample of the shards the splits name (splits: {named}): energon's"
            " loader finds no sample in any split (a training loader waits for ever)."
        )
    return Problem(f"{META_DIR}/{split_file}", what, fix)


def _loaded_split_files(
    dataset: PreparedDataset, split_files: Sequence[str], report: VerifyReport
) -> dict[str, dict[str, list[str]]]:
    """The splits of each of `split_files` that can be read, by file name. The split file energon reads by
    default (split.yaml, which prepare writes, or split.json in its place) that cannot be read is a problem
    of the dataset; another split file, of the metadataset reference that names it as its `split_config`
    (`_split_file_problems`), so it is left out here without a word."""
    loaded = {}
    for split_file in dict.fromkeys(split_files):
        try:
            loaded[split_file] = dataset.splits(split_file)
        except PrepError as error:
            if split_file == dataset.split_file():
                report.problems.append(_meta_file_problem(dataset, split_file, error))
    return loaded


def _unindexed_split_shards(
    dataset: PreparedDataset, split_file: str, splits: dict[str, list[str]], root: str
) -> list[Problem]:
    """A problem for each shard a split of `split_file` names that `.info.json` does not list."""
    fix = reprepare(root)
    if split_file != SPLIT_YAML:  # prepare rewrites split.yaml, not this one
        fix = f"remove the shard from {META_DIR}/{split_file}, or if it belongs in the dataset, {fix}"
    return [
        Problem(
            f"{META_DIR}/{split_file}",
            f"split {split!r} names shard {name!r}, which is not in .info.json"
            + (" and does not exist." if not dataset.shard_path(name).exists() else "."),
            fix,
        )
        for split, names in splits.items()
        for name in names
        if name not in dataset.shard_counts
    ]


def _null_rows(dataset: PreparedDataset, error: NullRowsError) -> str:
    """What index.sqlite's rows without a value are, naming the shard and sample of the first."""
    tar_file_id, index = error.first
    first = f"sample_index {index} of tar_file_id {tar_file_id}"
    if tar_file_id is not None and 0 <= tar_file_id < len(dataset.shards):
        first = f"shard {dataset.shards[tar_file_id]}, sample_index {index}"
        if index is not None:
            sample = next(dataset.index.samples_of_shard(tar_file_id, index - 1), None)
            if sample is not None and sample.index == index:
                first = f"sample {sample.key!r} of shard {dataset.shards[tar_file_id]}"
    return (
        f"{error.count:,} row(s) of its {error.table} table have no {error.column} (NULL), the first of {first}:"
        " the index was damaged after prepare, which writes every row whole."
    )


def _meta_file_problem(dataset: PreparedDataset, name: str, error: PrepError) -> Problem:
    """A file of `.nv-meta` that cannot be used: made readable if it is there but cannot be opened, written
    without aliases if it has one (energon's reader does not resolve them), else rebuilt (a missing one
    too)."""
    if isinstance(error, UnresolvedAliasError):  # readable, but not as energon reads it
        return Problem(f"{META_DIR}/{name}", error.problem, error.advice)
    reason = unreadable_reason(dataset.meta / name)
    gone = reason in (os.strerror(errno.ENOENT), os.strerror(errno.ENOTDIR))
    fix = reprepare(dataset.root) if reason is None or gone else READABLE
    return Problem(f"{META_DIR}/{name}", str(error), fix)


def unread_index_problem(error: PrepError, root: str) -> Problem:
    """The problem of an index.sqlite whose reading failed with `error`, its fix said once: a damaged one
    is prepared again (and its media described again, where it records how); one rewritten while it was
    read (`IndexChangedError`, whose own text says to open it anew) is verified again."""
    where = f"{META_DIR}/{INDEX_SQLITE}"
    if isinstance(error, IndexChangedError):
        return Problem(where, f"{error.change}.", VERIFY_AGAIN)
    fix = reprepare(root)
    if not isinstance(error, DamagedIndexError):
        return Problem(where, f"cannot be read: {error}", fix)
    commands = media_commands(error.path, root)
    if commands is not None:
        fix += f", then {commands} for its media metadata"
    return Problem(where, f"{error.problem}.", fix)


def _sqlite_problem(dataset: PreparedDataset, root: str) -> Problem | None:
    """index.sqlite missing or impossible to open, said once; None when it can be opened (whether it
    holds energon's tables is for the reader to find)."""
    where = f"{META_DIR}/{INDEX_SQLITE}"
    if not dataset.sqlite_path.exists():
        return Problem(
            where,
            "is missing; energon looks samples up by key in it (joined datasets, auxiliary data), and"
            " `shardprep info` and `preview` read it. energon releases before index.sqlite did not write it.",
            reprepare(root),
        )
    reason = unreadable_reason(dataset.sqlite_path)
    if reason is not None:
        return Problem(where, f"cannot be read ({reason}).", READABLE)
    return None


def verify_dataset(
    root: str | os.PathLike[str],
    *,
    deep: bool = False,
    dataset_config: str = DATASET_YAML,
    auxiliary: bool = False,
    split_files: Sequence[str] = (SPLIT_YAML,),
    split_files_read: SplitFilesRead | None = None,
) -> VerifyReport:
    """Check a prepared dataset, its dataset config being `.nv-meta/{dataset_config}` and its splits those
    of the `split_files` in `.nv-meta` (a metadataset's references name theirs with `split_config`); the
    report lists every problem found with its fix. An `auxiliary` dataset of a metadataset, which energon
    reads by member name through index.sqlite alone, needs no dataset config, and its split.yaml excludes
    nothing from it. `split_files_read`: split files parsed already, shared with the caller's readers."""
    dataset = PreparedDataset(root, split_files_read)
    split_files = tuple(dict.fromkeys(dataset.split_file(split_file) for split_file in split_files))
    report = VerifyReport(str(dataset.root), deep, dataset_config=dataset_config)
    root_text = str(dataset.root)
    try:
        for name, why in (
            (dataset_config, "energon's loader needs it"),
            (INDEX_UUID, "energon's caches key on it"),
        ):
            if name == dataset_config and auxiliary:
                continue
            if not (dataset.meta / name).exists():
                fix = reprepare(root_text)
                if name == dataset_config != DATASET_YAML:  # prepare writes dataset.yaml unless told
                    fix = reprepare(root_text, "--dataset-yaml-name", name)
                others = dataset.other_dataset_configs(name) if name == dataset_config else []
                if others:
                    why += (
                        f" ({META_DIR} holds {others[0]}, a dataset config of another name: give it with"
                        f" --dataset-config {others[0]}, as energon's loader is given dataset_config="
                        f"{others[0]!r})"
                    )
                    fix = f"verify with --dataset-config {others[0]}, or re-run prepare without --dataset-yaml-name"
                report.problems.append(Problem(f"{META_DIR}/{name}", f"is missing; {why}.", fix))
        config = None
        try:
            config = dataset.dataset_config(dataset_config)  # energon loads only a readable YAML mapping
        except PrepError as error:
            report.problems.append(_meta_file_problem(dataset, dataset_config, error))
        loaded = _loaded_split_files(dataset, split_files, report)
        in_splits: set[str] = set()
        for split_file, splits in loaded.items():
            report.problems.extend(_unindexed_split_shards(dataset, split_file, splits, root_text))
            in_splits |= {name for names in splits.values() for name in names}
            in_splits |= dataset.excluded_shards(split_file)
        for name in dataset.shards:
            if any(loaded.values()) and name not in in_splits:
                report.warnings.append(
                    Problem(
                        name,
                        "is indexed but in no split, so energon never loads it.",
                        f"add it to a split in {' or '.join(loaded)}"
                        + (" or re-run prepare" if SPLIT_YAML in loaded else ""),
                    )
                )
        sqlite_problem = _sqlite_problem(dataset, root_text)
        if sqlite_problem is not None:
            report.problems.append(sqlite_problem)
        samples, parts = {}, {}
        if sqlite_problem is None:
            try:
                samples, parts = _load_sqlite(dataset, deep)
            except NullRowsError as error:
                report.problems.append(
                    Problem(
                        f"{META_DIR}/{INDEX_SQLITE}",
                        _null_rows(dataset, error),
                        reprepare(root_text),
                    )
                )
                sqlite_problem = report.problems[-1]
            except PrepError as error:  # a damaged database: report it, keep checking the rest
                report.problems.append(unread_index_problem(error, root_text))
                sqlite_problem = report.problems[-1]
        if not auxiliary:  # energon reads an auxiliary dataset's members by name
            for split_file, splits in loaded.items():
                split_problems, split_warnings = _split_problems(
                    dataset, split_file, splits, samples, root_text
                )
                report.problems.extend(split_problems)
                report.warnings.extend(split_warnings)
        report.problems.extend(_module_problems(dataset, config, dataset_config))
        if parts:
            report.problems.extend(_unread_fields(config, parts, dataset_config))
        known_ids = set(range(len(dataset.shards)))
        stray = sorted(set(samples) - known_ids)
        if stray:
            report.problems.append(
                Problem(
                    f"{META_DIR}/{INDEX_SQLITE}",
                    f"has samples for tar_file_id(s) {stray[:5]} that .info.json does not list.",
                    reprepare(root_text),
                )
            )
        # the dataset's size as energon counts it; what is wrong in it is said by the problems
        report.shards = len(dataset.shards)
        report.samples = sum(dataset.shard_counts.values())
        report.parts = sum(
            len(parts[tar_file_id]["index"]) for tar_file_id in parts if tar_file_id in known_ids
        )
        for tar_file_id in range(len(dataset.shards)):
            _check_shard(
                report,
                dataset,
                tar_file_id,
                samples.get(tar_file_id),
                parts.get(tar_file_id),
                deep,
                indexed=sqlite_problem is None,
                auxiliary=auxiliary,
                split_files=split_files,
            )
    finally:
        dataset.close()
    return report


def shown_from(path: Path, folder: Path) -> str:
    """`path` as a metadataset's problems name it: relative to the YAML's `folder` when below it, else whole
    (a path with `../` is hard to follow, and no path at all in a bucket).

    >>> shown_from(Path("/m/primary"), Path("/m")), shown_from(Path("/data/b"), Path("/m"))
    ('primary', '/data/b')
    """
    relative = os.path.relpath(path, folder)
    return str(path) if relative.split(os.sep)[0] == ".." else relative


def reads_dataset(reference: DatasetReference) -> str:
    """How a metadataset's problem about the dataset of `reference` begins (its written path follows)."""
    return f"split {reference.split!r} reads the dataset"


def joins_auxiliary(reference: DatasetReference, aux: AuxReference) -> str:
    """How a metadataset's problem about auxiliary dataset `aux` of `reference` begins (its written path
    follows)."""
    return f"split {reference.split!r} joins auxiliary dataset {aux.name!r} from"


def named_yaml(yaml: Path, top: Path) -> str:
    """Where a problem of the metadataset YAML `yaml` is, in a verify of the one at `top`: the top YAML by
    its file name, a nested one by its full path."""
    return yaml.name if yaml == top else str(yaml)


def verify_metadataset(
    metadataset: Path,
    *,
    deep: bool = False,
    mirror: Path | None = None,
    unchecked: Collection[Path] = (),
) -> VerifyReport:
    """Check a metadataset: every dataset it names verified (its splits those of the split files its
    references load, their `split_config`; its problems named by its path), every dataset and auxiliary
    folder it names there, and every file the `aux.json` of the primary samples it loads names in the
    auxiliary dataset (the samples of the split each reference loads: its `split_part`, else the
    metadataset's split, in its `split_config`). energon's loader skips, without saying why, every sample
    whose auxiliary folder or file is gone, so each is a problem here. `mirror`: where a verify mirrors the
    object storage the YAML names (`read_metadataset`); the `aux.json` parts of a dataset there are not
    read (that would take a GET per sample), and the report says so. `unchecked`: places the caller could
    not look at, and says why itself: they are neither verified nor said to be missing."""
    report = VerifyReport(str(metadataset), deep)
    checked: set[tuple[Path, str]] = set()
    #: The splits loaded of each (primary, split file, auxiliary), whose samples' references are checked.
    joined: dict[tuple[Path, str, Path], tuple[DatasetReference, AuxReference, set[str]]] = {}
    #: (YAML, its split, dataset, split file, split loaded) whose split file has been checked.
    split_files_checked: set[tuple[Path, str, Path, str, str]] = set()
    #: Each split file parsed once, by whichever reader comes first (a dataset's verify, a reference's
    #: check, its samples' aux.json check); those that cannot be read, with why.
    split_files_read: SplitFilesRead = {}
    unreadable_split_files: dict[Path, PrepError] = {}
    references = read_metadataset(metadataset, mirror)
    unchecked = {Path(os.path.normpath(place)) for place in unchecked}

    def looked_at(path: Path) -> bool:
        return Path(os.path.normpath(path)) not in unchecked

    #: The split files each dataset's references load (their `split_config`): its splits are theirs.
    split_files: dict[Path, dict[str, None]] = {}
    for reference in references:
        split_files.setdefault(reference.path, {})[reference.split_config] = None

    def named(yaml: Path) -> str:
        return named_yaml(yaml, metadataset)

    def missing(what: str, path: Path, written: str, name: Path) -> Problem:
        return Problem(
            named(name),
            f"{what} {written!r}, which is {path}: {'it does not exist' if not path.exists() else 'not a folder'}.",
            f"move it back to {path}, or correct the path in {name} (relative paths start at its folder)",
        )

    def add(path: Path, prefix: str, config: str = DATASET_YAML, *, aux: bool = False) -> None:
        if (path, config) in checked:
            return
        checked.add((path, config))
        loads = (SPLIT_YAML,) if aux else tuple(split_files[path])
        try:
            part = verify_dataset(
                path,
                deep=deep,
                dataset_config=config,
                auxiliary=aux,
                split_files=loads,
                split_files_read=split_files_read,
            )
        except PrepError as error:
            fix = reprepare(path)
            inner = metadataset_file(path)
            if inner is not None:  # preparing it would index its datasets' shards again
                fix = (
                    f"name {inner} as the path instead: energon loads a metadataset from its YAML file, and"
                    " takes its folder for no dataset"
                )
            report.problems.append(Problem(prefix, str(error), fix))
            return
        report.shards += part.shards
        report.samples += part.samples
        report.parts += part.parts
        for kind in ("problems", "warnings"):
            getattr(report, kind).extend(
                Problem(f"{prefix}/{problem.where}", problem.what, problem.fix)
                for problem in getattr(part, kind)
            )

    for reference in references:
        name = reference.metadataset
        yaml_where = named(name)
        if reference.ignored_aux:
            report.warnings.append(_ignored_aux_warning(reference, yaml_where))
        if (reference.path.is_file() and reference.path.suffix == ".jsonl") or not looked_at(reference.path):
            continue  # an energon JSONL dataset (no shards to check here), or a place not looked at
        if not reference.path.is_dir():
            report.problems.append(missing(reads_dataset(reference), reference.path, reference.written, name))
            continue
        add(reference.path, shown_from(reference.path, metadataset.parent), reference.dataset_config)
        loaded = (name, reference.split, reference.path, reference.split_config, reference.split_part)
        if loaded not in split_files_checked:
            split_files_checked.add(loaded)
            report.problems.extend(
                _split_file_problems(reference, yaml_where, split_files_read, unreadable_split_files)
            )
        for aux in reference.aux:
            if not looked_at(aux.path):
                continue
            if not aux.path.is_dir():
                what = joins_auxiliary(reference, aux)
                problem = missing(what, aux.path, aux.written, name)
                if aux.folder:  # energon's loader then skips every sample (its error handler's default)
                    problem = Problem(
                        problem.where,
                        problem.what + " energon's loader skips every sample that reads it.",
                        problem.fix,
                    )
                report.problems.append(problem)
            elif not aux.folder:
                add(aux.path, shown_from(aux.path, metadataset.parent), aux=True)
            if aux.name == AUX_NAME and aux.path.is_dir():
                key = (reference.path, reference.split_config, aux.path)
                joined.setdefault(key, (reference, aux, set()))[2].add(reference.split_part)
    read_here = [
        entry for entry in joined.values() if mirror is None or not entry[0].path.is_relative_to(mirror)
    ]
    if len(read_here) < len(joined):
        report.unchecked = AUX_FILES_IN_STORAGE
    for reference, aux, splits in read_here:
        report.problems.extend(
            _reference_problems(reference, aux, splits, metadataset.parent, split_files_read)
        )
    return report


def _ignored_aux_warning(reference: DatasetReference, where: str) -> Problem:
    """The warning of `aux` on an element of a `join`, which energon ignores: its auxiliary datasets are
    neither given to the samples nor checked. `where` names the YAML."""
    names = ", ".join(aux.name for aux in reference.ignored_aux)
    return Problem(
        where,
        f"split {reference.split!r} joins dataset {reference.written!r} ({reference.path}) with `aux`"
        f" ({names}), which energon ignores on an element of a `join`: its samples get no auxiliary dataset,"
        " and verify does not check it.",
        f"remove `aux` from the element of the `join` in {where}; only a dataset reference outside a"
        " `join` gives its samples auxiliary datasets",
    )


def _split_file_problems(
    reference: DatasetReference, where: str, read: SplitFilesRead, unreadable: dict[Path, PrepError]
) -> list[Problem]:
    """The problem of a reference energon's loader fails on for its split file: a `split_config` not in
    the dataset's `.nv-meta` (FileNotFoundError), a split it loads that the file does not have
    ('Invalid split part'), or one that names no shard (EMPTY_SPLIT_ERROR); `where` names the YAML. The
    split file energon reads by default (split.yaml, or split.json in its place) missing or unreadable is
    the dataset's own problem, said when it is verified. `read` holds
    the split files parsed already (`SplitFilesRead`), `unreadable` why those that cannot be are not: each
    is parsed once for all references and readers."""
    dataset = reference.path
    config = split_file_name(dataset / META_DIR, reference.split_config)
    default = config == split_file_name(dataset / META_DIR, SPLIT_YAML)  # said when the dataset is verified
    split_file = dataset / META_DIR / config
    if not split_file.is_file():
        if default or not split_file.parent.is_dir():  # not prepared: said when it is verified
            return []
        held = ", ".join(_split_files(dataset / META_DIR)) or "none"
        return [
            Problem(
                where,
                f"split {reference.split!r} reads the splits of dataset {reference.written!r} ({dataset}) from"
                f" its split_config {config!r}, but {split_file} does not exist: energon's loader fails on it.",
                f"correct `split_config` in {where} to a split file {META_DIR} holds ({held}), or write"
                f" {split_file}",
            )
        ]
    if split_file not in read and split_file not in unreadable:
        try:
            read[split_file] = read_splits(split_file)
        except PrepError as error:
            unreadable[split_file] = error
    if split_file in unreadable:
        if default:
            return []
        return [
            Problem(where, str(unreadable[split_file]), f"correct {split_file}, or `split_config` in {where}")
        ]
    splits = read[split_file][0]
    with_shards = [split for split, shards in splits.items() if shards] or list(splits)
    if reference.split_part in splits:
        if splits[reference.split_part]:
            return []
        return [
            Problem(
                where,
                f"split {reference.split!r} loads split {reference.split_part!r} of dataset {reference.written!r}"
                f" ({dataset}), which names no shard in {META_DIR}/{config}: energon's loader fails on it"
                f" ({EMPTY_SPLIT_ERROR}).",
                f"give the reference under split {reference.split!r} in {where} the `split_part` of a split that"
                f" names shards ({', '.join(with_shards) or 'none'}), or name the shards of split"
                f" {reference.split_part!r} under `split_parts` in {split_file}",
            )
        ]
    return [
        Problem(
            where,
            f"split {reference.split!r} loads split {reference.split_part!r} of dataset {reference.written!r}"
            f" ({dataset}), which {META_DIR}/{config} does not have (its splits: {', '.join(splits) or 'none'}):"
            " energon's loader fails on it ('Invalid split part').",
            f"give the reference under split {reference.split!r} in {where} the `split_part` of a split it"
            f" has ({', '.join(with_shards) or 'none'}), or add split {reference.split_part!r} to `split_parts`"
            f" in {split_file}",
        )
    ]


def _split_files(meta: Path) -> list[str]:
    """The files of `meta` that read as split files (a mapping with `split_parts`), by name."""
    found = []
    for path in sorted(meta.iterdir()):
        if path.name.endswith(tuple(SPLIT_FILE_PARSERS)) and path.is_file():
            try:
                read_splits(path)
            except PrepError:
                continue
            found.append(path.name)
    return found


def _reference_problems(
    reference: DatasetReference,
    aux: AuxReference,
    splits: set[str],
    folder: Path,
    split_files_read: SplitFilesRead | None = None,
) -> list[Problem]:
    """A problem for each sample of the primary dataset's `splits` (those the metadataset loads, from the
    reference's split file) whose `aux.json` names a file the auxiliary dataset does not have (energon's
    loader skips it silently), or that names none; `folder` is the metadataset's, which the problems'
    paths start at. Nothing if either dataset cannot be read: their own checks say why.
    `split_files_read`: split files parsed already, shared with the caller's other readers."""
    try:
        with PreparedDataset(reference.path, split_files_read) as primary:
            references = loaded_references(primary, splits, reference.split_config)
        names = {found.name for found in references if found.name is not None}
        present = folder_files(aux.path, names) if aux.folder else dataset_files(aux.path)
    except PrepError:  # IndexReader's sqlite errors among them
        return []
    prefix = shown_from(reference.path, folder)
    split_yaml = f"{prefix}/{META_DIR}/{split_file_name(reference.path / META_DIR, reference.split_config)}"
    problems = []
    dangling = [found for found in references if found.name not in present]
    for found in dangling[:MAX_EXAMPLES]:
        sample = f"sample {found.key!r} (its {AUX_PART} at byte {found.offset:,})"
        drop = f"drop the sample by adding `{found.shard}/{found.key}` to `exclude` in {split_yaml}"
        if found.name is None:
            what = (
                f"{sample} {found.problem}, so no file of auxiliary dataset {aux.name!r} can be read for it."
            )
            fix = f"re-write the dataset with shardprep write, or {drop}"
        elif aux.folder:
            what = (
                f"{sample} reads field {found.field!r} from {found.name!r}, but {aux.path / found.name} does"
                " not exist: energon's loader skips the sample."
            )
            fix = f"put {found.name} back in {aux.path}, or {drop}"
        else:
            what = (
                f"{sample} reads field {found.field!r} from {found.name!r}, but auxiliary dataset"
                f" {aux.path} has no member of that name in its index: energon's loader skips the sample."
            )
            fix = (
                f"restore the member in a shard of {aux.path} and re-run"
                f" `shardprep prepare {shlex.quote(str(aux.path))}`, or {drop}"
            )
        problems.append(Problem(f"{prefix}/{found.shard}", what, fix))
    if len(dangling) > MAX_EXAMPLES:
        problems.append(
            Problem(
                prefix,
                f"... and {len(dangling) - MAX_EXAMPLES:,} more references to files auxiliary dataset"
                f" {aux.name!r} ({aux.path}) does not have.",
                f"restore them in {aux.path}, or drop their samples with `exclude` in {split_yaml}",
            )
        )
    return problems


def format_report(report: VerifyReport) -> str:
    """The report for people: one paragraph per problem, each with its fix, then the verdict."""
    mode = (
        "deep: every member re-read and decoded"
        if report.deep
        else "index and headers; --deep also reads every member"
    )
    if report.load:
        mode += f"; {report.loaded:,} samples loaded through {report.dataset_config}"
    if report.unchecked:
        mode += f"; {report.unchecked}"
    lines = [
        f"verify {report.root}: {report.shards:,} shards, {report.samples:,} samples, {report.parts:,} parts ({mode})"
    ]
    for warning in report.warnings:
        lines.append(f"WARNING {warning.where}: {warning.what}\n  fix: {warning.fix}")
    for problem in report.problems:
        lines.append(f"PROBLEM {problem.where}: {problem.what}\n  fix: {problem.fix}")
    lines.append("healthy" if report.healthy else f"NOT healthy: {len(report.problems)} problem(s)")
    return "\n".join(lines)


def report_json(report: VerifyReport) -> str:
    """The report for programs: what `format_report` says, as JSON; `loaded` only with --load, and
    `unchecked` only when something was left unchecked."""
    return json.dumps(
        {
            "root": report.root,
            "healthy": report.healthy,
            "deep": report.deep,
            "shards": report.shards,
            "samples": report.samples,
            "parts": report.parts,
            **({"loaded": report.loaded} if report.load else {}),
            **({"unchecked": report.unchecked} if report.unchecked else {}),
            "problems": [asdict(problem) for problem in report.problems],
            "warnings": [asdict(warning) for warning in report.warnings],
        },
        indent=2,
    )
