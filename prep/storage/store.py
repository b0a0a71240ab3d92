"""One dataset's bucket: list, read (whole or a byte range), download (in parts, a few at once), upload
(multipart when big) and delete objects, and list and abort the multipart uploads left incomplete below it.

Every request is retried on a transient failure (connection refused or reset, a timeout, a 5xx or a
throttling answer) with exponential backoff, a bounded number of times (`RetryPolicy`); then a
`StorageError` names the object, the byte range and what to do. Credentials and the endpoint come the way
boto and multi-storage-client find them: for `s3://`, botocore's chain (the AWS_* variables, including
AWS_ENDPOINT_URL, the shared files, the instance role); for `msc://PROFILE`, the profile in MSC's config
(MSC_CONFIG or its default places): its `storage_provider` (an S3-compatible type: `base_path`,
`endpoint_url`, `region_name`) and its `credentials_provider` (`S3Credentials`), else botocore's chain.
botocore is imported only here, when a remote address is opened.

A store pickles (to reach worker processes) without its client: botocore clients and their connection
pools must not cross a fork, so each process makes its own on first use (`client_for`, keyed by pid) from
the store's `ClientSpec`.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from prep.errors import PrepError
from prep.storage.address import ObjectAddress, is_bucket_name

#: How to get what remote addresses need.
S3_EXTRA = "pip install 'shardprep[s3]'"
#: MSC storage provider types that speak the S3 protocol.
S3_PROVIDER_TYPES = ("s3", "s8k", "ais_s3", "gcs_s3")
#: Objects up to this size go up in one PUT; bigger ones in parts of `PART_SIZE` (S3's minimum is 5 MiB).
MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_SIZE = 16 * 1024 * 1024
#: S3 takes at most this many parts per upload: a bigger file goes up in bigger parts.
MAX_PARTS = 10_000
#: Parts of one file on their way up, or down, at once.
PART_THREADS = 4
#: Parts held in memory at once in this process, whatever the number of files going up or down together
#: (an upload of 16 shards at a time would otherwise hold 16 x PART_THREADS parts).
PARTS_IN_MEMORY = 8
#: How long the server may take to answer the request that finishes a multipart upload: it joins the parts
#: first (S3 says that can take minutes, and keeps the connection alive meanwhile; other servers do not).
COMPLETE_READ_TIMEOUT = 15 * 60.0
#: S3 error codes worth another try (besides any 5xx answer).
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "InternalError"}
)

T = TypeVar("T")


class StorageError(PrepError):
    """A bucket request that failed for good: names the object and, for a read, the byte range."""


@dataclass(frozen=True)
class RetryPolicy:
    """Up to `attempts` tries, sleeping `first_delay`, then twice as long each time (0.25 + 0.5 + 1 + 2 s
    by default: about 4 s of waiting), and no new try once `budget` seconds have gone by since the first;
    each try may also take its own timeouts (a connection that cannot be made, a server that stops
    answering mid-read)."""

    attempts: int = 5
    first_delay: float = 0.25
    budget: float = 10.0
    connect_timeout: float = 3.0
    read_timeout: float = 10.0

    def delays(self) -> list[float]:
        return [self.first_delay * 2**i for i in range(self.attempts - 1)]


#: How botocore says it found keys that stay as they are (`ObjectStore.for_other_machines`).
STATIC_CREDENTIALS = ("env", "shared-credentials-file", "config-file", "boto-config")


@dataclass(frozen=True)
class ClientSpec:
    """What a botocore S3 client is made from: plain values, so a store can be sent to another process."""

    endpoint: str | None
    region: str
    credentials: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    connect_timeout: float = RetryPolicy.connect_timeout
    read_timeout: float = RetryPolicy.read_timeout

    def make(self) -> Any:
        import botocore.config
        import botocore.session

        config = botocore.config.Config(
            retries={"max_attempts": 1, "mode": "standard"},  # the retries are ours: bounded, with backoff
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            max_pool_connections=64,
            s3={"addressing_style": "path"} if self.endpoint else None,
        )
        session = botocore.session.Session()
        session.register_component("data_loader", _loader(session.get_config_variable("data_path")))
        # Times in answers stay text (nothing here reads them): parsing one takes dateutil ~0.1 ms, and a
        # listing of 1,000 objects has 1,000 of them.
        session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
        return session.create_client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, config=config, **dict(self.credentials)
        )


_LOADER: Any = None


def _loader(data_path: str | None) -> Any:
    """botocore's loader of its JSON service models, shared by every client made here: it caches what it
    has read, which makes a second client (a worker's, after a fork) about 5x quicker to make."""
    global _LOADER
    if _LOADER is None:
        import botocore.loaders

        _LOADER = botocore.loaders.create_loader(data_path)
    return _LOADER


#: This process's clients: (pid, spec) -> client. The pid keeps a forked child off its parent's client.
_CLIENTS: dict[tuple[int, ClientSpec], Any] = {}
_CLIENTS_LOCK = threading.Lock()
#: One per part in memory: read from a file and not yet uploaded, or downloaded and not yet written (see
#: PARTS_IN_MEMORY).
_PART_SLOTS = threading.BoundedSemaphore(PARTS_IN_MEMORY)
os.register_at_fork(
    after_in_child=lambda: globals().update(
        _CLIENTS_LOCK=threading.Lock(), _PART_SLOTS=threading.BoundedSemaphore(PARTS_IN_MEMORY)
    )
)


def client_for(spec: ClientSpec) -> Any:
    """This process's client for `spec`, made on first use (thread-safe: botocore clients are)."""
    key = (os.getpid(), spec)
    client = _CLIENTS.get(key)
    if client is None:
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = spec.make()
    return client


@dataclass(frozen=True)
class ObjectInfo:
    """An object below a dataset's address: its name relative to it, its size and its ETag."""

    name: str
    size: int
    etag: str


@dataclass(frozen=True)
class IncompleteUpload:
    """A multipart upload below a dataset's address, neither completed nor aborted: the object's name
    relative to the address, and the upload's id."""

    name: str
    upload_id: str


class ObjectStore:
    """The objects below one dataset address. Thread-safe (one botocore client per process, shared by its
    threads); picklable; counts the bytes and requests this process reads, for the benchmark and the tests."""

    def __init__(
        self,
        address: ObjectAddress,
        spec: ClientSpec,
        bucket: str,
        base: str = "",
        *,
        endpoint: str | None = None,
        retry: RetryPolicy = RetryPolicy(),
        part_size: int = PART_SIZE,
        multipart_threshold: int = MULTIPART_THRESHOLD,
    ) -> None:
        self.address = address
        self.spec = spec
        self.bucket = bucket
        #: What the bucket keys of an MSC profile begin with: its base_path after the bucket, as MSC joins
        #: it to a path (`data` and `data/` alike; `/data` and `data//` are other keys).
        self.base = base
        self.endpoint = endpoint or "the default AWS endpoint"
        self.retry = retry
        self.part_size = part_size
        self.multipart_threshold = multipart_threshold
        self.bytes_read = 0
        self.requests = 0
        self._count_lock = threading.Lock()

    @property
    def client(self) -> Any:
        return client_for(self.spec)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_count_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()

    def for_other_machines(self) -> ObjectStore:
        """This store, to be sent to processes on other machines (Ray tasks): with the keys this process
        found in its environment or its AWS credentials files, which another machine need not have.
        Credentials that expire and are renewed (an instance's or a container's role, SSO, an assumed
        role) are left for each machine to find as its own, and so are those of the MSC profile, which
        the store already carries."""
        if self.spec.credentials:
            return self
        import botocore.session

        found = botocore.session.Session().get_credentials()
        if found is None or found.method not in STATIC_CREDENTIALS:
            return self
        frozen = found.get_frozen_credentials()
        keys = {"aws_access_key_id": frozen.access_key, "aws_secret_access_key": frozen.secret_key}
        if frozen.token:
            keys["aws_session_token"] = frozen.token
        store = copy.copy(self)
        store.spec = replace(self.spec, credentials=tuple(sorted(keys.items())))
        store._count_lock = threading.Lock()
        return store

    # --- names -----------------------------------------------------------------------------------------

    def key(self, name: str) -> str:
        """The bucket key of `name` (relative to the dataset address)."""
        key = self.address.key(name)
        if not self.base or self.base.endswith("/"):
            return self.base + key
        return f"{self.base}/{key}"

    def url(self, name: str) -> str:
        return str(self.address.child(name))

    def where(self) -> str:
        """The dataset address, for an MSC profile with the bucket and key prefix it stands for (a base_path
        that is not what its author meant shows there)."""
        if self.address.scheme == "s3":
            return str(self.address)
        return f"{self.address} (bucket {self.bucket}, keys beginning {self._prefix()!r})"

    # --- reading ---------------------------------------------------------------------------------------

    def _prefix(self) -> str:
        """The key prefix of everything below the dataset address (`base/path/`, or "" for a whole bucket)."""
        prefix = self.key("")
        return prefix if prefix.endswith("/") or not prefix else prefix + "/"

    def list(self) -> list[ObjectInfo]:
        """Every object below the dataset address, by name relative to it (in the bucket's key order)."""
        prefix = self._prefix()
        found: list[ObjectInfo] = []
        token: str | None = None
        while True:
            arguments = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                arguments["ContinuationToken"] = token
            page = self._call(f"list the objects of {self.address}", lambda a=arguments: self._list_page(a))
            for entry in page.get("Contents", ()):
                name = entry["Key"][len(prefix) :]
                if name:
                    found.append(ObjectInfo(name, int(entry["Size"]), entry.get("ETag", "").strip('"')))
            if not page.get("IsTruncated"):
                return found
            token = page.get("NextContinuationToken")

    def _list_page(self, arguments: dict) -> dict:
        self._count(0)
        return self.client.list_objects_v2(**arguments)

    def _anything_below(self) -> bool:
        """Whether any object is below the dataset address (one request)."""
        arguments = {"Bucket": self.bucket, "Prefix": self._prefix(), "MaxKeys": 1}
        page = self._call(f"list the objects of {self.address}", lambda: self._list_page(arguments))
        return bool(page.get("Contents"))

    def in_other_unicode_form(self) -> str:
        """For an address below which nothing was found: a sentence naming the address that looks the same
        in the other Unicode normal form, where objects are below that one (a name typed or pasted on
        macOS is NFD, one written by most tools NFC, and keys are bytes); else "". A request per form."""
        for form in ("NFC", "NFD"):
            other = copy.copy(self)
            other.address = replace(self.address, prefix=unicodedata.normalize(form, self.address.prefix))
            if other.address != self.address and other._anything_below():
                return (
                    f" Objects are below {other.address}, which looks the same but writes its characters in"
                    f" Unicode's {form} form: give the address as the bucket writes it."
                )
        return ""

    def incomplete_uploads(self) -> list[IncompleteUpload]:
        """The multipart uploads below the dataset address that were begun and neither completed nor
        aborted (one request per 1,000 of them). A server that refuses the listing or does not have it is a
        StorageError saying so (no retries), as one that stays unreachable is."""
        prefix = self._prefix()
        found: list[IncompleteUpload] = []
        markers: dict[str, str] = {}
        while True:
            arguments = {"Bucket": self.bucket, "Prefix": prefix, **markers}
            page = self._call(
                f"list the incomplete multipart uploads below {self.address}",
                lambda a=arguments: self._uploads_page(a),
            )
            for upload in page.get("Uploads", ()):
                name = upload["Key"][len(prefix) :]
                if name:
                    found.append(IncompleteUpload(name, upload["UploadId"]))
            if not page.get("IsTruncated"):
                return found
            markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def _uploads_page(self, arguments: dict) -> dict:
        from botocore.exceptions import ClientError

        self._count(0)
        try:
            return self.client.list_multipart_uploads(**arguments)
        except ClientError as error:
            if _transient(error):
                raise
            code = error.response.get("Error", {}).get("Code") or _status(error)
            raise StorageError(
                f"The server does not list the incomplete multipart uploads below {self.address} ({code})."
            ) from None

    def read(
        self, name: str, offset: int, length: int, size: int | None = None, version: OneVersion | None = None
    ) -> bytes:
        """`length` bytes of object `name` from `offset` (fewer where the object ends first). Given `size`,
        the object's size when it was listed, a read of an object that has another size now (replaced
        since) is a StorageError saying so, not bytes of the new object; given `version`, so is a read of
        another version of it than `version`'s (replaced by one of its size)."""
        if length <= 0:
            return b""
        byte_range = f"bytes={offset}-{offset + length - 1}"
        what = f"read {self.url(name)} bytes {offset}-{offset + length - 1}"
        return self._call(what, lambda: self._get(name, byte_range, size, version))

    def get(self, name: str) -> bytes:
        """The whole of object `name`."""
        return self._call(f"read {self.url(name)}", lambda: self._get(name, None))

    def download(self, name: str, path: str | os.PathLike, size: int) -> None:
        """Object `name`, of `size` bytes as listed, into the file at `path`, in reads of `part_size`,
        PART_THREADS of them on their way at once (memory stays bounded, whatever its size), each part
        written at its place; an object of one part is read in this thread. A StorageError as `read`
        raises it (an object replaced since it was listed is one, and so is one whose parts come with
        different ETags: replaced by one of its size while it was read): a failure, or an interruption
        (Ctrl-C), stops the other reads, and leaves no file at `path`."""
        offsets = range(0, size, self.part_size)
        with _whole_or_none(path) as fd:
            if len(offsets) <= 1:
                _write_at(fd, self.read(name, 0, size, size), 0)
                return
            threads = min(PART_THREADS, len(offsets))
            go, stop = threading.Event(), threading.Event()
            version = OneVersion(self.url(name))

            def fetch(share: range) -> None:
                go.wait()
                for offset in share:
                    with _PART_SLOTS:  # all files' parts in memory: PARTS_IN_MEMORY at most
                        if stop.is_set():
                            return
                        part = self.read(name, offset, min(self.part_size, size - offset), size, version)
                        _write_at(fd, part, offset)

            pool = ThreadPoolExecutor(threads, "shardprep-download")
            try:
                fetching = [pool.submit(fetch, offsets[first::threads]) for first in range(threads)]
                # Only now: a thread whose start Ctrl-C cut short (the pool does not wait for it) finds
                # `stop` set, and does not touch the file.
                go.set()
                for done in wait(fetching, return_when=FIRST_EXCEPTION).done:
                    done.result()
            finally:
                stop.set()  # the threads fetch no further part
                go.set()
                pool.shutdown(cancel_futures=True)  # (the file stays open until they are done)

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        def head() -> bool:
            self._count(0)
            try:
                self.client.head_object(Bucket=self.bucket, Key=self.key(name))
            except ClientError as error:
                if _status(error) == 404:
                    return False
                raise
            return True

        return self._call(f"look up {self.url(name)}", head)

    def _get(
        self, name: str, byte_range: str | None, size: int | None = None, version: OneVersion | None = None
    ) -> bytes:
        arguments = {"Bucket": self.bucket, "Key": self.key(name)}
        if byte_range is not None:
            arguments["Range"] = byte_range
        response = self.client.get_object(**arguments)
        with response["Body"] as body:
            now = _object_size(response)
            if size is not None and now is not None and now != size:
                raise StorageError(
                    f"{self.url(name)} changed while it was read: it was listed at {size:,} bytes and is"
                    f" {now:,} bytes now. {_RUN_AGAIN}"
                )
            if version is not None:
                version.check(response.get("ETag"))
            data = body.read()
        self._count(len(data))
        return data

    def _count(self, size: int) -> None:
        with self._count_lock:
            self.bytes_read += size
            self.requests += 1

    # --- writing ---------------------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        """Write object `name` in one request."""
        self._call(
            f"write {self.url(name)}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data),
        )

    def upload_file(self, name: str, path: str | os.PathLike, stop: threading.Event | None = None) -> None:
        """Upload a local file as object `name`: in one PUT, or above `multipart_threshold` in parts (each
        part retried on its own; an upload that fails for good is aborted, so no parts are left behind).
        Once `stop` is set (the run is interrupted, or another upload failed), no further part is sent
        and the upload is aborted."""
        size = os.path.getsize(path)
        if size <= self.multipart_threshold:
            with open(path, "rb") as file:
                self.put(name, file.read())
            return
        part_size = max(self.part_size, -(-size // MAX_PARTS))
        fd = os.open(path, os.O_RDONLY)
        try:
            upload_id = self.start_multipart(name)
            try:
                numbers = range(1, -(-size // part_size) + 1)
                parts = self.send_parts(name, upload_id, fd, numbers, size, part_size, stop)
                self.finish_multipart(name, upload_id, parts)
            except BaseException:
                self.drop_multipart(name, upload_id)
                raise
        finally:
            os.close(fd)

    def send_parts(
        self,
        name: str,
        upload_id: str,
        fd: int,
        numbers: Iterable[int],
        size: int,
        part_size: int,
        stop: threading.Event | None = None,
    ) -> list[dict[str, Any]]:
        """Parts `numbers` of a multipart upload of the open file `fd` (`size` bytes, in parts of
        `part_size`), PART_THREADS of them on their way at most (`send_part`); what `finish_multipart`
        takes of them. Once `stop` is set (the run is interrupted, or another upload failed), no further
        part is sent: a StorageError."""
        parts: list[dict[str, Any]] = []
        with ThreadPoolExecutor(PART_THREADS, "shardprep-part") as pool:
            going: deque[Future[dict[str, Any]]] = deque()
            for number in numbers:
                if stop is not None and stop.is_set():
                    raise StorageError(
                        f"The upload of {self.url(name)} was stopped before its part {number}."
                    )
                if len(going) == PART_THREADS:
                    parts.append(going.popleft().result())
                offset = (number - 1) * part_size
                length = min(part_size, size - offset)
                going.append(pool.submit(self.send_part, name, upload_id, number, fd, offset, length))
            parts += [part.result() for part in going]
        return parts

    def start_multipart(self, name: str) -> str:
        """Begin a multipart upload of object `name` (nothing is visible under the name until
        `finish_multipart`); its upload id."""
        key = self.key(name)
        created = self._call(
            f"start a multipart upload of {self.url(name)}",
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key),
        )
        return created["UploadId"]

    def send_part(
        self, name: str, upload_id: str, number: int, fd: int, offset: int, length: int
    ) -> dict[str, Any]:
        """Upload part `number` of a multipart upload: `length` bytes of the open file `fd` from `offset`,
        read once one of the PARTS_IN_MEMORY parts' room is free; what `finish_multipart` takes of it."""
        key, url = self.key(name), self.url(name)
        with _PART_SLOTS:  # all files' parts in memory: PARTS_IN_MEMORY at most
            chunk = _read_at(fd, offset, length)
            answer = self._call(
                f"upload {url} bytes {offset}-{offset + length - 1} (part {number})",
                lambda: self.client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                ),
            )
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def finish_multipart(self, name: str, upload_id: str, parts: list[dict[str, Any]]) -> None:
        """Complete a multipart upload of `parts` (`send_part`'s answers, in any order): the object
        appears whole under its name."""
        key = self.key(name)
        ordered = sorted(parts, key=lambda part: part["PartNumber"])
        finishing = client_for(replace(self.spec, read_timeout=COMPLETE_READ_TIMEOUT))
        self._call(
            f"finish the multipart upload of {self.url(name)}",
            lambda: finishing.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": ordered}
            ),
        )

    def drop_multipart(self, name: str, upload_id: str) -> None:
        """Abort a multipart upload of this run's, as far as the bucket lets: this runs on the way out of a
        failure, whose own error is the one to report (the bucket's lifecycle rules clean up what this
        could not)."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key(name), UploadId=upload_id)
        except Exception:
            pass

    def delete(self, name: str) -> None:
        self._call(
            f"delete {self.url(name)}",
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self.key(name)),
        )

    def abort(self, upload: IncompleteUpload) -> None:
        """Abort a multipart upload: the server drops its parts. One that is gone already (completed or
        aborted since it was listed) is no error."""
        from botocore.exceptions import ClientError

        def abort() -> None:
            try:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key(upload.name), UploadId=upload.upload_id
                )
            except ClientError as error:
                if _status(error) != 404:  # NoSuchUpload
                    raise

        self._call(f"abort the incomplete multipart upload of {self.url(upload.name)}", abort)

    # --- retries ---------------------------------------------------------------------------------------

    def _call(self, what: str, request: Callable[[], T]) -> T:
        """`request()`, retried with backoff on transient failures; a StorageError saying `what` failed."""
        from http.client import HTTPException

        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
        from urllib3.exceptions import HTTPError as Urllib3Error  # a body cut off mid-read, unwrapped

        started = time.monotonic()
        delays = self.retry.delays()
        for attempt in range(self.retry.attempts):
            try:
                return request()
            except NoCredentialsError:
                raise StorageError(
                    f"Could not {what}: no credentials found. Set AWS_ACCESS_KEY_ID and"
                    " AWS_SECRET_ACCESS_KEY (s3://), or the profile's credentials_provider in the MSC"
                    " config (msc://)."
                ) from None
            except (BotoCoreError, ClientError, OSError, HTTPException, Urllib3Error) as error:
                if not _transient(error):
                    raise StorageError(f"Could not {what}: {_describe(error)}") from None
                elapsed = time.monotonic() - started
                if attempt == len(delays) or elapsed + delays[attempt] > self.retry.budget:
                    raise StorageError(
                        f"Could not {what} after {attempt + 1} attempt{'s' if attempt else ''} over {elapsed:.1f} s:"
                        f" {_describe(error).rstrip('.')}. Check that the storage endpoint ({self.endpoint}) is up"
                        " and reachable, then run again."
                    ) from None
                time.sleep(delays[attempt])
        raise AssertionError("unreachable")  # the loop returns or raises


def _read_at(fd: int, offset: int, length: int) -> bytes:
    """`length` bytes of the open file `fd` from `offset` (fewer only where the file ends first)."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset, length = offset + len(chunk), length - len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """`data` into the open file `fd` at `offset`."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


#: What to do about an object that changed while it was read.
_RUN_AGAIN = "Run again once the bucket is no longer being written."


class OneVersion:
    """The ETag an object was listed with, or else that of the first answer about it, which every later
    answer must give: the reads of an object in several requests (a download's parts, a shard's headers)
    are of one version of it (a replacement of the same size has another ETag)."""

    def __init__(self, url: str, etag: str | None = None) -> None:
        self.url = url
        self._etag = etag.strip('"') if etag else None
        self._lock = threading.Lock()

    def check(self, etag: str | None) -> None:
        """A StorageError unless `etag` (None: the server did not say) is the one this version has."""
        if not etag:
            return
        etag = etag.strip('"')
        with self._lock:
            first = self._etag = self._etag or etag
        if etag != first:
            raise StorageError(
                f"{self.url} changed while it was read: its reads came from two versions of it (ETags"
                f" {first} and {etag}). {_RUN_AGAIN}"
            )


@contextmanager
def _whole_or_none(path: str | os.PathLike) -> Iterator[int]:
    """The descriptor of a new (or emptied) file at `path`, open for writing; the file is removed unless
    the block completes, so that a file there is a whole one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    whole = False
    try:
        yield fd
        whole = True
    finally:
        os.close(fd)
        if not whole:
            os.unlink(path)


def _object_size(response: dict[str, Any]) -> int | None:
    """The whole object's size, from a GET's answer: the total of its Content-Range (`bytes 0-9/1234`),
    or the length of an answer that is the whole object; None where the server does not say.

    >>> _object_size({"ContentRange": "bytes 0-9/1234", "ContentLength": 10}), _object_size({"ContentLength": 7})
    (1234, 7)
    """
    content_range = response.get("ContentRange")
    if content_range:
        total = content_range.rpartition("/")[2]
        return int(total) if total.isdigit() else None
    length = response.get("ContentLength")
    return int(length) if length is not None else None


def _status(error: Exception) -> int:
    response = getattr(error, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _transient(error: Exception) -> bool:
    """Whether another try may succeed: no answer (refused, reset, timed out, cut off mid-body), a 5xx,
    throttling. Of botocore's own errors only its connection errors are; the rest (a bad parameter, no
    region) would fail again."""
    from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError
    from botocore.exceptions import ConnectionError as NoConnection

    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if _status(error) == 501:  # NotImplemented: the server does not have the request, and never will
            return False
        return _status(error) >= 500 or _status(error) == 429 or code in _TRANSIENT_CODES
    if _untrusted_certificate(error):  # every try meets the same certificate
        return False
    if isinstance(error, BotoCoreError):
        # refused or unreachable, a connect or read timeout, a connection closed or a body cut off
        return isinstance(error, (NoConnection, HTTPClientError, IncompleteReadError))
    return True  # OSError, http.client and urllib3 errors: the connection's


def _untrusted_certificate(error: BaseException) -> bool:
    """Whether `error` is, or was caused by, the server's TLS certificate failing verification."""
    import ssl

    seen: BaseException | None = error
    for _ in range(8):  # botocore's SSLError wraps urllib3's, which wraps ssl's
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(error: Exception) -> str:
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "?")
        message = error.response.get("Error", {}).get("Message", "")
        advice = {
            "NoSuchKey": "the object does not exist.",
            "404": "the object does not exist.",
            "NoSuchBucket": "the bucket does not exist.",
            "AccessDenied": "access denied; check the credentials and the bucket's policy.",
            "403": "access denied; check the credentials and the bucket's policy.",
        }.get(code)
        return advice or f"{code} {message}".strip() + "."
    text = str(error).rstrip(".") if str(error) else type(error).__name__
    if _untrusted_certificate(error):
        text += (
            ". The server's TLS certificate is not one this machine trusts: set AWS_CA_BUNDLE to a PEM file"
            " of the CA that signed it, or give the endpoint by the name its certificate is for."
        )
    return text


