"""`info`, `verify` and `preview` of a dataset in object storage, through a local mirror of what they read.

The mirror is a folder under `--tmp-path` (a temporary one by default, removed afterwards) holding the
dataset's `.nv-meta/` and `.tar.idx` files as they are in the bucket, and each shard the bucket has as a
sparse file of the shard's size, each at its key's `local_path` (a key's path part may be longer than a
local file name; `PreparedDataset` reads there too), so the local commands run on it unchanged:

- `info` reads the index and the shards' sizes: nothing of the shards is fetched;
- `preview` reads the parts it shows from the bucket by ranged GETs (`RemoteDataset.read_part`);
- `verify` of a metadataset, in a bucket or local (`verify_remote_metadataset`, `verify_local_metadataset`),
  mirrors each dataset, auxiliary folder and nested metadataset it names in object storage at its place
  in a mirror of object storage;
- `verify` needs the tar headers at the offsets the index names: each shard's headers are walked by ranged
  GETs as prepare walks them (`prep.tar.scan.RangedHeaderWalker`), the sample starts and part headers the
  index names are read too, and what was read is written into the sparse file at its place, with the
  bytes after the last sample (the end-of-archive marker); a shard of small members, a shard the walk
  finds damaged, and every shard with `--deep` are fetched whole.
"""

from __future__ import annotations

import copy
import os
import shlex
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np

from prep.errors import PrepError
from prep.index.dataset import PreparedDataset
from prep.index.format import (
    DATASET_YAML,
    INFO_JSON,
    INFO_YAML,
    META_DIR,
    METADATASET_YAML,
    TAR_INDEX_ENTRY,
    tar_index_name,
)
from prep.index.meta import read_shard_counts
from prep.index.metadataset import METADATASET_SUFFIXES, in_mirror, metadataset_error, read_metadataset
from prep.index.sqlite import PartLocation
from prep.index.staging import local_path
from prep.inspect.verify import (
    Problem,
    VerifyReport,
    joins_auxiliary,
    named_yaml,
    reads_dataset,
    verify_dataset,
    verify_metadataset,
)
from prep.storage.address import SCHEMES, ObjectAddress, enclosing_folders, is_plain_name, require_address
from prep.storage.ranged import MAX_WINDOW, RangedObject
from prep.storage.scratch import named_by_address, scratch_folder
from prep.storage.store import ObjectInfo, ObjectStore, StorageError, open_store
from prep.tar.fields import BLOCK
from prep.tar.scan import RangedHeaderWalker

#: Shards mirrored at once.
MIRROR_THREADS = 8
#: How the local mirror's shards are filled: "none" (sizes only), "headers", or "whole".
FILLS = ("none", "headers", "whole")


class RemoteDataset(PreparedDataset):
    """A `PreparedDataset` over a mirror whose parts' bytes are read from the bucket."""

    def __init__(self, root: Path, store: ObjectStore) -> None:
        super().__init__(root)
        self.store = store
        #: Each mirrored shard's size as the bucket listed it (its sparse file's size): a shard replaced
        #: by another object since is a StorageError when read, not bytes of the new object.
        self.listed_sizes = {
            shard: path.stat().st_size for shard in self.shards if (path := self.shard_path(shard)).is_file()
        }

    def read_part(self, location: PartLocation, offset: int = 0, size: int | None = None) -> bytes:
        start, size = self._range(location, offset, size)
        shard = self.shards[location.tar_file_id]
        return self.store.read(shard, start, size, self.listed_sizes.get(shard)) if size else b""


@contextmanager
def remote_mirror(
    address: str | ObjectAddress,
    fill: str = "none",
    *,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
    listed: list[ObjectInfo] | None = None,
) -> Iterator[tuple[Path, ObjectStore]]:
    """(mirror folder, store) of the prepared dataset at `address`, its shards filled as `fill` says;
    `listed`: the store's objects, where the caller has listed them already."""
    store = store or open_store(require_address(address))
    with scratch_folder(tmp_path, "mirror") as root:
        try:
            _mirror(store, root, fill, listed)
            yield root, store
        except PrepError as error:  # named by the address, not the mirror (gone when the user reads it)
            if str(root) not in str(error):
                raise
            raise PrepError(named_by_address(str(error), root, store.address)) from None


