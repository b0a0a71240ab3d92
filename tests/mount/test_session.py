"""The FUSE session against recorded kernel requests, over a socket pair standing in for /dev/fuse
(a SOCK_SEQPACKET pair keeps one request per read, as the device does): INIT of several protocol
versions, requests that get no reply, requests we do not know, and the session still serving after."""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path

import pytest

from prep.index.dataset import PreparedDataset
from prep.mount import wire
from prep.mount.failures import FULL_PER_KIND
from prep.mount.messages import STDERR, Messages
from prep.mount.nodes import ROOT_ID
from prep.mount.session import FuseSession, Owner
from prep.mount.tree import MountTree, View
from tests.support.datasets import prepared_dataset, writable_copy


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepared_dataset(tmp_path_factory.mktemp("session"), "shardprep")


class Kernel:
    """Our side of the pair: sends requests as the kernel would and reads the replies."""

    def __init__(self, dataset: Path, messages: Messages = STDERR) -> None:
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.session = FuseSession(
            theirs.detach(),
            MountTree(PreparedDataset(dataset), View.FLAT),
            Owner(0, 0, 0, 0),
            messages=messages,
        )
        self.session.start()
        self.unique = 0

    def send(self, opcode: int, body: bytes = b"", nodeid: int = ROOT_ID) -> int:
        self.unique += 2
        header = wire.IN_HEADER.pack(
            wire.IN_HEADER.size + len(body), opcode, self.unique, nodeid, 0, 0, 1, 0, 0
        )
        self.ours.send(header + body)
        return self.unique

    def reply(self) -> tuple[int, int, bytes]:
        """(error, unique, body) of the next reply."""
        self.ours.settimeout(5)
        data = self.ours.recv(1 << 20)
        length, error, unique = wire.OUT_HEADER.unpack_from(data)
        assert length == len(data)
        return error, unique, data[wire.OUT_HEADER.size :]

    def close(self) -> None:
        self.ours.close()
        assert self.session.finished.wait(5), "the session did not end when its device closed"
        os.close(self.session.device)


def init_request(minor: int, flags: int) -> bytes:
    """INIT's body as a kernel of protocol 7.`minor` sends it (flags2 and padding from 7.36)."""
    body = wire.INIT_IN.pack(7, minor, 128 * 1024, flags)
    return body + bytes(48) if minor >= 36 else body


@pytest.mark.parametrize(
    ("minor", "size", "reply_minor"),
    [
        (12, 24, 12),
        (22, 24, 22),
        (23, 64, 23),
        (27, 64, 27),
        (28, 64, 28),
        (31, 64, 31),
        (38, 64, 38),
        (41, 64, 38),
    ],
)
def test_init_is_answered_in_the_kernels_own_protocol_version(dataset, minor, size, reply_minor):
    kernel = Kernel(dataset)
    try:
        offered = wire.ASYNC_READ | wire.DO_READDIRPLUS | wire.MAX_PAGES
        unique = kernel.send(wire.Opcode.INIT, init_request(minor, offered))
        error, replied, body = kernel.reply()
        assert (error, replied, len(body)) == (0, unique, size)
        major, got_minor, _, flags = struct.unpack_from("<IIII", body)
        assert (major, got_minor) == (7, reply_minor)
        assert flags == offered & (wire.ASYNC_READ | wire.DO_READDIRPLUS | wire.MAX_PAGES)
        if size == 64:
            max_pages = wire.INIT_OUT.unpack(body)[8]
            assert (max_pages > 0) == (minor >= 28), "max_pages means something only from 7.28"
    finally:
        kernel.close()


@pytest.mark.parametrize("request_", [(6, 31), (8, 38)], ids=["too-old-minor", "other-major"])
def test_an_init_we_cannot_speak_is_refused_with_eproto(dataset, request_, capfd):
    major, minor = request_
    kernel = Kernel(dataset)
    try:
        kernel.send(wire.Opcode.INIT, wire.INIT_IN.pack(major, minor, 0, 0))
        assert kernel.reply()[0] == -errno.EPROTO
    finally:
        kernel.close()
    assert f"FUSE {major}.{minor}" in capfd.readouterr().err