def open_store(address: ObjectAddress, **options: Any) -> ObjectStore:
    """The bucket behind `address`, with a client set up as boto (or the MSC profile) says; `options` go
    to `ObjectStore` (retry, part_size, multipart_threshold)."""
    try:
        import botocore.session
    except ImportError:
        raise PrepError(f"{address} is in object storage, which needs the s3 extra: {S3_EXTRA}.") from None
    retry: RetryPolicy = options.get("retry", RetryPolicy())
    endpoint: str | None = None
    region: str | None = None
    credentials: dict[str, str] = {}
    bucket, base = address.authority, ""
    if address.scheme == "msc":
        bucket, base, endpoint, region, credentials = _msc_profile(address.authority)
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    spec = ClientSpec(
        endpoint or None,
        region or botocore.session.Session().get_config_variable("region") or "us-east-1",
        tuple(sorted(credentials.items())),
        retry.connect_timeout,
        retry.read_timeout,
    )
    client_for(spec)  # a bad configuration fails here, not in the first request
    return ObjectStore(address, spec, bucket, base, endpoint=endpoint, **options)


def _schema_problem(error: Any) -> str:
    """jsonschema's `error` about an MSC config, with the value it quotes named by its place instead
    (`profiles/p/credentials_provider is not of type 'object'`): that value may be a secret key."""
    place = "/".join(str(part) for part in error.absolute_path) or "the config"
    return str(error.message).replace(repr(error.instance), place)


