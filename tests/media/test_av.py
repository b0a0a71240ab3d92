"""Audio and video parts read as energon 7.4.1 reads them: WAV and FLAC from their headers alone, the
rest through PyAV, with the same numbers (and the same float text) as energon's `AVDecoder`."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.index.media import skipped_av_warning
from prep.media.av import AVMetadata, NeedsDecoder, av_metadata, header_metadata
from prep.media.images import from_bytes
from prep.media.pyav import pyav_available
from tests.support.media import audio_video, wav

MEDIA = audio_video()
PYAV = importlib.util.find_spec("av") is not None


def energon_says(name: str, data: bytes) -> str | None:
    """The `metadata_json` energon stores for a part called `name`, or None for no row."""
    from megatron.energon.media.extractor import MediaFilterConfig
    from megatron.energon.media.metadata import serialize_media_metadata

    found = MediaFilterConfig.parse(None, False, True).extract_metadata(data, filename=name)
    return None if found is None else serialize_media_metadata(found)[1]


def ours(data: bytes) -> str | None:
    found = av_metadata(from_bytes(data), len(data))
    return None if found is None else found.json()


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_every_clip_reads_as_energon_reports_it(name: str) -> None:
    pytest.importorskip("av", reason="energon describes audio/video only with PyAV installed")
    assert ours(MEDIA[name]) == energon_says(name, MEDIA[name])


def test_metadata_json_is_energons_compact_text_without_nones() -> None:
    found = AVMetadata(audio_duration=0.1, audio_channels=2, audio_sample_rate=8000, audio_num_samples=800)
    assert found.json() == (
        '{"audio_duration":0.1,"audio_channels":2,"audio_sample_rate":8000,"audio_num_samples":800}'
    )
    assert AVMetadata().json() == "{}"


@pytest.mark.parametrize(
    ("name", "most_bytes"),
    [("float-44100-2ch.wav", 200), ("pcm_24-44100-2ch.wav", 200), ("pcm_24-44100-2ch.flac", 12000)],
)
def test_wav_and_flac_are_read_from_their_headers_alone(name: str, most_bytes: int) -> None:
    if name not in MEDIA:
        pytest.skip("soundfile is not installed")
    data, read_bytes = MEDIA[name], []

    def read(offset: int, length: int) -> bytes:
        read_bytes.append(min(length, len(data) - offset))
        return data[offset : offset + length]

    assert header_metadata(read, len(data)) == av_metadata(from_bytes(data), len(data))
    assert sum(read_bytes) <= most_bytes < len(data)


def test_a_cut_wav_counts_the_whole_samples_that_are_there() -> None:
    whole = wav(8000, 2, 2, 100)
    found = header_metadata(from_bytes(whole[:-7]), len(whole) - 7)
    assert (found.audio_num_samples, found.audio_duration) == (98, 98 * (1 / 8000))


@pytest.mark.parametrize(
    "name",
    ["ima_adpcm-16000-1ch.wav", "cut.flac", "pcm_16-8000-1ch.flac", "vorbis-16000-1ch.ogg", "silent.wav"],
)
def test_what_ffmpeg_decides_goes_to_pyav(name: str) -> None:
    if name not in MEDIA:
        pytest.skip("soundfile is not installed")
    with pytest.raises(NeedsDecoder):
        header_metadata(from_bytes(MEDIA[name]), len(MEDIA[name]))


def test_pcm_that_ffmpeg_may_take_for_spdif_goes_to_pyav() -> None:
    data = bytearray(wav(48000, 2, 2, 2000))
    data[1000:1004] = b"\x72\xf8\x1f\x4e"
    with pytest.raises(NeedsDecoder, match="S/PDIF"):
        header_metadata(from_bytes(bytes(data)), len(data))


def test_without_pyav_wav_and_flac_are_still_described_and_the_rest_is_counted(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now fails, as where it is not installed
    pyav_available.cache_clear()  # asked again with PyAV gone, and again once the test has put it back
    request.addfinalizer(pyav_available.cache_clear)
    data = MEDIA["pcm16-16000-1ch.wav"]
    assert ours(data) == (
        '{"audio_duration":1.0,"audio_channels":1,"audio_sample_rate":16000,"audio_num_samples":16000}'
    )
    assert ours(b"\0\0\0\x18ftypmp42" + bytes(100)) is None
    assert "PyAV, which is not installed" in skipped_av_warning(3)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(name for name in MEDIA if name.endswith((".wav", ".WAV", ".flac")))),
    cut=st.integers(0, 300),
    flips=st.lists(st.tuples(st.integers(0, 299), st.integers(0, 255)), max_size=4),
)
def test_damaged_headers_give_metadata_or_need_pyav_never_a_crash(
    name: str, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(MEDIA[name][: cut or None])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    try:
        found = header_metadata(from_bytes(bytes(data)), len(data))
    except NeedsDecoder:
        return
    assert found.audio_num_samples > 0 and found.audio_sample_rate > 0 and found.audio_channels > 0
    if name.lower().endswith(".wav") and PYAV:  # a WAV is read from its header even with PyAV: as energon
        assert found.json() == energon_says(name, bytes(data))


def test_with_pyav_a_flac_goes_to_it() -> None:
    """A damaged FLAC frame changes what FFmpeg reports (rate, samples, or no row), which only decoding
    every frame tells; where PyAV is installed, FLAC is read as energon reads it."""
    pytest.importorskip("av", reason="without PyAV, FLAC is read from its header")
    if "pcm_16-16000-1ch.flac" not in MEDIA:
        pytest.skip("soundfile is not installed")
    data = bytearray(MEDIA["pcm_16-16000-1ch.flac"])
    data[100] = 0xFF  # inside the first frame: FFmpeg drops it
    assert ours(bytes(data)) == energon_says("x.flac", bytes(data))
    assert ours(bytes(data)) != header_metadata(from_bytes(bytes(data)), len(data)).json()


def test_a_flac_streaminfo_promising_more_than_its_frames_goes_to_pyav() -> None:
    if "pcm_16-16000-1ch.flac" not in MEDIA:
        pytest.skip("soundfile is not installed")
    data = bytearray(MEDIA["pcm_16-16000-1ch.flac"])
    packed = int.from_bytes(data[18:26], "big") + 1  # one sample more than the frames hold
    data[18:26] = packed.to_bytes(8, "big")
    with pytest.raises(NeedsDecoder, match="last frame"):
        header_metadata(from_bytes(bytes(data)), len(data))
