"""The small files of `.nv-meta`, read and written in one place: `.info.json` (and the legacy
`.info.yaml`), `split.yaml`, `index.uuid`, and the brace lists split files hold; `dataset.yaml` is read
here too (its text is written by `prep.index.dataset_yaml`).

`.info.json` lists every shard with its sample count; its key order is the shard order, which is each
shard's `tar_file_id` in sqlite. `split.yaml` lists each split's shards as brace patterns
(`a/{000..009}.tar`), collapsed in order when written and expanded with the `braceexpand` package when
read, as energon does. A split file is parsed as energon parses it, by the ending of its name
(`SPLIT_FILE_PARSERS`), and split.json stands in for a missing split.yaml (`split_file_name`). Readers raise PrepError naming the file and what to do.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import braceexpand

from prep.errors import PrepError
from prep.index.format import ENERGON_FORMAT_VERSION, INFO_JSON, INFO_YAML, META_DIR, SPLIT_JSON, SPLIT_YAML

RERUN_PREPARE = "Re-run `shardprep prepare` (or `energon prepare`) on the dataset folder."
#: What to do about an index file or folder that exists but cannot be opened.
MAKE_READABLE = "make it readable (check its owner and mode)"

_NUMBER = re.compile(r"\d+")
#: What `braceexpand` reads as syntax in a name: braces, and the backslash that escapes them.
_BRACE_SYNTAX = re.compile(r"([\\{}])")


def _escaped(literal: str) -> str:
    r"""A literal piece of a shard name with its braces and backslashes escaped, so that energon's
    `braceexpand` gives it back as it is (a shard may be named `y{1..2}.tar`).

    >>> print(_escaped("y{1..2}.tar"), _escaped("a\\b.tar"))
    y\{1..2\}.tar a\\b.tar
    """
    return _BRACE_SYNTAX.sub(r"\\\1", literal)


def _tokens(name: str) -> tuple[list[str], list[str]]:
    """Split a name into literal pieces and the digit runs between them (`len(literals) == len(digits) + 1`)."""
    literals: list[str] = []
    digits: list[str] = []
    position = 0
    for match in _NUMBER.finditer(name):
        literals.append(name[position : match.start()])
        digits.append(match.group())
        position = match.end()
    literals.append(name[position:])
    return literals, digits


def _changed_slot(previous: list[str], current: list[str]) -> int | None:
    """The one digit run that goes up by exactly one at the same width, else None."""
    changed = [slot for slot, (a, b) in enumerate(zip(previous, current, strict=True)) if a != b]
    if len(changed) != 1:
        return None
    slot = changed[0]
    a, b = previous[slot], current[slot]
    if len(a) != len(b) or int(b) != int(a) + 1:
        return None
    return slot


def collapse(names: list[str]) -> list[str]:
    """Replace each run of names counting up in one number by a brace range, keeping the order; braces
    and backslashes of the names themselves are escaped. `expand` gives the names back.

    >>> collapse(["s/000.tar", "s/001.tar", "s/002.tar", "t.tar", "s/007.tar"])
    ['s/{000..002}.tar', 't.tar', 's/007.tar']
    >>> expand(collapse(["{a}-0.tar", "{a}-1.tar", "z}.tar"]))
    ['{a}-0.tar', '{a}-1.tar', 'z}.tar']
    """
    out: list[str] = []
    i = 0
    while i < len(names):
        literals, first = _tokens(names[i])
        slot: int | None = None
        last = first
        j = i + 1
        while j < len(names):
            next_literals, digits = _tokens(names[j])
            if next_literals != literals or len(digits) != len(first):
                break
            changed = _changed_slot(last, digits)
            if changed is None or (slot is not None and changed != slot):
                break
            slot, last = changed, digits
            j += 1
        if slot is None:
            out.append(_escaped(names[i]))
        else:
            pieces = [_escaped(literals[0])]
            for k, run in enumerate(first):
                pieces.append(f"{{{run}..{last[k]}}}" if k == slot else run)
                pieces.append(_escaped(literals[k + 1]))
            out.append("".join(pieces))
        i = j if slot is not None else i + 1
    return out


def expand(patterns: list[str]) -> list[str]:
    """Expand brace patterns as energon does (the `braceexpand` package), in order."""
    return [name for pattern in patterns for name in braceexpand.braceexpand(pattern)]


def is_prepared(root: Path) -> bool:
    """Whether `root` already has an energon index (`.nv-meta/.info.json` or the legacy `.info.yaml`)."""
    return (root / META_DIR / INFO_JSON).is_file() or (root / META_DIR / INFO_YAML).is_file()


def unreadable_reason(path: Path) -> str | None:
    """Why the file or folder at `path` cannot be opened for reading (`os.strerror`), or None if it can.

    Opened without blocking, so a FIFO in its place does not wait for a writer.
    """
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as error:
        return error.strerror
    return None


def unreadable_error(path: Path, reason: str) -> PrepError:
    return PrepError(f"{path} cannot be read ({reason}): {MAKE_READABLE}.")


def _is_file(path: Path) -> bool:
    """`path.is_file()`, with a folder above it that cannot be searched named as such (not a traceback)."""
    try:
        return path.is_file()
    except PermissionError as error:
        raise unreadable_error(path.parent, error.strerror) from None


def read_info(meta: Path) -> dict:
    """The parsed `.info.json` of the index folder `meta` (or its legacy `.info.yaml`), checked: a mapping
    with `shard_counts`, shard name to sample count."""
    if _is_file(meta / INFO_JSON):
        path, info = meta / INFO_JSON, _parse(meta / INFO_JSON, json.loads, ValueError)
    elif _is_file(meta / INFO_YAML):
        path, info = meta / INFO_YAML, _parse_yaml(meta / INFO_YAML)
    else:
        raise PrepError(
            f"{meta.parent} has not been prepared: {META_DIR}/{INFO_JSON} is missing. {RERUN_PREPARE}"
        )
    counts = info.get("shard_counts") if isinstance(info, dict) else None
    if not isinstance(counts, dict) or not all(
        isinstance(count, int) and not isinstance(count, bool) for count in counts.values()
    ):
        raise PrepError(
            f"{path} has no valid `shard_counts` mapping of shard name to sample count. {RERUN_PREPARE}"
        )
    return info


def _utf8_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _parse(
    path: Path,
    loads: Callable[[Any], object],
    errors: type[Exception] | tuple,
    read: Callable[[Path], str | bytes] = _utf8_text,
) -> object:
    """A meta file read by `read` (as UTF-8 text unless told; `loads` takes what it gives) and parsed by
    `loads`; PrepError naming the file if it cannot be read or parsed."""
    try:
        return loads(read(path))
    except PermissionError as error:
        raise unreadable_error(path, error.strerror) from None
    except OSError as error:
        raise PrepError(f"{path} cannot be read ({error.strerror}). {RERUN_PREPARE}") from None
    except UnicodeDecodeError as error:  # before `errors`: for JSON it is a ValueError too
        raise PrepError(
            f"{path} is not UTF-8 text (byte {error.start:,} is 0x{error.object[error.start]:02x})."
            f" {RERUN_PREPARE}"
        ) from None
    except errors as error:
        raise PrepError(f"{path} is not valid ({error}). {RERUN_PREPARE}") from None


def _parse_yaml(path: Path) -> object:
    """A YAML meta file parsed as far as energon's reader can parse it (`prep.index.yaml_reader`)."""
    import yaml

    from prep.index.yaml_reader import load_yaml

    return _parse(path, lambda text: load_yaml(text, path), yaml.YAMLError)


