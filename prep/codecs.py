"""A part's bytes by its name's last extension, both ways: one table of codecs for `write` and `inspect`.

    >>> encode_part("txt", "héllo"), encode_part("cls", 7), encode_part("json", {"a": 1})
    (b'h\\xc3\\xa9llo', b'7', b'{"a": 1}')
    >>> describe_part("seg.0.json", b'{"a": 1}'), describe_part("cls", b"7")
    ('{\\n  "a": 1\\n}', '7')

The table follows what energon's loader decodes (webdataset's default decoders, with images and media
by extension), so a part `write` makes is one energon reads back as the same value: text as UTF-8, class
labels as integers, JSON, msgpack, numpy arrays; media (images, audio, video, documents) as their bytes,
never re-encoded, read from a file when given a path. As in webdataset's writer, bytes are taken as the
part's encoded content (a file from a folder source, a JSONL line) and written as they are; only class
labels are checked to be integers. Pickles are written only when the caller allows it (they run code
when loaded) and never unpickled here. `describe` turns content back into a short text for
people (preview) and raises on content its extension cannot hold (verify --deep).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Characters of decoded content shown per part.
TEXT_LIMIT = 600


class EncodeError(ValueError):
    """A value that cannot be written as the part it is mapped to (the message says why)."""


@dataclass(frozen=True)
class Codec:
    """How one kind of part is written (`encode`: value -> bytes, raising EncodeError) and described
    (`describe`: bytes, character limit -> text, raising on content it cannot read)."""

    name: str
    encode: Callable[[object], bytes]
    describe: Callable[[bytes, int], str] | None
    #: Media: bytes in, the same bytes out; a str given for the part names the file to read.
    media: bool = False
    #: Whether verify --deep reports content `describe` cannot read (text may be in another encoding).
    checked: bool = True


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit:,} more characters)"


def _encode_text(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value).encode()
    raise EncodeError(f"a {type(value).__name__} cannot be written as text (give a string)")


def _describe_text(data: bytes, limit: int) -> str:
    return _shorten(data.decode("utf-8"), limit)


def _encode_json(value: object) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)  # already-encoded JSON (e.g. a JSONL line) is kept byte for byte
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise EncodeError(f"not JSON-serialisable ({error})") from None


def _describe_json(data: bytes, limit: int) -> str:
    return _shorten(json.dumps(json.loads(data), indent=2, ensure_ascii=False), limit)


def _encode_integer(value: object) -> bytes:
    if isinstance(value, bool):
        raise EncodeError("a class label must be an integer, not a bool")
    if isinstance(value, int):
        return str(value).encode()
    if (
        isinstance(value, str | bytes)
        and value.strip().lstrip(b"-" if isinstance(value, bytes) else "-").isdigit()
    ):
        return str(int(value)).encode()
    raise EncodeError(f"a class label must be an integer, got {value!r:.40}")


def _describe_integer(data: bytes, limit: int) -> str:
    return str(int(data.decode("utf-8").strip()))


def _encode_msgpack(value: object) -> bytes:
    import msgpack

    if isinstance(value, bytes | bytearray):
        return bytes(value)  # an encoded msgpack file
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as error:
        raise EncodeError(f"not msgpack-serialisable ({error})") from None


def _describe_msgpack(data: bytes, limit: int) -> str:
    import msgpack

    return _shorten(repr(msgpack.unpackb(data, raw=False)), limit)


def _encode_npy(value: object) -> bytes:
    import numpy as np

    if isinstance(value, bytes | bytearray):
        return bytes(value)  # an encoded .npy file
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise EncodeError(f"not an array ({error})") from None
    if array.dtype == object:
        raise EncodeError("not a regular numeric array (ragged or mixed values)")
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _describe_npy(data: bytes, limit: int) -> str:
    import numpy as np

    array = np.load(io.BytesIO(data), allow_pickle=False)
    return f"array shape {tuple(array.shape)} dtype {array.dtype}"


def _encode_npz(value: object) -> bytes:
    import numpy as np

    if isinstance(value, bytes | bytearray):
        return bytes(value)  # an encoded .npz file
    if not isinstance(value, dict):
        raise EncodeError(f"an npz part needs a dict of arrays, got a {type(value).__name__}")
    out = io.BytesIO()
    try:
        np.savez(out, **{str(name): np.asarray(array) for name, array in value.items()})
    except (TypeError, ValueError) as error:
        raise EncodeError(f"not a dict of arrays ({error})") from None
    return out.getvalue()


def _describe_npz(data: bytes, limit: int) -> str:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return "arrays " + ", ".join(
            f"{name}: {arrays[name].shape} {arrays[name].dtype}" for name in arrays.files
        )


def _encode_pickle(value: object) -> bytes:
    import pickle

    if isinstance(value, bytes | bytearray):
        return bytes(value)  # an encoded pickle file
    return pickle.dumps(value)


def _describe_pickle(data: bytes, limit: int) -> str:
    return f"pickle, {len(data):,} bytes (not unpickled: that would run code from the dataset)"


def _encode_media(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str | Path):
        try:
            return Path(value).read_bytes()
        except OSError as error:
            raise EncodeError(f"missing media file {str(value)!r} ({error.strerror or error})") from None
    raise EncodeError(f"a media part needs bytes or a file path, got a {type(value).__name__}")


def _describe_image(data: bytes, limit: int) -> str:
    try:
        from PIL import Image
    except ImportError:
        return f"image, {len(data):,} bytes (install Pillow to see its size and mode)"
    with Image.open(io.BytesIO(data)) as image:
        description = f"image {image.format} {image.width}x{image.height} mode {image.mode}"
        image.verify()
    return description


def _encode_raw(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise EncodeError(f"a {type(value).__name__} has no encoder for this extension (give bytes or a string)")


TEXT = Codec("text", _encode_text, _describe_text, checked=False)
JSON = Codec("json", _encode_json, _describe_json)
INTEGER = Codec("integer", _encode_integer, _describe_integer)
MSGPACK = Codec("msgpack", _encode_msgpack, _describe_msgpack)
NPY = Codec("npy", _encode_npy, _describe_npy)
NPZ = Codec("npz", _encode_npz, _describe_npz)
PICKLE = Codec("pickle", _encode_pickle, _describe_pickle)
IMAGE = Codec("image", _encode_media, _describe_image, media=True)
MEDIA = Codec("media", _encode_media, None, media=True)
RAW = Codec("raw", _encode_raw, None)

# Extensions as webdataset's default decoders (and so energon's loader) read them, plus the text and
# media extensions that they leave as bytes.
CODECS: dict[str, Codec] = {
    **dict.fromkeys("txt text transcript caption md csv tsv html xml yaml yml".split(), TEXT),
    **dict.fromkeys("json jsn".split(), JSON),
    **dict.fromkeys("cls cls2 index inx id".split(), INTEGER),
    **dict.fromkeys("mp msg msgpack".split(), MSGPACK),
    "npy": NPY,
    "npz": NPZ,
    **dict.fromkeys("pickle pyd pkl".split(), PICKLE),
    **dict.fromkeys("jpg jpeg png gif bmp tif tiff webp ppm pgm pbm pnm jp2 heic avif".split(), IMAGE),
    **dict.fromkeys(
        "wav mp3 flac ogg opus m4a aac mp4 webm avi mkv mov mpg mpeg pdf bin gz zst".split(), MEDIA
    ),
}


def extension(part: str) -> str:
    """The extension that picks a part's codec: the last dot-separated piece, lower-cased.

    >>> extension("caption.TXT"), extension("jpg")
    ('txt', 'jpg')
    """
    return part.rpartition(".")[2].lower()


def codec_for(part: str) -> Codec:
    """The codec of a part name (RAW for extensions nobody decodes: bytes, or a string as UTF-8)."""
    return CODECS.get(extension(part), RAW)


def encoder_for(part: str, allow_pickle: bool = False) -> Callable[[object], bytes]:
    """The encoder for a part name; pickle only with `allow_pickle` (it runs code when loaded)."""
    codec = codec_for(part)
    if codec is PICKLE and not allow_pickle:
        raise EncodeError(
            f"part {part!r} would be pickled, which runs arbitrary code when loaded; allow it explicitly"
            " (--allow-pickle) or choose json, msgpack or npy"
        )
    return codec.encode


def encode_part(part: str, value: object, allow_pickle: bool = False) -> bytes:
    """Encode one value as the part `part`; raises EncodeError with the reason."""
    return encoder_for(part, allow_pickle)(value)


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
    describe = codec_for(part).describe
    if describe is None:
        return f"{len(data):,} bytes: {raw_preview(data)}"
    try:
        return describe(data, limit)
    except Exception as error:  # any decoder failure is shown, not raised: preview must go on
        return f"cannot decode as {extension(part)} ({error}); {len(data):,} bytes: {raw_preview(data)}"


def content_problem(part: str, data: bytes) -> str | None:
    """Why a part's content cannot be read as its extension says, or None if it can (or is not checked)."""
    codec = codec_for(part)
    if codec.describe is None or not codec.checked:
        return None
    try:
        codec.describe(data, 0)
    except Exception as error:  # the reason is the report
        return f"{type(error).__name__}: {error}"
    return None