def _named_by_addresses(text: str, addresses: dict[str, str]) -> str:
    """`text` with each of the mirror's folders (`addresses`' keys) named by the address it stands for."""
    for mirror, address in addresses.items():
        text = named_by_address(text, mirror, address)
    return text


def _mirror(store: ObjectStore, root: Path, fill: str, listed: list[ObjectInfo] | None = None) -> None:
    objects = _plain(store.list() if listed is None else listed)
    meta_prefix = META_DIR + "/"
    meta = [name for name in objects if name.startswith(meta_prefix)]  # configs/x.yaml too
    if _holds_metadataset(objects):  # a polylithic write's folder: name its datasets
        _download(store, root, METADATASET_YAML)
        raise metadataset_error(root, root / METADATASET_YAML)
    if not meta:
        raise PrepError(
            f"{store.where()} is not a prepared dataset: it has no {META_DIR}/ objects. Prepare it first with"
            f" `shardprep prepare {shlex.quote(str(store.address))}`."
            + ("" if objects else store.in_other_unicode_form())
        )
    (root / META_DIR).mkdir(parents=True)
    for name in meta:  # .info.json (or the legacy .info.yaml) first: it names the shards
        if name.rpartition("/")[2] in (INFO_JSON, INFO_YAML):
            _download(store, root, name)
    shards = list(read_shard_counts(root / META_DIR))
    wanted = [tar_index_name(shard) for shard in shards if tar_index_name(shard) in objects]
    present = [shard for shard in shards if shard in objects]
    _refuse_file_and_folder(store, [*present, *wanted, *meta])
    with ThreadPoolExecutor(MIRROR_THREADS, "shardprep-mirror") as pool:
        list(pool.map(lambda name: _download(store, root, name, objects[name].size), [*meta, *wanted]))
        list(pool.map(lambda shard: _mirror_shard(store, root, shard, objects[shard].size, fill), present))


def _refuse_file_and_folder(store: ObjectStore, names: list[str]) -> None:
    """A PrepError if one of `names` is also the folder of another (objects `x.tar` and `x.tar/y.tar`):
    a bucket holds both, a local folder, the mirror, cannot."""
    local = {local_path(name): name for name in names}
    folders = enclosing_folders(local)
    for path, name in local.items():
        if path in folders:
            inside = local[folders[path]]
            raise PrepError(
                f"{store.url(name)} is an object, and the folder of {store.url(inside)} too: energon's loader"
                " reads both, but info, verify and preview read a dataset through a local copy, which cannot"
                " hold a file and a folder of one name. Rename one of them and prepare the dataset again."
            )


def _plain(listed: list[ObjectInfo]) -> dict[str, ObjectInfo]:
    """The objects listed, by name, that the mirror holds: those whose keys energon reads as theirs
    (`is_plain_name`); any other (a folder marker, a `//` or `..` in the key) is not where energon looks,
    and its place in the mirror would be another's, or outside it."""
    return {info.name: info for info in listed if is_plain_name(info.name)}


def _download(store: ObjectStore, root: Path, name: str, size: int | None = None) -> None:
    """Object `name` into its place below `root`, unless there already: with its `size` as listed, a part
    at a time (an `index.sqlite` of 244M samples is 30 GB), else in one GET (a YAML)."""
    target = root / local_path(name)
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if size is None:
        target.write_bytes(store.get(name))
    else:
        store.download(name, target, size)


