"""The FUSE protocol structs we write have the sizes and layouts of the kernel's `<linux/fuse.h>`."""

from __future__ import annotations

from prep.mount import wire

# Sizes of the kernel's structs (protocol 7.38), as `sizeof` gives them in C.
KERNEL_SIZES = {
    "fuse_in_header": (wire.IN_HEADER, 40),
    "fuse_out_header": (wire.OUT_HEADER, 16),
    "fuse_attr": (wire.ATTR, 88),
    "fuse_attr_out without attr": (wire.ATTR_OUT_HEAD, 16),
    "fuse_entry_out without attr": (wire.ENTRY_OUT_HEAD, 40),
    "fuse_init_out": (wire.INIT_OUT, 64),
    "fuse_open_out": (wire.OPEN_OUT, 16),
    "fuse_dirent without name": (wire.DIRENT_HEAD, 24),
    "fuse_kstatfs": (wire.KSTATFS, 80),
}


def test_every_struct_has_the_kernel_size():
    for name, (layout, size) in KERNEL_SIZES.items():
        assert layout.size == size, name
    assert wire.ENTRY_OUT_SIZE == 128


def test_a_readdirplus_entry_is_a_lookup_entry_then_a_dirent_padded_to_eight_bytes():
    packer = wire.NodePacker(uid=1000, gid=100, time_s=1_700_000_000, time_ns=5, valid_s=3600)
    for name in (b"a", b"1234567", b"12345678", b"x" * 200):
        piece = packer.direntplus(4 * 9 + 3, 12, name, False, 1234)
        assert len(piece) % 8 == 0 and len(piece) == wire.dirent_size(len(name), plus=True)
        nodeid, generation, entry_valid, attr_valid, _, _ = wire.ENTRY_OUT_HEAD.unpack_from(piece)
        assert (nodeid, generation, entry_valid, attr_valid) == (39, 0, 3600, 3600)
        ino, size, blocks, *_, mode, nlink, uid, gid, _, _, _ = wire.ATTR.unpack_from(piece, 40)
        assert (ino, size, blocks, mode, nlink, uid, gid) == (39, 1234, 3, 0o100444, 1, 1000, 100)
        ino, cookie, length, kind = wire.DIRENT_HEAD.unpack_from(piece, 128)
        assert (ino, cookie, length, kind) == (39, 12, len(name), wire.DT_REG)
        assert piece[152 : 152 + len(name)] == name and not any(piece[152 + len(name) :])


def test_init_reply_takes_only_offered_features_and_names_our_protocol():
    offered = wire.ASYNC_READ | wire.DO_READDIRPLUS | (1 << 5)
    major, minor, readahead, flags, *rest = wire.INIT_OUT.unpack(wire.pack_init_reply(offered, 256))
    assert (major, minor) == (7, 38)
    assert flags == wire.ASYNC_READ | wire.DO_READDIRPLUS
    assert rest[4] == 256  # max_pages, after max_background, congestion_threshold, max_write, time_gran
