"""`prepare`: index existing WebDataset shards and write energon's `.nv-meta`, in parallel and all-or-nothing.

    >>> import io, shutil, tarfile, tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> with tarfile.open(root / "shard-0.tar", "w") as tar:
    ...     for name in ("0001.txt", "0001.json", "0002.txt"):
    ...         tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    >>> prepare_dataset(root, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    {'shard-0.tar': 2}
    >>> shutil.rmtree(root)

The stages of `prepare`, in order, all under the dataset's lock (`prep.index.lock`: one writing run per
dataset), with a full disk or a refused write reported plainly (`prep.errors.plain_io_errors`):

1. the shards: every tar below the folder in energon's order (`shards.list_dataset_shards`), or for
   `--tar-index-only` those the existing `.info.json` lists; over an existing index only if the wizard
   says so;
2. the split (`splits.SplitSpec`), from the options or asked;
3. the index, staged (`stage_index`): each shard scanned in a worker (`shards.index_shard`) with its
   `.tar.idx` written there, or with `--engine ray` as a Ray task (`shards.scan_shard` on
   `prep.engines.ray_cluster`) whose rows come back for the `.tar.idx` to be written here; with
   `--resume` the shards an interrupted run finished are taken from its checkpoint (`prepare.resume`)
   instead; the rows inserted here as they come (`prep.index.sqlite`), then `.info.json`, `split.yaml`
   and `index.uuid` (`prep.index.meta`); a shard without the end-of-archive
   marker is indexed to its end and named in one warning (refused with `strict`);
4. `dataset.yaml` (and a `sample_loader.py`) as the wizard decides (`prep.index.dataset_yaml`);
5. everything put in place at once (`prep.index.staging`).

What the user is told and asked goes through a `Wizard`: `Unattended` decides from the options alone and
says nothing (the Python API, `--non-interactive`); the command line's wizard (`prep.prepare.wizard`)
talks on the terminal and asks energon's questions.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from prep.engines import LOCAL, check_engine
from prep.errors import MAX_REPORTED_ERRORS, PrepError, ShardError, errors_report, plain_io_errors
from prep.index.dataset_yaml import (
    DatasetDefinition,
    check_dataset_yaml_name,
    check_definition,
    define_dataset,
    find_sample_type,
    parse_field_map,
)
from prep.index.format import (
    DATASET_YAML,
    INDEX_SQLITE,
    INDEX_UUID,
    INFO_JSON,
    INFO_YAML,
    SAMPLE_LOADER_PY,
    SPLIT_YAML,
    tar_index_name,
)
from prep.index.lock import dataset_lock
from prep.index.media import ShardReads, add_media_metadata, keep_old_media, skipped_av_warning
from prep.index.meta import (
    info_json_from_yaml,
    info_json_text,
    info_yaml_text,
    is_prepared,
    new_index_uuid,
    split_yaml_text,
)
from prep.index.rows import MAX_PART_NAMES, ShardRows, write_tar_index
from prep.index.splits import SHUFFLE_SEED, SplitSpec, parse_split_parts, parse_split_ratio
from prep.index.sqlite import DuplicateKeyError, IndexGrowth, SqliteIndexWriter
from prep.index.staging import NAME_MAX, Staging
from prep.media.filter import MediaFilter
from prep.prepare.fix_duplicates import fix_duplicates, refuse_unfinished_fix
from prep.prepare.resume import ShardCheckpoint
from prep.prepare.shards import (
    check_dataset_root,
    index_shard,
    list_dataset_shards,
    reindexed_shards,
    scan_shard,
)
from prep.processes import ordered_map, worker_count
from prep.storage.address import enclosing_folders, is_plain_name
from prep.tar.scan import repack_command

#: Samples whose parts the wizard shows after indexing (energon shows two).
PREVIEW_SAMPLES = 2
#: With more part types than this, energon offers no field map (a sample loader instead).
MAX_FIELD_MAP_PARTS = 10


@dataclass(frozen=True)
class IndexProgress:
    """Where the indexing is, told as each shard's result comes in (in shard order)."""

    done: int
    total: int
    #: Samples indexed so far.
    samples: int
    #: The problem of the shard that just came in, if it failed (all are reported together at the end).
    failed: PrepError | None = None
    #: With --resume: (shards taken from the checkpoint so far, shards it holds in all, their samples).
    reused: tuple[int, int, int] = (0, 0, 0)


#: `progress(state)`, called as each shard's rows go in.
ShardProgress = Callable[[IndexProgress], None]
#: A shard task: (dataset root, shard, tar_file_id, staged `.tar.idx` path).
ShardTask = tuple[str, str, int, str]


