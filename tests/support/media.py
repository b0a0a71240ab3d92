"""Real image files made with Pillow, real audio and video files (the standard library's `wave`, and
`soundfile` and PyAV where installed), in the variants the media readers must tell apart, and
the comparison of two indexes' media tables."""

from __future__ import annotations

import io
import shutil
import sqlite3
import wave
import zlib
from pathlib import Path

from PIL import Image, ImageDraw

from tests.support.prepare import assert_same_index


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def picture(mode: str, size: tuple[int, int]) -> Image.Image:
    """A non-uniform picture (so encoders keep every feature), converted to `mode`."""
    image = Image.new("RGB", size, (20, 120, 200))
    draw = ImageDraw.Draw(image)
    draw.ellipse((size[0] // 5, size[1] // 5, size[0] * 4 // 5, size[1] * 4 // 5), fill=(250, 40, 10))
    draw.line((0, 0, size[0], size[1]), fill=(0, 255, 0), width=3)
    if mode == "RGBA":
        alpha = Image.linear_gradient("L").resize(size)
        image.putalpha(alpha)
        return image
    if mode == "LA":
        return image.convert("L").convert("LA")
    return image.convert(mode)


def images() -> dict[str, bytes]:
    """name (with the extension a dataset would use) -> bytes, across formats, modes and sizes."""
    made: dict[str, bytes] = {}
    for size in ((1, 1), (33, 17), (640, 480)):
        w, h = size
        made[f"rgb{w}.jpg"] = encode(picture("RGB", size), "JPEG", quality=80)
        made[f"grey{w}.jpeg"] = encode(picture("L", size), "JPEG")
        made[f"rgb{w}.png"] = encode(picture("RGB", size), "PNG")
        made[f"rgba{w}.png"] = encode(picture("RGBA", size), "PNG")
        made[f"p{w}.gif"] = encode(picture("P", size), "GIF")
        made[f"lossy{w}.webp"] = encode(picture("RGB", size), "WEBP", quality=70)
        made[f"lossless{w}.webp"] = encode(picture("RGBA", size), "WEBP", lossless=True)
    big = picture("RGB", (300, 200))
    made["cmyk.jpg"] = encode(picture("CMYK", (40, 30)), "JPEG")
    made["progressive.jpg"] = encode(big, "JPEG", progressive=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: Pillow still reports the stored size
    made["exif.JPG"] = encode(big, "JPEG", exif=exif.tobytes(), icc_profile=b"\0" * 70000)
    made["mono.png"] = encode(picture("1", (19, 7)), "PNG")
    made["la.png"] = encode(picture("LA", (12, 9)), "PNG")
    made["grey.png"] = encode(picture("L", (12, 9)), "PNG")
    made["i16.png"] = encode(picture("L", (8, 8)).convert("I;16"), "PNG")
    made["p4bit.png"] = encode(picture("P", (10, 10)), "PNG", bits=4)
    made["ptrans.png"] = encode(picture("P", (10, 10)), "PNG", transparency=0)
    made["grey.gif"] = encode(picture("L", (21, 13)), "GIF")
    made["trans.gif"] = encode(picture("P", (21, 13)), "GIF", transparency=3)
    frames = [picture("RGB", (16, 16)).convert("P"), picture("RGB", (16, 16)).rotate(90).convert("P")]
    made["anim.gif"] = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], loop=0)
    made["anim.webp"] = encode(
        frames[0].convert("RGB"), "WEBP", save_all=True, append_images=[frames[1].convert("RGB")]
    )
    made["rgbalossy.webp"] = encode(picture("RGBA", (24, 16)), "WEBP", quality=60)
    made["opaque.webp"] = encode(
        picture("RGBA", (24, 16)).convert("RGB").convert("RGBA"), "WEBP", lossless=True
    )
    made["ramp.gif"] = encode(Image.linear_gradient("L").resize((16, 16)), "GIF", optimize=False)  # mode L
    made["wide-frame.gif"] = made["p33.gif"][:6] + (10).to_bytes(2, "little") + made["p33.gif"][8:]
    made["two-pictures.jpg"] = encode(  # a multi-picture file, as stereo cameras write: Pillow's MPO
        picture("RGB", (20, 12)), "MPO", save_all=True, append_images=[picture("RGB", (20, 12))]
    )
    made["stray-bytes.jpg"] = _stray_bytes_after_app0(made["rgb33.jpg"])
    screen = 13 + 3 * 2 ** ((made["p33.gif"][10] & 7) + 1)  # the header and its global colour table
    made["stray-byte.gif"] = made["p33.gif"][:screen] + b"\x00" + made["p33.gif"][screen:]
    frame = made["rgb33.jpg"].index(b"\xff\xc0")  # its height to 0, as when a DNL marker gives it
    made["no-height.jpg"] = made["rgb33.jpg"][: frame + 5] + b"\0\0" + made["rgb33.jpg"][frame + 7 :]
    header = b"IHDR\0\0\0\0" + made["rgb33.png"][20:29]  # width 0, its checksum right
    made["no-width.png"] = made["rgb33.png"][:12] + header + zlib.crc32(header).to_bytes(4, "big")
    made["no-width.png"] += made["rgb33.png"][33:]
    # VP8X flags that disagree with the chunks after them: libwebp goes by the ALPH chunk, or by the
    # lossless bitstream's own alpha bit
    alpha = encode(picture("RGBA", (24, 16)), "WEBP", quality=60, icc_profile=b"\0" * 100)
    made["alpha-unflagged.webp"] = alpha[:20] + bytes([alpha[20] & ~0x10]) + alpha[21:]
    opaque = encode(picture("RGB", (24, 16)), "WEBP", lossless=True, icc_profile=b"\0" * 101)
    made["opaque-flagged.webp"] = opaque[:20] + bytes([opaque[20] | 0x10]) + opaque[21:]
    made["pixels.bmp"] = encode(picture("RGB", (9, 5)), "BMP")
    made["pixels.tiff"] = encode(picture("RGB", (9, 5)), "TIFF")
    made["png-named.jpg"] = made["rgba33.png"]
    made["text-named.jpg"] = b"this is not an image at all"
    made["empty.png"] = b""
    return made


def _stray_bytes_after_app0(jpeg: bytes) -> bytes:
    """The JPEG with stray bytes (an escaped 0xff among them) between APP0 and the next segment, as some
    encoders leave: libjpeg warns of "extraneous bytes before marker", Pillow skips them."""
    end = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:end] + b"\x00\x17\xff\x00\x42" + jpeg[end:]


