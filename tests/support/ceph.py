"""A Ceph object gateway (radosgw) on loopback: an S3 server written in C++, for `tools.bench_s3` and for
`tests/storage/test_ceph.py`.

moto (`tests.support.s3`) is a Python program and its server closes every connection after one answer.
Ceph's gateway, the S3 server of many production stores, keeps connections open between requests, as
S3 does, which matters to a client that forks (see `tests/storage/test_ceph.py`), and costs less CPU per
byte (on a 2-CPU VM: 5-6 ms per MB taken in for its three daemons together, against moto's 12), which
matters on a benchmark machine of few cores, where the server's CPU time is taken from the tool's.

`CephS3Server` starts a throw-away, single-machine Ceph cluster under a folder of its own: one monitor,
one object store daemon (BlueStore, on a sparse file in that folder: the dataset takes its size in disk,
not memory), and the gateway, each a child process in the foreground, authentication between them off,
all on 127.0.0.1; a gateway user with the tests' keys. `stop` ends the three. Starting takes about 15 s.
The gateway sends without Nagle's delay (beast's `tcp_nodelay=1`, which Ceph documents for sending at
once rather than waiting for a full buffer): with the delay, the body of every GET's answer waited
~44 ms for the client's delayed ACK of its head.

It needs Ceph's daemons on the PATH (`INSTALL`: Ceph 16 on Debian 12); `available()` says whether they
are there. `.ci/run` installs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.support.leftovers import process_cpu_seconds
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server, free_port

DAEMONS = ("ceph-mon", "ceph-osd", "radosgw")
INSTALL = "apt-get install --no-install-recommends radosgw ceph-mon ceph-osd"
#: What energon's client needs in its environment to upload to the gateway: Ceph 16 predates the trailing
#: checksums that botocore 1.36 and later send by default with a streamed upload (an `aws-chunked` body,
#: as multi-storage-client sends a `.tar.idx`), takes the trailer for the next request ("failed to read
#: header: bad method") and answers 400. With these, checksums go only where S3 requires them, as AWS
#: advises for such servers. Over http://, as here, shardprep's uploads need neither (test_ceph.py);
#: over https://, botocore streams theirs with trailing checksums too (README).
CLIENT_ENV = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
}
#: The object store's size: a sparse file, which takes only what is written.
CAPACITY = 64 << 30
#: Memory for the object store daemon's caches (Ceph's default is 4 GiB).
CACHE = 2 << 30


def available() -> bool:
    return all(shutil.which(name) for name in (*DAEMONS, "ceph", "monmaptool", "radosgw-admin"))


class CephS3Server(S3Server):
    """Ceph's gateway on `127.0.0.1:port` over a one-daemon cluster under `folder`."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "rgw.log")
        self.folder = folder
        self.conf = folder / "ceph.conf"
        self.daemons: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        if not available():
            raise RuntimeError(f"Ceph's daemons are not on the PATH: {INSTALL}")
        self.folder.mkdir(parents=True, exist_ok=True)
        fsid, mon = str(uuid.uuid4()), f"v2:127.0.0.1:{free_port()}"
        self._write_conf(fsid, mon)
        with contextlib.ExitStack() as undo:
            undo.callback(self.stop)  # whatever fails on the way
            self._run(
                "monmaptool",
                "--create",
                "--fsid",
                fsid,
                "--addv",
                "a",
                f"[{mon}]",
                str(self.folder / "monmap"),
            )
            self._run(
                "ceph-mon", "-c", str(self.conf), "-i", "a", "--mkfs", "--monmap", str(self.folder / "monmap")
            )
            self._spawn("ceph-mon", "-i", "a")
            osd = self._ceph("osd", "create").strip()
            self._run("ceph-osd", "-c", str(self.conf), "-i", osd, "--mkfs")
            self._ceph("osd", "crush", "add", f"osd.{osd}", "1.0", "root=default")
            self._spawn("ceph-osd", "-i", osd)
            self._wait("the object store daemon to be up", self._osd_up)
            self._run(
                "radosgw-admin", "-c", str(self.conf), "-n", "client.rgw", "user", "create", "--uid=bench",
                "--display-name=bench", f"--access-key={ACCESS_KEY}", f"--secret={SECRET_KEY}",
            )  # fmt: skip
            self._spawn("radosgw", "-n", "client.rgw")
            self._wait("the gateway to answer", self._answers)
            self._warm_up()
            undo.pop_all()

    def _warm_up(self) -> None:
        """Make the gateway create its pools now: it makes each on first use (the one for multipart
        uploads at the first upload begun, which takes about a second), and the first tool to be timed
        would pay for them."""
        client, bucket = self.client(), "warm-up"
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="object", Body=b"x")
        upload = client.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
        client.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload)
        client.delete_object(Bucket=bucket, Key="object")
        client.delete_bucket(Bucket=bucket)

    def _write_conf(self, fsid: str, mon: str) -> None:
        folder = self.folder
        for name in ("mon", "osd", "run", "log"):
            (folder / name).mkdir(exist_ok=True)
        self.conf.write_text(
            f"""[global]
fsid = {fsid}
mon host = {mon}
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms mon service mode = crc
ms mon cluster mode = crc
ms client mode = crc
ms service mode = crc
ms cluster mode = crc
run dir = {folder}/run
admin socket = {folder}/run/$name.asok
log file = {folder}/log/$name.log
debug rgw = 0/0
debug ms = 0/0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 0
osd crush chooseleaf type = 0
[mon.a]
mon data = {folder}/mon
[osd]
osd data = {folder}/osd
osd objectstore = bluestore
bluestore block path = {folder}/block.img
bluestore block create = true
bluestore block size = {CAPACITY}
bluestore fsck on mount = false
osd memory target = {CACHE}
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{self.port} tcp_nodelay=1
rgw data = {folder}/rgw
"""
        )

    def _run(self, *command: str) -> str:
        result = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
        return result.stdout

    def _ceph(self, *command: str) -> str:
        """The `ceph` tool's answer; it fails after 30 s without a monitor instead of waiting on."""
        return self._run("ceph", "-c", str(self.conf), "--connect-timeout", "30", *command)

    def _spawn(self, daemon: str, *arguments: str) -> None:
        with open(self.folder / "log" / f"{daemon}.out", "ab") as out:
            self.daemons[daemon] = subprocess.Popen(
                [daemon, "-f", "-c", str(self.conf), *arguments],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait(self, what: str, ready: Callable[[], bool], seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for daemon, process in self.daemons.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{daemon} exited ({process.returncode}); see {self.folder / 'log'}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"waited {seconds:.0f} s for {what}; see {self.folder / 'log'}")

    def _osd_up(self) -> bool:
        stat = json.loads(self._ceph("osd", "stat", "-f", "json"))
        return stat.get("num_up_osds", 0) == 1

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
            return True
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        """CPU time the three daemons have used so far (user and system, all their threads)."""
        return sum(process_cpu_seconds(process.pid) for process in self.daemons.values())

    def bytes_sent(self) -> int:
        """Bytes of object data the gateway was asked for so far: its `get_b` counter, which Ceph 16
        keeps one short per GET (it adds up last - first of each range asked for), plus its count of GETs
        (HEADs among them, which add 1 each). A GET the client abandons counts whole; moto's count is of
        bytes sent. Listings and other XML answers are left out, unlike moto's count."""
        socket = self.folder / "run" / "client.rgw.asok"
        counters = json.loads(self._run("ceph", "--admin-daemon", str(socket), "perf", "dump"))["rgw"]
        return int(counters["get_b"]) + int(counters["get"])

    def stop(self) -> None:
        """End the gateway, the store and the monitor (each's process group), then wait for each."""
        stopping = [self.daemons.pop(daemon) for daemon in reversed(DAEMONS) if daemon in self.daemons]
        for process in stopping:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in stopping:
            process.wait(timeout=30)


class StartingCeph:
    """A `CephS3Server` starting in a thread of its own from the moment this is made: a test run that will
    need one starts it first, and its 15-25 s of waiting on the daemons pass beside other tests.
    `server()` waits for it (and raises what its start raised); `stop()` waits for the start and stops it."""

    def __init__(self, folder: Path) -> None:
        self._server = CephS3Server(folder)
        self._error: BaseException | None = None
        #: Set once the start has ended, either way. Waited on rather than the thread: a `join` that a
        #: Ctrl-C (or SIGTERM, `tests.support.sigterm`) interrupts can return at once when called again,
        #: and `stop` then left the start's last steps running past the run's end.
        self._ended = threading.Event()
        threading.Thread(target=self._start, name="ceph-start", daemon=True).start()

    def _start(self) -> None:
        try:
            self._server.start()
        except BaseException as error:  # noqa: BLE001 - raised again in the test that needs the server
            self._error = error
        finally:
            self._ended.set()

    def server(self) -> CephS3Server:
        self._ended.wait()
        if self._error is not None:
            raise self._error
        return self._server

    def stop(self) -> None:
        self._ended.wait()
        self._server.stop()