class ShardSource(Protocol):
    """Where the shards are when they are not files below the dataset folder (`prep.prepare.remote`: objects
    in a bucket); the folder then holds only the index being built."""

    #: The dataset's address, which messages name instead of the local folder the index is built in.
    name: str

    def list_shards(self, exclude: str | None) -> list[str]:
        """The shards to index, in energon's order, less those `exclude` matches; a PrepError if none."""

    def scan(self, tasks: list[ShardTask], workers: int) -> Generator[ShardRows | ShardError]:
        """Each task's shard indexed, its rows (or its error) in task order; the `.tar.idx` is written here.
        Closed by the run once it has taken what it needs (its workers end there)."""

    def read_part(self, shard: str, offset: int, size: int) -> bytes:
        """`size` bytes of `shard` from `offset` (for the wizard's preview)."""

    def checkpoint(self) -> ShardCheckpoint:
        """Where `--resume` keeps the shards' rows, and what says a shard is unchanged."""

    def media_reads(self, shards: list[str]) -> ShardReads:
        """How the media stage (`--media-metadata-by-*`) reads the parts of `shards`."""

    def indexed(self, tar_indexes: dict[str, Path]) -> None:
        """Every shard was indexed without a problem: `tar_indexes` gives each `.tar.idx` (its name in the
        dataset: the staged file, renamed when the index is committed). Called before the rest of the
        index is written and committed."""

    def index_growth(self, path: Path) -> IndexGrowth | None:
        """What to tell how far the `index.sqlite` being written at `path` (the staged file) is final, if
        anything is to be done with it meanwhile."""


@dataclass(frozen=True)
class PrepareOptions:
    """What a prepare is told up front (the flags of `shardprep prepare`)."""

    split_ratio: str | None = None
    split_parts: tuple[str, ...] = ()
    #: The ratio split shuffles the shards with this seed first; None keeps energon's sorted order.
    shuffle_seed: int | None = None
    exclude: str | None = None
    num_workers: int | None = None
    tar_index_only: bool = False
    force_overwrite: bool = False
    #: energon sample type for dataset.yaml (`CrudeWebdataset` for crude); None: none (or ask).
    sample_type: str | None = None
    field_map: str | None = None
    skip_dataset_yaml: bool = False
    dataset_yaml_name: str = DATASET_YAML
    #: A finished dataset.yaml text to write as it is, instead of one made from the sample type.
    dataset_yaml: str | None = None
    #: Refuse shards that end without the end-of-archive marker (by default they are indexed, with a warning).
    strict: bool = False
    #: Where shards are scanned: "local" (worker processes here) or "ray" (Ray tasks, `prep.engines`).
    engine: str = LOCAL
    #: With the "ray" engine, the cluster to use; None starts a local Ray instance for the run.
    ray_address: str | None = None
    #: Keep each shard's rows as it is indexed, and reuse those an interrupted run kept (`prepare.resume`).
    resume: bool = False
    #: Describe media parts into index.sqlite (`--media-metadata-by-*`, `prep.media.filter`); None: not.
    media_filter: MediaFilter | None = None
    #: Rename members in place first so that keys are unique across shards, as energon's
    #: --fix-duplicates does (`prep.prepare.fix_duplicates`).
    fix_duplicates: bool = False

    def __post_init__(self) -> None:
        worker_count(self.num_workers, 1)
        if self.media_filter is not None and self.tar_index_only:
            raise PrepError(
                "--media-metadata-by-... cannot be combined with --tar-index-only (as in energon)."
            )
        check_engine(self.engine, self.ray_address)
        # An unknown sample type, a bad field map or a crude one are refused before any work.
        field_map = parse_field_map(self.field_map) if self.field_map is not None else None
        if self.sample_type is not None:
            check_definition(find_sample_type(self.sample_type), field_map)
        if not (self.skip_dataset_yaml or self.tar_index_only):
            check_dataset_yaml_name(self.dataset_yaml_name)