def without_created_at(root: Path) -> None:
    """Blank `media_filters.created_at_utc` (a clock time, different in each run) after checking it is set."""
    db = sqlite3.connect(root / ".nv-meta" / "index.sqlite")
    try:
        stamps = [row[0] for row in db.execute("SELECT created_at_utc FROM media_filters")]
        assert stamps and all(len(stamp) == len("2025-01-01 00:00:00") for stamp in stamps), stamps
        db.execute("UPDATE media_filters SET created_at_utc = NULL")
        db.commit()
    finally:
        db.close()


def assert_same_media_index(ours: Path, theirs: Path, *, dataset_yaml: str | None = "dataset.yaml") -> None:
    """`assert_same_index` with the media tables included (on copies, the creation times blanked)."""
    copies = []
    for root in (ours, theirs):
        copy = root.parent / f"{root.name}-compared"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root, copy, symlinks=True)
        without_created_at(copy)
        copies.append(copy)
    assert_same_index(*copies, dataset_yaml=dataset_yaml)


def wav(rate: int, channels: int, width: int, frames: int) -> bytes:
    """A PCM WAV written by the standard library's `wave`, its samples a fixed byte pattern."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(bytes((i * 7) % 251 for i in range(frames * channels * width)))
    return buffer.getvalue()


def soundfile_audio(fmt: str, subtype: str, rate: int, channels: int, frames: int) -> bytes:
    """A sine in `fmt`/`subtype` written by libsndfile (the `soundfile` package)."""
    import numpy as np
    import soundfile

    data = np.sin(np.arange(frames * channels, dtype=np.float64).reshape(frames, channels) / 7.0) * 0.5
    buffer = io.BytesIO()
    soundfile.write(buffer, data, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def pyav_media(
    fmt: str,
    video: str | None,
    audio: str | None,
    seconds: float,
    *,
    fps: int = 25,
    size: tuple[int, int] = (64, 48),
    rate: int = 16000,
    layout: str = "mono",
) -> bytes:
    """A clip encoded by PyAV: `video` frames of changing grey and/or `audio` of a sine."""
    import av
    import numpy as np

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        # every stream is added before the first packet is written
        pictures = container.add_stream(video, rate=fps) if video else None
        sound = container.add_stream(audio, rate=rate, layout=layout) if audio else None
        if pictures is not None:
            pictures.width, pictures.height = size
            pictures.pix_fmt = "yuvj420p" if video == "mjpeg" else "yuv420p"
            for index in range(round(seconds * fps)):
                pixels = np.full((size[1], size[0], 3), (index * 9) % 255, dtype=np.uint8)
                for packet in pictures.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                    container.mux(packet)
            for packet in pictures.encode():
                container.mux(packet)
        if sound is not None:
            context = sound.codec_context
            step, total, channels = (
                context.frame_size or 1024,
                round(seconds * rate),
                context.layout.nb_channels,
            )
            for start in range(0, total, step):
                count = min(step, total - start)
                sine = np.tile(np.sin(np.arange(start, start + count) / 5.0) * 0.3, (channels, 1))
                frame = _audio_frame(sine, context.format.name, layout)
                frame.sample_rate, frame.pts = rate, start
                for packet in sound.encode(frame):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    return buffer.getvalue()


def _audio_frame(samples: object, sample_format: str, layout: str) -> object:
    """A PyAV audio frame of `samples` (channels x count, floats in -1..1) in the encoder's format."""
    import av
    import numpy as np

    planar = sample_format.endswith("p")
    kind = sample_format.rstrip("p")
    scaled = {
        "flt": lambda x: x.astype(np.float32),
        "s16": lambda x: (x * 30000).astype(np.int16),
        "s32": lambda x: (x * 2e9).astype(np.int32),
    }[kind](samples)
    if not planar:
        scaled = np.ascontiguousarray(scaled.T).reshape(1, -1)
    return av.AudioFrame.from_ndarray(scaled, format=sample_format, layout=layout)