def _mirror_shard(store: ObjectStore, root: Path, shard: str, size: int, fill: str) -> None:
    """The shard as a sparse file of its size, with the bytes `fill` asks for at their places."""
    path = root / local_path(shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.truncate(size)
        if fill == "none" or size == 0:
            return
        fd = file.fileno()

        def fetch(offset: int, length: int) -> bytes:
            data = store.read(shard, offset, length, size)
            os.pwrite(fd, data, offset)
            return data

        def fetch_whole() -> None:  # a window at a time: memory stays bounded, whatever the shard's size
            for offset in range(0, size, MAX_WINDOW):
                fetch(offset, min(MAX_WINDOW, size - offset))

        if fill == "whole":
            fetch_whole()
            return
        reader = RangedObject(fetch, size, name=shard)
        walker = RangedHeaderWalker(shard, reader)
        if walker.mostly_small_members():
            fetch_whole()  # small members: the whole shard costs about what walking it would
            return
        try:
            walker.scan()
        except PrepError:  # a damaged shard: mirrored whole, so verify sees what a local verify sees
            fetch_whole()
            return
        visited = set(walker.header_offsets)
        for offset in _indexed_header_offsets(root, shard):  # a stale index may point elsewhere
            if 0 <= offset < size and offset not in visited:
                reader[offset : offset + BLOCK]
        for offset in range(walker.end, size, MAX_WINDOW):  # the end-of-archive marker and what follows
            reader[offset : min(size, offset + MAX_WINDOW)]


def _indexed_header_offsets(root: Path, shard: str) -> list[int]:
    """Where the `.tar.idx` says the shard's samples start: their headers are what verify checks first."""
    path = root / local_path(tar_index_name(shard))
    if not path.is_file() or path.stat().st_size % TAR_INDEX_ENTRY.size:
        return []
    return np.fromfile(path, dtype=f"<u{TAR_INDEX_ENTRY.size}").astype(np.int64)[:-1].tolist()


def verify_remote(
    address: str,
    *,
    deep: bool = False,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
    dataset_config: str = DATASET_YAML,
) -> VerifyReport:
    """`verify` of a bucket dataset, on a mirror of its headers (or, with `deep`, of its whole shards); the
    report names the address, not the mirror. A metadataset there is verified by `verify_remote_metadataset`."""
    store = store or open_store(require_address(address))
    listed = store.list()
    if _holds_metadataset({info.name for info in listed}):
        return verify_remote_metadataset(address, deep=deep, tmp_path=tmp_path, store=store)
    fill = "whole" if deep else "headers"
    with remote_mirror(address, fill, tmp_path=tmp_path, store=store, listed=listed) as (mirror, _):
        report = verify_dataset(mirror, deep=deep, dataset_config=dataset_config)
    return _named_report(report, address, {str(mirror): address})


def _named_report(report: VerifyReport, root: str, addresses: dict[str, str]) -> VerifyReport:
    """`report` of a mirror, its root `root` and every path of the mirror named by the address it stands
    for (`addresses`: the mirror's folders and the addresses they stand for)."""
    report.root = root

    def named(problem: Problem) -> Problem:
        return Problem(*(_named_by_addresses(str(text), addresses) for text in astuple(problem)))

    report.problems = [named(problem) for problem in report.problems]
    report.warnings = [named(problem) for problem in report.warnings]
    return report


def _holds_metadataset(names: Collection[str]) -> bool:
    """Whether objects of these `names` (below an address) are a metadataset (a polylithic write's folder),
    not a prepared dataset."""
    return METADATASET_YAML in names and not any(name.startswith(META_DIR + "/") for name in names)


def verify_remote_metadataset(
    address: str, *, deep: bool = False, tmp_path: str | Path | None = None, store: ObjectStore | None = None
) -> VerifyReport:
    """`verify` of the metadataset a bucket `write --media-column` makes: its YAML mirrored at its place in
    a mirror of object storage, then verified as `verify_local_metadataset` verifies a local one."""
    store = store or open_store(require_address(address))
    here = store.address

    def verify(root: Path) -> VerifyReport:
        folder = in_mirror(root, here.scheme, f"{here.authority}/{here.prefix}")
        folder.mkdir(parents=True, exist_ok=True)
        _download(store, folder, METADATASET_YAML)
        return _verify_mirrored_metadataset(
            folder / METADATASET_YAML, root, deep, {(here.scheme, here.authority): store}
        )

    return _verified_in_mirror(address, tmp_path, verify)


def verify_local_metadataset(
    metadataset: Path, *, deep: bool = False, tmp_path: str | Path | None = None
) -> VerifyReport:
    """`verify` of a metadataset YAML: every dataset and auxiliary folder it names in object storage,
    relative to a YAML there or by an `s3://` or `msc://` address (in a bucket or an MSC profile's), is
    mirrored at its place in a mirror of object storage (`in_mirror`: a dataset as `verify_remote`
    mirrors it, a folder as its listing, a nested metadataset's YAML as it is, then what that names), and
    the YAML verified with the mirror (`verify_metadataset`); local paths are verified as they are. A
    place that cannot be read is a problem naming its address and why; one whose MSC profile cannot be
    opened here, or in storage verify does not read, is a warning that it was not checked."""
    return _verified_in_mirror(
        str(metadataset), tmp_path, lambda root: _verify_mirrored_metadataset(metadataset, root, deep, {})
    )


def _verified_in_mirror(
    name: str, tmp_path: str | Path | None, verify: Callable[[Path], VerifyReport]
) -> VerifyReport:
    """`verify(mirror)`'s report, the metadataset named `name` and every place of the mirror (a scratch
    folder, gone afterwards) named by the address it stands for, in the report and in an error."""
    with scratch_folder(tmp_path, "mirror") as root:
        addresses = {f"{root / scheme}{os.sep}": f"{scheme}://" for scheme in SCHEMES}
        try:
            report = verify(root)
        except PrepError as error:  # named by the address, not the mirror (gone when the user reads it)
            raise PrepError(_named_by_addresses(str(error), addresses)) from None
    return _named_report(report, name, addresses)


def _verify_mirrored_metadataset(
    metadataset: Path, root: Path, deep: bool, stores: dict[tuple[str, str], ObjectStore | PrepError]
) -> VerifyReport:
    """`verify_local_metadataset` of the YAML `metadataset`, what it names in object storage mirrored
    below `root`; `stores`: those opened already, by (scheme, bucket or profile)."""
    fill = "whole" if deep else "headers"
    problems: list[Problem] = []
    warnings: list[Problem] = []
    unchecked: list[Path] = []
    mirrored: set[Path] = set()
    while (places := _named_places(metadataset, root)).keys() - mirrored:  # a round per level of nesting
        for place, named in places.items():  # in the order of the YAML (and of the report)
            if place in mirrored:
                continue
            scheme, authority, *key = place.relative_to(root).parts
            where = named_yaml(named.yaml, metadataset)
            if named.written.lower().startswith("s3://") or "+s3://" in named.written.lower():
                problems.append(_unloadable_s3(named, where))
            bucket = stores.get((scheme, authority))
            if bucket is None:
                bucket = stores[scheme, authority] = _open(scheme, authority)
            if isinstance(bucket, PrepError):
                unchecked.append(place)
                warnings.append(_not_checked(named, where, bucket))
                continue
            try:
                _mirror_place(bucket, "/".join(key), place, named.folder, fill)
            except StorageError as error:
                unchecked.append(place)
                problems.append(_unreadable(named, where, error))
        mirrored |= places.keys()
    report = verify_metadataset(metadataset, deep=deep, mirror=root, unchecked=unchecked)
    report.problems[:0] = problems
    report.warnings[:0] = warnings
    return report


@dataclass(frozen=True)
class _Named:
    """A place in object storage a metadataset names: the YAML naming it first, how a problem about it
    begins (`reads_dataset`, `joins_auxiliary`), its text in the YAML, and whether it is a folder of plain
    files."""

    yaml: Path
    saying: str
    written: str
    folder: bool


def _named_places(metadataset: Path, root: Path) -> dict[Path, _Named]:
    """Each place in object storage (mirrored at `root`, `in_mirror`) that the `metadataset` YAML in the
    mirror names, with those the nested metadatasets mirrored so far name (a nested one not yet mirrored
    is named itself); places that leave the mirror are left out (the verify calls them missing)."""
    places: dict[Path, _Named] = {}
    for reference in read_metadataset(metadataset, root):
        yaml = reference.metadataset
        named = [(reference.path, _Named(yaml, reads_dataset(reference), reference.written, False))]
        named += [
            (aux.path, _Named(yaml, joins_auxiliary(reference, aux), aux.written, aux.folder))
            for aux in reference.aux
        ]
        for path, what in named:
            place = Path(os.path.normpath(path))
            if place.is_relative_to(root) and len(place.relative_to(root).parts) >= 2:  # scheme, bucket
                places.setdefault(place, what)
    return places


def _open(scheme: str, authority: str) -> ObjectStore | PrepError:
    """The store of bucket or MSC profile `authority`, or why it cannot be opened here."""
    if scheme not in SCHEMES:
        return PrepError(
            f"verify reads object storage through {' and '.join(f'{s}://' for s in SCHEMES)} only."
        )
    try:
        return open_store(ObjectAddress(scheme, authority, ""))
    except PrepError as error:
        return error


def _unloadable_s3(named: _Named, where: str) -> Problem:
    """The problem of an `s3://` address in a metadataset: energon 7.4.1 (its EPath) reads object storage
    through `msc://` only, and takes `s3://bucket/key` for a local path below the working directory."""
    return Problem(
        where,
        f"{named.saying} {named.written!r}, an s3:// address, which energon's loader does not read: it reads"
        " object storage through msc:// addresses only, and takes this one for a local path.",
        f"write it as msc://PROFILE/KEY in {where}, with a profile of the MSC config on its bucket",
    )


def _unreadable(named: _Named, where: str, error: StorageError) -> Problem:
    return Problem(
        where,
        f"{named.saying} {named.written!r}, which cannot be read: {error}",
        f"give these credentials read access to it (list and get), or correct the path in {where}",
    )


def _not_checked(named: _Named, where: str, error: PrepError) -> Problem:
    return Problem(
        where,
        f"{named.saying} {named.written!r}, which was not checked: {error}",
        "verify it where its storage can be opened, or verify a local copy of it",
    )


def _store_at(store: ObjectStore, prefix: str) -> ObjectStore:
    """The objects below `prefix` of the bucket (or profile) of `store`."""
    other = copy.copy(store)
    other.address = ObjectAddress(store.address.scheme, store.address.authority, prefix)
    return other


def _mirror_place(bucket: ObjectStore, prefix: str, target: Path, folder: bool, fill: str) -> None:
    """What a metadataset names at `prefix` of the `bucket`, mirrored at `target`: a nested metadataset's
    YAML as it is, a prepared dataset as `_mirror` mirrors it, or (`folder`) a folder of plain files as its
    listing. Nothing when the bucket has nothing there, so the metadataset's check says it does not exist."""
    above, _, name = prefix.rpartition("/")
    if not folder and target.suffix in METADATASET_SUFFIXES:
        parent = _store_at(bucket, above)
        if parent.exists(name):
            _download(parent, target.parent, name)
            return
    store = _store_at(bucket, prefix)
    objects = _plain(store.list())
    if not objects:
        return
    target.mkdir(parents=True, exist_ok=True)
    if folder:
        for name in objects:
            path = target / local_path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        return
    try:
        _mirror(store, target, fill, list(objects.values()))
    except StorageError:
        raise
    except PrepError:  # not a prepared dataset: verifying the folder says so
        return
