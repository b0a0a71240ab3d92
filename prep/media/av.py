"""An audio or video part's metadata, as energon 7.4.1 reports it (its `AVMetadata`, made by PyAV).

energon opens every audio/video part with PyAV and decodes the whole audio stream to count its samples;
the audio duration it stores is then the end of the last decoded frame. For two formats the same
numbers are in the header, and this module reads them without any library:

- WAV (RIFF/WAVE): integer PCM of 8, 16, 24 or 32 bits, float PCM of 32 or 64 bits, A-law and mu-law,
  plain or WAVE_FORMAT_EXTENSIBLE: the `fmt ` chunk and where the `data` chunk starts. The sample count
  is the whole blocks FFmpeg would read: up to the data chunk's end, or the part's end when the part
  stops sooner or the size field is 0 or 0xFFFFFFFF (FFmpeg's "to the end" values).
- FLAC, only where PyAV is not installed (with PyAV, FLAC goes to it: a damaged frame changes what
  FFmpeg reports, and only decoding every frame tells): the STREAMINFO block (sample rate, channels,
  total samples), when the stream has two frames or more (FFmpeg cannot seek back in a one-frame FLAC,
  so energon writes no row for it) and its last frame, found from the end of the part (its header's
  CRC-8 and its own CRC-16 checked), ends at the part's end on sample `total`: so a file cut short is
  not described from a header that promises more.

Everything else goes to PyAV (`prep.media.pyav`), and so do the cases above that FFmpeg treats specially:
RF64/RIFX, compressed WAV codecs, a plain PCM WAV (format tag 1) whose first 64 KiB of data hold an
S/PDIF sync word (FFmpeg may take it for AC-3 or DTS), a WAV holding SMV video or no sample, a FLAC with one frame or an unknown
total, a FLAC whose last frame does not close the part (trailing tags, a cut), or any header this
module does not follow. What this cannot see: FFmpeg also probes the first packets of a 16-bit PCM WAV
for a compressed stream (DTS, AC-3, MP3 in disguise); PCM that happens to look like one is described
here as PCM.

    >>> import struct
    >>> fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    >>> wav = b"RIFF" + struct.pack("<I", 36 + 8) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
    >>> wav += b"data" + struct.pack("<I", 8) + bytes(8)
    >>> print(av_metadata(lambda at, n: wav[at : at + n], len(wav)).json())
    {"audio_duration":0.0005,"audio_channels":1,"audio_sample_rate":8000,"audio_num_samples":4}
"""

from __future__ import annotations

import json
import struct
from functools import cache
from typing import NamedTuple

from prep.media.images import ReadAt

#: WAV format tags read here, and the sample widths (bits) each may have.
WAV_PCM, WAV_FLOAT, WAV_ALAW, WAV_MULAW, WAV_EXTENSIBLE = 1, 3, 6, 7, 0xFFFE
WAV_WIDTHS = {WAV_PCM: (8, 16, 24, 32), WAV_FLOAT: (32, 64), WAV_ALAW: (8,), WAV_MULAW: (8,)}
#: The tail of the sub-format GUID of WAVE_FORMAT_EXTENSIBLE (its first two bytes are the format tag).
WAV_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
#: Data sizes FFmpeg reads as "up to the end of the file".
WAV_UNKNOWN_SIZES = (0, 0xFFFFFFFF)
#: How much of a PCM WAV's data FFmpeg probes for S/PDIF (IEC 61937), and the sync word, both byte orders.
SPDIF_PROBE_BYTES = 1 << 16
SPDIF_SYNC = (b"\x72\xf8\x1f\x4e", b"\xf8\x72\x4e\x1f")
#: The chunks after which this module cannot say what FFmpeg does.
WAV_FOREIGN_CHUNKS = frozenset({b"SMV0", b"XMA2"})
FLAC_MAGIC = b"fLaC"
STREAMINFO = 0
#: How much of a FLAC's end is searched for its last frame when STREAMINFO gives no largest frame size.
FLAC_TAIL_BYTES = 1 << 18


class AVMetadata(NamedTuple):
    """energon's `AVMetadata`: its fields in its order; None is left out of the stored JSON."""

    video_duration: float | None = None
    video_num_frames: int | None = None
    video_fps: float | None = None
    video_width: int | None = None
    video_height: int | None = None
    audio_duration: float | None = None
    audio_channels: int | None = None
    audio_sample_rate: int | None = None
    audio_num_samples: int | None = None

    def json(self) -> str:
        """The `media_metadata.metadata_json` text, byte for byte as energon writes it."""
        return json.dumps(
            {name: value for name, value in self._asdict().items() if value is not None},
            separators=(",", ":"),
        )


