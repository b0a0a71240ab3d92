"""Decode a sample part by its extension, for people (preview) and for checking (verify --deep).

One table maps the last extension of a part name to a decoder, the way webdataset chooses its
decoders. Decoders return a short description and raise on content they cannot read. Pickles are
never unpickled: that would run code from the dataset.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import numpy as np

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "gif", "bmp", "tif", "tiff"}
)
TEXT_EXTENSIONS = frozenset(
    {"txt", "text", "transcript", "caption", "md", "csv", "tsv", "html", "xml", "yaml", "yml"}
)
INTEGER_EXTENSIONS = frozenset({"cls", "cls2", "index", "inx", "id"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})

TEXT_LIMIT = 600


def extension(part: str) -> str:
    """The last extension of a part name, lower-cased: `seg.0.JSON` -> `json`."""
    return part.rsplit(".", 1)[-1].lower()


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit:,} more characters)"


def _json(data: bytes, limit: int) -> str:
    return _shorten(json.dumps(json.loads(data), indent=2, ensure_ascii=False), limit)


def _text(data: bytes, limit: int) -> str:
    return _shorten(data.decode("utf-8"), limit)


def _integer(data: bytes, limit: int) -> str:
    return str(int(data.decode("utf-8").strip()))


def _image(data: bytes, limit: int) -> str:
    try:
        from PIL import Image
    except ImportError:
        return f"image, {len(data):,} bytes (install Pillow to see its size and mode)"
    with Image.open(io.BytesIO(data)) as image:
        description = f"image {image.format} {image.width}x{image.height} mode {image.mode}"
        image.verify()
    return description


def _npy(data: bytes, limit: int) -> str:
    array = np.load(io.BytesIO(data), allow_pickle=False)
    return f"array shape {tuple(array.shape)} dtype {array.dtype}"


def _npz(data: bytes, limit: int) -> str:
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return "arrays " + ", ".join(
            f"{name}: {arrays[name].shape} {arrays[name].dtype}" for name in arrays.files
        )


def _pickle(data: bytes, limit: int) -> str:
    return f"pickle, {len(data):,} bytes (not unpickled: that would run code from the dataset)"


DECODERS: dict[str, Callable[[bytes, int], str]] = {
    **{ext: _json for ext in JSON_EXTENSIONS},
    **{ext: _text for ext in TEXT_EXTENSIONS},
    **{ext: _integer for ext in INTEGER_EXTENSIONS},
    **{ext: _image for ext in IMAGE_EXTENSIONS},
    "npy": _npy,
    "npz": _npz,
    "pyd": _pickle,
    "pickle": _pickle,
    "pkl": _pickle,
}


def raw_preview(data: bytes, limit: int = 64) -> str:
    """The first bytes as a Python bytes literal.

    >>> raw_preview(b"abc"), raw_preview(bytes(100), 4)
    ("b'abc'", "b'\\\\x00\\\\x00\\\\x00\\\\x00' ... (100 bytes)")
    """
    if len(data) <= limit:
        return repr(data)
    return f"{data[:limit]!r} ... ({len(data):,} bytes)"


def describe_part(part: str, data: bytes, limit: int = TEXT_LIMIT) -> str:
    """A human description of a part's content; undecodable content is shown raw with the reason."""
    decoder = DECODERS.get(extension(part))
    if decoder is None:
        return f"{len(data):,} bytes: {raw_preview(data)}"
    try:
        return decoder(data, limit)
    except Exception as error:  # any decoder failure is shown, not raised: preview must go on
        return f"cannot decode as {extension(part)} ({error}); {len(data):,} bytes: {raw_preview(data)}"


def content_problem(part: str, data: bytes) -> str | None:
    """Why a part's content cannot be decoded by its extension, or None if it can (or has no decoder)."""
    decoder = DECODERS.get(extension(part))
    if decoder is None or decoder is _text:  # text parts may legitimately be in another encoding
        return None
    try:
        decoder(data, 0)
    except Exception as error:  # the reason is the report
        return f"{type(error).__name__}: {error}"
    return None