def _msc_profile(name: str) -> tuple[str, str, str | None, str | None, dict[str, str]]:
    """(bucket, base prefix, endpoint, region, client credentials) of the MSC profile `name`."""
    try:
        from multistorageclient.config import StorageClientConfig
    except ImportError:
        raise PrepError(
            f"msc://{name}/ addresses need multi-storage-client, part of the s3 extra: {S3_EXTRA}."
        ) from None
    config_env = os.environ.get("MSC_CONFIG")
    try:
        config, path = StorageClientConfig.read_msc_config()
    except Exception as error:  # MSC's: a ValueError (not YAML or JSON), RuntimeError (not its schema), ...
        # a RuntimeError's arguments are a text and jsonschema's error, whose message says what is wrong
        cause = error.args[-1] if isinstance(error, RuntimeError) and error.args else error
        detail = _schema_problem(cause) if hasattr(cause, "message") else str(cause)
        if config_env and config_env not in detail:
            detail = f"{config_env}: {detail}"
        raise PrepError(
            f"msc://{name}/: the MSC config cannot be read ({detail}). Correct it, or set MSC_CONFIG to the"
            " path of another."
        ) from None
    profiles = (config or {}).get("profiles") or {}
    if name not in profiles:
        if config_env and not os.path.exists(config_env):
            where = f"MSC_CONFIG names {config_env}, which does not exist"
            where += f"; MSC read {path}" if path else ", and none is in MSC's default places"
        else:
            where = path or "none was found: set MSC_CONFIG to its path"
        raise PrepError(f"msc://{name}/: the MSC config ({where}) has no profile {name!r}.")
    provider = profiles[name].get("storage_provider") or {}
    if provider.get("type") not in S3_PROVIDER_TYPES:
        raise PrepError(
            f"msc://{name}/: the profile's storage provider is {provider.get('type')!r}; shardprep reads"
            f" S3-compatible ones ({', '.join(S3_PROVIDER_TYPES)})."
        )
    options = provider.get("options") or {}
    base_path = str(options.get("base_path", ""))
    bucket, _, base = base_path.lstrip("/").partition("/")  # as MSC splits base_path joined to a path
    if not bucket:
        raise PrepError(f"msc://{name}/: the profile's storage_provider has no base_path (BUCKET/PREFIX).")
    if not is_bucket_name(bucket):
        raise PrepError(
            f"msc://{name}/: the profile's base_path, {base_path!r}, does not begin with a bucket name: write it"
            " as BUCKET/PREFIX, without a scheme or an endpoint."
        )
    credentials: dict[str, str] = {}
    given = profiles[name].get("credentials_provider") or {}
    if given.get("type") == "S3Credentials":
        given_options = given.get("options") or {}
        for ours, theirs in (
            ("aws_access_key_id", "access_key"),
            ("aws_secret_access_key", "secret_key"),
            ("aws_session_token", "session_token"),
        ):
            if given_options.get(theirs):
                credentials[ours] = str(given_options[theirs])
    return bucket, base, options.get("endpoint_url") or None, options.get("region_name") or None, credentials
