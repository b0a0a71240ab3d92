"""Turn a field's value into a part's bytes, chosen by the part name's last extension from one table.

    >>> encode_part("txt", "héllo"), encode_part("cls", 7), encode_part("json", {"a": 1})
    (b'h\\xc3\\xa9llo', b'7', b'{"a": 1}')

Media parts (jpg, png, wav, ...) are bytes written as they are, never re-encoded; a `str` given for a
media part names the file to read. Pickle is used only when the caller allows it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

#: Extensions whose parts are media files: bytes in, the same bytes out.
MEDIA_EXTENSIONS = frozenset(
    "jpg jpeg png gif bmp tif tiff webp ppm pgm pbm jp2 heic avif "
    "wav mp3 flac ogg opus m4a aac "
    "mp4 webm avi mkv mov mpg mpeg "
    "pdf bin gz zst".split()
)


class EncodeError(ValueError):
    """A value that cannot be written as the part it is mapped to (the message says why)."""


def _text(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value).encode()
    raise EncodeError(f"a {type(value).__name__} cannot be written as text (give a string)")


def _json(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)  # already-encoded JSON (e.g. a JSONL line) is kept byte for byte
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise EncodeError(f"not JSON-serialisable ({error})") from None


def _msgpack(value: object) -> bytes:
    import msgpack

    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as error:
        raise EncodeError(f"not msgpack-serialisable ({error})") from None


def _npy(value: object) -> bytes:
    import numpy as np

    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise EncodeError(f"not an array ({error})") from None
    if array.dtype == object:
        raise EncodeError("not a regular numeric array (ragged or mixed values)")
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _cls(value: object) -> bytes:
    if isinstance(value, bool):
        raise EncodeError("a class label must be an integer, not a bool")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, str | bytes) and value.strip().lstrip(b"-" if isinstance(value, bytes) else "-").isdigit():
        return str(int(value)).encode()
    raise EncodeError(f"a class label must be an integer, got {value!r:.40}")


def _pickle(value: object) -> bytes:
    import pickle

    return pickle.dumps(value)


def _media(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str | Path):
        try:
            return Path(value).read_bytes()
        except OSError as error:
            raise EncodeError(f"missing media file {str(value)!r} ({error.strerror or error})") from None
    raise EncodeError(f"a media part needs bytes or a file path, got a {type(value).__name__}")


def _raw(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise EncodeError(f"a {type(value).__name__} has no encoder for this extension (give bytes or a string)")


ENCODERS: dict[str, Callable[[object], bytes]] = {
    "txt": _text,
    "text": _text,
    "json": _json,
    "jsn": _json,
    "msgpack": _msgpack,
    "mp": _msgpack,
    "npy": _npy,
    "cls": _cls,
    "cls2": _cls,
    "index": _cls,
    "pickle": _pickle,
    "pyd": _pickle,
    **dict.fromkeys(MEDIA_EXTENSIONS, _media),
}
PICKLE_EXTENSIONS = frozenset({"pickle", "pyd"})


def extension(part: str) -> str:
    """The extension that picks a part's encoder: the last dot-separated piece, lower-cased.

    >>> extension("caption.TXT"), extension("jpg")
    ('txt', 'jpg')
    """
    return part.rpartition(".")[2].lower()


def encoder_for(part: str, allow_pickle: bool = False) -> Callable[[object], bytes]:
    """The encoder for a part name; pickle only with `allow_pickle` (it runs code when loaded)."""
    ext = extension(part)
    if ext in PICKLE_EXTENSIONS and not allow_pickle:
        raise EncodeError(
            f"part {part!r} would be pickled, which runs arbitrary code when loaded; allow it explicitly"
            " (--allow-pickle) or choose json, msgpack or npy."
        )
    return ENCODERS.get(ext, _raw)


def encode_part(part: str, value: object, allow_pickle: bool = False) -> bytes:
    """Encode one value as the part `part`; raises EncodeError with the reason."""
    return encoder_for(part, allow_pickle)(value)
