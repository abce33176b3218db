"""Creates and enters a private network namespace (Linux); run as a script.

    python -I -S _netns.py create
    python -I -S _netns.py enter NET_FD USER_FD PROGRAM -- ARGV...

`create` calls unshare(CLONE_NEWNET); where that needs a capability the
process lacks (not root), it calls unshare(CLONE_NEWUSER | CLONE_NEWNET)
instead and maps only its own uid and gid. It then brings the new
namespace's loopback interface up, prints `ready net` or `ready user+net`,
and waits for EOF on stdin, so that its parent can open
/proc/<pid>/ns/{net,user} (which keep the namespaces alive after this
process exits). On failure it prints one line, `error: <what failed>`, and
exits 1.

`enter` joins the user namespace behind USER_FD (-1: none) and then the
network namespace behind NET_FD, closes both, and replaces itself with
PROGRAM (same process, so same pid and process group), whose argv is ARGV.
If that fails it writes `tfdist-launch: ...` to stderr and exits 126 or
127, as a shell would.

Run with `python -I -S`: it imports only the standard library, runs
single-threaded (setns into a user namespace requires it) and starts in
~40 ms. Only tfdist.launch.isolation runs it; `_preload_server.py` loads
it to call `join` in the tasks it forks.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys

# <sched.h> and <linux/sockios.h>, <net/if.h>.
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
# struct ifreq: the interface name, ifr_flags, and the rest of its 40 bytes.
IFREQ_FORMAT = "16sH22x"

_libc = ctypes.CDLL(None, use_errno=True)


def _call(what: str, function: str, *args: int) -> None:
    """Calls libc's `function(*args)`; OSError "<what>: <strerror>" if < 0."""
    if getattr(_libc, function)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise OSError(e.errno, f"writing {path}: {e.strerror}") from e


def _bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(IFREQ_FORMAT, b"lo", 0)
        _, flags = struct.unpack(
            IFREQ_FORMAT, fcntl.ioctl(sock, SIOCGIFFLAGS, request)
        )
        fcntl.ioctl(
            sock, SIOCSIFFLAGS, struct.pack(IFREQ_FORMAT, b"lo", flags | IFF_UP)
        )


def create() -> int:
    """Creates the namespace(s), reports them, waits for EOF on stdin."""
    try:
        try:
            _call("unshare(CLONE_NEWNET)", "unshare", CLONE_NEWNET)
            kinds = "net"
        except OSError as e:
            if e.errno != errno.EPERM:
                raise
            uid, gid = os.geteuid(), os.getegid()
            _call(
                "unshare(CLONE_NEWUSER | CLONE_NEWNET)",
                "unshare",
                CLONE_NEWUSER | CLONE_NEWNET,
            )
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            kinds = "user+net"
        _bring_loopback_up()
    except OSError as e:  # e.strerror says what failed and why.
        print(f"error: {e.strerror or e}", flush=True)
        return 1
    print(f"ready {kinds}", flush=True)
    sys.stdin.read()
    return 0


def join(net_fd: int, user_fd: int) -> bool:
    """Joins the user namespace behind `user_fd` (-1: none), then the network
    namespace behind `net_fd`, and closes both.

    The calling process must be single-threaded (setns into a user namespace
    requires it). On failure writes `tfdist-launch: ...` to stderr and
    returns False.
    """
    try:
        if user_fd >= 0:
            _call("setns(CLONE_NEWUSER)", "setns", user_fd, CLONE_NEWUSER)
            os.close(user_fd)
        _call("setns(CLONE_NEWNET)", "setns", net_fd, CLONE_NEWNET)
        os.close(net_fd)
    except OSError as e:
        sys.stderr.write(
            f"tfdist-launch: cannot enter the job's network namespace: "
            f"{e.strerror or e}\n"
        )
        return False
    return True


def enter(net_fd: int, user_fd: int, program: str, argv: list[str]) -> int:
    """Joins the namespaces and execs `program`; returns only on failure."""
    if not join(net_fd, user_fd):
        return 126
    try:
        os.execv(program, argv)
    except OSError as e:
        sys.stderr.write(f"tfdist-launch: cannot run {program}: {e.strerror}\n")
        return 127 if e.errno == errno.ENOENT else 126
    return 126  # Not reached: execv returns only by raising.


def main(args: list[str]) -> int:
    if args[:1] == ["create"]:
        return create()
    if args[:1] == ["enter"] and len(args) >= 6 and args[4] == "--":
        return enter(int(args[1]), int(args[2]), args[3], args[5:])
    sys.stderr.write(f"usage: see the docstring of {__file__}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
