"""`write`: raw records to a prepared dataset in one pass — shards, `.tar.idx` and `.nv-meta` together.

    >>> from prep.write import write_dataset                                   # doctest: +SKIP
    >>> write_dataset([{"__key__": "a", "txt": "hello"}], "/data/out")         # doctest: +SKIP

Each record becomes a sample: a key (from `__key__`, the folder stem, `key_column`, or generated and
zero-padded), parts encoded by extension (`prep.part_encoders`), a split (`prep.sample_split`), then
the shard writer of its split. With `media_columns` the media go to an auxiliary dataset and the primary
sample keeps their file names in an `aux.json` part; a MetadatasetV2 YAML ties the two together.
Bad input stops the run (`on_error="stop"`) or is skipped and listed in a rejects file ("skip").
Nothing is in place until everything is written.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prep.dataset_build import DatasetBuild
from prep.dataset_yaml import (
    crude_definition,
    dataset_yaml_text,
    field_map_definition,
    find_sample_type,
    parse_field_map,
    sample_loader_definition,
    sample_loader_template,
)
from prep.errors import PrepError
from prep.index_format import META_DIR, SAMPLE_LOADER_PY, split_member_name
from prep.jsonl_shards import ShardJob, plan_shards, write_planned_shard
from prep.part_encoders import MEDIA_EXTENSIONS, EncodeError, encoder_for, extension
from prep.sample_split import GroupSpool, split_for
from prep.shard_writer import BLOCK, sample_tar_bytes
from prep.source_jsonl import JsonlSource
from prep.sources import DictSource, Record, Reject, Source
from prep.split import parse_split_ratio

#: The primary sample's part that names its media in the auxiliary dataset: {column: file name}.
AUX_PART = "aux.json"
METADATASET_YAML = "metadataset.yaml"
PRIMARY_FOLDER, AUX_FOLDER = "primary", "media"
REJECTS_FILE = "rejects.jsonl"
#: The aux name the MetadatasetV2 YAML uses; the cooker receives the aux file store under this name.
AUX_NAME = "media"


class BadInputError(PrepError):
    """Input that cannot become a sample, with `on_error="stop"`: names `file:line` and the reason."""


@dataclass
class WriteProgress:
    samples: int
    bytes: int
    rejects: int
    seconds: float


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

    @property
    def samples(self) -> int:
        return sum(self.samples_per_split.values())


def _key_problem(key: str) -> str | None:
    """Why a sample key would not come back from energon as itself, or None."""
    if not key:
        return "the sample key is empty"
    if split_member_name(f"{key}.x") != (key, "x"):
        return (
            f"sample key {key!r} would not survive energon's key rule (a key may not contain a dot after its"
            " last slash, start with __ or end with a slash)"
        )
    return None


def _parse_parts(specs: Iterable[str]) -> list[tuple[str, str]]:
    """`["text=txt", "meta=json", "caption=caption.txt"]` -> [(field, part)]; `jpg` alone means jpg=jpg."""
    parts = []
    for spec in specs:
        column, equals, part = spec.partition("=")
        part = part if equals else column
        if not column or not part or "/" in part:
            raise PrepError(f"Invalid --part {spec!r}: expected FIELD=PART, e.g. text=txt or image=jpg.")
        parts.append((column, part))
    names = [part for _, part in parts]
    if len(set(names)) != len(names):
        raise PrepError(f"Two fields map to the same part name in --part {' '.join(specs)}.")
    return parts


def _parse_media(specs: Iterable[str]) -> list[tuple[str, str | None]]:
    media = []
    for spec in specs:
        column, equals, ext = spec.partition("=")
        if not column or (equals and not ext):
            raise PrepError(f"Invalid --media-column {spec!r}: expected FIELD or FIELD=EXT, e.g. image=jpg.")
        media.append((column, ext.lower().lstrip(".") if equals else None))
    return media


def _dataset_yaml(sample_type: str | None, field_map: str | None, polylithic: bool) -> tuple[str, dict[str, str]]:
    """dataset.yaml text and any extra `.nv-meta` files (a sample_loader.py template)."""
    chosen = find_sample_type(sample_type or "CrudeWebdataset")
    if chosen.crude:
        if field_map:
            raise PrepError("--field-map needs a --sample-type other than CrudeWebdataset.")
        return dataset_yaml_text(crude_definition()), {}
    if polylithic:
        raise PrepError(
            "A dataset with --media-column must be crude (energon hands auxiliary datasets only to cookers);"
            " leave out --sample-type."
        )
    if field_map:
        return dataset_yaml_text(field_map_definition(chosen, parse_field_map(field_map))), {}
    loader = sample_loader_template(chosen, ["TODO"])
    return dataset_yaml_text(sample_loader_definition(chosen, SAMPLE_LOADER_PY)), {SAMPLE_LOADER_PY: loader}


def _metadataset_yaml(splits: list[str], aux_format: str) -> str:
    import yaml

    aux = f"filesystem://{AUX_FOLDER}" if aux_format == "folder" else AUX_FOLDER
    document = {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {split: {"path": PRIMARY_FOLDER, "aux": {AUX_NAME: aux}} for split in splits},
    }
    return yaml.dump(document, sort_keys=False)


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepError(f"{out_dir} exists and is not a folder. Give a new or empty folder for the dataset.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise PrepError(
            f"{out_dir} is not empty. Give a new or empty folder, or pass --overwrite to replace its contents"
            " (the old contents stay until the new dataset is complete)."
        )


def _clear_old_contents(out_dir: Path, token: str) -> None:
    """Remove what was in `out_dir` before this run (its index first, so it never looks complete)."""
    for meta in sorted(out_dir.rglob(META_DIR), key=lambda path: len(path.parts)):
        if meta.is_dir() and token not in str(meta):
            shutil.rmtree(meta, ignore_errors=True)
    folders = []
    for folder, dirs, files in os.walk(out_dir):
        dirs[:] = [name for name in dirs if token not in name]  # this run's staging folders stay
        folders.append(folder)
        for name in files:
            if token not in name:
                os.unlink(os.path.join(folder, name))
    for folder in reversed(folders[1:]):
        if os.path.islink(folder):
            os.unlink(folder)
        elif not os.listdir(folder):
            os.rmdir(folder)


class _Run:
    """State of one write: the builds, the rejects, the counts."""

    def __init__(self, out_dir: Path, options: dict) -> None:
        self.out_dir = out_dir
        self.o = options
        self.created_out_dir = not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        self.polylithic = bool(options["media"])
        root = out_dir / PRIMARY_FOLDER if self.polylithic else out_dir
        build_options = dict(maxcount=options["maxcount"], maxsize=options["maxsize"], pattern=options["pattern"])
        self.primary = DatasetBuild(root, **build_options)
        self.token = self.primary.token
        self.aux_build: DatasetBuild | None = None
        self.aux_folder: Path | None = None
        if self.polylithic:
            if options["aux_format"] == "tar":
                self.aux_build = DatasetBuild(out_dir / AUX_FOLDER, **build_options)
            else:
                self.aux_folder = out_dir / f".{AUX_FOLDER}.shardprep-{self.token}.tmp"
                self.aux_folder.mkdir()
        self.rejects_path: Path = options["rejects"] or out_dir / REJECTS_FILE
        self.rejects_staged = self.rejects_path.with_name(f"{self.rejects_path.name}.shardprep-{self.token}.tmp")
        self.rejects_file = None
        self.rejects = 0
        self.samples = 0
        self.bytes = 0
        self.keys: set[str] = set()
        self.spool = GroupSpool(out_dir) if options["group_contiguous"] else None
        self.oversize_groups = 0

    def reject(self, where: str, reason: str, text: str = "") -> None:
        if self.o["on_error"] == "stop":
            raise BadInputError(
                f"{where}: {reason}. Nothing was written. Fix the input, or pass --on-error skip to skip"
                " such input and list it in a rejects file."
            )
        if self.rejects_file is None:
            self.rejects_staged.parent.mkdir(parents=True, exist_ok=True)
            self.rejects_file = open(self.rejects_staged, "w", encoding="utf-8")  # noqa: SIM115
        self.rejects_file.write(json.dumps({"where": where, "reason": reason, "input": text}, ensure_ascii=False) + "\n")
        self.rejects += 1

    def folder(self, split: str) -> str:
        return split if self.o["ratio"] is not None else ""

    def write_sample(self, split: str, key: str, parts: list[tuple[str, bytes]], same_shard: bool = False) -> None:
        self.bytes += self.primary.writer(split, self.folder(split)).write(key, parts, same_shard)
        self.samples += 1

    def write_media(self, key: str, media: list[tuple[str, bytes]]) -> None:
        if self.aux_build is not None:
            self.bytes += self.aux_build.writer("train").write(key, media)
            return
        assert self.aux_folder is not None
        for part, data in media:
            target = self.aux_folder / f"{key}.{part}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            self.bytes += len(data)

    def drain_groups(self) -> None:
        """Write the spooled groups, each whole in one shard (a new shard when it does not fit)."""
        if self.spool is None:
            return
        for _, split, samples in self.spool.groups():
            writer = self.primary.writer(split, self.folder(split))
            nbytes = sum(sample_tar_bytes(parts) for _, parts in samples)
            if not writer.room_for(len(samples), nbytes):
                writer.finish_shard()
            if len(samples) > writer.maxcount or nbytes > writer.maxsize:
                self.oversize_groups += 1
            for number, (key, parts) in enumerate(samples):
                self.write_sample(split, key, parts, same_shard=number > 0)

    def abort(self) -> None:
        if self.spool is not None:
            self.spool.close()
        if self.rejects_file is not None:
            self.rejects_file.close()
        self.rejects_staged.unlink(missing_ok=True)
        self.primary.abort()
        if self.aux_build is not None:
            self.aux_build.abort()
        if self.aux_folder is not None:
            shutil.rmtree(self.aux_folder, ignore_errors=True)
        for folder in (self.out_dir / PRIMARY_FOLDER, self.out_dir / AUX_FOLDER, self.out_dir):
            if folder != self.out_dir or self.created_out_dir:
                try:
                    folder.rmdir()
                except OSError:
                    pass


def _encode(part: str, value: object, record: Record, allow_pickle: bool) -> bytes:
    if isinstance(value, str) and extension(part) in MEDIA_EXTENSIONS:
        return _read_media(value, record)  # a media part given as a path reads the file
    return encoder_for(part, allow_pickle)(value)


def _read_media(value: str, record: Record) -> bytes:
    """The bytes of a media file named in a record, relative to the source's folder."""
    path = Path(value) if record.base is None else record.base / value
    try:
        return path.read_bytes()
    except OSError as error:
        raise EncodeError(f"missing media file {value!r} ({error.strerror or error})") from None


