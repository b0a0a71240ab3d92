"""An image's width, height, format and mode from its header, as Pillow (energon's reader) reports them.

energon opens every image part with Pillow and decodes it in full to learn four facts; they are all in
the first bytes of the four common formats, which this module reads without a decoder:

- JPEG: the markers up to the first start-of-frame (SOF), stray bytes between segments skipped as
  Pillow skips them; its precision, size and component count (1 -> L, 3 -> RGB, 4 -> CMYK). A
  multi-picture file (an APP2 segment starting "MPF\\0", as cameras and Pillow write it) may be
  Pillow's MPO: handed to Pillow.
- PNG: the IHDR chunk; bit depth and colour type -> Pillow's mode table.
- GIF: the logical screen, the first frame's descriptor (it may widen the image) and which palette it
  uses: P, or L when the palette is the identity grey ramp (or there is none); stray bytes between
  blocks are skipped, as Pillow skips them.
- WebP: the VP8X canvas and its alpha flag (for a still image, an ALPH chunk or a lossless bitstream's
  alpha bit, as libwebp decides), or the VP8L / VP8 bitstream header; RGBA or RGB.

Anything else goes to Pillow (`Image.open` and `load`, as energon does), which must then be installed;
bytes Pillow does not recognise are not an image (None), as in energon, and neither is an image of
no width or no height. A header that is cut short or that Pillow would refuse raises MediaError with
the byte offset (in the part) of the problem.

    >>> import struct, zlib
    >>> ihdr = struct.pack(">IIBBBBB", 3, 2, 8, 6, 0, 0, 0)
    >>> png = b"\\x89PNG\\r\\n\\x1a\\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\\0" * 4
    >>> image_metadata(from_bytes(png), len(png))
    ImageMetadata(width=3, height=2, format='PNG', mode='RGBA')
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
from collections.abc import Callable
from typing import NamedTuple

#: `read(offset, length)`: up to `length` bytes of the part from `offset` (fewer at its end).
ReadAt = Callable[[int, int], bytes]

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GIF_MAGICS = (b"GIF87a", b"GIF89a")
#: The leading bytes every parser here starts from (more are read only as a format needs them).
HEAD_BYTES = 64

#: PNG (bit depth, colour type) -> Pillow's mode.
PNG_MODES = {
    (1, 0): "1",
    (2, 0): "L",
    (4, 0): "L",
    (8, 0): "L",
    (16, 0): "I;16",
    (8, 2): "RGB",
    (16, 2): "RGB",
    (1, 3): "P",
    (2, 3): "P",
    (4, 3): "P",
    (8, 3): "P",
    (8, 4): "LA",
    (16, 4): "RGBA",
    (8, 6): "RGBA",
    (16, 6): "RGBA",
}
#: JPEG component count -> Pillow's mode.
JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
#: JPEG start-of-frame markers (all but DHT 0xC4, JPG 0xC8 and DAC 0xCC in 0xC0..0xCF).
JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers without a length field: TEM, RST0..7, SOI, EOI.
JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8, 0xD9})
JPEG_SOS = 0xDA
JPEG_APP2 = 0xE2
#: Bytes read at a time while looking past stray bytes for the next JPEG marker or GIF block.
SKIP_BLOCK = 4096
#: What ends a run of stray bytes: the 0xff that starts a JPEG marker; a GIF block's introducer
#: (extension, image or trailer).
JPEG_MARKER_START = re.compile(rb"\xff")
GIF_BLOCK_START = re.compile(rb"[!,;]")
#: The identifier that starts an APP2 segment of the multi-picture format (Pillow's test for MPO).
JPEG_MPF = b"MPF\x00"


class MediaError(ValueError):
    """A part whose header cannot be read: `problem`, at byte `offset` of the part."""

    def __init__(self, problem: str, offset: int) -> None:
        super().__init__(f"{problem} (at byte {offset} of the part)")
        self.problem = problem
        self.offset = offset


class ImageMetadata(NamedTuple):
    """energon's `ImageMetadata`: what its media-metadata readers see for an image part."""

    width: int
    height: int
    format: str
    mode: str

    def json(self) -> str:
        """The `media_metadata.metadata_json` text, byte for byte as energon writes it."""
        return json.dumps(self._asdict(), separators=(",", ":"))


def from_bytes(data: bytes) -> ReadAt:
    """A ReadAt over bytes in memory."""
    return lambda offset, length: data[offset : offset + length]


def from_file(descriptor: int, offset: int, size: int) -> ReadAt:
    """A ReadAt over the `size` bytes at `offset` of an open file (one `pread` per call, nothing cached)."""

    def read(at: int, length: int) -> bytes:
        length = max(0, min(length, size - at))
        return os.pread(descriptor, length, offset + at) if length else b""

    return read


