"""A file or folder made immutable for a test: a real failure to rename it, even as root."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` made immutable (chattr +i: as root too, renaming it fails with EPERM) while in the block;
    the test is skipped where chattr does not work (another filesystem, no CAP_LINUX_IMMUTABLE)."""
    try:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"chattr +i does not work here: {error}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
