"""An audio/video part read with PyAV, step for step as energon 7.4.1 reads it, for the formats whose
metadata is not in a header this package reads (`prep.media.av`).

energon's steps, on the first video and the first audio stream:

1. video: the duration in the stream header, or, without one, the end of the last packet with a
   timestamp; minus the stream's start time, times its time base. The frame count counts the packets
   with a timestamp; the frame rate is the stream's average rate (else frames over duration); width and
   height are those of the first decoded frame (else the stream's).
2. audio: the sample rate and channels of the stream; the whole stream decoded from the start, its
   samples counted, and the duration taken as the end of the last frame with a timestamp (else the
   stream header's, else the last packet's), minus the start time, times the time base.

Any error PyAV raises means no row, as in energon, and so does PyAV missing. PyAV's threads are turned off per stream as energon
does, since the media stage runs in forked workers.
"""

from __future__ import annotations

import io
from functools import cache
from typing import Any

from prep.media.av import AVMetadata


@cache
def pyav_available() -> bool:
    """Whether PyAV can be imported here (asked once per process)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def pyav_metadata(data: bytes) -> AVMetadata | None:
    """energon's metadata of the audio/video file `data`, or None where PyAV cannot read it or is not
    installed (energon without PyAV writes no row either)."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(io.BytesIO(data), "r") as container:
            for stream in container.streams:
                if stream.codec_context is not None:
                    stream.codec_context.thread_type = "NONE"
                    stream.codec_context.thread_count = 0
            video = _video(container) if container.streams.video else {}
            audio = _audio(container) if container.streams.audio else {}
            return AVMetadata(**video, **audio)
    except Exception:  # PyAV's many errors, as energon: no row
        return None


def _scaled(duration: Any, stream: Any) -> Any:
    """A duration in stream ticks, less the start time, times the float time base (energon's arithmetic)."""
    if duration is None:
        return None
    if stream.start_time is not None:
        duration -= stream.start_time
    if stream.time_base is not None:
        duration *= float(stream.time_base)
    return duration


def _video(container: Any) -> dict[str, Any]:
    stream = container.streams.video[0]
    duration, frames = stream.duration, None
    if duration is None:
        frames, last = 0, None
        for packet in container.demux(video=0):
            if packet.pts is not None:
                frames += 1
                last = packet
        if last is not None and last.duration is not None:
            duration = last.pts + last.duration
    duration = _scaled(duration, stream)
    if frames is None:
        frames = sum(1 for packet in container.demux(video=0) if packet.pts is not None)
    fps = None
    if stream.average_rate is not None:
        fps = float(stream.average_rate)
    elif duration is not None:
        fps = frames / duration
    container.seek(0)
    width, height = stream.width, stream.height
    for frame in container.decode(video=0):
        width, height = frame.width, frame.height
        break
    return {
        "video_duration": duration,
        "video_num_frames": frames,
        "video_fps": fps,
        "video_width": width,
        "video_height": height,
    }


def _audio(container: Any) -> dict[str, Any]:
    stream = container.streams.audio[0]
    rate, duration = stream.sample_rate, stream.duration
    samples, last = 0, None
    container.seek(0)
    for frame in container.decode(audio=0):
        if frame.pts is not None:
            last = frame
        samples += frame.samples
    if last is not None and last.duration is not None:
        duration = last.pts + last.duration
    if duration is None:
        last = None
        container.seek(0)
        for packet in container.demux(audio=0):
            if packet.pts is not None:
                last = packet
        if last is not None and last.duration is not None:
            duration = last.pts + last.duration
    return {
        "audio_duration": _scaled(duration, stream),
        "audio_channels": stream.channels,
        "audio_sample_rate": rate,
        "audio_num_samples": samples,
    }
