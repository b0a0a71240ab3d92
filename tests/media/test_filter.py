"""energon's three media filters: which parts are looked at and what kind they are."""

from __future__ import annotations

import pytest

from prep.errors import PrepError
from prep.media.filter import AV, IMAGE, media_filter_from_options, parse_media_filter
from tests.support.media import images

IMAGES = images()


def test_by_extension_any_case_and_only_energons_extensions() -> None:
    media = parse_media_filter(None, header=False, extension=True)
    assert [media.considers(name) for name in ("a.JPG", "a.b.webp", "a.wav", "a.json", "a.heic")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert media.kind("a.Mp4", b"") == AV
    assert not media.sniffs


def test_by_header_sniffs_content_then_falls_back_to_the_extension() -> None:
    media = parse_media_filter(None, header=True, extension=False)
    assert media.considers("a.json") and media.sniffs
    assert media.kind("a.txt", IMAGES["rgb33.png"]) == IMAGE
    assert media.kind("a.jpg", b"plain text") == IMAGE
    assert media.kind("a.bin", b"RIFF\0\0\0\0WAVEfmt ") == AV
    assert media.kind("a.txt", b"plain text") is None


def test_a_glob_must_match_the_lower_case_name_and_the_name_itself() -> None:
    media = parse_media_filter("*.jpg,*.png", header=False, extension=False)
    assert media.patterns == ("*.jpg", "*.png") and media.stored_patterns == "*.jpg,*.png"
    assert media.considers("a.JPG") and media.kind("a.JPG", IMAGES["rgb1.jpg"]) is None
    assert media.kind("a.jpg", IMAGES["rgb1.jpg"]) == IMAGE
    assert not parse_media_filter("*.JPG", header=False, extension=False).considers("a.JPG")


@pytest.mark.parametrize(
    "given", [("*.jpg", True, False), (None, True, True), ("*.jpg", False, True), ("", False, False)]
)
def test_exactly_one_filter(given: tuple) -> None:
    with pytest.raises(PrepError, match="exactly one"):
        parse_media_filter(*given)


def test_no_option_means_no_media_metadata() -> None:
    assert media_filter_from_options(None, False, False) is None