def read_shard_counts(meta: Path) -> dict[str, int]:
    """Shard name -> sample count from `.info.json`, in its order (the `tar_file_id` order)."""
    return {str(name): int(count) for name, count in read_info(meta)["shard_counts"].items()}


def info_json_text(shard_counts: dict[str, int]) -> str:
    """`.info.json` exactly as energon writes it: format version, then shard counts in shard order."""
    info = {"energon_version": ENERGON_FORMAT_VERSION, "shard_counts": shard_counts}
    return json.dumps(info, indent=2)


def info_yaml_text(shard_counts: dict[str, int]) -> str:
    """The legacy `.info.yaml`, kept in sync when a dataset still has one (energon does the same)."""
    import yaml

    return yaml.dump({"energon_version": ENERGON_FORMAT_VERSION, "shard_counts": shard_counts})


def info_json_from_yaml(meta: Path) -> str:
    """`.info.json` for an index folder that holds only the legacy `.info.yaml` (energon writes it when it
    re-indexes such a dataset)."""
    return json.dumps(read_info(meta), indent=2)


def split_yaml_text(splits: dict[str, list[str]]) -> str:
    """`split.yaml`: each split's shards, brace-collapsed in order, and an empty exclude list."""
    import yaml

    document = {"split_parts": {name: collapse(shards) for name, shards in splits.items()}, "exclude": []}
    return yaml.dump(document, sort_keys=False)