class StagedIndex:
    """A dataset's new index, written to staging but not yet in place: `commit()` it, or leave the `with`
    block without committing to discard it."""

    def __init__(self, root: Path, shards: list[str], staging: Staging, file_mode: int | None) -> None:
        self.root = root
        self.shards = shards
        self.staging = staging
        self.file_mode = file_mode
        self.shard_counts: dict[str, int] = {}
        self.part_names: list[str] = []
        #: The first samples of the first shard: [(key, [(part, offset, size)])], for the wizard's preview.
        self.first_samples: list[tuple[str, list[tuple[str, int, int]]]] = []
        #: Shards indexed to their end because the end-of-archive marker is missing.
        self.without_end_marker: list[str] = []
        #: (shard, offset) of shards with data after their end-of-archive marker, which is not indexed.
        self.data_after_end: list[tuple[str, int]] = []
        #: Where the shards are read, when not below `root` (`ShardSource`).
        self.source: ShardSource | None = None

    def write_meta(self, name: str, text: str) -> None:
        """Write `.nv-meta/NAME` into the staged index, with the permissions energon gives its files. A
        symbolic link carried over from the previous index is replaced by the file, not written through:
        its target is outside the staged index, and a run that fails must leave it as it was."""
        path = self.staging.meta_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)  # a name may be in a sub-folder: configs/x.yaml
        if path.is_symlink():
            path.unlink()
        path.write_text(text)
        if self.file_mode is not None:
            os.chmod(path, self.file_mode)

    def meta_exists(self, name: str) -> bool:
        """Whether `.nv-meta/NAME` exists (carried over from the previous index or written in this run)."""
        return self.staging.meta_file(name).is_file()

    @property
    def name(self) -> str:
        """How messages name the dataset: its folder, or its bucket address."""
        return dataset_name(self.root, self.source)

    def read_part(self, shard: str, offset: int, size: int) -> bytes:
        if self.source is not None:
            return self.source.read_part(shard, offset, size)
        with open(self.root / shard, "rb") as file:
            return os.pread(file.fileno(), size, offset)

    def commit(self) -> None:
        self.staging.commit()

    def __enter__(self) -> StagedIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.staging.__exit__(*exc_info)


def dataset_name(root: Path, source: ShardSource | None) -> str:
    """How messages name the dataset whose index is built in `root`."""
    return source.name if source is not None else str(root)


class Wizard(Protocol):
    """What a prepare tells and asks its user, at each stage."""

    def go_over_existing(self, name: str) -> bool:
        """Dataset `name` has an index already: prepare it again?"""

    def shards_found(self, shards: list[str]) -> None:
        """The shards that will be indexed."""

    def shards_reused(self, reused: int, total: int) -> None:
        """With --resume: `reused` of the `total` shards were finished by an earlier run and are not scanned."""

    def shards_without_end_marker(self, shards: list[str]) -> None:
        """Shards that end right after their last member, without the end-of-archive marker: indexed as
        GNU tar, tarfile and energon read them, but perhaps cut short."""

    def shards_with_data_after_end(self, shards: list[tuple[str, int]]) -> None:
        """(shard, offset) of shards holding data after their end-of-archive marker, where every reader
        stops: indexed to the marker, as energon does, but that data is lost to training."""

    def split_ratio(self) -> str:
        """The train/val/test ratio, when the options give no split."""

    def media_not_described(self, count: int) -> None:
        """`count` audio/video parts matched the media filter but got no metadata (not read yet)."""

    def media_lost(self, warning: str) -> None:
        """The old index's media metadata could not be carried over (`keep_old_media`'s warning)."""

    def dataset_definition(self, staged: StagedIndex) -> DatasetDefinition | None:
        """After indexing: what to write as dataset.yaml (and sample_loader.py), or None for nothing."""

    def fixing_duplicates(self, line: str) -> None:
        """One line of what --fix-duplicates finds and does (energon's lines, and each shard renamed)."""


class Unattended:
    """The wizard without a user: the options decide, a missing answer is an error, nothing is printed."""

    def __init__(self, options: PrepareOptions) -> None:
        self.options = options

    def go_over_existing(self, name: str) -> bool:
        if self.options.force_overwrite:
            return True
        raise PrepError(f"{name} has already been prepared. Use --force-overwrite to prepare it again.")

    def shards_found(self, shards: list[str]) -> None:
        pass

    def shards_reused(self, reused: int, total: int) -> None:
        pass

    def fixing_duplicates(self, line: str) -> None:
        pass

    def shards_without_end_marker(self, shards: list[str]) -> None:
        warnings.warn(without_end_marker_warning(shards), stacklevel=4)

    def shards_with_data_after_end(self, shards: list[tuple[str, int]]) -> None:
        warnings.warn(data_after_end_warning(shards), stacklevel=4)

    def media_not_described(self, count: int) -> None:
        warnings.warn(skipped_av_warning(count), stacklevel=4)

    def media_lost(self, warning: str) -> None:
        warnings.warn(warning, stacklevel=4)

    def split_ratio(self) -> str:
        raise PrepError(
            "--split-ratio is required with --non-interactive (unless --split-parts or --tar-index-only"
            " is given), e.g. --split-ratio 8,1,1."
        )

    def dataset_definition(self, staged: StagedIndex) -> DatasetDefinition | None:
        options = self.options
        if options.skip_dataset_yaml:
            return None
        if options.dataset_yaml is not None:
            return DatasetDefinition(options.dataset_yaml)
        if options.sample_type is None:
            return None
        field_map = parse_field_map(options.field_map) if options.field_map is not None else None
        definition = define_dataset(find_sample_type(options.sample_type), field_map, loader_parts(staged))
        if definition.sample_loader is not None and staged.meta_exists(SAMPLE_LOADER_PY):
            return DatasetDefinition(definition.yaml)  # keep the user's edited loader
        return definition


