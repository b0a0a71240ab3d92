"""`shardprep verify --load`: every sample loaded and decoded the way energon's loader does, in parallel.

What `energon lint` checks, sample by sample, and faster: energon builds the dataset from its
`dataset.yaml` (sample type and field map, its `sample_loader.py`, or a `CrudeWebdataset`) and turns
each raw sample into a typed sample with `load_sample`, decoding parts with its default decoder (images
to tensors, JSON, text, audio and video). Here the same dataset factory does the same on every sample,
one slice of a shard per task on worker processes (`prep.processes.ordered_map`), and every sample
that raises is named by shard, key and part with its exception. For a `CrudeWebdataset`, whose cooking
happens in the user's task encoder (`energon lint` refuses such a dataset), decoding each part with
energon's default decoder is what can be checked.

The stages:

1. the splits to check (`--split`, else every split of `split.yaml` that has shards);
2. each split's dataset factory built from `dataset.yaml` (once per process, on first use);
3. the split's shards cut into slices of at most `SLICE` samples, the tasks;
4. each slice's raw samples read as energon's tar reader gives them (its part filter and the split
   file's `exclude` applied), each loaded by the factory; a failure becomes a `Failure`;
5. the results gathered in order into a `LoadReport`, progress reported after each slice.

`python -m cookers.energon_lint DATASET [--split NAME] [--num-workers N]` prints one JSON object per
line: `{"progress": {...}}` after each slice, `{"failure": {...}}` for each failing sample, and last
`{"report": {...}}`; the exit code is 0 when every sample loaded, 1 otherwise. `shardprep verify
--load` runs it as a child process, so `prep` never imports energon or torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from megatron.energon import WorkerConfig
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory
from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError
from megatron.energon.flavors.webdataset.field_access import split_field_access
from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder
from megatron.energon.flavors.webdataset.structs import FilteredSample
from megatron.energon.metadataset import load_dataset
from megatron.energon.source_info import SourceInfo
from webdataset.autodecode import DecodingError

from prep.errors import PrepError
from prep.index.dataset import PreparedDataset
from prep.index.format import DATASET_YAML, META_DIR, SPLIT_YAML
from prep.index.meta import read_splits
from prep.processes import ordered_map, worker_count

#: Samples per task: small enough to spread a few big shards over every worker, big enough that the
#: per-task cost (a message each way, a shard opened) stays small.
SLICE = 500
#: Characters of an exception's message kept (energon's messages may hold a whole sample's repr).
MESSAGE_LIMIT = 300

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Failure:
    """One sample that does not load: where it is, which part (None if no single part), and the error."""

    split: str
    shard: str
    key: str
    part: str | None
    error_type: str
    message: str


@dataclass
class LoadReport:
    """Every sample of the checked splits, loaded: how many, and those that failed."""

    root: str
    splits: list[str]
    samples: int = 0
    excluded: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class _Slice:
    """A task: samples [start, stop) of one shard of one dataset of a split."""

    root: str
    split: str
    dataset: int
    shard: int
    start: int
    stop: int
    #: The dataset config in `.nv-meta` (`dataset.yaml` unless told).
    config: str = DATASET_YAML


#: Per process: the dataset factories of each (root, split), and each root opened for reading.
_factories: dict[tuple[str, str, str], list[BaseWebdatasetFactory]] = {}
_datasets: dict[str, PreparedDataset] = {}


def split_factories(root: str, split: str, config: str = DATASET_YAML) -> list[BaseWebdatasetFactory]:
    """The webdataset factories energon builds for `split` of the dataset at `root` from its dataset
    config `config` (one per process)."""
    if (root, split, config) not in _factories:
        loaded = load_dataset(EPath(root), dataset_config=config).get_datasets(
            training=False,
            split_part=split,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            decoder=SampleDecoder(),
        )
        factories = [entry.dataset for entry in loaded.datasets]
        for factory in factories:
            if not isinstance(factory, BaseWebdatasetFactory):
                raise TypeError(
                    f"{root}: {type(factory).__name__} is not a WebDataset; only those are checked"
                )
        _factories[root, split, config] = factories
    return _factories[root, split, config]


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def field_paths(root: str, config: str = DATASET_YAML) -> list[list[str]]:
    """The accesses of the field map in the dataset's `dataset.yaml`, e.g. `[["json", "caption"], ["jpg"]]`
    (none for a sample loader or a crude dataset): they say which part a missing field belongs to."""
    parsed = yaml.safe_load((Path(root) / META_DIR / config).read_text()) or {}
    field_map = parsed.get("field_map") if isinstance(parsed, dict) else None
    if not isinstance(field_map, dict):
        return []
    return [access for value in field_map.values() for access in split_field_access(str(value))]


def describe_failure(
    error: Exception, parts: Collection[str] = (), paths: list[list[str]] | None = None
) -> tuple[str | None, str, str]:
    """(part, exception type, message) of a sample's load failure; `parts` are the parts the sample has
    and `paths` the field map's accesses (`field_paths`).

    A decoding error names the part its cause came from. A field-map access that found nothing has a
    KeyError naming what was missing as its context: a part the sample lacks, or a field inside a part.
    Other failures (a sample loader's) name no single part.

    >>> describe_failure(KeyError("text"))
    (None, 'KeyError', "'text'")
    """
    missing = error.__context__.args[0] if isinstance(error.__context__, KeyError) else None
    if isinstance(error, DecodingError) and error.__cause__ is not None:
        return error.k, type(error.__cause__).__name__, _short(error.__cause__)
    for path in paths or []:
        if missing == path[0] and missing not in parts:
            return missing, type(error).__name__, f"the sample has no part {missing!r}"
        if missing in path[1:] and path[0] in parts:
            access = path[0] + "".join(f"[{name}]" for name in path[1:])
            what = f"the part has no field {missing!r} (the field map reads {access})"
            return path[0], type(error).__name__, what
    return None, type(error).__name__, _short(error)


def _prepared(root: str) -> PreparedDataset:
    if root not in _datasets:
        _datasets[root] = PreparedDataset(root)
    return _datasets[root]


def raw_samples(task: _Slice, factory: BaseWebdatasetFactory) -> Iterator[tuple[str, FilteredSample | None]]:
    """(key, raw sample) for each sample of the slice; the raw sample as energon's tar
    reader hands it to `load_sample` (the parts its part filter takes, in tar order; `__key__`, `__shard__`,
    `__restore_key__`, `__sources__`), or None for a sample `exclude`d in the split file.

    The bytes are read at the offsets of `index.sqlite`, one `pread` per part, instead of walking the tar
    headers again: a few times faster than energon's reader, and the index was checked against the
    headers by `verify` before.
    """
    dataset = _prepared(task.root)
    shard = factory.shards[task.shard]
    tar_file_id = dataset.tar_file_id(shard.name)
    # energon's index of a sample counts from the split's first shard
    first = sum(other.count for other in factory.shards[: task.shard])
    keep = factory.part_filter
    for key, _, index in dataset.index.shard_samples_page(
        tar_file_id, task.start - 1, task.stop - task.start
    ):
        if not factory.sample_filter(f"{shard.name}/{key}"):
            yield key, None
            continue
        parts = {
            name: location
            for name, location in dataset.index.parts_of_sample(tar_file_id, index)
            if keep is None or keep(name)
        }
        restore = first + index
        source = SourceInfo(
            dataset_path=factory.path,
            index=restore,
            shard_name=shard.name,
            file_names=tuple(f"{key}.{name}" for name in parts),
        )
        raw = {name: dataset.read_part(location) for name, location in parts.items()}
        yield (
            key,
            FilteredSample(
                __key__=key,
                __shard__=shard.name,
                __restore_key__=("Webdataset", restore),
                __sources__=(source,),
                **raw,
            ),
        )


def check_slice(task: _Slice) -> tuple[int, int, list[Failure]]:
    """Load every sample of one slice: (samples loaded or failed, samples excluded, failures)."""
    factory = split_factories(task.root, task.split, task.config)[task.dataset]
    shard = factory.shards[task.shard].name
    paths = field_paths(task.root, task.config)
    checked = excluded = 0
    failures = []
    for key, raw in raw_samples(task, factory):
        if raw is None:
            excluded += 1
            continue
        checked += 1
        try:
            factory.load_sample(raw)
        except Exception as error:
            part, kind, message = describe_failure(error, raw.keys(), paths)
            failures.append(Failure(task.split, shard, key, part, kind, message))
    return checked, excluded, failures


def field_map_problem(root: str, factory: BaseWebdatasetFactory, config: str = DATASET_YAML) -> str | None:
    """Why dataset.yaml's field map cannot build the factory's sample type, or None: each field the type
    needs (no default; energon fills the `__key__`-like ones) must be mapped. energon checks only that
    the map names no other fields, so without this every sample fails alike and is named alone."""
    parsed = yaml.safe_load((Path(root) / META_DIR / config).read_text()) or {}
    field_map = parsed.get("field_map") if isinstance(parsed, dict) else None
    sample_type = getattr(factory, "__sample_type__", None)
    if not isinstance(field_map, dict) or not dataclasses.is_dataclass(sample_type):
        return None
    needed = [
        field.name
        for field in dataclasses.fields(sample_type)
        if field.default is dataclasses.MISSING
        and field.default_factory is dataclasses.MISSING
        and not field.name.startswith("__")
    ]
    unmapped = [name for name in needed if name not in field_map]
    if not unmapped:
        return None
    return (
        f"{META_DIR}/{config}: its field_map gives {sample_type.__name__} no"
        f" {', '.join(repr(name) for name in unmapped)}, which every sample needs: add"
        f" {'them' if len(unmapped) > 1 else 'it'} to field_map (the part to read each from)"
    )


def _splits(root: str, split: str | None) -> list[str]:
    if split is not None:
        return [split]
    splits, _ = read_splits(Path(root) / META_DIR / SPLIT_YAML)
    return [name for name, shards in splits.items() if shards]


def _tasks(root: str, splits: list[str], config: str) -> list[_Slice]:
    tasks = []
    for split in splits:
        try:
            factories = split_factories(root, split, config)
        except EmptyDatasetError:
            continue  # a split without shards has nothing to load (`energon lint` skips it too)
        for position, factory in enumerate(factories):
            problem = field_map_problem(root, factory, config)
            if problem is not None:
                raise PrepError(problem)
            for number, shard in enumerate(factory.shards):
                for start in range(0, shard.count, SLICE):
                    tasks.append(
                        _Slice(root, split, position, number, start, min(start + SLICE, shard.count), config)
                    )
    return tasks


def load_check(
    dataset: str | Path,
    split: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
    on_failure: Callable[[Failure], None] | None = None,
    config: str = DATASET_YAML,
) -> LoadReport:
    """Load every sample of `split` (default: every split with shards) of the prepared dataset through
    its `dataset.yaml` (or the dataset config `config` of its `.nv-meta`), on `workers` processes (default: one per CPU); `progress(done, total)` is called
    after each slice and `on_failure` for each failing sample as it is found."""
    root = str(Path(dataset).resolve())
    splits = _splits(root, split)
    tasks = _tasks(root, splits, config)
    total = sum(task.stop - task.start for task in tasks)
    report = LoadReport(root, splits)
    done = 0
    results = ordered_map(
        check_slice,
        [(task,) for task in tasks],
        worker_count(workers, len(tasks)),
        what="loading samples",
    )
    try:
        for task, (checked, excluded, failures) in zip(tasks, results, strict=True):
            report.samples += checked
            report.excluded += excluded
            report.failures.extend(failures)
            if on_failure is not None:
                for failure in failures:
                    on_failure(failure)
            done += task.stop - task.start
            if progress is not None:
                progress(done, total)
    finally:
        opened = _datasets.pop(root, None)  # read in this process when there is one worker
        if opened is not None:
            opened.close()
    return report


def _emit(kind: str, value: Any) -> None:
    sys.stdout.write(json.dumps({kind: value}) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """The child process of `shardprep verify --load`: JSON lines on stdout; exit 0 if every sample
    loaded, 1 if one failed, 2 if the dataset could not be checked at all."""
    parser = argparse.ArgumentParser(
        prog="python -m cookers.energon_lint", description=__doc__.split("\n")[0]
    )
    parser.add_argument("dataset")
    parser.add_argument("--split", default=None)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--dataset-config", default=DATASET_YAML)
    args = parser.parse_args(argv)
    try:
        report = load_check(
            args.dataset,
            args.split,
            args.num_workers,
            progress=lambda done, total: _emit("progress", {"done": done, "total": total}),
            on_failure=lambda failure: _emit("failure", asdict(failure)),
            config=args.dataset_config,
        )
    except PrepError as error:
        _emit("error", str(error))
        return 2
    except Exception as error:  # the dataset cannot be built at all (dataset.yaml, sample_loader.py)
        _emit("error", f"energon cannot build the dataset: {type(error).__name__}: {_short(error)}")
        return 2
    summary = {"root": report.root, "splits": report.splits, "samples": report.samples}
    _emit("report", {**summary, "excluded": report.excluded, "failed": len(report.failures)})
    return 0 if report.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