class NeedsDecoder(Exception):
    """Raised by the header readers: this part's metadata needs PyAV (the header does not settle it)."""


def av_metadata(read: ReadAt, size: int) -> AVMetadata | None:
    """The metadata of the audio/video part of `size` bytes that `read` reads, or None where energon
    writes no row: PyAV cannot read it, or it needs PyAV and PyAV is not installed."""
    from prep.media.pyav import pyav_available, pyav_metadata

    try:
        return header_metadata(read, size, flac=not pyav_available())
    except NeedsDecoder:
        return pyav_metadata(read(0, size))


def header_metadata(read: ReadAt, size: int, *, flac: bool = True) -> AVMetadata:
    """The metadata from the header alone (WAV; FLAC unless `flac` is False); NeedsDecoder for anything
    else."""
    head = read(0, 12)
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return _wav(read, size)
    if head[:4] == FLAC_MAGIC:
        if not flac:
            raise NeedsDecoder("FLAC, and PyAV is here to judge its frames as energon does")
        return _flac(read, size)
    raise NeedsDecoder("not WAV or FLAC")


def audio_only(samples: int, channels: int, rate: int) -> AVMetadata:
    """What energon reports for an audio stream that starts at 0 in time base 1/rate, decoded to its
    end: the duration is the sample count times the float time base, as PyAV's arithmetic gives it."""
    return AVMetadata(
        audio_duration=samples * float(1 / rate),
        audio_channels=channels,
        audio_sample_rate=rate,
        audio_num_samples=samples,
    )


def _wav(read: ReadAt, size: int) -> AVMetadata:
    position = 12
    fmt: bytes | None = None
    data_start = data_end = -1
    while position + 8 <= size:
        chunk = read(position, 8)
        if len(chunk) < 8:
            break
        name, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if name in WAV_FOREIGN_CHUNKS:
            raise NeedsDecoder(f"WAV chunk {name!r}")
        body = position + 8
        if name == b"fmt " and fmt is None:
            fmt = read(body, min(length, 40))
        elif name == b"data" and data_start < 0:
            if fmt is None:
                raise NeedsDecoder("WAV data before fmt")
            data_start = body
            if length in WAV_UNKNOWN_SIZES:
                data_end = size
                break
            data_end = min(body + length, size)
        position = body + length + (length & 1)
    if fmt is None or data_start < 0:
        raise NeedsDecoder("WAV without fmt or data")
    tag, channels, rate, block_align, bits = _wav_format(fmt)
    if tag not in WAV_WIDTHS or bits not in WAV_WIDTHS[tag] or channels < 1 or rate < 1:
        raise NeedsDecoder("a WAV codec FFmpeg decodes")
    if block_align != channels * bits // 8:
        raise NeedsDecoder("WAV block size other than one sample per channel")
    if struct.unpack("<H", fmt[:2])[0] == WAV_PCM:
        probe = read(data_start, SPDIF_PROBE_BYTES)
        if any(sync in probe for sync in SPDIF_SYNC):
            raise NeedsDecoder("WAV data FFmpeg may take for S/PDIF")
    samples = max(0, data_end - data_start) // block_align
    if samples == 0:
        raise NeedsDecoder("WAV without a whole sample")
    return audio_only(samples, channels, rate)


def _wav_format(fmt: bytes) -> tuple[int, int, int, int, int]:
    """(format tag, channels, sample rate, block align, bits per sample) of a `fmt ` chunk, the
    extensible form resolved to its sub-format."""
    if len(fmt) < 16:
        raise NeedsDecoder("short WAV fmt chunk")
    tag, channels, rate, _, block_align, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == WAV_EXTENSIBLE:
        if len(fmt) < 40 or fmt[26:40] != WAV_GUID_TAIL:
            raise NeedsDecoder("WAV sub-format")
        valid_bits = struct.unpack("<H", fmt[18:20])[0]
        if valid_bits not in (0, bits):
            raise NeedsDecoder("WAV valid bits narrower than the container")
        tag = struct.unpack("<H", fmt[24:26])[0]
    return tag, channels, rate, block_align, bits