def image_metadata(read: ReadAt, size: int) -> ImageMetadata | None:
    """The metadata of the image part of `size` bytes that `read` reads, or None if it is no image."""
    head = read(0, HEAD_BYTES)
    if head.startswith(JPEG_MAGIC):
        return _identified(_jpeg(read, size))
    if head.startswith(PNG_MAGIC):
        return _identified(_png(head))
    if head[:6] in GIF_MAGICS:
        return _identified(_gif(read))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(read, head)
    return pillow_metadata(read(0, size))


def _identified(metadata: ImageMetadata | None) -> ImageMetadata | None:
    """None for an image of no width or no height, which Pillow's `Image.open` does not identify (so
    energon writes no row for it: a JPEG whose height is left to a DNL marker, say)."""
    if metadata is None or min(metadata.width, metadata.height) <= 0:
        return None
    return metadata


def pillow_metadata(data: bytes) -> ImageMetadata | None:
    """What Pillow reports after decoding `data` in full (energon's way): for formats read here without a
    decoder only when a header needs Pillow's judgement."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise MediaError(
            "this image is not JPEG, PNG, GIF or WebP; reading other formats needs Pillow"
            " (pip install 'shardprep[media]')",
            0,
        ) from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return ImageMetadata(
                image.width, image.height, image.format or "UNKNOWN", image.mode or "UNKNOWN"
            )
    except UnidentifiedImageError:
        return None
    except Exception as error:  # Pillow's many ways to refuse: OSError, SyntaxError, a decompression bomb
        raise MediaError(f"Pillow cannot read this image: {error}", 0) from None


def _need(data: bytes, length: int, what: str, offset: int) -> bytes:
    if len(data) < length:
        raise MediaError(f"the image ends inside its {what}", offset + len(data))
    return data


def _jpeg(read: ReadAt, size: int) -> ImageMetadata | None:
    position = 2
    while True:
        marker = _need(read(position, 2), 2, "markers (no start-of-frame before the end)", position)
        if marker[0] != 0xFF:  # stray bytes between segments, which Pillow (and libjpeg) skip
            position = _skip_to(read, position, JPEG_MARKER_START)
            continue
        code = marker[1]
        if code == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if code == 0x00:  # an escaped 0xff among stray bytes, skipped as Pillow does
            position += 2
            continue
        if code in JPEG_STANDALONE:
            position += 2
            continue
        (length,) = struct.unpack(">H", _need(read(position + 2, 2), 2, "marker length", position + 2))
        if code in JPEG_SOF:
            frame = _need(read(position + 4, 6), 6, "start-of-frame", position + 4)
            bits, height, width, layers = struct.unpack(">BHHB", frame)
            if bits != 8:
                raise MediaError(f"Pillow cannot handle {bits}-bit JPEG layers", position + 4)
            if layers not in JPEG_MODES:
                raise MediaError(f"Pillow cannot handle {layers}-layer JPEG images", position + 9)
            if _has_multi_picture(read, position + 2 + length, size):
                return pillow_metadata(read(0, size))
            return ImageMetadata(width, height, "JPEG", JPEG_MODES[layers])
        if code == JPEG_SOS:
            raise MediaError("the JPEG scan starts before any start-of-frame marker", position)
        if code == JPEG_APP2 and read(position + 4, 4) == JPEG_MPF:
            return pillow_metadata(read(0, size))
        if position + 2 + length > size:
            raise MediaError(f"the JPEG segment 0xff{code:02x} here runs past the end of the image", position)
        position += 2 + length


def _has_multi_picture(read: ReadAt, position: int, size: int) -> bool:
    """Whether an APP2 "MPF" segment follows the frame header before the scan (Pillow reads up to SOS)."""
    while position + 4 <= size:
        marker = read(position, 4)
        if len(marker) < 4:
            return False
        if marker[0] != 0xFF:
            position = _skip_to(read, position, JPEG_MARKER_START)
            continue
        code = marker[1]
        if code == 0xFF or code == 0x00:
            position += 1 if code else 2
            continue
        if code in JPEG_STANDALONE:
            position += 2
            continue
        if code == JPEG_SOS:
            return False
        if code == JPEG_APP2 and read(position + 4, 4) == JPEG_MPF:
            return True
        position += 2 + struct.unpack(">H", marker[2:])[0]
    return False


def _skip_to(read: ReadAt, position: int, wanted: re.Pattern[bytes]) -> int:
    """Where the next byte `wanted` matches is from `position`, or where the part ends: the stray bytes
    before it are skipped, as Pillow skips them."""
    while block := read(position, SKIP_BLOCK):
        found = wanted.search(block)
        if found:
            return position + found.start()
        position += len(block)
    return position


def _png(head: bytes) -> ImageMetadata:
    chunk = _need(head[8:33], 25, "IHDR chunk", 8)
    length, name = struct.unpack(">I4s", chunk[:8])
    if name != b"IHDR" or length < 13:
        raise MediaError("a PNG must start with its IHDR chunk", 8)
    width, height, bits, colour = struct.unpack(">IIBB", chunk[8:18])
    mode = PNG_MODES.get((bits, colour))
    if mode is None:
        raise MediaError(f"unknown PNG bit depth {bits} with colour type {colour}", 24)
    return ImageMetadata(width, height, "PNG", mode)


def _gif(read: ReadAt) -> ImageMetadata:
    screen = _need(read(0, 13), 13, "logical screen descriptor", 0)
    width, height, flags = struct.unpack("<HHB", screen[6:11])
    position = 13
    palette: bool | None = None  # the frame's palette: a needed one, an identity grey ramp, or none
    if flags & 0x80:
        length = 3 << ((flags & 7) + 1)
        palette = _palette_needed(_need(read(position, length), length, "global colour table", position))
        position += length
    while True:
        block = _need(read(position, 1), 1, "blocks (no image before the end)", position)
        if block == b"!":  # an extension: a label, then sub-blocks up to an empty one
            position += 2
            position = _skip_sub_blocks(read, position)
        elif block == b",":
            descriptor = _need(read(position + 1, 9), 9, "image descriptor", position + 1)
            left, top, frame_width, frame_height, frame_flags = struct.unpack("<HHHHB", descriptor)
            width, height = max(width, left + frame_width), max(height, top + frame_height)
            if frame_flags & 0x80:
                length = 3 << ((frame_flags & 7) + 1)
                local = _need(read(position + 10, length), length, "local colour table", position + 10)
                palette = _palette_needed(local)
            return ImageMetadata(width, height, "GIF", "P" if palette else "L")
        elif block == b";":
            raise MediaError("the GIF ends (its trailer) before its first image", position)
        else:  # a stray byte between blocks, which Pillow skips
            position = _skip_to(read, position + 1, GIF_BLOCK_START)


def _palette_needed(colours: bytes) -> bool:
    """Pillow's rule: a palette is needed unless entry i is (i, i, i) throughout."""
    return any(
        not (i // 3 == colours[i] == colours[i + 1] == colours[i + 2]) for i in range(0, len(colours), 3)
    )


def _skip_sub_blocks(read: ReadAt, position: int) -> int:
    while True:
        length = _need(read(position, 1), 1, "extension sub-blocks", position)[0]
        position += 1 + length
        if length == 0:
            return position


def _webp(read: ReadAt, head: bytes) -> ImageMetadata:
    chunk = _need(head[12:30], 18, "first chunk", 12)
    name, data = chunk[:4], chunk[8:]
    if name == b"VP8X":
        alpha = bool(data[0] & 0x10)
        width = 1 + int.from_bytes(data[4:7], "little")
        height = 1 + int.from_bytes(data[7:10], "little")
        if not data[0] & 0x02:  # a still image: libwebp also looks at its chunks for alpha
            alpha = _still_webp_alpha(read, 20 + int.from_bytes(chunk[4:8], "little"), alpha)
    elif name == b"VP8L":
        if data[0] != 0x2F:
            raise MediaError("a lossless WebP bitstream must start with 0x2f", 20)
        (bits,) = struct.unpack("<I", data[1:5])
        width, height, alpha = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF), bool(bits >> 28 & 1)
    elif name == b"VP8 ":
        if data[3:6] != b"\x9d\x01\x2a":
            raise MediaError("a lossy WebP frame must carry the start code 9d 01 2a", 23)
        width, height = (value & 0x3FFF for value in struct.unpack("<HH", data[6:10]))
        alpha = False
    else:
        raise MediaError(f"unknown WebP chunk {name!r}", 12)
    return ImageMetadata(width, height, "WEBP", "RGBA" if alpha else "RGB")


def _still_webp_alpha(read: ReadAt, position: int, flagged: bool) -> bool:
    """Whether libwebp (Pillow's reader) gives a still VP8X image alpha: an ALPH chunk before its
    bitstream, or a lossless bitstream's own alpha bit, decide it over the VP8X flag (`flagged`)."""
    position += position & 1
    alpha_chunk = False
    while len(header := read(position, 13)) >= 8:
        name, length = header[:4], int.from_bytes(header[4:8], "little")
        if name == b"ALPH":
            alpha_chunk = True
        elif name == b"VP8L":
            return alpha_chunk or (len(header) == 13 and bool(header[12] >> 4 & 1))
        elif name == b"VP8 ":
            return flagged or alpha_chunk
        position += 8 + length + (length & 1)
    return flagged or alpha_chunk
