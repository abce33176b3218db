"""The cluster of a job whose tasks run on real hosts.

    cluster = cluster_from_hosts(["10.0.0.1:2222", "10.0.0.2:2222"],
                                 JobShape(2))                 # --print-tf-config
    hosts = read_hosts_file("hosts.txt")                     # --hosts-file
    placement = place(hosts, JobShape(4), port=2222)         # who runs where

A hosts file lists the machines a job may use, one per line, as MPI and
Horovod hostfiles do: `HOST slots=N` or `HOST:N` (N tasks on HOST; N is 1
when left out), `#` starting a comment. Tasks fill the hosts in the file's
order, chief first, then the workers, the ps tasks and the evaluator; the
k-th task on a host listens on `port + k`.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job

__all__ = [
    "DEFAULT_PORT",
    "Host",
    "HostsFile",
    "Placement",
    "cluster_from_hosts",
    "parse_hosts",
    "place",
    "read_hosts_file",
    "worker_slots",
]

#: The first task's port on each host, unless given (TensorFlow's and
#: Kubeflow's usual port).
DEFAULT_PORT = 2222

_SLOTS = re.compile(r"^(?P<host>\S+?)(?::(?P<colon>\d+))?(?:\s+slots=(?P<slots>\d+))?$")


@dataclasses.dataclass(frozen=True)
class Host:
    """A machine of a hosts file and how many tasks it may run."""

    name: str
    slots: int


def parse_hosts(text: str, source: str = "<hosts>") -> tuple[Host, ...]:
    """Returns the hosts `text` lists, in its order (see the module docstring).

    Args:
      text: The hosts file's contents.
      source: What to call it in errors (the file's path).

    Raises:
      LauncherError: If a line is not `HOST [slots=N]` or `HOST:N` with
        N >= 1, a host is not a valid host name or address, or a host is
        listed twice; the message names the line.
    """
    hosts: dict[str, Host] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _SLOTS.match(line)
        where = f"{source}, line {number}: {line!r}"
        if match is None or (match["colon"] and match["slots"]):
            raise errors.LauncherError(
                f"{where} is not a host entry; expected 'HOST slots=N' or "
                "'HOST:N' (N tasks on HOST), as in '10.0.0.1 slots=4'."
            )
        slots = int(match["colon"] or match["slots"] or 1)
        name = match["host"]
        if name.startswith("-"):  # A remote shell would take it for an option.
            raise errors.LauncherError(
                f"{where}: host {name!r} starts with '-'; expected a host name "
                "or address (RFC 1123 names start with a letter or digit)."
            )
        try:
            spec.Address(name, 1)
        except errors.ClusterConfigError as e:
            raise errors.LauncherError(f"{where}: {e}") from e
        if slots < 1:
            raise errors.LauncherError(
                f"{where} grants {slots} slots; expected N >= 1. Remove the "
                "line to take the host out of the job."
            )
        if name.lower() in hosts:
            raise errors.LauncherError(
                f"{where} lists {name!r} a second time; expected each host "
                "once. Add its slots up on one line."
            )
        hosts[name.lower()] = Host(name, slots)
    return tuple(hosts.values())


def read_hosts_file(path: str) -> tuple[Host, ...]:
    """Returns the hosts the file at `path` lists.

    Raises:
      LauncherError: If it cannot be read, or as `parse_hosts`.
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise errors.LauncherError(
            f"cannot read the hosts file {path!r}: {e.strerror or e}. Pass a "
            "readable file with one 'HOST slots=N' per line."
        ) from e
    return parse_hosts(text, path)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each task of a job runs: `hosts[i]` runs `shape.tasks()[i]`."""

    shape: job.JobShape
    hosts: tuple[str, ...]
    port: int

    @property
    def num_workers(self) -> int:
        return self.shape.num_workers

    def cluster(self) -> spec.ClusterSpec:
        """The cluster: the k-th task on a host listens on `port + k`."""
        on_host: dict[str, int] = {}
        addresses = []
        for host in self.hosts:
            k = on_host.get(host, 0)
            on_host[host] = k + 1
            addresses.append(str(spec.Address(host, self.port + k)))
        return self.shape.cluster_spec(addresses)

    def host_of(self, task: spec.TaskSpec) -> str:
        """The host `task` runs on."""
        return self.hosts[self.shape.tasks().index(task)]


def worker_slots(hosts: Sequence[Host], shape: job.JobShape, left_out: frozenset[str] = frozenset()) -> int:
    """How many workers `hosts` have room for beside `shape`'s other tasks (chief, ps, evaluator)."""
    slots = sum(h.slots for h in hosts if h.name not in left_out)
    return max(0, slots - (shape.num_tasks - shape.num_workers))


def place(
    hosts: Sequence[Host],
    shape: job.JobShape,
    *,
    port: int,
    left_out: frozenset[str] = frozenset(),
) -> Placement:
    """Places `shape`'s tasks on `hosts`' slots, in the file's order.

    Args:
      hosts: The machines, as `read_hosts_file` returns them.
      shape: The job's tasks.
      port: The first task's port on each host.
      left_out: Hosts not to use (a task of theirs was lost).

    Raises:
      LauncherError: If the slots are too few for the tasks, or a port
        would pass 65535.
    """
    slots = [h.name for h in hosts if h.name not in left_out for _ in range(h.slots)]
    if len(slots) < shape.num_tasks:
        skipped = f" (leaving out {', '.join(sorted(left_out))})" if left_out else ""
        raise errors.LauncherError(
            f"the hosts{skipped} give {len(slots)} slot(s), fewer than the "
            f"{shape.num_tasks} task(s) the job needs "
            f"({', '.join(t.name for t in shape.tasks())}). Add hosts or "
            "slots, or run fewer tasks."
        )
    placement = Placement(shape, tuple(slots[: shape.num_tasks]), port)
    try:
        placement.cluster()
    except errors.ClusterConfigError as e:
        raise errors.LauncherError(
            f"--port {port} leaves no room for {shape.num_tasks} task(s) on "
            f"these hosts: {e} Pass a lower --port."
        ) from e
    return placement


class HostsFile:
    """A job's hosts file: re-read between attempts, watched during them.

    The job runs as many workers as the listed slots hold beside its other
    tasks, at most `workers.maximum`. A host whose task was lost
    (`leave_out`) is not used again until the file stops listing it (a
    cluster manager taking it out, to put it back once repaired).

    Contract: the launcher calls `refresh`, `workers`, `placement` and
    `leave_out` between attempts; during one, a `GrantWatcher`'s thread
    calls `grant` alone.

    Args:
      path: The hosts file.
      shape: The job's tasks, with the most workers it may run.
      port: The first task's port on each host.

    Raises:
      LauncherError: If the file cannot be read or is malformed.
    """

    def __init__(self, path: str, shape: job.JobShape, *, port: int) -> None:
        self.path = path
        self._shape = shape
        self._port = port
        self._left_out: frozenset[str] = frozenset()
        self.hosts = read_hosts_file(path)

    @property
    def left_out(self) -> frozenset[str]:
        """The hosts not used because a task of theirs was lost."""
        return self._left_out

    def refresh(self) -> None:
        """Re-reads the file; an unreadable, malformed or empty one leaves the last list."""
        hosts = self._read()
        if hosts is not None:
            self._list(hosts)

    def workers(self) -> int:
        """How many workers the listed hosts (less the left out) run: at most the shape's."""
        return min(worker_slots(self.hosts, self._shape, self._left_out), self._shape.num_workers)

    def placement(self, num_workers: int) -> Placement:
        """Where an attempt of `num_workers` workers runs (see `place`)."""
        shape = dataclasses.replace(self._shape, num_workers=num_workers)
        return place(self.hosts, shape, port=self._port, left_out=self._left_out)

    def leave_out(self, host: str) -> None:
        """Stops using `host` (a task of it was lost)."""
        self._left_out |= {host}

    def grant(self) -> tuple[str, ...] | None:
        """Where the tasks would run now (`Placement.hosts`), read afresh; `()` if nowhere.

        None if the file cannot be read or parsed, or lists no host (a file
        being rewritten in place: `>` empties it first).
        """
        hosts = self._read()
        if hosts is None:
            return None
        self._list(hosts)
        num_workers = self.workers()
        if num_workers < 1:
            return ()
        return self.placement(num_workers).hosts

    def _read(self) -> tuple[Host, ...] | None:
        try:
            hosts = read_hosts_file(self.path)
        except errors.LauncherError:
            return None
        return hosts or None

    def _list(self, hosts: tuple[Host, ...]) -> None:
        self.hosts = hosts
        self._left_out &= {h.name for h in hosts}


def cluster_from_hosts(
    hosts: Sequence[str], shape: job.JobShape
) -> spec.ClusterSpec:
    """Returns the cluster of a job of `shape` whose tasks run on `hosts`.

    Hosts are assigned in `shape.tasks()` order: the chief (if any), the
    workers, the ps tasks, then the evaluator (if any).

    Args:
      hosts: One `host:port` per task, such as `["10.0.0.1:2222", ...]`.
      shape: The job's tasks.

    Returns:
      The `ClusterSpec` listing `hosts` in their jobs.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If the number of hosts is not the number of tasks (the
        message gives both), an entry is not a valid `host:port`, or two
        entries are the same address.

    Example:
      >>> cluster_from_hosts(["a:1", "b:1", "c:1"],
      ...                    JobShape(2, has_chief=True)).to_dict()
      {'chief': ['a:1'], 'worker': ['b:1', 'c:1']}
    """
    if not isinstance(shape, job.JobShape):
        raise TypeError(
            f"shape must be a JobShape; received shape={shape!r} of type "
            f"{type(shape).__name__}."
        )
    tasks = shape.tasks()
    if isinstance(hosts, str) or not isinstance(hosts, Sequence):
        raise TypeError(
            f"hosts must be a sequence of 'host:port' str; received "
            f"hosts={hosts!r} of type {type(hosts).__name__}."
        )
    if len(hosts) != len(tasks):
        raise errors.LauncherError(
            f"hosts lists {len(hosts)} address(es) but the job has "
            f"{len(tasks)} task(s) ({', '.join(t.name for t in tasks)}); "
            "expected one host:port per task, in the order chief, workers, "
            "ps, evaluator. Add or remove hosts, or change the task counts."
        )
    seen: dict[tuple[str, int], int] = {}
    for index, text in enumerate(hosts):
        try:
            address = spec.Address.parse(text)
        except errors.ClusterConfigError as e:
            raise errors.LauncherError(
                f"hosts[{index}]={text!r} (for task {tasks[index].name}) is "
                f"not a valid host:port: {e}"
            ) from e
        key = (address.host.lower(), address.port)
        if key in seen:
            raise errors.LauncherError(
                f"hosts[{index}]={text!r} repeats hosts[{seen[key]}]; "
                "expected a distinct host:port per task. Give each task its "
                "own host or port."
            )
        seen[key] = index
    return shape.cluster_spec([str(h) for h in hosts])
