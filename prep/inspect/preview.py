"""The first samples of a split, or one sample by key, decoded for people to read.

Parts are read by byte offset through the index and described by their codec (`prep.codecs`): JSON
pretty-printed, text, image size and mode, array shape and dtype; `raw` shows the bytes instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from prep.codecs import TEXT_LIMIT, describe_part, raw_preview
from prep.errors import PrepError
from prep.index.dataset import PreparedDataset
from prep.index.meta import RERUN_PREPARE
from prep.index.sqlite import PartLocation, SampleRow
from prep.tar.fields import BLOCK, MAX_OCTAL_SIZE, NAME
from prep.tar.header import header_member


def default_split(dataset: PreparedDataset) -> str | None:
    """`train` when the dataset has a non-empty train split, else None (all shards in index order)."""
    return "train" if dataset.splits().get("train") else None


def first_samples(dataset: PreparedDataset, split: str | None, count: int) -> Iterator[SampleRow]:
    """The first `count` samples of a split in shard order, without those the split file excludes one by
    one (of all shards, every sample, when `split` is None)."""
    remaining = count
    excluded = dataset.excluded_samples() if split is not None else {}  # energon's loader skips them
    for shard in dataset.split_shards(split):
        if remaining <= 0:
            return
        if shard not in dataset.shard_counts:
            raise PrepError(
                f"split {split!r} of {dataset.meta / dataset.split_file()} names shard {shard!r}, which .info.json does"
                f" not list. `shardprep verify {dataset.root}` names every such shard and what to do."
            )
        skipped = excluded.get(dataset.tar_file_id(shard), set())
        for sample in dataset.index.samples_of_shard(dataset.tar_file_id(shard)):
            if sample.key in skipped:
                continue
            yield sample
            remaining -= 1
            if remaining <= 0:
                return


def sample_by_key(dataset: PreparedDataset, key: str) -> SampleRow:
    sample = dataset.index.sample_by_key(key)
    if sample is None:
        raise PrepError(
            f"{dataset.root} has no sample with key {key!r}. `shardprep preview` shows existing keys."
        )
    return sample


class ShownSample(NamedTuple):
    """A sample as printed, and how many of its parts could not be read (the command then fails)."""

    text: str
    unreadable: int


def _other_member(header: bytes, name: str, location: PartLocation) -> str | None:
    """Why the 512 bytes before a part's indexed offset are not the header of member `name` with the
    indexed size, or None when they are (or may be: a name longer than the name field or not ASCII,
    which a PAX record may hold, and a size above the ustar field's limit are not compared)."""
    at = f"the index puts it at byte {location.offset:,}, but"
    member = header_member(header)
    if member is None:
        return f"{at} no tar header precedes it there: the shard or its index changed after prepare."
    found, size = member
    expected = name.encode("utf-8", "surrogateescape")
    # a name that fits the name field is written there as it is (longer ones are cut or abbreviated by
    # some writers, and non-ASCII ones replaced, beside a PAX record that holds the real one)
    name_differs = found != expected and len(expected) <= NAME.stop and expected.isascii()
    if name_differs or (size != location.size and location.size <= MAX_OCTAL_SIZE):
        shown = found.decode("utf-8", "backslashreplace")
        return (
            f"{at} the tar header there is of {shown!r} ({size:,} bytes): the index does not describe"
            " this shard (it was replaced, or index.sqlite belongs to other shards)."
        )
    return None


def format_sample(
    dataset: PreparedDataset, sample: SampleRow, *, raw: bool = False, limit: int = TEXT_LIMIT
) -> ShownSample:
    """One sample: its key and shard, then each part with its size and decoded (or raw) content."""
    shard = dataset.shards[sample.tar_file_id]
    lines = [f"== {sample.key}  ({shard}, sample {sample.index}, {sample.size:,} bytes in the tar)"]
    unreadable = 0
    for part, location in dataset.index.parts_of_sample(sample.tar_file_id, sample.index):
        if location.offset is None or location.size is None:  # NULL in a hand-damaged index.sqlite
            lines.append(f"-- {part}: its index.sqlite row has no byte offset or size. {RERUN_PREPARE}")
            unreadable += 1
            continue
        if location.offset < BLOCK:
            lines.append(
                f"-- {part}: index.sqlite puts it at byte {location.offset:,}, before any header could be. {RERUN_PREPARE}"
            )
            unreadable += 1
            continue
        try:  # the member's header too: it says whether the index still describes this shard
            data = dataset.read_part(
                location._replace(offset=location.offset - BLOCK, size=location.size + BLOCK)
            )
        except OSError as error:
            lines.append(f"-- {part} ({location.size:,} bytes): unreadable ({error})")
            unreadable += 1
            continue
        elsewhere = _other_member(data[:BLOCK], f"{sample.key}.{part}", location)
        if elsewhere is not None:
            lines.append(f"-- {part} ({location.size:,} bytes): not shown: {elsewhere}")
            unreadable += 1
            continue
        data = data[BLOCK:]
        shown = raw_preview(data, limit) if raw else describe_part(part, data, limit)
        separator = "\n" if "\n" in shown else " "
        body = shown.replace("\n", "\n   ") if separator == "\n" else shown
        lines.append(
            f"-- {part} ({location.size:,} bytes):{separator}{'   ' if separator == chr(10) else ''}{body}"
        )
    return ShownSample("\n".join(lines), unreadable)