def _flac(read: ReadAt, size: int) -> AVMetadata:
    block = read(4, 38)
    if len(block) < 38 or block[0] & 0x7F != STREAMINFO or int.from_bytes(block[1:4], "big") < 34:
        raise NeedsDecoder("FLAC without STREAMINFO first")
    info = block[4:]
    min_block, max_block = struct.unpack(">HH", info[:4])
    max_frame = int.from_bytes(info[7:10], "big")
    packed = int.from_bytes(info[10:18], "big")
    rate, channels, total = packed >> 44, ((packed >> 41) & 7) + 1, packed & ((1 << 36) - 1)
    if rate < 1 or total <= max_block:
        raise NeedsDecoder("FLAC of one frame or unknown length")
    tail_bytes = max_frame + 2 if max_frame else FLAC_TAIL_BYTES
    if _last_flac_frame_end(read, size, tail_bytes, min_block, max_block) != total:
        raise NeedsDecoder("FLAC whose last frame does not end the part on its total")
    return audio_only(total, channels, rate)


def _crc_table(polynomial: int, bits: int) -> tuple[int, ...]:
    top, mask = 1 << (bits - 1), (1 << bits) - 1
    table = []
    for byte in range(256):
        crc = byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ polynomial if crc & top else crc << 1) & mask
        table.append(crc)
    return tuple(table)


#: FLAC's checksums: CRC-8 (x^8+x^2+x+1) over a frame header, CRC-16 (x^16+x^15+x^2+1) over a frame.
CRC8 = _crc_table(0x07, 8)
CRC16 = _crc_table(0x8005, 16)


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = CRC8[crc ^ byte]
    return crc


@cache
def _crc16_pairs() -> tuple[int, ...]:
    """CRC-16 steps two bytes at a time: entry v is the register after shifting v through 16 bits."""
    return tuple(
        ((CRC16[high] << 8) & 0xFFFF) ^ CRC16[low ^ (CRC16[high] >> 8)]
        for high in range(256)
        for low in range(256)
    )


def _crc16(data: bytes) -> int:
    pairs, crc, even = _crc16_pairs(), 0, len(data) & ~1
    for word in struct.unpack(f">{even // 2}H", data[:even]):
        crc = pairs[crc ^ word]
    if even < len(data):
        crc = ((crc << 8) & 0xFFFF) ^ CRC16[(crc >> 8) ^ data[-1]]
    return crc


def _last_flac_frame_end(read: ReadAt, size: int, tail_bytes: int, min_block: int, max_block: int) -> int:
    """The sample after the last frame, when a whole frame (both checksums right) ends exactly at the
    part's end within its last `tail_bytes`; else -1."""
    start = max(42, size - tail_bytes)
    tail = read(start, size - start)
    at = len(tail)
    while (at := tail.rfind(b"\xff", 0, at)) >= 0:
        if at + 1 < len(tail) and tail[at + 1] in (0xF8, 0xF9):
            header = _flac_frame_header(tail, at)
            if header is not None and _crc16(tail[at:-2]) == int.from_bytes(tail[-2:], "big"):
                variable, number, block = header
                if variable:
                    return number + block
                return number * max_block + block if min_block == max_block else -1
    return -1


def _flac_frame_header(tail: bytes, at: int) -> tuple[bool, int, int] | None:
    """(variable block size, frame or sample number, block size) of a frame header whose CRC-8 is right."""
    if at + 5 > len(tail) or tail[at + 3] & 1:
        return None
    block_code, rate_code = tail[at + 2] >> 4, tail[at + 2] & 15
    if block_code == 0 or rate_code == 15:
        return None
    position = at + 4
    first = tail[position]
    leading = 8 - (~first & 0xFF).bit_length()  # the coded number's length, as in UTF-8
    if leading == 1 or leading == 8:
        return None
    extra = max(0, leading - 1)
    number = first & (0xFF >> (leading + 1))
    for byte in tail[position + 1 : position + 1 + extra]:
        if byte & 0xC0 != 0x80:
            return None
        number = number << 6 | byte & 0x3F
    position += 1 + extra
    if block_code == 1:
        block = 192
    elif block_code <= 5:
        block = 576 << (block_code - 2)
    elif block_code <= 7:
        width = block_code - 5
        block = int.from_bytes(tail[position : position + width], "big") + 1
        position += width
    else:
        block = 256 << (block_code - 8)
    position += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if position >= len(tail) or _crc8(tail[at:position]) != tail[position]:
        return None
    return bool(tail[at + 1] & 1), number, block
