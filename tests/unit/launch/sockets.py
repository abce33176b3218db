"""Which TCP ports are listening, and where, as /proc/net/tcp{,6} say.

`/proc/net/tcp` and `/proc/net/tcp6` list the sockets of the reader's
network namespace; `/proc/<pid>/net/...` those of process `pid`'s. A
socket listening on the all-zero address (`0.0.0.0` or `::`, shown by `ss`
as `*:PORT`) accepts connections on every interface of its namespace.
"""

from __future__ import annotations

import dataclasses
import os

# /proc/net/tcp's `st` column for a listening socket (TCP_LISTEN).
_LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class ListeningSocket:
    """One listening TCP socket: local address (hex, as /proc has it), inode."""

    address_hex: str
    port: int
    inode: int

    @property
    def is_wildcard(self) -> bool:
        """Whether it listens on every interface (0.0.0.0 or ::)."""
        return set(self.address_hex) == {"0"}


def listening(pid: int | str = "self") -> list[ListeningSocket]:
    """The listening TCP sockets in process `pid`'s network namespace."""
    sockets = []
    for name in ("tcp", "tcp6"):
        path = f"/proc/{pid}/net/{name}"
        if not os.path.exists(path):  # No IPv6 in this kernel.
            continue
        with open(path) as f:
            next(f)  # The header.
            for line in f:
                fields = line.split()
                address_hex, port_hex = fields[1].split(":")
                if fields[3] == _LISTEN:
                    sockets.append(
                        ListeningSocket(
                            address_hex, int(port_hex, 16), int(fields[9])
                        )
                    )
    return sockets


def interfaces(pid: int | str = "self") -> set[str]:
    """The network interfaces of process `pid`'s network namespace."""
    with open(f"/proc/{pid}/net/dev") as f:
        return {line.split(":")[0].strip() for line in list(f)[2:]}


def network_namespace(pid: int | str = "self") -> str:
    """The id of process `pid`'s network namespace, as `net:[4026531840]`."""
    return os.readlink(f"/proc/{pid}/ns/net")


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` has open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # Closed meanwhile.
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes
