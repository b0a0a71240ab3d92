"""Mount and unmount a FUSE filesystem: the device a session serves, and the checks before it.

Mounting uses `fusermount3` (so ordinary users can mount: it opens `/dev/fuse`, mounts it and passes the
open device back over a socket) and falls back to mount(2) for root, as libfuse does. Unmounting uses
`fusermount3`, else `umount`, else umount2(2) as root; a server's mount is unmounted by a watcher if
the server ends without unmounting it (`unmount_if_left_dead`). Every refusal comes back as a PrepError
that says what to install or check.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import subprocess
import time

from prep.errors import PrepError

FUSE_DEVICE = "/dev/fuse"
#: The mount table's type of every mount `mount_device` makes (FUSE's type, our subtype).
FS_SUBTYPE = "shardprep"
FS_TYPE = f"fuse.{FS_SUBTYPE}"
FUSE_INSTALL_HINT = (
    "On Debian/Ubuntu install it with `apt-get install fuse3`; in a container also start it with"
    " `--device /dev/fuse --cap-add SYS_ADMIN`."
)


def mount_table() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process sees, in mount order, from
    /proc/self/mountinfo; empty where there is no such file."""
    try:
        with open("/proc/self/mountinfo") as table:
            lines = table.read().splitlines()
    except OSError:  # pragma: no cover - not Linux
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        mounts.append((_unescape(fields[4]), fields[fields.index("-") + 1]))
    return mounts


def mounted_here(path: str) -> str | None:
    """The filesystem type mounted at `path` (e.g. "fuse.shardprep"), from this process's mount table, or
    None. Unlike os.path.ismount it also sees a FUSE mount whose server has died (where every stat fails
    with ENOTCONN, or ECONNABORTED when the kernel aborted the connection)."""
    target = os.path.abspath(path)
    if not os.path.exists("/proc/self/mountinfo"):  # pragma: no cover - not Linux
        return "unknown" if os.path.ismount(target) else None
    for point, kind in reversed(mount_table()):  # the last mount at a path is the one in effect
        if point == target:
            return kind
    return None


def server_gone(path: str) -> bool:
    """Whether `path` is a FUSE mount whose server has died: ENOTCONN, or ECONNABORTED where the kernel
    aborted the connection (seen on mounts made through fusermount3).

    Asks the server: the lookup of a name never used before, which the kernel cannot answer from what
    it keeps (a stat of the mount point it answers from attributes it cached while the server lived)."""
    try:
        os.stat(os.path.join(path, f".shardprep-probe-{os.getpid()}-{time.monotonic_ns()}"))
    except OSError as error:
        return error.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def fuse_problem() -> str | None:
    """Why this machine cannot mount a FUSE filesystem, or None if it can."""
    if not os.uname().sysname == "Linux":
        return f"shardprep mount needs Linux with FUSE; this is {os.uname().sysname}."
    try:
        info = os.stat(FUSE_DEVICE)
    except OSError:
        return f"there is no {FUSE_DEVICE}, so FUSE filesystems cannot be mounted here. {FUSE_INSTALL_HINT}"
    if not stat.S_ISCHR(info.st_mode) or (os.major(info.st_rdev), os.minor(info.st_rdev)) != (10, 229):
        return f"{FUSE_DEVICE} is not the FUSE device (char 10:229). {FUSE_INSTALL_HINT}"
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        return (
            f"{FUSE_DEVICE} exists but this user may not open it. Add the user to the `fuse` group or run as"
            f" a user that can. {FUSE_INSTALL_HINT}"
        )
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return f"fusermount3 is not installed, so an ordinary user cannot mount. {FUSE_INSTALL_HINT}"
    return None


def _mount_options(fsname: str) -> str:
    safe_name = fsname.replace(",", "_").replace("\\", "_")
    return f"ro,nosuid,nodev,default_permissions,fsname={safe_name},subtype={FS_SUBTYPE}"