#: What to do about a shard with data after its end-of-archive marker.
DATA_AFTER_END_ADVICE = (
    "To keep that data, put the shard's members into one archive and replace the shard with it, e.g. with"
    f" GNU tar: `{repack_command('SHARD')}`."
)


def without_end_marker_warning(shards: list[str]) -> str:
    """The one warning for every shard that lacks the end-of-archive marker."""
    listed = ", ".join(shards[:MAX_REPORTED_ERRORS])
    more = f" and {len(shards) - MAX_REPORTED_ERRORS} more" if len(shards) > MAX_REPORTED_ERRORS else ""
    return (
        f"{len(shards)} shard(s) end without the end-of-archive marker (two zero blocks) and were indexed to"
        f" their end, as GNU tar, tarfile and energon read them: {listed}{more}. Such a shard may have been"
        " cut short at a member boundary; check that its last samples are complete (shardprep verify), or"
        " run with --strict to refuse such shards."
    )


def data_after_end_warning(shards: list[tuple[str, int]]) -> str:
    """The one warning for every shard that holds data after its end-of-archive marker."""
    listed = ", ".join(f"{shard} (at byte {offset:,})" for shard, offset in shards[:MAX_REPORTED_ERRORS])
    more = f" and {len(shards) - MAX_REPORTED_ERRORS} more" if len(shards) > MAX_REPORTED_ERRORS else ""
    return (
        f"{len(shards)} shard(s) hold data after their end-of-archive marker, where GNU tar, tarfile and"
        f" energon stop reading, so it is not indexed: {listed}{more}. Such a shard is often two archives"
        f" joined end to end (`cat a.tar b.tar`), the second of which no reader sees. {DATA_AFTER_END_ADVICE}"
        " --strict refuses such shards."
    )


def loader_parts(staged: StagedIndex) -> list[str]:
    """The parts a new sample_loader.py's `part_filter` keeps: all of them, unless there are too many."""
    return staged.part_names if len(staged.part_names) <= MAX_FIELD_MAP_PARTS else ["TODO"]


def prepare(
    root: Path,
    options: PrepareOptions,
    wizard: Wizard | None = None,
    progress: ShardProgress | None = None,
    media_progress: ShardProgress | None = None,
    source: ShardSource | None = None,
) -> dict[str, int] | None:
    """Prepare the dataset at `root` and return its shard counts (shard name -> samples, in `.info.json`
    order); None if the wizard declined to go over an existing index. `media_progress` is told of the
    media stage's shards, as `progress` is of the indexing. With a `source`, the shards are read from it
    and `root` holds only the index being built."""
    wizard = wizard or Unattended(options)
    check_dataset_root(root)
    with plain_io_errors(dataset_name(root, source), "prepare"), dataset_lock(root, "prepare"):
        return _prepare_locked(root, options, wizard, progress, media_progress, source)


