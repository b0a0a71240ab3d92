"""A folder of files grouped into samples by stem, energon's key rule: `0001.jpg` + `0001.txt` -> sample `0001`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prep.errors import PrepError
from prep.index.format import META_DIR
from prep.index.group import key_and_part
from prep.index.meta import is_prepared
from prep.write.sources import FileSource, Record, Reject


class FolderSource(FileSource):
    """One record per key (relative folder + file name up to its first dot), parts named by the rest.

    Hidden files and folders are left out, and so are prepared datasets below the folder (an earlier
    write's output: shards and `.tar.idx` files are not samples); links to folders are followed, as
    energon's walk follows them, but not a link back to a folder above it; samples come in sorted key
    order, parts in sorted order.
    """

    default_parts = "by-name"

    def grouped(self) -> dict[str, dict[str, str]]:
        """key -> {part: relative path}, keys sorted."""
        if is_prepared(self.path):
            raise PrepError(
                f"{self.path} is a prepared dataset (it has {META_DIR}): its shards are not samples."
                " Give the folder of raw files it was written from, or index its shards with shardprep prepare."
            )
        samples: dict[str, dict[str, str]] = {}
        # the real folders above each folder walked: a link back to one of them would never end
        above = {str(self.path): frozenset({os.path.realpath(self.path)})}
        for folder, dirs, files in os.walk(self.path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not is_prepared(Path(folder, d)))
            for name in list(dirs):
                real = os.path.realpath(os.path.join(folder, name))
                if real in above[folder]:
                    dirs.remove(name)  # its files are read already, through the folder it links back to
                else:
                    above[os.path.join(folder, name)] = above[folder] | {real}
            relative = os.path.relpath(folder, self.path)
            prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
            for file in files:
                if file.startswith("."):
                    continue
                member = key_and_part(prefix + file)
                if member is None:
                    continue
                key, part = member
                samples.setdefault(key, {})[part] = prefix + file
        return {key: dict(sorted(samples[key].items())) for key in sorted(samples)}

    def records(self) -> Iterator[Record | Reject]:
        for key, parts in self.grouped().items():
            where = f"{self.path / key}.*"
            fields = {}
            try:
                for part, relative in parts.items():
                    fields[part] = (self.path / relative).read_bytes()
            except OSError as error:
                yield Reject(where, f"unreadable file {error.filename} ({error.strerror})")
                continue
            yield Record(fields, where, key=key, base=self.path)
