"""Run `shardprep prepare` and `energon prepare` for real, and compare what they wrote."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import braceexpand
import yaml

from tests.support import energon_cli

REPO = Path(__file__).resolve().parents[2]


def run_shardprep(
    *args: str,
    input: str | None = None,
    honour_permissions: bool = False,
    check: bool = False,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """`python -m prep ARGS` in a child process, as a user would run it (stdin closed unless `input`), in
    the folder `cwd` (the repository's by default).

    `honour_permissions`: as root, drop the capabilities that let root read any file (setpriv), so file
    modes apply as they do to an ordinary user. `check`: fail the test unless the command succeeds.
    """
    command = [sys.executable, "-m", "prep", *args]
    if honour_permissions and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            import pytest

            pytest.skip("running as root without setpriv: cannot make a file unreadable to root")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    result = subprocess.run(
        command,
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    if check:
        assert result.returncode == 0, f"shardprep {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def run_energon(
    command: str,
    *args: str,
    input: str | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """`energon COMMAND ARGS` (stdin closed unless `input`), which must succeed unless not `check`: a real
    run of energon's command line in a process of its own (`tests.support.energon_cli`)."""
    result = energon_cli.SERVER.run([command, *args], input=input, cwd=cwd, env=None, timeout=timeout)
    if check:
        assert result.returncode == 0, f"energon {command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def run_energon_prepare(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return run_energon("prepare", *args, input=input)


def prepared_outputs(root: Path) -> dict:
    """What a prepare writes, to compare two runs: every `.tar.idx`, the sqlite contents, `.info.json`,
    `split.yaml` and `dataset.yaml` (None if absent); not the random `index.uuid`."""
    meta = root / ".nv-meta"
    return {
        "tar.idx": tar_indexes(root),
        "sqlite": sqlite_contents(meta / "index.sqlite"),
        "info": (meta / ".info.json").read_bytes(),
        "split": (meta / "split.yaml").read_bytes(),
        "dataset.yaml": (meta / "dataset.yaml").read_bytes() if (meta / "dataset.yaml").exists() else None,
    }


def sqlite_contents(path: Path) -> dict:
    """Schema (columns, indexes with their columns) and all rows, in a canonical order."""
    db = sqlite3.connect(path)
    try:
        tables = {}
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            columns = [row[1:] for row in db.execute(f"PRAGMA table_info({table})")]
            indexes = {}
            for _, name, unique, origin, partial in db.execute(f"PRAGMA index_list({table})"):
                indexes[name] = (
                    unique,
                    origin,
                    partial,
                    [r[2] for r in db.execute(f"PRAGMA index_info({name})")],
                )
            rows = sorted(db.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            tables[table] = {"columns": columns, "indexes": indexes, "rows": rows}
        return tables
    finally:
        db.close()


def media_rows(root: Path) -> list[tuple]:
    """The `media_metadata` rows of `root`'s index, sorted."""
    db = sqlite3.connect(root / ".nv-meta" / "index.sqlite")
    try:
        return sorted(db.execute("SELECT * FROM media_metadata"))
    finally:
        db.close()


def expanded_splits(meta: Path) -> dict:
    document = yaml.safe_load((meta / "split.yaml").read_text())
    parts = {
        name: [shard for pattern in patterns for shard in braceexpand.braceexpand(pattern)]
        for name, patterns in document["split_parts"].items()
    }
    return {"split_parts": parts, "exclude": document.get("exclude")}


def tar_indexes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.tar.idx"))}


def assert_same_index(ours: Path, theirs: Path, *, dataset_yaml: str | None = "dataset.yaml") -> None:
    """Everything energon's loader and random access read must be equal (index.uuid: a fresh uuid4 each)."""
    a, b = ours / ".nv-meta", theirs / ".nv-meta"
    info_a, info_b = json.loads((a / ".info.json").read_text()), json.loads((b / ".info.json").read_text())
    assert info_a == info_b
    assert list(info_a["shard_counts"]) == list(info_b["shard_counts"]), "shard order differs"
    assert list(info_a) == list(info_b), ".info.json key order differs"
    assert expanded_splits(a) == expanded_splits(b)
    if dataset_yaml:
        assert yaml.safe_load((a / dataset_yaml).read_text()) == yaml.safe_load(
            (b / dataset_yaml).read_text()
        )
    assert sqlite_contents(a / "index.sqlite") == sqlite_contents(b / "index.sqlite")
    assert tar_indexes(ours) == tar_indexes(theirs)
    assert tar_indexes(ours), "no .tar.idx written"
    assert uuid.UUID((a / "index.uuid").read_text()).version == 4


def twin(dataset: Path, name: str) -> Path:
    """A copy of a dataset folder (shards only) for the other tool to prepare."""
    copy = dataset.parent / name
    shutil.copytree(dataset, copy, ignore=shutil.ignore_patterns(".nv-meta*", "*.tar.idx*"), symlinks=True)
    return copy


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes hash and mode under root (hidden staging folders included), to prove nothing changed."""
    state = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            state[str(path.relative_to(root))] = (
                hashlib.sha256(path.read_bytes()).digest(),
                path.stat().st_mode,
            )
        elif path.is_dir():
            state[str(path.relative_to(root)) + "/"] = (b"", path.stat().st_mode)
    return state