def _prepare_locked(
    root: Path,
    options: PrepareOptions,
    wizard: Wizard,
    progress: ShardProgress | None,
    media_progress: ShardProgress | None = None,
    source: ShardSource | None = None,
) -> dict[str, int] | None:
    name = dataset_name(root, source)
    if options.tar_index_only:
        shards, split = reindexed_shards(root, options.exclude, name), None
        _check_index_files(root, shards, source)
    else:
        if is_prepared(root) and not wizard.go_over_existing(name):
            return None
        if source is not None:
            shards = source.list_shards(options.exclude)
        else:
            shards = list_dataset_shards(root, options.exclude)
        _check_index_files(root, shards, source)
        wizard.shards_found(shards)
        split = choose_split(options, wizard)
    # --fix-duplicates (prep.prepare.fix_duplicates): keys made unique in place before the scan; without
    # it, a fix an earlier run left unfinished stops the run.
    if options.fix_duplicates:
        fix_duplicates(root, shards, options.num_workers, wizard.fixing_duplicates)
    else:
        refuse_unfinished_fix(root)
    checkpoint = None
    if options.resume:
        checkpoint = ShardCheckpoint(root) if source is None else source.checkpoint()
        wizard.shards_reused(len(checkpoint.check(shards)), len(shards))
    with stage_index(
        root,
        shards,
        split=split,
        num_workers=options.num_workers,
        progress=progress,
        strict=options.strict,
        engine=options.engine,
        ray_address=options.ray_address,
        checkpoint=checkpoint,
        source=source,
    ) as staged:
        if staged.without_end_marker:
            wizard.shards_without_end_marker(staged.without_end_marker)
        if staged.data_after_end:
            wizard.shards_with_data_after_end(staged.data_after_end)
        index = staged.staging.meta_file(INDEX_SQLITE)
        if options.media_filter is not None:
            workers = worker_count(options.num_workers, len(shards))
            reads = None if source is None else source.media_reads(shards)
            media = add_media_metadata(
                root, shards, index, options.media_filter, workers, media_progress, reads=reads
            )
            if media.skipped_av:
                wizard.media_not_described(media.skipped_av)
        elif (staged.staging.meta / INDEX_SQLITE).is_file():  # (a bucket's, where it has media tables)
            lost = keep_old_media(name, staged.staging.meta / INDEX_SQLITE, index)
            if lost is not None:
                wizard.media_lost(lost)
        if split is not None:
            definition = wizard.dataset_definition(staged)
            if definition is not None:
                staged.write_meta(options.dataset_yaml_name, definition.yaml)
                if definition.sample_loader is not None:
                    staged.write_meta(SAMPLE_LOADER_PY, definition.sample_loader)
        staged.commit()
    if source is None:  # (a bucket's is removed once the index is uploaded)
        ShardCheckpoint(root).remove()  # what an interrupted run kept is for an index now replaced
    return staged.shard_counts


def choose_split(options: PrepareOptions, wizard: Wizard) -> SplitSpec:
    """The split the options give (`--split-parts` wins over `--split-ratio`), or the one the wizard gets."""
    if options.split_parts:
        return SplitSpec(patterns=parse_split_parts(options.split_parts))
    ratio = options.split_ratio if options.split_ratio is not None else wizard.split_ratio()
    return SplitSpec(ratio=parse_split_ratio(ratio), shuffle_seed=options.shuffle_seed)


def prepare_dataset(
    root: str | Path,
    *,
    split_ratio: str | None = None,
    split_parts: list[str] | None = None,
    shuffle_seed: int | None = SHUFFLE_SEED,
    exclude: str | None = None,
    num_workers: int | None = None,
    tar_index_only: bool = False,
    dataset_yaml: str | None = None,
    dataset_yaml_name: str = DATASET_YAML,
    sample_type: str | None = None,
    field_map: str | None = None,
    force_overwrite: bool = True,
    strict: bool = False,
    engine: str = LOCAL,
    ray_address: str | None = None,
    resume: bool = False,
    fix_duplicates: bool = False,
) -> dict[str, int]:
    """Prepare the dataset at `root` non-interactively and return its shard counts.

    `split_ratio` ("8,1,1", default "1,0,0") assigns whole shards, shuffled with
    `random.Random(shuffle_seed)` (None keeps the sorted order); `split_parts` (["train:train/.*", ...])
    assigns by brace-expanded regex instead. `dataset_yaml` is the text of `.nv-meta/<dataset_yaml_name>`
    to write with the index; or name a `sample_type` (and a `field_map` JSON) to have one made. An
    existing index is replaced unless `force_overwrite` is False. A shard that ends without the
    end-of-archive marker is indexed with a warning (`warnings.warn`), or refused if `strict`.
    `engine="ray"` scans the shards as Ray tasks, on the cluster at `ray_address` or a local Ray instance.
    With `resume`, each shard's rows are kept as it is indexed and those an interrupted run kept are reused.
    `fix_duplicates` renames members in place first when a key is in two shards, as energon does.
    """
    options = PrepareOptions(
        split_ratio=split_ratio if split_ratio is not None or split_parts else "1,0,0",
        split_parts=tuple(split_parts or ()),
        shuffle_seed=shuffle_seed,
        exclude=exclude,
        num_workers=num_workers,
        tar_index_only=tar_index_only,
        force_overwrite=force_overwrite,
        sample_type=sample_type,
        field_map=field_map,
        dataset_yaml=dataset_yaml,
        dataset_yaml_name=dataset_yaml_name,
        strict=strict,
        engine=engine,
        ray_address=ray_address,
        fix_duplicates=fix_duplicates,
        resume=resume,
    )
    shard_counts = prepare(Path(root), options)
    assert shard_counts is not None  # Unattended never declines: it goes over an index or raises
    return shard_counts


