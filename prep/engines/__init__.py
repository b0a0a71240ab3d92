"""Engines that run a command's per-shard work somewhere other than this machine's worker processes.

`prep.processes` is the local engine; `ray_cluster` runs the same functions as Ray tasks, on a local Ray
instance or an existing cluster. Like `prep.processes`, an engine knows nothing of shards or indexes: it
maps a function over tasks and hands the results back in task order, a bounded number in flight.
"""

from prep.errors import PrepError

#: The engines a command runs on (`--engine`): worker processes on this machine, or Ray tasks.
LOCAL = "local"
RAY = "ray"
ENGINES = (LOCAL, RAY)


def check_engine(engine: str, ray_address: str | None) -> None:
    """A PrepError unless `engine` is known, `ray_address` comes with the Ray engine, and Ray is installed
    for it (found, not imported: Ray is slow to import), so a run refuses before any work.

    >>> check_engine("local", None)
    """
    if engine not in ENGINES:
        raise PrepError(f"Unknown engine {engine!r}; choose one of {', '.join(ENGINES)}.")
    if ray_address is not None and engine != RAY:
        raise PrepError("--ray-address is for --engine ray; add --engine ray or leave the address out.")
    if engine == RAY:
        from prep.engines.ray_cluster import check_ray_installed

        check_ray_installed()
