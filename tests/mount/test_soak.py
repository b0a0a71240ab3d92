"""A short soak of the mount (the long one is `python -m tools.soak_mount`): 64 threads reading random
files at once, then `ls -R` again and again; every byte right, no error, the server's memory bounded."""

from __future__ import annotations

import pytest

from prep.mount.device import fuse_problem
from tools.soak_mount import make_dataset, report, soak

FUSE_MISSING = fuse_problem()


@pytest.mark.skipif(FUSE_MISSING is not None, reason=f"FUSE unavailable: {FUSE_MISSING}")
def test_64_threads_reading_at_once_get_every_byte_right(tmp_path):
    expected = make_dataset(tmp_path, 3000)
    result = soak(tmp_path / "dataset", tmp_path / "mnt", expected, threads=64, seconds=6, listings=3)
    print(report(result, 64))
    assert result.ok, report(result, 64)
    assert result.reads > 1000 and result.listings == 3
    assert max(result.rss_kb) - result.rss_kb[0] < 64 * 1024, report(result, 64)