def _record_parts(source: Source, record: Record, fields: dict, o: dict) -> list[tuple[str, bytes]]:
    """The parts of one record, encoded; raises EncodeError or KeyError (a missing field)."""
    allow_pickle = o["allow_pickle"]
    mapping = o["parts"] or source.default_parts
    if mapping == "json-line":
        if record.raw is not None and fields is record.fields:
            return [("json", record.raw)]
        return [("json", _encode("json", fields, record, allow_pickle))]
    if mapping == "json-row":
        return [("json", _encode("json", fields, record, allow_pickle))]
    if mapping == "by-name":
        return [
            (name, _encode(name, value, record, allow_pickle))
            for name, value in fields.items()
            if value is not None and not name.startswith("__")
        ]
    parts = []
    for column, part in mapping:
        if column not in fields:
            raise KeyError(column)
        value = fields[column]
        if value is not None:  # a null writes no part, as webdataset leaves out missing parts
            parts.append((part, _encode(part, value, record, allow_pickle)))
    return parts


def _media_parts(
    key: str, record: Record, fields: dict, media: list[tuple[str, str | None]]
) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """Take the media fields out of `fields`: (aux parts, {column: aux file name}); raises EncodeError."""
    parts: list[tuple[str, bytes]] = []
    names: dict[str, str] = {}
    for column, ext in media:
        if column not in fields:
            raise EncodeError(f"no field {column!r} for --media-column")
        value = fields.pop(column)
        if ext is None:
            if isinstance(value, str) and "." in value:
                ext = value.rpartition(".")[2].lower()
            elif extension(column) in MEDIA_EXTENSIONS:
                ext = extension(column)
            else:
                raise EncodeError(f"cannot tell the file type of media field {column!r}; give --media-column {column}=EXT")
        if isinstance(value, str):
            data = _read_media(value, record)
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
        else:
            raise EncodeError(f"media field {column!r} holds a {type(value).__name__}, not a path or bytes")
        part = ext if len(media) == 1 else f"{column}.{ext}"
        parts.append((part, data))
        names[column] = f"{key}.{part}"
    return parts, names


