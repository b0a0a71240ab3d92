"""Image headers read without a decoder report what Pillow (energon's reader) reports after decoding."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from prep.media.images import ImageMetadata, MediaError, from_bytes, image_metadata
from tests.support.media import encode, images

IMAGES = images()


def pillow_says(data: bytes) -> ImageMetadata | None:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return ImageMetadata(image.width, image.height, image.format, image.mode)
    except Image.UnidentifiedImageError:
        return None


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_image_reads_as_pillow_reports_it_after_decoding(name: str) -> None:
    data = IMAGES[name]
    assert image_metadata(from_bytes(data), len(data)) == pillow_says(data)


def test_metadata_json_is_energons_compact_text() -> None:
    assert ImageMetadata(3, 2, "PNG", "RGBA").json() == '{"width":3,"height":2,"format":"PNG","mode":"RGBA"}'


@pytest.mark.parametrize(
    ("name", "most_bytes"),
    [("exif.JPG", 300), ("rgb640.png", 64), ("lossy640.webp", 64), ("p640.gif", 900)],
)
def test_only_the_header_bytes_are_read(name: str, most_bytes: int) -> None:
    data, read_bytes = IMAGES[name], []

    def read(offset: int, length: int) -> bytes:
        read_bytes.append(min(length, len(data) - offset))
        return data[offset : offset + length]

    assert image_metadata(read, len(data)) is not None
    assert sum(read_bytes) <= most_bytes < len(data)


@pytest.mark.parametrize(
    ("name", "cut", "problem", "offset"),
    [
        ("exif.JPG", 1000, "segment 0xffe2 here runs past the end", None),
        ("rgb33.png", 20, "ends inside its IHDR chunk", 20),
        ("p33.gif", 11, "ends inside its logical screen descriptor", 11),
        ("lossy33.webp", 25, "ends inside its first chunk", 25),
    ],
)
def test_a_cut_header_names_its_problem_and_offset(
    name: str, cut: int, problem: str, offset: int | None
) -> None:
    data = IMAGES[name][:cut]
    with pytest.raises(MediaError, match=problem) as raised:
        image_metadata(from_bytes(data), len(data))
    assert raised.value.offset <= cut
    if offset is not None:
        assert raised.value.offset == offset


def test_a_jpeg_pillow_refuses_is_an_error_not_a_guess() -> None:
    data = bytearray(IMAGES["rgb33.jpg"])
    sof = data.index(b"\xff\xc0")
    data[sof + 4] = 12  # 12-bit samples: Pillow cannot open it, so energon fails on it
    with pytest.raises(MediaError, match="12-bit") as raised:
        image_metadata(from_bytes(bytes(data)), len(data))
    assert raised.value.offset == sof + 4


def test_a_multi_picture_jpeg_is_described_as_pillows_mpo() -> None:
    data = IMAGES["two-pictures.jpg"]
    assert b"MPF\0" in data
    assert image_metadata(from_bytes(data), len(data)) == ImageMetadata(20, 12, "MPO", "RGB")


def test_stray_bytes_between_jpeg_segments_are_skipped_as_pillow_skips_them() -> None:
    data = IMAGES["stray-bytes.jpg"]
    assert image_metadata(from_bytes(data), len(data)) == ImageMetadata(33, 17, "JPEG", "RGB")


def test_a_stray_byte_between_gif_blocks_is_skipped_as_pillow_skips_it() -> None:
    data = IMAGES["stray-byte.gif"]
    assert image_metadata(from_bytes(data), len(data)) == ImageMetadata(33, 17, "GIF", "P")


@pytest.mark.parametrize("name", ["no-height.jpg", "no-width.png"])
def test_an_image_of_no_width_or_height_is_not_an_image_as_pillow_does_not_identify_it(name: str) -> None:
    data = IMAGES[name]
    assert image_metadata(from_bytes(data), len(data)) is None


@pytest.mark.parametrize(("name", "mode"), [("alpha-unflagged.webp", "RGBA"), ("opaque-flagged.webp", "RGB")])
def test_a_still_webps_alpha_is_decided_by_its_chunks_as_libwebp_decides_it(name: str, mode: str) -> None:
    data = IMAGES[name]
    assert image_metadata(from_bytes(data), len(data)) == ImageMetadata(24, 16, "WEBP", mode)


def test_bytes_pillow_does_not_recognise_are_not_an_image() -> None:
    assert image_metadata(from_bytes(b"plain text"), 10) is None
    assert image_metadata(from_bytes(b""), 0) is None


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(["JPEG", "PNG", "GIF", "WEBP"]),
    mode=st.sampled_from(["RGB", "L", "RGBA", "P", "1", "LA"]),
    width=st.integers(1, 300),
    height=st.integers(1, 300),
)
def test_any_size_and_mode_reads_as_pillow_reports_it(fmt: str, mode: str, width: int, height: int) -> None:
    image = Image.new("RGB", (width, height), (width % 256, height % 256, 7)).convert(mode)
    if fmt == "JPEG" and mode not in ("RGB", "L"):
        image = image.convert("RGB")
    data = encode(image, fmt)
    assert image_metadata(from_bytes(data), len(data)) == pillow_says(data)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(
        ["exif.JPG", "rgba33.png", "trans.gif", "lossy33.webp", "lossless33.webp", "anim.gif"]
    ),
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 399), st.integers(0, 255)), max_size=4),
)
def test_damaged_headers_give_metadata_none_or_media_error_never_a_crash(
    name: str, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(IMAGES[name][: max(cut, 0) or None])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    try:
        image_metadata(from_bytes(bytes(data)), len(data))
    except MediaError as error:
        assert 0 <= error.offset <= max(len(data), 1 << 17)