def stage_index(
    root: Path,
    shards: list[str],
    *,
    split: SplitSpec | None,
    num_workers: int | None = None,
    progress: ShardProgress | None = None,
    strict: bool = False,
    engine: str = LOCAL,
    ray_address: str | None = None,
    checkpoint: ShardCheckpoint | None = None,
    source: ShardSource | None = None,
) -> StagedIndex:
    """Index `shards` under `root` into a staging area: `.tar.idx` files, `index.sqlite`, `index.uuid`,
    `.info.json` and, when `split` is given, `split.yaml`. Nothing is in place until `commit()`.

    With `split=None` (energon's --tar-index-only) `.info.json` and `split.yaml` are not rewritten. With
    `strict`, a shard without the end-of-archive marker is an error; otherwise it is listed in
    `without_end_marker`. `engine` and `ray_address` say where the shards are scanned (`_scanned`); a
    `checkpoint` (already `check`ed) gives the rows of the shards it holds and keeps those scanned.
    """
    if not shards:
        raise PrepError(f"No shards to index under {root}.")
    workers = worker_count(num_workers, len(shards))
    meta_mode, file_mode = _permissions(root, root / shards[0])
    with ExitStack() as on_error:
        staging = on_error.enter_context(Staging(root, meta_mode=meta_mode))
        staged = StagedIndex(root, shards, staging, file_mode)
        staged.source = source
        _insert_rows(staged, workers, progress, strict, engine, ray_address, checkpoint)
        _write_meta(staged, split)
        on_error.pop_all()  # success: the caller owns the staging now
    return staged


def _check_index_files(root: Path, shards: list[str], source: ShardSource | None) -> None:
    """A PrepError for shards whose `.tar.idx` cannot be written: in a local dataset, its name would be
    longer than a file name may be (a shard's name takes up to NAME_MAX bytes, and `.idx` adds four; a
    bucket's is built under its `local_path` and goes up under its own name, as energon writes it there);
    another shard's index has it (`a.tar` and `a.tgz`), or a folder has it (in a bucket, one of shards:
    `a.tar.idx/b.tar`); or for shards in a bucket whose key energon's loader reads as another
    (`is_plain_name`)."""
    if source is not None:
        unplain = [shard for shard in shards if not is_plain_name(shard)]
        if unplain:
            others = f" (and {len(unplain) - 1} more)" if len(unplain) > 1 else ""
            raise PrepError(
                f"Shard {unplain[0]!r}{others} in {source.name}: energon's loader reads a key with an empty"
                " part (a leading or doubled '/'), a '.' or a '..' part as another key (it drops or resolves"
                " such parts), so it could not load this shard. Rename the object, or leave it out with"
                " --exclude."
            )
    too_long = [
        shard
        for shard in shards
        if source is None and len(os.fsencode(PurePosixPath(tar_index_name(shard)).name)) > NAME_MAX
    ]
    if too_long:
        others = f" (and {len(too_long) - 1} more)" if len(too_long) > 1 else ""
        raise PrepError(
            f"{too_long[0]}{others}: the name of its index file, {PurePosixPath(too_long[0]).name}.idx, would"
            f" be longer than the {NAME_MAX} bytes a file name may have, so it cannot be written. Give the"
            " shard a shorter name."
        )
    first_with: dict[str, str] = {}
    for shard in shards:
        other = first_with.setdefault(tar_index_name(shard), shard)
        if other != shard:
            raise PrepError(
                f"{other} and {shard} would both have their index in {tar_index_name(shard)} (energon names a"
                " shard's index file by replacing its suffix), so one index would overwrite the other. Rename"
                " one of the two shards, or leave one out with --exclude."
            )
    if source is None:
        folders = [shard for shard in shards if (root / tar_index_name(shard)).is_dir()]
        where = str(root)
    else:  # the index is built in a local folder first
        holding = enclosing_folders(shards)
        folders = [shard for shard in shards if tar_index_name(shard) in holding]
        where = source.name
    if folders:
        others = f" (and {len(folders) - 1} more)" if len(folders) > 1 else ""
        raise PrepError(
            f"{where}/{tar_index_name(folders[0])}{others} is a folder, where prepare writes the index file"
            " of the shard beside it. Remove or rename the folder, then run again."
        )