def audio_video() -> dict[str, bytes]:
    """name -> bytes of audio and video files of several sizes: WAV from the standard library always;
    WAV/FLAC/OGG from `soundfile` and MP4/MOV/MKV/WebM/MP3/OGG/FLAC from PyAV when those are installed."""
    made: dict[str, bytes] = {}
    for rate, channels, width, frames in ((16000, 1, 2, 16000), (44100, 2, 2, 12345), (8000, 1, 1, 7)):
        made[f"pcm{width * 8}-{rate}-{channels}ch.wav"] = wav(rate, channels, width, frames)
    made["pcm24-3ch.WAV"] = wav(22050, 3, 3, 1000)
    made["silent.wav"] = wav(48000, 2, 4, 0)
    whole = wav(8000, 2, 2, 100)
    made["cut.wav"] = whole[:-7]
    made["to-the-end.wav"] = whole[:40] + (0xFFFFFFFF).to_bytes(4, "little") + whole[44:]
    made["not-really.wav"] = b"RIFF\0\0\0\0WAVEfmt "
    try:
        import soundfile  # noqa: F401
    except ImportError:
        pass
    else:
        for fmt, subtype, ext in (
            ("WAV", "FLOAT", "wav"),
            ("WAV", "ULAW", "wav"),
            ("WAVEX", "PCM_24", "wav"),
            ("WAV", "IMA_ADPCM", "wav"),
            ("FLAC", "PCM_16", "flac"),
            ("FLAC", "PCM_24", "flac"),
            ("OGG", "VORBIS", "ogg"),
        ):
            for rate, channels, frames in ((16000, 1, 16000), (44100, 2, 12345), (8000, 1, 5)):
                made[f"{subtype.lower()}-{rate}-{channels}ch.{ext}"] = soundfile_audio(
                    fmt, subtype, rate, channels, frames
                )
        long = soundfile_audio("FLAC", "PCM_16", 8000, 1, 30000)
        made["cut.flac"] = long[: len(long) // 2]
    try:
        import av  # noqa: F401
    except ImportError:
        return made
    made["h264-aac.mp4"] = pyav_media("mp4", "libx264", "aac", 0.5)
    made["mpeg4.mp4"] = pyav_media("mp4", "mpeg4", None, 0.4, size=(48, 32))
    made["mjpeg.mov"] = pyav_media("mov", "mjpeg", None, 0.2)
    made["vp9-opus.webm"] = pyav_media("webm", "libvpx-vp9", "libopus", 0.3, rate=48000)
    made["h264-opus.mkv"] = pyav_media("matroska", "libx264", "libopus", 0.3, rate=48000)
    made["aac.m4a"] = pyav_media("mp4", None, "aac", 0.3, layout="stereo")
    made["lame.mp3"] = pyav_media("mp3", None, "libmp3lame", 0.4)
    made["opus.ogg"] = pyav_media("ogg", None, "libopus", 0.3, rate=48000)
    for samples in (1, 4096, 9000):
        made[f"pyav-{samples}.flac"] = pyav_media("flac", None, "flac", samples / 8000, rate=8000)
    return made
