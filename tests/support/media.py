"""Real image files made with Pillow, in every mode and variant the media readers must tell apart, and
the comparison of two indexes' media tables."""

from __future__ import annotations

import io
import shutil
import sqlite3
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
    made["pixels.bmp"] = encode(picture("RGB", (9, 5)), "BMP")
    made["pixels.tiff"] = encode(picture("RGB", (9, 5)), "TIFF")
    made["png-named.jpg"] = made["rgba33.png"]
    made["text-named.jpg"] = b"this is not an image at all"
    made["empty.png"] = b""
    return made


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