def _insert_rows(
    staged: StagedIndex,
    workers: int,
    progress: ShardProgress | None,
    strict: bool,
    engine: str = LOCAL,
    ray_address: str | None = None,
    checkpoint: ShardCheckpoint | None = None,
) -> None:
    """Scan every shard in the workers and insert its rows as it comes back, in shard order; every bad
    shard is reported, in one error."""
    root, shards, staging = staged.root, staged.shards, staged.staging
    tar_indexes = [staging.tar_index_file(shard, fitted=staged.source is not None) for shard in shards]
    tasks = [
        (str(root), shard, i, str(path))
        for i, (shard, path) in enumerate(zip(shards, tar_indexes, strict=True))
    ]
    errors: list[PrepError] = []
    part_names: set[str] = set()
    sqlite_path = staging.meta_file(INDEX_SQLITE)
    growth = staged.source.index_growth(sqlite_path) if staged.source is not None else None
    with (
        SqliteIndexWriter(sqlite_path, shards, growth) as writer,
        _scanned(_not_reused(tasks, checkpoint), workers, engine, ray_address, staged.source) as scanned,
    ):
        results = _resumed(tasks, scanned, checkpoint) if checkpoint is not None else scanned
        samples = reused_shards = reused_samples = 0
        reusable = checkpoint.reusable if checkpoint is not None else set()
        for done, result in enumerate(results, 1):
            failed = _add_shard(staged, writer, result, strict, errors)
            count = 0 if failed or isinstance(result, ShardError) else result.count
            samples += count
            if done - 1 in reusable:  # results come in task order: this one came from the checkpoint
                reused_shards, reused_samples = reused_shards + 1, reused_samples + count
            if progress is not None:
                reused = (reused_shards, len(reusable), reused_samples)
                progress(IndexProgress(done, len(tasks), samples, failed, reused))
            if failed or errors:
                continue  # keep scanning to report every bad shard, but stop building
            assert isinstance(result, ShardRows)
            if len(part_names) < MAX_PART_NAMES:
                part_names.update(result.distinct_part_names())
            if result.tar_file_id == 0:
                staged.first_samples = result.first_samples(PREVIEW_SAMPLES)
        if errors:
            raise errors_report(errors, "problems; nothing was written and the previous index is untouched:")
        if staged.source is not None:  # (a bucket's source uploads the `.tar.idx` files from here on)
            staged.source.indexed(dict(zip(map(tar_index_name, shards), tar_indexes, strict=True)))
        writer.finish()
    staged.part_names = sorted(part_names)
    if staged.file_mode is not None:
        os.chmod(sqlite_path, staged.file_mode)
    for shard, path in zip(shards, tar_indexes, strict=True):  # each shard's mode plus rw for the owner
        try:
            os.chmod(path, stat.S_IMODE((root / shard).stat().st_mode) | 0o600)
        except OSError:
            pass


def _add_shard(
    staged: StagedIndex,
    writer: SqliteIndexWriter,
    result: ShardRows | ShardError,
    strict: bool,
    errors: list[PrepError],
) -> PrepError | None:
    """Insert one shard's rows (unless an earlier shard failed); its problem, if it has one, goes to
    `errors` and is returned."""
    problem: PrepError | None = None
    if isinstance(result, ShardError):
        problem = result
    elif not result.end_marker and strict:
        problem = _no_end_marker(result.shard, result.end)
    elif result.after_end is not None and strict:
        problem = _data_after_end(result.shard, result.end, result.after_end)
    else:
        if not result.end_marker:
            staged.without_end_marker.append(result.shard)
        if result.after_end is not None:
            staged.data_after_end.append((result.shard, result.after_end))
        if errors:
            return None
        try:
            writer.add_rows(result)
            staged.shard_counts[result.shard] = result.count
        except DuplicateKeyError as error:
            problem = error
    if problem is not None:
        errors.append(problem)
    return problem


@contextmanager
def _scanned(
    tasks: list[tuple[str, str, int, str]],
    workers: int,
    engine: str,
    ray_address: str | None,
    source: ShardSource | None = None,
) -> Iterator[Iterator[ShardRows | ShardError]]:
    """Each shard task `(root, shard, tar_file_id, staged .tar.idx)` scanned, its result in task order: in
    worker processes here, which write the `.tar.idx` themselves, or as Ray tasks, whose rows come back
    for this process to write it (a Ray worker may be on a machine that cannot see the staging); or by
    the `source` the shards are in, the `.tar.idx` written here."""
    # Each iterator is closed on the way out, an interrupt included: its workers end there, before the
    # caller's staging is removed (left to the garbage collector, a worker could still be writing a staged
    # `.tar.idx` after the staging was gone).
    if source is not None:
        with closing(_tar_indexes_written(source.scan(tasks, workers), [task[3] for task in tasks])) as scans:
            yield scans
        return
    if engine == LOCAL:
        with closing(
            ordered_map(index_shard, tasks, workers, what="indexing shards", preload="prep.tar.scan")
        ) as scans:
            yield scans
        return
    from prep.engines.ray_cluster import RayEngine  # Ray is slow to import: only for --engine ray

    with RayEngine(ray_address, workers) as cluster:
        # Absolute: a Ray worker does not run in this process's folder.
        remote = [(os.path.abspath(root), shard, tar_file_id) for root, shard, tar_file_id, _ in tasks]
        scans = cluster.ordered_map(scan_shard, remote, what="indexing shards", name=lambda task: task[1])
        with closing(_tar_indexes_written(scans, [task[3] for task in tasks])) as written:
            yield written