def test_forget_interrupt_and_unknown_requests_never_stop_the_session(dataset):
    kernel = Kernel(dataset)
    try:
        kernel.send(wire.Opcode.INIT, init_request(38, wire.DO_READDIRPLUS))
        assert kernel.reply()[0] == 0
        kernel.send(wire.Opcode.FORGET, struct.pack("<Q", 1), nodeid=12345)
        kernel.send(wire.Opcode.BATCH_FORGET, struct.pack("<II", 2, 0) + struct.pack("<QQ", 7, 1) * 2)
        kernel.send(wire.Opcode.INTERRUPT, struct.pack("<Q", 999))
        unknown = kernel.send(4242, b"\xff" * 16)
        assert kernel.reply()[:2] == (-errno.ENOSYS, unknown), "FORGET and INTERRUPT must get no reply"
        short = kernel.send(wire.Opcode.LOOKUP, b"")  # a body too short to hold a name
        assert kernel.reply()[1] == short
        alive = kernel.send(wire.Opcode.GETATTR, bytes(16))
        error, unique, body = kernel.reply()
        assert (error, unique) == (0, alive) and len(body) == wire.ATTR_OUT_HEAD.size + wire.ATTR.size
    finally:
        kernel.close()


def test_a_read_that_fails_other_than_with_an_os_error_in_a_pool_thread_is_answered_eio(dataset):
    # A read the page cache cannot answer goes to a pool thread; the index gone from under it there
    # (its first query there opens it: a PrepError) must still be answered, or its reader waits for ever.
    from prep.errors import PrepError

    kernel = Kernel(dataset)
    tree = kernel.session.tree

    def not_cached(node: int, offset: int, into: memoryview) -> memoryview:
        raise BlockingIOError(errno.EAGAIN, "not in the page cache")

    def index_gone(node: int, offset: int, size: int) -> bytes:
        raise PrepError("index.sqlite is missing")

    tree.read_cached, tree.read = not_cached, index_gone
    try:
        kernel.send(wire.Opcode.INIT, init_request(38, 0))
        assert kernel.reply()[0] == 0
        read = kernel.send(wire.Opcode.READ, wire.READ_IN.pack(0, 0, 4096, 0) + bytes(24), nodeid=7)
        assert kernel.reply()[:2] == (-errno.EIO, read)
    finally:
        kernel.close()


def test_a_read_of_a_shard_that_became_a_folder_is_answered_eio_and_told_with_its_path(dataset, tmp_path):
    # An OSError the tree does not expect (EISDIR) was a silent EIO: only --debug said anything, and not
    # of OSErrors at all.
    copy = writable_copy(dataset, tmp_path / "dataset")
    (copy / "shard-000.tar").unlink()
    (copy / "shard-000.tar").mkdir()
    said: list[str] = []
    kernel = Kernel(copy, Messages("a list", said.append))
    try:
        kernel.send(wire.Opcode.INIT, init_request(38, 0))
        assert kernel.reply()[0] == 0
        kernel.send(wire.Opcode.LOOKUP, b"s0_000.txt\0")
        error, _, body = kernel.reply()
        assert error == 0
        node = wire.ENTRY_OUT_HEAD.unpack_from(body)[0]
        for _ in range(FULL_PER_KIND + 2):
            read = kernel.send(wire.Opcode.READ, wire.READ_IN.pack(0, 0, 4096, 0) + bytes(24), nodeid=node)
            assert kernel.reply()[:2] == (-errno.EIO, read)
    finally:
        kernel.close()
    assert len(said) == FULL_PER_KIND + 1, said  # the last: the count, told as the session ends
    assert said[0].startswith(
        "READ of /s0_000.txt (4096 bytes at 0) answered as an I/O error: IsADirectoryError"
    )
    assert said[-1] == "2 more READ requests failed with IsADirectoryError."
