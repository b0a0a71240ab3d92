"""energon's loader for the cookers' tests: a train dataset read in file order, and its state saved and
restored (what the cookers' task encoders must survive)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def end_workers(loader: Any) -> None:
    """End the worker processes of an energon loader read to its end, now, and check they ended cleanly.

    energon's loaders keep their workers between epochs (torch's `persistent_workers`): torch ends them only
    when the loader's iterator is deleted. Deleted in a garbage collection (a loader is easily kept in a
    cycle: energon keeps the exceptions it tried dataset configs with, and their tracebacks hold the
    caller's frames), the queues that would tell the workers to stop are closed first, and torch kills the
    workers with SIGTERM after 5 s; each leaves behind the `/tmp/pymp-*` folder multiprocessing made in it.
    """
    iterator = loader._iterator
    if iterator is None:
        return
    iterator._shutdown_workers()
    assert [worker.exitcode for worker in iterator._workers] == [0] * len(iterator._workers), (
        "the loader's workers did not end on their own"
    )


def batches_around_a_restore(fresh: Callable[[], Any], taken: int = 3) -> tuple[list, list]:
    """The batches a fresh savable loader gives after its first `taken`, and the batches a second fresh
    loader gives once the first one's state, saved after those `taken`, is restored into it.

    Both are read to the end, then their workers ended (`end_workers`).
    """
    loader = fresh()
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    state = loader.save_state_rank()
    expected = list(iterator)
    restored = fresh()
    restored.restore_state_rank(state)
    got = list(restored)
    for each in (loader, restored):
        end_workers(each)
    return expected, got


def train_dataset(
    path: Any,
    encoder: Any,
    *,
    batch_size: int | None,
    workers: int = 0,
    buffer: int | None = None,
    shuffle: int | None = None,
    error_handler: Callable | None = None,
    **settings: Any,
) -> Any:
    """energon's train dataset of `path` through `encoder` on one rank with `workers` workers, read in
    file order unless `shuffle` is given, no sequence cut, one pass; `buffer` is the packing buffer,
    `settings` go to `get_train_dataset` as they are."""
    from megatron.energon import WorkerConfig, get_train_dataset

    config = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    if error_handler is not None:
        config.global_error_handler = error_handler
    options: dict[str, Any] = {
        "shuffle_buffer_size": shuffle,
        "max_samples_per_sequence": None,
        "packing_buffer_size": buffer,
        "repeat": False,
    }
    options.update(settings)
    return get_train_dataset(
        path, worker_config=config, batch_size=batch_size, task_encoder=encoder, **options
    )
