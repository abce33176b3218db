"""Start-up of a multi-task job, bounded: coordination timeouts, own port, missing peers.

Used by every strategy whose tasks form a TF cluster, before the strategy
starts TF's runtime:

1. `configure_coordination` sets TF's coordination service's register,
   heartbeat and shutdown-barrier timeouts from `timeout_s` (TF's own
   configuration would set none: a task that never starts would be waited
   for forever, observed with TF 2.21);
2. `check_own_port` refuses a second process started with this task's
   address;
3. after a failed start, `unreachable_peers` names the tasks that do not
   accept connections and `start_up_error` says so;
4. `report_exposure` warns once where this task's server, on a cluster of
   this host, would listen on the host's network (run outside tfdist's
   launcher, which isolates local jobs).
"""

from __future__ import annotations

import errno
import socket
import warnings
from collections.abc import Sequence

from tfdist import errors
from tfdist._internal import coordination
from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec as spec_lib
from tfdist.launch import isolation

__all__ = [
    "check_own_port",
    "configure_coordination",
    "device_name",
    "report_exposure",
    "start_up_error",
    "unreachable_peers",
]

#: Seconds a TCP connect to a peer may take in `unreachable_peers`.
_CONNECT_TIMEOUT_S = 2.0


def device_name(task: spec_lib.TaskSpec) -> str:
    """TF's name of `task`'s host: "/job:worker/replica:0/task:1"."""
    return f"/job:{task.task_type}/replica:0/task:{task.task_id}"


def configure_coordination(
    config: ClusterConfig, timeout_s: float, *, jobs: Sequence[str] = ("chief", "worker")
) -> None:
    """Configures TF's coordination service with bounds from `timeout_s`.

    Must run before the TF strategy is built (which then keeps this
    configuration). Registration and the shutdown barrier wait at most
    `timeout_s`; a silent task is declared dead by TF after
    `2 * timeout_s` (tfdist's watchdog reports it sooner).

    Args:
      config: The validated cluster, with this task.
      timeout_s: The strategy's bound, seconds.
      jobs: The jobs whose tasks take part (in this order; the first
        present job's task 0 leads the service).
    """
    assert config.cluster is not None
    present = [
        (job, len(config.cluster.addresses(job)))
        for job in jobs
        if config.cluster.addresses(job)
    ]
    millis = int(timeout_s * 1000)
    coordination.configure_coordination_service(
        present,
        f"/job:{present[0][0]}/replica:0/task:0",
        register_timeout_ms=millis,
        heartbeat_timeout_ms=2 * millis,
        shutdown_barrier_timeout_ms=millis,
    )


def check_own_port(config: ClusterConfig) -> None:
    """Raises ClusterConfigError if this task's port is already taken.

    Two processes started with the same task index (or a stale process
    still holding the port) would otherwise fail inside TF's gRPC server
    start or wait for each other. Hosts that are not an address of this
    machine are not checked.
    """
    if config.cluster is None or config.task is None:
        return
    address = spec_lib.Address.parse(config.cluster.address(config.task))
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As TF's gRPC server binds: connections of a killed predecessor
        # left in TIME_WAIT do not hold the port; a listening socket does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address.host, address.port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # Not a local address, or no permission: TF decides.
            raise errors.ClusterConfigError(
                f"task {config.task.name}'s address {address} is already in "
                "use: another process was started with the same task index, "
                "or a previous run still holds the port. Give every process "
                "its own task.index in TF_CONFIG (tfdist-launch does), or stop "
                "the old process.",
                field="task.index",
            ) from e


def report_exposure(config: ClusterConfig, strategy_name: str) -> None:
    """Warns once per process if this task serves a local cluster on the host's network.

    Call before the strategy starts TF's server for this task. A cluster
    whose every address is on this host could run in a private network
    namespace (as `tfdist.launch` runs it); started any other way (TF_CONFIG
    set by hand, servers started with `tf.distribute.Server`), its servers
    listen on every interface of the host without authentication: a
    `RuntimeWarning` says so (`isolation.report_local_exposure`).
    """
    if config.cluster is None or config.task is None:
        return
    isolation.report_local_exposure(
        [config.cluster.address(task) for task in config.cluster.tasks()], what=f"{strategy_name} (task {config.task.name})", report=_warn)


def _warn(notice: str) -> None:
    # stacklevel 6: the strategy's caller (through report_exposure,
    # report_local_exposure and its once-per-process guard, the strategy).
    warnings.warn(notice, RuntimeWarning, stacklevel=6)


def unreachable_peers(
    config: ClusterConfig, *, jobs: Sequence[str] = ("chief", "worker")
) -> list[str]:
    """`"worker:1 (host:port)"` for each other task of `jobs` that refuses TCP connections."""
    assert config.cluster is not None
    names = []
    for task in config.cluster.tasks():
        if task == config.task or task.task_type not in jobs:
            continue
        address = spec_lib.Address.parse(config.cluster.address(task))
        try:
            with socket.create_connection(
                (address.host, address.port), timeout=_CONNECT_TIMEOUT_S
            ):
                pass
        except OSError:
            names.append(f"{task.name} ({address})")
    return names


def start_up_error(
    config: ClusterConfig,
    timeout_s: float,
    cause: Exception,
    *,
    jobs: Sequence[str] = ("chief", "worker"),
) -> errors.WorkerUnavailableError:
    """The error for a cluster that did not start within `timeout_s`."""
    missing = unreachable_peers(config, jobs=jobs)
    text = str(cause).strip()
    first_line = text.splitlines()[0] if text else ""
    if missing:
        found = (
            f"{', '.join(missing)} did not accept connections (not started, "
            "or exited during start-up)"
        )
    else:
        found = (
            "every task accepts connections, but not all of them joined (a "
            "task may have a different TF_CONFIG cluster)"
        )
    return errors.WorkerUnavailableError(
        f"the cluster did not start within timeout_s={timeout_s:g} s: "
        f"{found}. Start every task of the cluster, each with the same "
        "TF_CONFIG cluster and its own task (tfdist-launch does this), or "
        f"raise timeout_s. TensorFlow reported: {type(cause).__name__}: "
        f"{first_line}",
        task=missing[0].split(" ")[0] if missing else None,
    )