def read_splits(path: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The split file's shard lists (brace-expanded, excluded shards removed) and its expanded excludes.

    Entries of `exclude` that contain a `/` below a shard name exclude single samples; energon keeps them
    in the exclude list, and so does this function.
    """
    raw = _parse_split_file(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("split_parts"), dict):
        raise PrepError(f"{path} has no `split_parts` mapping, so no split can be read. {RERUN_PREPARE}")
    excludes = expand([str(pattern) for pattern in raw.get("exclude") or []])
    excluded = set(excludes)
    splits: dict[str, list[str]] = {}
    for split, patterns in raw["split_parts"].items():
        names = expand([str(pattern) for pattern in patterns or []])
        splits[str(split)] = [name for name in names if name not in excluded]
    return splits, excludes


def _parse_json_split_file(path: Path) -> object:
    """A `.json` split file parsed as energon parses it, with `json.load` on its bytes: no YAML syntax, tabs
    may indent it, and it may be UTF-8 (with a byte order mark or not), UTF-16 or UTF-32, as `json` detects.
    PrepError naming the file and the line and column of a syntax error."""
    try:
        return _parse(path, json.loads, (), Path.read_bytes)
    except json.JSONDecodeError as error:
        raise PrepError(
            f"{path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}. energon"
            " reads a split file whose name ends in .json with json.load, so its loader fails on it."
        ) from None


#: How energon parses a split file, by the ending of its name: (the format, its parser here). It refuses
#: a split file with another ending ('Invalid file extension').
SPLIT_FILE_PARSERS: dict[str, tuple[str, Callable[[Path], object]]] = {
    ".yaml": ("YAML", _parse_yaml),
    ".json": ("JSON", _parse_json_split_file),
}


def split_file_name(meta: Path, split_config: str) -> str:
    """The split file energon reads from the index folder `meta` when told `split_config`: that one, but
    split.json in place of a split.yaml that is missing (energon tries it on FileNotFoundError, for that
    name alone, whether named or the default), when split.json is there.

    >>> split_file_name(Path("/nowhere"), "split.yaml"), split_file_name(Path("/nowhere"), "all.yaml")
    ('split.yaml', 'all.yaml')
    """
    if split_config == SPLIT_YAML and not (meta / SPLIT_YAML).exists() and (meta / SPLIT_JSON).exists():
        return SPLIT_JSON
    return split_config


def _parse_split_file(path: Path) -> object:
    """The split file at `path` parsed as energon parses it, by the ending of its name
    (`SPLIT_FILE_PARSERS`); PrepError naming the file if it cannot be read or parsed."""
    for ending, (_, parse) in SPLIT_FILE_PARSERS.items():
        if path.name.endswith(ending):
            return parse(path)
    endings = " or ".join(f"{ending} (as {kind})" for ending, (kind, _) in SPLIT_FILE_PARSERS.items())
    raise PrepError(
        f"{path} is not a split file energon reads: it reads one whose name ends in {endings}, and refuses"
        " any other ('Invalid file extension')."
    )


def read_dataset_yaml(path: Path) -> dict:
    """`dataset.yaml` parsed; PrepError naming the file unless it is a YAML mapping, the only kind energon
    loads."""
    config = _parse_yaml(path)
    if not isinstance(config, dict):
        holds = "is empty" if config is None else f"holds a YAML {type(config).__name__}"
        raise PrepError(
            f"{path} {holds}, not a mapping with a `sample_type`, so energon cannot load the dataset."
            f" {RERUN_PREPARE}"
        )
    return config


def new_index_uuid() -> str:
    """A fresh dataset identity, as energon writes one on every re-index."""
    return str(uuid.uuid4())
