"""Which path a multi-worker job's gradient buckets take between workers.

    group = transport.host_group(config, "auto", timeout_s=300)
    # None: TF's collective ops over gRPC; else a host_memory.HostGroup.

- "grpc": TF's collective ops (any cluster).
- "host_memory": `tfdist/collectives/host_memory.py`, through /dev/shm
  (every chief and worker on one host and sharing its /dev/shm).
- "auto" (the default): "host_memory" where it works, else "grpc".

Workers share memory only if they run on one host *and* see the same
/dev/shm (two containers on one host may each have their own), which
addresses alone do not tell. So where the addresses name one host, every
task makes its group (writing a random token to a file of it), publishes
its token in TF's coordination service, and reads its peers': the group
is used only if each peer's token is in its file here. The check gives
every task the same answer (sharing is mutual and transitive), so no task
takes shared memory while another takes gRPC.
"""

from __future__ import annotations

import glob
import hashlib
import os

from absl import logging

from tfdist import errors
from tfdist._internal import coordination
from tfdist.cluster import ClusterConfig
from tfdist.collectives import host_memory

__all__ = ["TRANSPORTS", "check_transport", "host_group", "remove_stale_files"]

#: The values of `MultiWorkerMirroredStrategy(transport=...)`.
TRANSPORTS = ("auto", "grpc", "host_memory")

#: Groups this process has made (or tried to): one per strategy, in the same order on every worker.
_made_groups = 0

#: A token no group writes: published by a task that could not make its group.
_NO_TOKEN = "-"


def check_transport(transport: str, config: ClusterConfig) -> None:
    """Raises ConfigError for an unknown transport, or "host_memory" on several hosts.

    Call before TF's runtime starts: the error then costs no start-up.
    """
    if transport not in TRANSPORTS:
        raise errors.ConfigError(
            f"unknown transport; received transport={transport!r}. Use one of "
            f"{', '.join(map(repr, TRANSPORTS))}."
        )
    hosts = _hosts(config)
    if transport == "host_memory" and len(hosts) > 1:
        raise errors.ConfigError(
            f"transport='host_memory' needs every chief and worker on one host; "
            f"received hosts {hosts}. Use transport='auto' (or 'grpc') for a "
            "cluster of several hosts."
        )


def remove_stale_files(config: ClusterConfig, transport: str) -> None:
    """In the first training task: removes files a crashed job on these addresses left in /dev/shm.

    Call before TF's runtime starts and after this task's port was found
    free (no live job has these addresses), before this process made a
    group: peers make theirs only once every task has started.
    """
    assert config.cluster is not None and config.task is not None
    if transport == "grpc" or _made_groups or _training_tasks(config)[0] != config.task:
        return
    for path in glob.glob(os.path.join(host_memory.DIRECTORY, f"tfdist-{_fingerprint(config)}-*")):
        try:
            os.remove(path)
        except OSError:  # Another user's, or gone.
            pass


def host_group(
    config: ClusterConfig, transport: str, *, timeout_s: float
) -> host_memory.HostGroup | None:
    """This task's host-memory group, or None where buckets take gRPC.

    Every chief and worker must call it, after TF's runtime has started
    (it uses the coordination service), with the same `transport`; each
    blocks until its peers have published their tokens (at most
    `timeout_s` per peer). Every task returns a group, or every task None.

    Raises:
      ConfigError: For `transport="host_memory"` when the workers do not
        share /dev/shm (tasks in separate containers, or no /dev/shm).
    """
    assert config.cluster is not None and config.task is not None
    if transport == "grpc" or (transport == "auto" and len(_hosts(config)) > 1):
        return None
    global _made_groups
    _made_groups += 1
    tasks = _training_tasks(config)
    rank = tasks.index(config.task)
    name = f"{_fingerprint(config)}-{_made_groups}"
    group = None
    if host_memory.available():
        try:
            group = host_memory.HostGroup(
                name, rank, len(tasks), timeout_s=timeout_s, peer_names=[t.name for t in tasks]
            )
        except OSError as e:
            logging.warning("tfdist: cannot make a host-memory group in %s (%s).", host_memory.DIRECTORY, e)
    prefix = f"tfdist/host_memory/{name}"
    coordination.set_key(f"{prefix}/{rank}", group.token if group is not None else _NO_TOKEN)
    tokens = {
        r: coordination.get_key(f"{prefix}/{r}", timeout_s=timeout_s)
        for r in range(len(tasks))
        if r != rank
    }
    if group is not None and group.shares_memory_with(tokens):
        logging.info("tfdist: gradients cross the %d workers of this host through shared memory.", len(tasks))
        return group
    if group is not None:
        group.close()
    if transport == "host_memory":
        raise errors.ConfigError(
            f"transport='host_memory' needs every chief and worker to share "
            f"{host_memory.DIRECTORY}; {config.task.name} does not see its peers' "
            "files there (tasks in separate containers or namespaces?). Use "
            "transport='auto' or 'grpc', or give the tasks one /dev/shm."
        )
    logging.info("tfdist: the workers do not share %s; gradients cross them over gRPC.", host_memory.DIRECTORY)
    return None


def _fingerprint(config: ClusterConfig) -> str:
    """The same short hash of the cluster in every task: its groups' files start with it."""
    assert config.cluster is not None
    return hashlib.sha256(f"{config.cluster.to_dict()}".encode()).hexdigest()[:16]


def _training_tasks(config: ClusterConfig) -> list:
    assert config.cluster is not None
    return [t for t in config.cluster.tasks() if t.task_type in ("chief", "worker")]


def _hosts(config: ClusterConfig) -> list[str]:
    if config.cluster is None:
        return []
    addresses = [config.cluster.address(t) for t in _training_tasks(config)]
    return sorted({address.rsplit(":", 1)[0] for address in addresses})
