"""A cluster of free 127.0.0.1 ports, for running a job on this machine.

    cluster = make_local_cluster(JobShape(2, num_ps=1, has_chief=True))
    cluster.addresses("worker")        # ('127.0.0.1:40313', '127.0.0.1:35501')

`make_local_cluster` takes candidates from `portpicker`, skips any already
handed out in this cluster, and keeps a port only if it can bind it on
127.0.0.1 itself (no `SO_REUSEADDR`), holding every chosen port bound until
all are chosen. Between that check and a task's server binding the port,
another process can still take it; a task that loses that race fails at
start-up, and `--restarts` relaunches the job on fresh ports. Jobs that run
in a private network namespace (`tfdist.launch.isolation`) cannot lose it:
nothing else binds ports there.

The addresses say 127.0.0.1, but TensorFlow's server binds its port on
every interface; see `isolation` for what keeps it private.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import socket

import portpicker  # type: ignore[import-untyped]

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job

__all__ = ["LOCAL_HOST", "free_local_address", "make_local_cluster"]

#: The host in every address of a local cluster.
LOCAL_HOST = "127.0.0.1"

# Candidate ports tried per port before giving up.
_MAX_PORT_ATTEMPTS = 50


def make_local_cluster(shape: job.JobShape) -> spec.ClusterSpec:
    """Returns a cluster of `shape` whose addresses are free 127.0.0.1 ports.

    Every port is distinct, was free when chosen (this function bound it on
    127.0.0.1 itself, without `SO_REUSEADDR`), and is released again before
    returning, for the task to bind. See the module docstring for the race
    this cannot close.

    Args:
      shape: The job's tasks.

    Returns:
      A `ClusterSpec` with addresses `127.0.0.1:<port>`, in `shape.tasks()`
      order.

    Raises:
      TypeError: If `shape` is not a `JobShape`.
      LauncherError: If no free port can be found.

    Example:
      >>> cluster = make_local_cluster(JobShape(2))
      >>> [t.name for t in cluster.tasks()]
      ['worker:0', 'worker:1']
    """
    if not isinstance(shape, job.JobShape):
        raise TypeError(
            f"shape must be a JobShape; received shape={shape!r} of type "
            f"{type(shape).__name__}. Pass e.g. JobShape(2, num_ps=1, "
            "has_chief=True)."
        )
    ports = _pick_free_ports(shape.num_tasks)
    return shape.cluster_spec([f"{LOCAL_HOST}:{port}" for port in ports])


def free_local_address() -> str:
    """A `127.0.0.1:port` address whose port was free just now.

    Raises:
      LauncherError: If no free port is found.
    """
    return f"{LOCAL_HOST}:{_pick_free_ports(1)[0]}"


def _pick_free_ports(count: int) -> tuple[int, ...]:
    """Returns `count` distinct ports, each bindable on 127.0.0.1 just now."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count):
            for _ in range(_MAX_PORT_ATTEMPTS):
                try:
                    port = portpicker.pick_unused_port()
                except portpicker.NoFreePortFoundError:
                    continue
                if port in ports:
                    continue
                sock = _bind_loopback(port)
                if sock is not None:
                    held.append(sock)
                    ports.append(port)
                    break
            else:
                raise errors.LauncherError(
                    f"found only {len(ports)} of the {count} free "
                    f"{LOCAL_HOST} ports needed after {_MAX_PORT_ATTEMPTS} "
                    "tries for the next; expected the ephemeral port range to "
                    "have room. Stop stale local clusters (`ss -ltnp`), or "
                    "run fewer tasks."
                )
    finally:
        for sock in held:
            sock.close()
    return tuple(ports)


def _bind_loopback(port: int) -> socket.socket | None:
    """Binds `port` on 127.0.0.1 (no address reuse); `None` if it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOCAL_HOST, port))
    except OSError:
        sock.close()
        return None
    return sock
