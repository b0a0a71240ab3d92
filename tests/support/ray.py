"""A real local Ray instance for the engine tests, started and stopped by the test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start a local Ray instance with 2 CPUs, its files (and so its processes' command lines) under the
    session's temporary folder, where the end-of-run check looks for leftovers; yield the `ray` module;
    shut it down afterwards. Skips when Ray is not installed or cannot start on this machine."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=str(tmp_path_factory.mktemp("ray")),
        )
    except Exception as error:  # noqa: BLE001 - a sandbox without what Ray needs (shared memory, ports)
        ray.shutdown()
        pytest.skip(f"a local Ray instance cannot start here: {error}")
    try:
        yield ray
    finally:
        ray.shutdown()
