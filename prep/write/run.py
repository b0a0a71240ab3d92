"""`write`: raw records to a prepared dataset in one pass — shards, `.tar.idx` and `.nv-meta` together.

    >>> import shutil, tempfile
    >>> out = Path(tempfile.mkdtemp()) / "out"
    >>> summary = write_dataset([{"__key__": "a", "txt": "hello"}, {"__key__": "b", "txt": "world"}], out)
    >>> summary.samples, summary.shard_names, sorted(path.name for path in (out / ".nv-meta").iterdir())
    (2, ['shard-000000.tar'], ['.info.json', 'dataset.yaml', 'index.sqlite', 'index.uuid', 'split.yaml'])
    >>> shutil.rmtree(out.parent)

Each record goes through four stages, in order; a stage that cannot take it raises `Rejected`, and the
run then stops (`--on-error stop`) or lists the record in a rejects file and goes on (`skip`):

1. key (`keys.SampleKeys`): from `__key__`, the folder stem or `--key-column`, or generated;
2. split (`splits.group_of`, `splits.split_for`): a seeded hash of its group picks the split;
3. parts (`parts.record_parts`): fields encoded by extension, media split off for the aux dataset;
4. sink (`WriteRun.add`): the split's shard writer, or first the group spool (`--group-contiguous`).

A plain JSONL file (generated keys, each line as the `json` part, one split, `--on-error stop`) skips
the loop: its shards are planned from the line lengths and written on every core (`jsonl_parallel`), or
with `--engine ray` as Ray tasks (`prep.engines.ray_cluster`). Other JSONL, CSV and Parquet files with
`--engine ray`, and every write with `--resume` (on either engine), go in blocks read in parallel
(`blockwise`), with the same bytes as the loop writes; `--resume` keeps each finished block and shard
beside OUT_DIR for a rerun (`resume`).
The shards, their `.tar.idx` and `.nv-meta` are built in staging (`build.DatasetBuild`) and nothing is
in place until everything is written; the whole run holds OUT_DIR's lock (`prep.index.lock`), and a full
disk or a refused write is reported plainly (`prep.errors.plain_io_errors`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prep.engines import LOCAL, RAY
from prep.errors import PrepError, plain_io_errors
from prep.index.checkpoint import RESUME_DIR, Checkpoint
from prep.index.dataset_yaml import CRUDE_CLASS, DatasetDefinition, define_dataset, find_sample_type
from prep.index.format import INDEX_SQLITE, META_DIR, METADATASET_YAML
from prep.index.lock import LOCK_FILE, dataset_lock
from prep.index.media import MediaSummary, add_folder_media_metadata
from prep.index.staging import Staging, commit_together
from prep.media.filter import MediaFilter
from prep.processes import in_child, worker_count
from prep.progress import time_left
from prep.tar.fields import END_OF_ARCHIVE
from prep.write.blockwise import engine_map, refusal, write_in_blocks
from prep.write.build import DatasetBuild, ShardSlot, ShardWritten
from prep.write.jsonl_parallel import ShardDone, ShardJob, plan_shards, write_planned_shard
from prep.write.keys import Rejected, SampleKeys, path_problem
from prep.write.options import WriteOptions
from prep.write.parts import Parts, check_field_map, parts_written
from prep.write.polylithic import AUX_FOLDER, PRIMARY_FOLDER, metadataset_yaml
from prep.write.resume import WriteCheckpoint
from prep.write.shards import sample_tar_bytes
from prep.write.sources import DictSource, Record, Reject, Source
from prep.write.sources.jsonl import JsonlSource
from prep.write.splits import GroupSpool
from prep.write.stages import stage_record

REJECTS_FILE = "rejects.jsonl"
#: Records between two progress reports.
PROGRESS_EVERY = 1024


class BadInputError(PrepError):
    """Input that cannot become a sample, with `on_error="stop"`: names `file:line` and the reason."""


@dataclass
class WriteProgress:
    samples: int
    bytes: int
    rejects: int
    seconds: float
    #: Where a run of several stages is (`write --engine ray`): its stage, and pieces done of the total.
    stage: str = ""
    done: int = 0
    total: int = 0
    #: Seconds the stage will take yet, at its pace so far (None: not known yet).
    eta: float | None = None
    #: Of `samples` and `bytes`, those of blocks an earlier run encoded (`--resume`): they took this run
    #: no time, so a rate leaves them out.
    reused_samples: int = 0
    reused_bytes: int = 0


@dataclass
class WriteSummary:
    """What a write produced."""

    out_dir: Path
    samples_per_split: dict[str, int]
    shards: int
    bytes: int
    rejects: int
    rejects_path: Path | None
    seconds: float
    dataset: Path
    aux: Path | None = None
    metadataset: Path | None = None
    oversize_groups: int = 0
    shard_names: list[str] = field(default_factory=list)
    #: With --resume: shards an earlier run finished and this one reused, shards in all, and the same of
    #: blocks read (`blockwise`).
    resumed: tuple[int, int, int, int] | None = None
    #: With a media filter: media rows written (primary and auxiliary dataset together), None without.
    media: MediaSummary | None = None

    @property
    def samples(self) -> int:
        return sum(self.samples_per_split.values())


class WriteRun:
    """One write under way: the primary (and aux) dataset builds, the rejects, the counts.

    A context manager: leaving it without `commit` removes everything the run wrote and leaves `out_dir`
    as it was.
    """

    def __init__(
        self,
        out_dir: Path,
        options: WriteOptions,
        progress: Callable[[WriteProgress], None] | None,
        on_shard: ShardWritten | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.options = options
        self.started = time.perf_counter()
        self.progress = progress
        limits, pattern = options.limits, options.shard_pattern
        with ExitStack() as stack:  # each part discards what it staged unless committed
            # Files beside the datasets (rejects, the aux folder, the metadataset), put in place last.
            self.staging = stack.enter_context(Staging(out_dir, meta=False))
            root = out_dir / PRIMARY_FOLDER if options.polylithic else out_dir
            build = DatasetBuild(root, limits=limits, pattern=pattern, on_shard=on_shard)
            self.primary = stack.enter_context(build)
            self.aux_build: DatasetBuild | None = None
            self.aux_folder: Path | None = None
            if options.polylithic and options.aux_format == "tar":
                aux = DatasetBuild(out_dir / AUX_FOLDER, limits=limits, pattern=pattern, on_shard=on_shard)
                self.aux_build = stack.enter_context(aux)
            elif options.polylithic:
                self.aux_folder = self.staging.temp_path(out_dir / AUX_FOLDER)
                self.aux_folder.mkdir()
            self._staged = stack.pop_all()
        self.rejects_path = options.rejects or out_dir / REJECTS_FILE
        self.rejects_file = None
        self.rejects = 0
        #: `where: reason` of the first input rejected, for the message when nothing is left to write.
        self.first_reject = ""
        self.samples = 0
        self.bytes = 0
        #: Of those, the samples and bytes of blocks an earlier run encoded (`--resume`).
        self.reused_samples = 0
        self.reused_bytes = 0
        self.spool = (
            GroupSpool(self.primary.staging.meta_file("groups.spool")) if options.group_contiguous else None
        )
        self.oversize_groups = 0
        #: The part names written so far, kept only to check --field-map at the end (`finish`).
        self.part_names: set[str] | None = None
        self.resumed: tuple[int, int, int, int] | None = None
        self._stage_started = self.started
        #: (path relative to the aux folder, size) of each media file written there, for its media index.
        self.aux_files: list[tuple[str, int]] = []
        self.media: MediaSummary | None = None

    # -- the error policy and progress ----------------------------------------------------------------
    def reject(self, where: str, reason: str, text: str = "") -> None:
        """Stop the run on bad input (`--on-error stop`), or list it in the rejects file and go on."""
        if self.options.on_error == "stop":
            raise BadInputError(
                f"{where}: {reason}. Nothing was written. Fix the input, or pass --on-error skip to skip"
                " such input and list it in a rejects file."
            )
        if self.rejects_file is None:
            self.first_reject = f"{where}: {reason}"
            self.rejects_file = open(self.staging.temp_path(self.rejects_path), "w", encoding="utf-8")  # noqa: SIM115
        self.rejects_file.write(
            json.dumps({"where": where, "reason": reason, "input": text}, ensure_ascii=False) + "\n"
        )
        self.rejects += 1

    def report(self, every: int = 1) -> None:
        """Tell the progress callback where the run is (only every `every` records)."""
        if self.progress is not None and (self.samples + self.rejects) % every == 0:
            self.progress(
                WriteProgress(
                    self.samples,
                    self.bytes,
                    self.rejects,
                    time.perf_counter() - self.started,
                    reused_samples=self.reused_samples,
                    reused_bytes=self.reused_bytes,
                )
            )

    def stage(self, stage: str, done: int, total: int, reused: tuple[int, int] = (0, 0)) -> None:
        """Tell the progress callback that `done` of the `total` pieces of `stage` are done (0 when the
        stage starts); `reused` is (pieces taken from an earlier run so far, such pieces in all), which
        the stage's pace leaves out."""
        now = time.perf_counter()
        if done == 0:
            self._stage_started = now
        if self.progress is not None:
            eta = time_left(now - self._stage_started, done, total, reused)
            seconds = now - self.started
            self.progress(
                WriteProgress(
                    self.samples,
                    self.bytes,
                    self.rejects,
                    seconds,
                    stage,
                    done,
                    total,
                    eta,
                    self.reused_samples,
                    self.reused_bytes,
                )
            )

    # -- the sink ---------------------------------------------------------------------------------------
    def add(self, key: str, group: str, split: str, parts: Parts, media: Parts) -> None:
        """Write one sample (to the group spool first, when groups stay contiguous) and its media."""
        if self.part_names is not None:
            self.part_names.update(part for part, _ in parts)
        if media:
            self._write_media(key, media)
        if self.spool is not None:
            self.spool.add(group, split, (key, parts))
        else:
            self._write_sample(split, key, parts)

    def _write_sample(self, split: str, key: str, parts: Parts, same_shard: bool = False) -> None:
        writer = self.primary.writer(split, self.options.split_folder(split))
        self.bytes += writer.write(key, parts, same_shard)
        self.samples += 1

    def _write_media(self, key: str, media: Parts) -> None:
        if self.aux_build is not None:
            self.bytes += self.aux_build.writer("train").write(key, media)
            return
        assert self.aux_folder is not None
        media_filter = self.options.media_filter
        for part, data in media:
            name = f"{key}.{part}"
            problem = path_problem(name)
            if problem is not None:  # the key and parts stages refuse such names; nothing is written outside
                raise PrepError(
                    f"Media file name {name!r} would leave {self.out_dir / AUX_FOLDER}: {problem}."
                )
            target = self.aux_folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            self.bytes += len(data)
            if media_filter is not None and media_filter.considers(target.name):
                self.aux_files.append((name, len(data)))

    def drain_groups(self) -> None:
        """Write the spooled groups, each whole in one shard (a new shard when it does not fit)."""
        if self.spool is None:
            return
        limits = self.options.limits
        for _, split, samples in self.spool.groups():
            writer = self.primary.writer(split, self.options.split_folder(split))
            nbytes = sum(sample_tar_bytes(key, parts) for key, parts in samples)
            if not writer.room_for(len(samples), nbytes):
                writer.finish_shard()
            if not limits.fits(len(samples), nbytes):
                self.oversize_groups += 1
            for number, (key, parts) in enumerate(samples):
                self._write_sample(split, key, parts, same_shard=number > 0)
        self.spool.close()
        self.spool = None

    # -- the end ----------------------------------------------------------------------------------------
    def finish(self, definition: DatasetDefinition, sources: list[Source]) -> None:
        """Write every index into staging (nothing is in place yet); a PrepError naming the `sources` if
        there is no sample, as energon refuses an empty dataset."""
        self.drain_groups()
        split_names = list(self.options.split_names)
        if not self.samples:
            names = ", ".join(source.name for source in sources)
            rejected = f" ({self.rejects:,} rejected, the first {self.first_reject})" if self.rejects else ""
            raise PrepError(
                f"{names}: no sample to write{rejected}. energon cannot load an empty dataset, so nothing"
                f" was written to {self.out_dir}. Check the SOURCE paths and their contents."
            )
        if self.part_names is not None:
            check_field_map(self.options.field_map, self.part_names)
        media, workers = self.options.media_filter, self.options.num_workers
        described = [self.primary.finish(split_names, definition, media, workers)]
        if self.aux_build is not None:
            crude = define_dataset(find_sample_type(CRUDE_CLASS))
            described.append(self.aux_build.finish(split_names, crude, media, workers))
        elif self.aux_folder is not None and media is not None:
            described.append(self._describe_aux_folder(media))
        if media is not None:
            self.media = MediaSummary(
                sum(summary.rows for summary in described if summary is not None),
                sum(summary.skipped_av for summary in described if summary is not None),
            )
        if self.rejects_file is not None:
            self.rejects_file.close()
        if self.options.polylithic:
            written = self.primary.split_counts(split_names)
            used = [name for name in split_names if written[name] or name == "train"]
            staged = self.staging.temp_path(self.out_dir / METADATASET_YAML)
            staged.write_text(metadataset_yaml(used, self.options.aux_format))

    def _describe_aux_folder(self, media: MediaFilter) -> MediaSummary:
        """The aux folder's media files into its own `.nv-meta/index.sqlite`, as `prepare-media` on it."""
        assert self.aux_folder is not None
        meta = self.aux_folder / META_DIR
        meta.mkdir()
        workers = worker_count(self.options.num_workers, len(self.aux_files))
        self.aux_files.sort()
        return add_folder_media_metadata(self.aux_folder, self.aux_files, meta / INDEX_SQLITE, media, workers)

    def commit(self) -> None:
        """Put everything in place as one commit (`commit_together`): old contents aside (with
        --overwrite), the aux dataset, the primary dataset (its `.nv-meta` last), then the rejects and the
        metadataset. If any step fails or is cut short, every one is undone: `out_dir` is as it was."""
        builds = [build for build in (self.aux_build, self.primary) if build is not None]
        with Staging(self.out_dir, meta=False) as old:
            if self.options.overwrite:
                keep = set().union(
                    self.staging.staged_paths(),
                    *(build.staging.staged_paths() for build in builds),
                    {self.out_dir / name for name in _run_files(self.options)},
                )
                for path in _old_contents(self.out_dir, keep):
                    old.retire(path)
            commit_together([old, *(build.staging for build in builds), self.staging])

    def __enter__(self) -> WriteRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the run's files; unless committed, the builds and then the staging remove everything the
        run wrote (and `write`'s lock then removes out_dir if it made it)."""
        failure: OSError | None = None
        for file in (self.spool, self.rejects_file):
            try:
                if file is not None:
                    file.close()
            except OSError as error:  # a full disk fails the last flush; the staged files go all the same
                failure = failure or error
        if exc_info[0] is None and failure is not None:
            self._staged.__exit__(type(failure), failure, failure.__traceback__)
            raise failure
        self._staged.__exit__(*exc_info)

    def summary(self) -> WriteSummary:
        split_names = list(self.options.split_names)
        shard_names = sorted(shard.shard for shard in self.primary.finished)
        return WriteSummary(
            out_dir=self.out_dir,
            samples_per_split=self.primary.split_counts(split_names),
            shards=len(shard_names),
            bytes=self.bytes,
            rejects=self.rejects,
            rejects_path=self.rejects_path if self.rejects else None,
            seconds=time.perf_counter() - self.started,
            dataset=self.primary.root,
            aux=self.out_dir / AUX_FOLDER if self.options.polylithic else None,
            metadataset=self.out_dir / METADATASET_YAML if self.options.polylithic else None,
            oversize_groups=self.oversize_groups,
            shard_names=shard_names,
            resumed=self.resumed,
            media=self.media,
        )


def write(
    sources: list[Source],
    out_dir: Path,
    options: WriteOptions,
    progress: Callable[[WriteProgress], None] | None = None,
    on_shard: ShardWritten | None = None,
    *,
    keep_checkpoint: bool = False,
) -> WriteSummary:
    """Write `sources` into a prepared, energon-loadable dataset at `out_dir` and return a summary;
    `on_shard` is told of each shard as soon as it is whole (`DatasetBuild`). With `keep_checkpoint`,
    what `--resume` kept stays once the dataset is in place (a write to a bucket is done only once it is
    uploaded)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepError(f"{out_dir} exists and is not a folder. Give a new or empty folder for the dataset.")
    _check_apart(sources, out_dir, options.rejects)
    if options.rejects is not None:
        _check_rejects_path(options.rejects)
    parts = parts_written(options, sources)
    if options.field_map and parts is not None:
        check_field_map(options.field_map, parts)
    with plain_io_errors(out_dir, "write"), dataset_lock(out_dir, "write"):
        _check_out_dir(out_dir, options)
        with WriteRun(out_dir, options, progress, on_shard) as run:
            if options.field_map and parts is None:
                run.part_names = set()  # the parts are known once written: --field-map is checked then
            if options.resume:
                _write_in_blocks(run, sources)
            elif not _write_jsonl_in_parallel(run, sources):
                if options.engine == RAY:
                    _write_in_blocks(run, sources)
                else:
                    _write_records(run, sources)
            run.report()
            run.finish(options.definition(), sources)
            run.commit()
        if options.resume and not keep_checkpoint:
            Checkpoint(out_dir).remove()  # what an interrupted run kept is for a dataset now in place
    return run.summary()


def write_dataset(
    sources: Source | Iterable[Source] | Iterable[dict],
    out_dir: str | Path,
    *,
    progress: Callable[[WriteProgress], None] | None = None,
    **options: object,
) -> WriteSummary:
    """Write `sources` into a prepared, energon-loadable dataset at `out_dir` and return a summary.

    `sources` is one source, a list of sources (`prep.write.sources.open_sources`), or any iterable of
    dicts (webdataset style: `__key__` and parts). The options are `WriteOptions.parse`'s: `parts`,
    `key_column`, `maxcount`, `maxsize`, `shard_pattern`, `split_ratio`, `group_by`, `group_contiguous`,
    `seed`, `media_columns`, `aux_format`, `sample_type`, `field_map`, `on_error`, `rejects`,
    `overwrite`, `allow_pickle`, `num_workers`, `engine`, `ray_address`, `media_metadata_by_glob`,
    `media_metadata_by_header`, `media_metadata_by_extension`; see `shardprep write --help` for
    what each does.
    """
    return write(_as_sources(sources), Path(out_dir), WriteOptions.parse(**options), progress)  # type: ignore[arg-type]


def _as_sources(sources: Source | Iterable[Source] | Iterable[dict]) -> list[Source]:
    if hasattr(sources, "records"):
        return [sources]  # type: ignore[list-item]
    if isinstance(sources, list) and sources and all(hasattr(source, "records") for source in sources):
        return sources
    return [DictSource(sources)]  # type: ignore[arg-type]


def _write_records(run: WriteRun, sources: list[Source]) -> None:
    """Every record through the stages: key, split, parts, sink."""
    keys = SampleKeys(run.options.key_column)
    for source in sources:
        for record in source.records():
            if type(record) is Reject:
                run.reject(record.where, record.reason, record.input)
                continue
            try:
                staged = stage_record(source, record, keys, run.options)
            except Rejected as rejected:
                run.reject(record.where, str(rejected), _show(record))
                continue
            run.add(*staged)
            run.report(PROGRESS_EVERY)


def _write_in_blocks(run: WriteRun, sources: list[Source]) -> None:
    """`--resume`, and `--engine ray` of what is not one plain JSONL file: blocks read in parallel
    (`blockwise`), or a PrepError naming what cannot be written so byte for byte as one process does."""
    options = run.options
    problem = refusal(options, sources)
    if problem is not None:
        flag = "--resume" if options.resume else "--engine ray"
        raise PrepError(f"{flag} cannot write this: {problem}. Leave out {flag} to write it in one pass.")
    checkpoint = WriteCheckpoint(run.out_dir, sources, options) if options.resume else None
    write_in_blocks(run, sources, checkpoint)
    if checkpoint is not None:
        blocks = checkpoint.reused_blocks, checkpoint.blocks
        run.resumed = (checkpoint.reused_shards, len(run.primary.finished), *blocks)


def _write_jsonl_in_parallel(run: WriteRun, sources: list[Source]) -> bool:
    """Write a plain JSONL source's shards in worker processes or Ray tasks (`jsonl_parallel`); False
    when not applicable or not worth it.

    Only for the plain case with on_error=stop: generated keys, the default `json` part, one split. The
    shards, keys and index are those the single-process loop writes; the first bad line stops the run."""
    options = run.options
    plain = (
        options.key_column is None
        and options.group_by is None
        and options.split_ratio is None
        and not options.polylithic
        and options.parts is None
        and options.on_error == "stop"
    )
    if not plain or len(sources) != 1 or type(sources[0]) is not JsonlSource:
        return False
    if options.engine == LOCAL and worker_count(options.num_workers, 2) < 2:
        return False  # one core: not worth the planning pass
    source = sources[0]
    plans = in_child(plan_shards, source.path, options.limits, what="planning shards")
    if plans is None or len(plans) < 2:
        return False
    workers = worker_count(options.num_workers, len(plans))
    build = run.primary
    slots = [build.reserve_shard("train") for _ in plans]
    jobs = [
        (
            ShardJob(
                source.path,
                source.name,
                plan,
                slot.shard,
                slot.path,
                slot.tar_index_path,
                slot.rows_path,
                build.headers,
            ),
        )
        for plan, slot in zip(plans, slots, strict=True)
    ]
    with _shards_written(jobs, workers, options) as written:
        _adopt_shards(run, slots, written)
    return True


@contextmanager
def _shards_written(
    jobs: list[tuple[ShardJob]], workers: int, options: WriteOptions
) -> Iterator[Iterator[ShardDone]]:
    """Each planned shard written, its result in plan order: in worker processes here, or as Ray tasks
    (which write into this run's staging, so a worker on another machine needs OUT_DIR on a shared
    filesystem at the same path)."""
    with engine_map(options, workers) as mapper:
        yield mapper(write_planned_shard, jobs, what="writing shards", name=lambda job: job[0].shard)


def _adopt_shards(run: WriteRun, slots: list[ShardSlot], written: Iterator[ShardDone]) -> None:
    """Take each written shard into the build, in order; a bad line stops the run."""
    build = run.primary
    for slot, done in zip(slots, written, strict=True):
        if done.reject is not None:
            run.reject(done.reject.where, done.reject.reason, done.reject.input)  # stops the run
        build.adopt(slot, done.count, done.nbytes)
        run.samples += done.count
        run.bytes += done.nbytes - len(END_OF_ARCHIVE)
        run.report()


def _show(record: Record) -> str:
    """The record as text for the rejects file."""
    if record.raw is not None:
        return record.raw.decode("utf-8", "replace")
    try:
        return json.dumps(
            record.fields, ensure_ascii=False, default=lambda value: f"<{type(value).__name__}>"
        )[:10_000]
    except (TypeError, ValueError):
        return repr(record.fields)[:10_000]


def _check_out_dir(out_dir: Path, options: WriteOptions) -> None:
    """A PrepError unless `out_dir` is empty (but for the lock, and with --resume what an interrupted
    run kept), or --overwrite is given."""
    ours = _run_files(options)
    others = [entry for entry in out_dir.iterdir() if entry.name not in ours]
    # a killed run's staged files are gone (`prep.index.lock`), their folders (a split's) not
    others = [entry for entry in others if not (entry.is_dir() and _holds_no_file(entry))]
    if others and not options.overwrite:
        kept = ""
        if (out_dir / RESUME_DIR).exists():
            # A dataset beside the checkpoint is most often the one an interrupted --overwrite was
            # replacing (it stays until the new one is complete), else one whose run ended before it
            # removed its checkpoint; --resume --overwrite is right either way and reuses what was kept.
            kept = (
                " (it holds what an interrupted write kept, beside an earlier dataset or other files: rerun"
                " that write with --resume --overwrite, which reuses what it kept and replaces the rest)"
                if any(entry.name != RESUME_DIR for entry in others)
                else " (it holds what an interrupted write kept: rerun that write with --resume)"
            )
        raise PrepError(
            f"{out_dir} is not empty{kept}. Give a new or empty folder, or pass --overwrite to replace its"
            " contents (the old contents stay until the new dataset is complete)."
        )


def _run_files(options: WriteOptions) -> set[str]:
    """What in OUT_DIR belongs to the run, not to the dataset it replaces: the lock and, with --resume,
    what an interrupted run kept (removed once the new dataset is in place)."""
    return {LOCK_FILE, RESUME_DIR} if options.resume else {LOCK_FILE}


def _check_apart(sources: list[Source], out_dir: Path, rejects: Path | None = None) -> None:
    """A PrepError if a source lies in OUT_DIR (an --overwrite would delete it once read), OUT_DIR lies in
    a folder source (the run would read its own output) or --rejects names a source (the run would
    replace it), links followed."""
    out = out_dir.resolve()
    rejected = rejects.resolve() if rejects is not None else None
    for source in sources:
        for path in getattr(source, "paths", ()):
            resolved = Path(path).resolve()
            if rejected is not None and (rejected == resolved or rejected.is_relative_to(resolved)):
                raise PrepError(
                    f"--rejects {rejects} is SOURCE {path}{'' if rejected == resolved else ' or inside it'},"
                    " which the run would replace or read. Name a file apart from the sources."
                )
            if resolved.is_relative_to(out):
                raise PrepError(
                    f"SOURCE {path} is inside OUT_DIR {out_dir}, whose contents a write replaces. Give an"
                    " OUT_DIR apart from the sources."
                )
            if resolved.is_dir() and out.is_relative_to(resolved):
                raise PrepError(
                    f"OUT_DIR {out_dir} is inside the folder SOURCE {path}, which would then hold the"
                    " dataset's own shards as samples. Give an OUT_DIR outside it."
                )


def _check_rejects_path(path: Path) -> None:
    """A PrepError unless `--rejects` names a file that can be put in place (its folders are made as needed)."""
    if path.is_dir():
        raise PrepError(
            f"--rejects {path} is a folder. Name a file for the rejects, e.g. {path / REJECTS_FILE}."
        )
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise PrepError(f"--rejects {path}: {folder} is not a folder. Name a file in a folder.")
            break


def _holds_no_file(folder: Path) -> bool:
    return not any(files for _, _, files in os.walk(folder))


def _old_contents(out_dir: Path, keep: set[Path]) -> list[Path]:
    """What was in `out_dir` before this run, as few paths as cover it: all but `keep` (this run's staged
    files and its own) and the folders on their way, which stay and hold the new dataset. A folder that
    holds nothing kept is one path, however much it holds; old indexes come first, so nothing old looks
    complete while the rest goes aside."""
    on_the_way = {folder for path in keep for folder in path.parents}
    old = []
    folders = [out_dir]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                path = Path(entry.path)
                if path in keep:
                    continue
                if path in on_the_way:  # a folder, or a link to one, holding staged files
                    folders.append(path)
                else:
                    old.append(path)
    return sorted(old, key=lambda path: path.name != META_DIR)