def _mount_with_fusermount(mountpoint: str, fsname: str) -> int:
    """Let fusermount3 open the device and mount it; it passes the open device back over a socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        result = subprocess.run(
            ["fusermount3", "-o", _mount_options(fsname), "--", mountpoint],
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise PrepError(
                f"Mounting at {mountpoint} failed: {result.stderr.strip() or 'fusermount3 refused'}. Check that"
                f" the mount point is an existing folder that is not already mounted. {FUSE_INSTALL_HINT}"
            )
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise PrepError(
            f"fusermount3 mounted {mountpoint} but passed back no FUSE device. {FUSE_INSTALL_HINT}"
        )
    return fds[0]


def _mount_as_root(mountpoint: str, fsname: str) -> int:
    """mount(2) the device directly, as libfuse does for root when fusermount3 is missing."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    options = (
        f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},default_permissions"
    ).encode()
    flags = 1 | 2 | 4  # MS_RDONLY | MS_NOSUID | MS_NODEV
    source = fsname.replace(",", "_").encode()
    if libc.mount(source, mountpoint.encode(), FS_TYPE.encode(), flags, options) != 0:
        os.close(fd)
        code = ctypes.get_errno()
        raise PrepError(f"Mounting at {mountpoint} failed: {os.strerror(code)}. {FUSE_INSTALL_HINT}")
    return fd


def mount_device(mountpoint: str, fsname: str) -> int:
    """Mount an empty FUSE filesystem at `mountpoint` and return the device descriptor that serves it."""
    problem = fuse_problem()
    if problem is not None:
        raise PrepError(f"Cannot mount: {problem}")
    if shutil.which("fusermount3") is not None:
        return _mount_with_fusermount(mountpoint, fsname)
    return _mount_as_root(mountpoint, fsname)


def unmount_if_left_dead(mountpoint: str) -> int:
    """Start a watcher that unmounts the mount at `mountpoint` if its server ends without unmounting it
    (SIGKILL, the OOM killer, a closed terminal), so no "Transport endpoint is not connected" is left.

    Returns a descriptor for the server to hold while it serves: when every copy of it is closed,
    however the server ended, the watcher wakes, unmounts (lazily) a mount of ours still at
    `mountpoint` whose server is gone, and exits. It holds nothing else open (not the FUSE device,
    whose last copy closing is what tells the kernel the server is gone, nor the folder it was started
    in), and it is in a session of its own, so the signals of the server's terminal do not reach it.
    Call it before starting threads.
    """
    watch, held = os.pipe()
    pid = os.fork()
    if pid != 0:
        os.close(watch)
        return held
    try:  # the watcher
        os.setsid()
        os.chdir("/")
        watch = fcntl.fcntl(watch, fcntl.F_DUPFD, 3)  # above the standard streams, replaced next
        null = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(null, stream)
        os.closerange(3, watch)
        os.closerange(watch + 1, os.sysconf("SC_OPEN_MAX"))
        while os.read(watch, 1):
            pass
        if mounted_here(mountpoint) == FS_TYPE and server_gone(mountpoint):
            unmount(mountpoint, lazy=True)
    finally:
        os._exit(0)


def unmount(mountpoint: str, lazy: bool = False) -> str | None:
    """Unmount a FUSE mount (detach it now and finish when its files close, if `lazy`).

    Returns None on success, else why it failed. Uses fusermount3, else umount, else (as root, the
    twin of `_mount_as_root`) umount2(2) itself.
    """
    commands = {
        "fusermount3": ["fusermount3", "-u", *(["-z"] if lazy else []), mountpoint],
        "umount": ["umount", *(["-l"] if lazy else []), mountpoint],
    }
    for tool, command in commands.items():
        if shutil.which(tool) is not None:
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                return None
            return (result.stderr or result.stdout).strip() or f"{tool} exited with {result.returncode}"
    if os.geteuid() != 0:
        raise PrepError(f"Neither fusermount3 nor umount is installed. {FUSE_INSTALL_HINT}")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.umount2(mountpoint.encode(), 2 if lazy else 0) != 0:  # 2: MNT_DETACH
        return os.strerror(ctypes.get_errno())
    return None