def write_dataset(
    sources: Source | Iterable[Source] | Iterable[dict],
    out_dir: str | Path,
    *,
    parts: list[str] | None = None,
    key_column: str | None = None,
    maxcount: int = 10_000,
    maxsize: float = 3e9,
    shard_pattern: str = "shard-%06d.tar",
    split_ratio: str | None = None,
    group_by: str | None = None,
    group_contiguous: bool = False,
    seed: int = 0,
    media_columns: list[str] | None = None,
    aux_format: str = "folder",
    sample_type: str | None = None,
    field_map: str | None = None,
    on_error: str = "stop",
    rejects: str | Path | None = None,
    overwrite: bool = False,
    allow_pickle: bool = False,
    progress: Callable[[WriteProgress], None] | None = None,
) -> WriteSummary:
    """Write `sources` into a prepared, energon-loadable dataset at `out_dir` and return a summary.

    `sources` is one source, a list of sources (`prep.sources.open_sources`), or any iterable of dicts
    (webdataset style: `__key__` and parts). See `shardprep write --help` for the options.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    source_list = _as_sources(sources)
    if on_error not in ("stop", "skip"):
        raise PrepError(f"--on-error must be stop or skip, not {on_error!r}.")
    if aux_format not in ("folder", "tar"):
        raise PrepError(f"--aux-format must be folder or tar, not {aux_format!r}.")
    if maxcount < 1 or maxsize < 1:
        raise PrepError("--maxcount and --maxsize must be positive.")
    try:
        shard_pattern % 0
    except (TypeError, ValueError):
        raise PrepError(f"--shard-pattern {shard_pattern!r} needs one %d-style number, e.g. shard-%06d.tar.") from None
    if not shard_pattern.endswith(".tar"):
        raise PrepError(f"--shard-pattern {shard_pattern!r} must end in .tar (energon finds shards by suffix).")
    if group_contiguous and group_by is None:
        raise PrepError("--group-contiguous needs --group-by COLUMN.")
    media = _parse_media(media_columns or [])
    ratio = parse_split_ratio(split_ratio) if split_ratio is not None else None
    split_names = [name for name, _ in ratio] if ratio is not None else ["train", "val", "test"]
    options = {
        "parts": _parse_parts(parts) if parts else None,
        "maxcount": maxcount,
        "maxsize": maxsize,
        "pattern": shard_pattern,
        "ratio": ratio,
        "media": media,
        "aux_format": aux_format,
        "on_error": on_error,
        "rejects": Path(rejects) if rejects is not None else None,
        "group_contiguous": group_contiguous,
        "allow_pickle": allow_pickle,
    }
    dataset_yaml, extra_meta = _dataset_yaml(sample_type, field_map, bool(media))
    _check_out_dir(out_dir, overwrite)
    run = _Run(out_dir, options)
    try:
        _write_records(run, source_list, key_column, group_by, ratio, seed, progress, started)
        run.drain_groups()
        run.primary.finish(split_names, dataset_yaml, extra_meta)
        if run.aux_build is not None:
            run.aux_build.finish(["train", "val", "test"], dataset_yaml_text(crude_definition()))
        if run.rejects_file is not None:
            run.rejects_file.close()
        if run.spool is not None:
            run.spool.close()
        _commit(run, split_names, overwrite)
    except BaseException:
        run.abort()
        raise
    shard_names = [shard.shard for shard in run.primary.finished]
    return WriteSummary(
        out_dir=out_dir,
        samples_per_split={name: sum(s.count for s in run.primary.finished if s.split == name) for name in split_names},
        shards=len(shard_names),
        bytes=run.bytes,
        rejects=run.rejects,
        rejects_path=run.rejects_path if run.rejects else None,
        seconds=time.perf_counter() - started,
        dataset=run.primary.root,
        aux=out_dir / AUX_FOLDER if run.polylithic else None,
        metadataset=out_dir / METADATASET_YAML if run.polylithic else None,
        oversize_groups=run.oversize_groups,
        shard_names=sorted(shard_names),
    )


def _as_sources(sources: Source | Iterable[Source] | Iterable[dict]) -> list[Source]:
    if hasattr(sources, "records"):
        return [sources]  # type: ignore[list-item]
    if isinstance(sources, list) and sources and all(hasattr(source, "records") for source in sources):
        return sources
    return [DictSource(sources)]  # type: ignore[arg-type]


def _write_records(
    run: _Run,
    sources: list[Source],
    key_column: str | None,
    group_by: str | None,
    ratio: list[tuple[str, float]] | None,
    seed: int,
    progress: Callable[[WriteProgress], None] | None,
    started: float,
) -> None:
    o = run.o
    media = o["media"]
    keys = run.keys
    generated = 0
    plain = key_column is None and group_by is None and ratio is None and not media and run.spool is None
    if plain and o["parts"] is None and o["on_error"] == "stop" and len(sources) == 1:
        if type(sources[0]) is JsonlSource and _write_jsonl_in_parallel(run, sources[0], progress, started):
            if progress is not None:
                progress(WriteProgress(run.samples, run.bytes, run.rejects, time.perf_counter() - started))
            return
    for source in sources:
        for record in source.records():
            if type(record) is Reject:
                run.reject(record.where, record.reason, record.input)
                continue
            fields = record.fields
            key = record.key
            if key is None and key_column is not None:
                value = fields.get(key_column)
                if value is None:
                    run.reject(record.where, f"no key field {key_column!r}", _show(record))
                    continue
                key = str(value)
            if key is None:
                key = f"{generated:09d}"  # zero-padded: keys sort in input order
                generated += 1
            else:
                problem = _key_problem(key) or (f"duplicate sample key {key!r}" if key in keys else None)
                if problem:
                    run.reject(record.where, problem, _show(record))
                    continue
                keys.add(key)
            group = key
            if group_by is not None:
                if group_by not in fields:
                    run.reject(record.where, f"no field {group_by!r} to group by", _show(record))
                    continue
                group = fields[group_by]
                group = group.decode("utf-8", "replace") if isinstance(group, bytes) else group
            split = split_for(group, ratio, seed) if ratio is not None else "train"
            try:
                aux_parts: list[tuple[str, bytes]] = []
                if media:
                    fields = dict(fields)
                    aux_parts, names = _media_parts(key, record, fields, media)
                parts = _record_parts(source, record, fields, o)
                if media:
                    parts.append((AUX_PART, json.dumps(names, ensure_ascii=False).encode()))
            except EncodeError as error:
                run.reject(record.where, str(error), _show(record))
                continue
            except KeyError as error:
                run.reject(record.where, f"no field {error.args[0]!r} for --part", _show(record))
                continue
            if not parts:
                run.reject(record.where, "the record has no parts to write", _show(record))
                continue
            if aux_parts:
                run.write_media(key, aux_parts)
            if run.spool is not None:
                run.spool.add(group, split, (key, parts))
            else:
                run.write_sample(split, key, parts)
            if progress is not None and (run.samples + run.rejects) % 1024 == 0:
                progress(WriteProgress(run.samples, run.bytes, run.rejects, time.perf_counter() - started))
    if progress is not None:
        progress(WriteProgress(run.samples, run.bytes, run.rejects, time.perf_counter() - started))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _write_jsonl_in_parallel(
    run: _Run, source: JsonlSource, progress: Callable[[WriteProgress], None] | None, started: float
) -> bool:
    """Write a plain JSONL source's shards in worker processes (`prep.jsonl_shards`); False when not worth it.

    Only for the plain case with on_error=stop: generated keys, the default `json` part, one split. The
    shards, keys and index are those the single-process loop writes; the first bad line stops the run."""
    cores = _cores()
    if cores < 2:
        return False
    plans = plan_shards(source.path, run.o["maxcount"], run.o["maxsize"])
    if plans is None or len(plans) < 2:
        return False
    build = run.primary
    slots = [build.reserve_shard("train") for _ in plans]
    jobs = [
        ShardJob(source.path, source.name, plan, slot.shard, slot.path, slot.tar_index_path, slot.rows_path, build.headers)
        for plan, slot in zip(plans, slots, strict=True)
    ]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = context.Pool(min(cores, len(jobs)), initializer=_quiet_worker)
    finished = False
    try:
        for slot, done in zip(slots, pool.imap(write_planned_shard, jobs), strict=True):
            if done.reject is not None:
                run.reject(done.reject.where, done.reject.reason, done.reject.input)  # stops the run
            build.adopt(slot, done.count, done.nbytes)
            run.samples += done.count
            run.bytes += done.nbytes - 2 * BLOCK
            if progress is not None:
                progress(WriteProgress(run.samples, run.bytes, run.rejects, time.perf_counter() - started))
        finished = True
    finally:
        if not finished:
            pool.terminate()  # on an error, no worker may still be writing when the run cleans up
        pool.close()
        pool.join()
    return True


def _quiet_worker() -> None:
    """Workers leave interrupts to the main process, which stops them; SIGTERM ends them at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _show(record: Record) -> str:
    """The record as text for the rejects file."""
    if record.raw is not None:
        return record.raw.decode("utf-8", "replace")
    try:
        return json.dumps(record.fields, ensure_ascii=False, default=lambda value: f"<{type(value).__name__}>")[:10_000]
    except (TypeError, ValueError):
        return repr(record.fields)[:10_000]


def _commit(run: _Run, split_names: list[str], overwrite: bool) -> None:
    """Put everything in place: old contents out (with --overwrite), aux, rejects, shards, `.nv-meta` last."""
    out_dir = run.out_dir
    if overwrite:
        _clear_old_contents(out_dir, run.token)
    if run.aux_build is not None:
        run.aux_build.commit()
    if run.aux_folder is not None:
        os.rename(run.aux_folder, out_dir / AUX_FOLDER)
    if run.rejects:
        os.replace(run.rejects_staged, run.rejects_path)
    if run.polylithic:
        staged = out_dir / f".{METADATASET_YAML}.shardprep-{run.token}.tmp"
        used = [name for name in split_names if any(s.split == name for s in run.primary.finished) or name == "train"]
        staged.write_text(_metadataset_yaml(used, run.o["aux_format"]))
        run.primary.commit()
        os.replace(staged, out_dir / METADATASET_YAML)
    else:
        run.primary.commit()
