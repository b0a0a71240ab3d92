"""The parts stage of a write: a record's fields to its encoded parts, and its media to the aux dataset.

Which fields become which parts is the user's `--part` mapping or the source's default (`"json-line"`,
`"json-row"`, `"by-name"`, or (field, part) pairs); each value is encoded by its part's extension
(`prep.codecs`). A media part given as a path is read relative to the source's folder. With
`--media-column` the media fields leave the sample for the auxiliary dataset, and the sample keeps their
file names there in its `aux.json` part.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from prep.codecs import EncodeError, codec_for, encoder_for, extension
from prep.errors import PrepError
from prep.index.dataset_yaml import field_map_parts
from prep.index.format import AUX_PART
from prep.write.keys import Rejected, path_problem
from prep.write.options import WriteOptions
from prep.write.sources import Record, Source

Parts = list[tuple[str, bytes]]


def record_parts(source: Source, record: Record, key: str, options: WriteOptions) -> tuple[Parts, Parts]:
    """(the sample's parts, its media for the auxiliary dataset) of one record; Rejected if it has none
    or a value cannot be written as its part."""
    fields = record.fields
    try:
        media: Parts = []
        if options.media:
            fields = dict(fields)
            media, names = _media_parts(key, record, fields, options.media)
        parts = _encoded_parts(source, record, fields, options)
        if options.media:
            parts.append((AUX_PART, json.dumps(names, ensure_ascii=False).encode()))
    except EncodeError as error:
        raise Rejected(str(error)) from None
    except KeyError as error:
        raise Rejected(f"no field {error.args[0]!r} for --part") from None
    if not parts:
        raise Rejected("the record has no parts to write")
    return parts, media


def parts_written(options: WriteOptions, sources: list[Source]) -> set[str] | None:
    """The names of the parts the write gives its samples, where known before reading: from --part or
    the sources' default parts; None when a source names them by its fields (folders, dicts)."""
    if options.parts is not None:
        names = {part for _, part in options.parts}
    else:
        names = set()
        for source in sources:
            mapping = source.default_parts
            if mapping in ("json-line", "json-row"):
                names.add("json")
            elif isinstance(mapping, list):
                names.update(part for _, part in mapping)
            else:
                return None
    return names | {AUX_PART} if options.media else names


def check_field_map(field_map: dict[str, str] | None, parts: set[str]) -> None:
    """A PrepError if --field-map reads a field from parts that no sample has (energon would load none)."""
    for field, names in field_map_parts(field_map or {}).items():
        if not parts.intersection(names):
            raise PrepError(
                f"--field-map reads {field!r} from {field_map[field]!r} (part {' or '.join(names)}), but no"
                f" sample has that part; the parts written are {', '.join(sorted(parts)) or 'none'}. Map"
                " the field to one of them, or write the part with --part FIELD=PART."
            )


def _encode(part: str, value: object, record: Record, allow_pickle: bool) -> bytes:
    if isinstance(value, str) and codec_for(part).media:
        return read_media(value, record)  # a media part given as a path reads the file
    return encoder_for(part, allow_pickle)(value)


#: While set (`media_files_read`), every media file a record names is listed here as it is read: what
#: `write --resume` must check again before it reuses what was made from the record.
_MEDIA_READ: ContextVar[list[Path] | None] = ContextVar("media_read", default=None)


@contextmanager
def media_files_read() -> Iterator[list[Path]]:
    """The media files named by path that the records staged inside the block read, in order."""
    read: list[Path] = []
    token = _MEDIA_READ.set(read)
    try:
        yield read
    finally:
        _MEDIA_READ.reset(token)


def read_media(value: str, record: Record) -> bytes:
    """The bytes of a media file named in a record, relative to the source's folder."""
    path = Path(value) if record.base is None else record.base / value
    try:
        data = path.read_bytes()
    except OSError as error:
        raise EncodeError(f"missing media file {value!r} ({error.strerror or error})") from None
    read = _MEDIA_READ.get()
    if read is not None:
        read.append(path)
    return data


def _encoded_parts(source: Source, record: Record, fields: dict, options: WriteOptions) -> Parts:
    """The parts of one record, encoded; raises EncodeError or KeyError (a missing field)."""
    allow_pickle = options.allow_pickle
    mapping = options.parts or source.default_parts
    if mapping == "json-line":
        if record.raw is not None and fields is record.fields:
            return [("json", record.raw)]
        return [("json", _encode("json", fields, record, allow_pickle))]
    if mapping == "json-row":
        return [("json", _encode("json", fields, record, allow_pickle))]
    if mapping == "by-name":
        parts = []
        for name, value in fields.items():
            if value is None or name.startswith("__"):
                continue
            if "/" in name:  # `key.a/b` would be member `b` of folder `key.a` to energon: the part is lost
                raise EncodeError(f"field {name!r} has a slash, which a part name may not have")
            parts.append((name, _encode(name, value, record, allow_pickle)))
        return parts
    parts = []
    for column, part in mapping:
        if column not in fields:
            raise KeyError(column)
        value = fields[column]
        if value is not None:  # a null writes no part, as webdataset leaves out missing parts
            parts.append((part, _encode(part, value, record, allow_pickle)))
    return parts


def _media_parts(
    key: str, record: Record, fields: dict, media: tuple[tuple[str, str | None], ...]
) -> tuple[Parts, dict[str, str]]:
    """Take the media fields out of `fields`: (aux parts, {field: aux file name}); raises EncodeError."""
    parts: Parts = []
    names: dict[str, str] = {}
    for column, ext in media:
        if column not in fields:
            raise EncodeError(f"no field {column!r} for --media-column")
        value = fields.pop(column)
        if ext is None:
            file_name = value.rpartition("/")[2] if isinstance(value, str) else ""
            if "." in file_name:
                ext = file_name.rpartition(".")[2].lower()
            elif codec_for(column).media:
                ext = extension(column)
            else:
                raise EncodeError(
                    f"cannot tell the file type of media field {column!r}; give --media-column {column}=EXT"
                )
        if isinstance(value, str):
            data = read_media(value, record)
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
        else:
            raise EncodeError(f"media field {column!r} holds a {type(value).__name__}, not a path or bytes")
        part = ext if len(media) == 1 else f"{column}.{ext}"
        name = f"{key}.{part}"
        problem = path_problem(name)
        if problem is not None:
            raise EncodeError(f"media file name {name!r} would leave the aux dataset: {problem}")
        parts.append((part, data))
        names[column] = name
    return parts, names
