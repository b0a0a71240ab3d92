"""A real S3 server on loopback for the object-storage tests: moto's server mode in a child process.

`S3Server` starts `python -m moto.server` on a free port of 127.0.0.1, can be stopped and started again on
the same port (its buckets are lost: moto keeps them in memory), and is always ended at teardown, so no
process outlives the test. `env` holds what a client needs (the AWS_* variables, AWS_ENDPOINT_URL);
`msc_config` writes a multi-storage-client config whose profile points at the server. Used by the tests
(`tests/storage/conftest.py`) and by `tools.bench_s3`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from tests.support.leftovers import process_cpu_seconds
from tests.support.shards import sample_members, tricky_members, write_tarfile

ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"
#: Bytes of each big member of `mixed_dataset`.
BIG = 512 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class S3Server:
    """moto's S3 server on `127.0.0.1:port`, in a child process of its own process group."""

    def __init__(self, log: Path, counted: bool = False, open_requests: int | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log
        #: Run `tests.support.moto_counted` (which counts the bytes it sends, see `bytes_sent`), not moto.server.
        self.counted = counted
        #: With a number, moto answers that many requests from anyone, then checks each request's
        #: credentials and IAM policy, as S3 does (see `user_without`).
        self.open_requests = open_requests
        self.process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def start(self) -> None:
        with open(self.log, "ab") as log:
            module = "tests.support.moto_counted" if self.counted else "moto.server"
            env = dict(os.environ)
            if self.open_requests is not None:
                env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(self.open_requests)
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, "-H", "127.0.0.1", "-p", str(self.port)],
                cwd=Path(__file__).resolve().parents[2],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto server did not answer within 30 s")

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far (user and system)."""
        assert self.process is not None
        return process_cpu_seconds(self.process.pid)

    def bytes_sent(self) -> int:
        """The bytes of response bodies the server has sent so far (a `counted` server only)."""
        from tests.support.moto_counted import COUNT_PATH

        with urllib.request.urlopen(self.endpoint + COUNT_PATH, timeout=10) as answer:
            return int(answer.read())

    def stop(self) -> None:
        """End the server (its whole process group) and wait for it."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)
        self.process = None

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def user_without(self, action: str) -> dict[str, str]:
        """The AWS_* variables of a new IAM user allowed every S3 request but `action` (e.g.
        `s3:ListBucketMultipartUploads`); three of the server's `open_requests`."""
        import json

        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )
        iam.create_user(UserName="limited")
        statements = [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
            {"Effect": "Deny", "Action": action, "Resource": "*"},
        ]
        policy = json.dumps({"Version": "2012-10-17", "Statement": statements})
        iam.put_user_policy(UserName="limited", PolicyName="limited", PolicyDocument=policy)
        key = iam.create_access_key(UserName="limited")["AccessKey"]
        return {
            **self.env,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def upload_folder(self, folder: Path, bucket: str, prefix: str, pattern: str = "*") -> list[str]:
        """Every file below `folder` (whose name matches `pattern`) as an object under `bucket/prefix/`;
        the keys written."""
        client, keys = self.client(), []
        for path in sorted(folder.rglob(pattern)):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(folder).as_posix()}"
                client.upload_file(str(path), bucket, key)
                keys.append(key)
        return keys

    def download_prefix(self, bucket: str, prefix: str, folder: Path) -> list[str]:
        """Every object under `bucket/prefix/` as a file below `folder`; the names (relative) fetched."""
        client, names = self.client(), []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            for entry in page.get("Contents", ()):
                name = entry["Key"][len(prefix) + 1 :]
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, entry["Key"], str(target))
                names.append(name)
        return sorted(names)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        client, found = self.client(), []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found += [entry["Key"] for entry in page.get("Contents", ())]
        return sorted(found)

    def leave_incomplete_upload(self, bucket: str, key: str) -> None:
        """A multipart upload of `key` with one part sent, never completed nor aborted: what a run killed
        (SIGKILL, a lost machine) in the middle of uploading `key` leaves on the server."""
        client = self.client()
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * 100)

    def incomplete_uploads(self, bucket: str) -> list[str]:
        """The keys of the bucket's multipart uploads neither completed nor aborted."""
        client, found = self.client(), []
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            found += [upload["Key"] for upload in page.get("Uploads", ())]
        return sorted(found)

    def delete_keys(self, bucket: str, keys: list[str]) -> None:
        client = self.client()
        for start in range(0, len(keys), 1000):
            objects = [{"Key": key} for key in keys[start : start + 1000]]
            client.delete_objects(Bucket=bucket, Delete={"Objects": objects})

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        self.delete_keys(bucket, self.keys(bucket, prefix + "/"))

    def msc_config(self, path: Path, profile: str, bucket: str) -> Path:
        """A multi-storage-client config with `profile` on `bucket` of this server."""
        import yaml

        config = {
            "profiles": {
                profile: {
                    "storage_provider": {
                        "type": "s3",
                        "options": {
                            "base_path": bucket,
                            "endpoint_url": self.endpoint,
                            "region_name": REGION,
                        },
                    },
                    "credentials_provider": {
                        "type": "S3Credentials",
                        "options": {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY},
                    },
                }
            }
        }
        path.write_text(yaml.safe_dump(config))
        return path


class Outage:
    """A TCP relay in front of the server, to take the endpoint away mid-run and bring it back with the
    buckets intact (moto forgets them when it stops): `cut()` closes the listening socket and resets every
    open connection, as a dying server does; `restore()` listens on the same port again. `relayed` counts
    the bytes sent back to clients, so a test can cut once a run is under way."""

    def __init__(self, server: S3Server) -> None:
        import threading

        self.target = ("127.0.0.1", server.port)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.relayed = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._threads: list = []
        self.restore()

    def restore(self) -> None:
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def cut(self) -> None:
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close alone does not
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.shutdown(socket.SHUT_RDWR)  # wakes the relay thread blocked on it
                sock.close()  # linger 0: a reset, not a polite close
            except OSError:
                pass

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                if counted:
                    self.relayed += len(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets -= {source, sink}
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def mixed_dataset(root: Path) -> Path:
    """Shards of every header kind (ustar, GNU long names, PAX, a global header, links), shards of small
    text samples, and one of big members."""
    write_tarfile(
        root / "pax" / "shard-000.tar", tricky_members("p/") + sample_members("pax-", 30), non_regular=True
    )
    write_tarfile(
        root / "gnu" / "shard-000.tar", tricky_members("g/") + sample_members("gnu-", 30), tarfile.GNU_FORMAT
    )
    write_tarfile(root / "global.tar", sample_members("glob-", 12), pax_headers={"comment": "global"})
    for shard in range(3):
        write_tarfile(root / f"text-{shard:03d}.tar", sample_members(f"t{shard}-", 200), tarfile.GNU_FORMAT)
    big_parts = {"bin": b"\x01" * BIG, "json": b'{"i": %d}'}
    write_tarfile(root / "big-000.tar", sample_members("big-", 12, big_parts), tarfile.GNU_FORMAT)
    return root
