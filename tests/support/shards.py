"""Real shards made by real writers: Python's tarfile (ustar, GNU, PAX), webdataset's TarWriter, GNU tar."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

Members = list[tuple[str, bytes]]


def sample_members(prefix: str, count: int, parts: dict[str, bytes] | None = None) -> Members:
    """`count` samples named `{prefix}{i:05d}.{part}`, each with the given parts (default json + txt)."""
    parts = parts or {"json": b'{"i": %d}', "txt": b"text %d"}
    members = []
    for i in range(count):
        for part, template in parts.items():
            data = template % i if b"%d" in template else template
            members.append((f"{prefix}{i:05d}.{part}", data))
    return members


def write_tarfile(
    path: Path, members: Members, fmt: int = tarfile.PAX_FORMAT, *, non_regular: bool = False, **extra
) -> Path:
    """Write members with Python's tarfile in the given format; `extra` may add pax_headers (a global header).

    With `non_regular`, a folder, a symbolic link with a long target and a hard link go between the members
    (energon skips them; their headers must still be walked right).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt, **extra) as tar:
        for number, (name, data) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
            if non_regular and number == len(members) // 2:
                for kind, link in (
                    (tarfile.DIRTYPE, ""),
                    (tarfile.SYMTYPE, "t" * 150),
                    (tarfile.LNKTYPE, name),
                ):
                    special = tarfile.TarInfo(f"special-{kind.decode()}")
                    special.type, special.linkname = kind, link
                    tar.addfile(special)
    return path


def without_end_marker(shard: Path) -> Path:
    """Cut the end-of-archive marker (and any record padding) off a shard: it ends with its last member."""
    data = shard.read_bytes()
    shard.write_bytes(data[: -(-len(data.rstrip(b"\0")) // 512) * 512])
    return shard


def write_webdataset(path: Path, samples: list[dict]) -> Path:
    """Write samples (dicts with __key__ and parts) with webdataset's TarWriter."""
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def write_gnu_tar(path: Path, members: Members, fmt: str = "gnu") -> Path:
    """Write members as files in a scratch folder, then pack them with GNU tar (`--format=gnu|pax|ustar`)."""
    scratch = path.parent / f".scratch-{path.name}"
    if scratch.exists():
        shutil.rmtree(scratch)
    names = []
    for name, data in members:
        target = scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        names.append(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["tar", f"--format={fmt}", "-cf", str(path.resolve()), "--no-recursion", "-C", str(scratch), *names],
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    shutil.rmtree(scratch)
    return path


def tricky_members(prefix: str) -> Members:
    """Names that exercise energon's key rule: folders with dots, multi-dot parts, empty parts, long and
    non-ASCII names, and members energon skips (no dot, `__meta__`)."""
    long_folder = "deep/" + "x" * 60 + "/" + "y" * 60
    return [
        (f"{prefix}a.b/000001.json", b'{"a": 1}'),
        (f"{prefix}a.b/000001.seg.0.txt", b"segment zero"),
        (f"{prefix}a.b/000001.empty", b""),
        (f"{prefix}a.b/000002.json", b'{"a": 2}'),
        (f"{prefix}README", b"no dot: skipped"),
        (f"{prefix}__meta__/info.json", b"{}"),
        (f"{prefix}{long_folder}/000003.json", b'{"long": true}'),
        (f"{prefix}{long_folder}/000003.txt", b"long name"),
        (f"{prefix}ünï/000004.txt", "non-ascii ☃".encode()),
        (f"{prefix}plain000005.bin", bytes(range(256)) * 3),
        (f"{prefix}dot/.hidden.txt", b"energon's regex makes the key 'dot/'"),
    ]


HOSTILE_NAMES = [
    "../../../etc/passwd.txt",
    "/absolute/path/s1.txt",
    "a\nb/s2.txt",
    "tab\there/s3.txt",
    "x" * 65_536 + "/s4.txt",
    "/".join(["d"] * 300) + "/s5.txt",
    "nul\0inside/s6.txt",
    "./s7.txt",
    "s8..txt",
    "s9.txt/",
]


def hostile_shard(path: Path) -> Path:
    """Members with hostile names, each holding its own name, written by tarfile in PAX format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in HOSTILE_NAMES:
            info = tarfile.TarInfo(name)
            data = name.encode("utf-8", "surrogateescape")[:100]
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