def _not_reused(
    tasks: list[tuple[str, str, int, str]], checkpoint: ShardCheckpoint | None
) -> list[tuple[str, str, int, str]]:
    """The shard tasks to scan: all of them, or those the checkpoint holds no valid rows for."""
    if checkpoint is None:
        return tasks
    return [task for position, task in enumerate(tasks) if position not in checkpoint.reusable]


def _resumed(
    tasks: list[tuple[str, str, int, str]],
    scanned: Iterator[ShardRows | ShardError],
    checkpoint: ShardCheckpoint,
) -> Iterator[ShardRows | ShardError]:
    """Every shard's result in task order: the saved rows of a shard an earlier run finished (its staged
    `.tar.idx` written here), or the next scanned one, which is saved as it passes."""
    for position, (_, shard, tar_file_id, tar_index) in enumerate(tasks):
        if position in checkpoint.reusable:
            rows = checkpoint.load(shard, tar_file_id)
            write_tar_index(Path(tar_index), rows)
            yield rows
            continue
        result = next(scanned)
        if isinstance(result, ShardRows):
            checkpoint.save(result)
        yield result


def _tar_indexes_written(
    results: Generator[ShardRows | ShardError], tar_indexes: list[str]
) -> Iterator[ShardRows | ShardError]:
    """`results`, each shard's staged `.tar.idx` written here from its rows as it passes; `results` is
    closed when this is. A --resume run takes no result past the last, so `results` is left unfinished:
    closed by the garbage collector, what its close raised (a Ctrl-C while it stopped its workers) was
    printed and dropped, and the run went on."""
    with closing(results):
        for result, path in zip(results, tar_indexes, strict=False):
            if isinstance(result, ShardRows):
                write_tar_index(Path(path), result)
            yield result


def _write_meta(staged: StagedIndex, split: SplitSpec | None) -> None:
    """`index.uuid`, and unless only the shard indexes are rebuilt, `.info.json` and `split.yaml`."""
    staging, counts = staged.staging, staged.shard_counts
    staged.write_meta(INDEX_UUID, new_index_uuid())
    if split is None:  # --tar-index-only: a legacy .info.yaml gains the .info.json energon now reads
        if staging.meta_file(INFO_YAML).is_file() and not staging.meta_file(INFO_JSON).is_file():
            staged.write_meta(INFO_JSON, info_json_from_yaml(staging.meta_file(INFO_JSON).parent))
        return
    staged.write_meta(INFO_JSON, info_json_text(counts))
    if staging.meta_file(INFO_YAML).is_file():
        staged.write_meta(INFO_YAML, info_yaml_text(counts))
    staged.write_meta(SPLIT_YAML, split_yaml_text(split.assign(staged.shards)))


def _permissions(root: Path, first_shard: Path) -> tuple[int | None, int | None]:
    """energon's permissions for new index files: the folder's mode plus rwx for the owner, the first
    shard's mode plus rw for the owner."""
    try:
        meta_mode = stat.S_IMODE(root.stat().st_mode) | 0o700
        file_mode = stat.S_IMODE(first_shard.stat().st_mode) | 0o600
        return meta_mode, file_mode
    except OSError:
        return None, None


def _data_after_end(shard: str, end: int, after: int) -> ShardError:
    return ShardError(
        shard,
        f"holds data after its end-of-archive marker (which starts at byte {end:,}), where GNU tar, tarfile"
        " and energon stop reading: perhaps a second archive joined on with `cat`, which --strict refuses.",
        offset=after,
        advice=DATA_AFTER_END_ADVICE + " Without --strict it is indexed up to the marker, as energon does.",
    )


def _no_end_marker(shard: str, end: int) -> ShardError:
    return ShardError(
        shard,
        "ends right after its last member, without the end-of-archive marker (two zero blocks) that tar"
        " writers put there: it may have been cut short at a member boundary, and --strict refuses it.",
        offset=end,
        advice="Check the shard's last samples; without --strict it is indexed to its end, as GNU tar,"
        " tarfile and energon read it.",
    )
