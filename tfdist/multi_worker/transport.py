"""Which path a multi-worker job's gradient buckets take between workers.

    group = transport.host_group(config, "auto", timeout_s=300)
    # None: TF's collective ops over gRPC; else a host_memory.HostGroup.

- "grpc": TF's collective ops (any cluster).
- "host_memory": `tfdist/collectives/host_memory.py`, through /dev/shm
  (every chief and worker on one host and sharing its /dev/shm).
- "auto" (the default): "host_memory" where it works, else "grpc".

Workers share memory only if they run on one host *and* see the same
/dev/shm (two containers on one host may each have their own), which
addresses alone do not tell. So where the addresses name one host, the
tasks agree through TF's coordination service, in three rounds:

1. the first task publishes a random run id, which names the group's
   files (a job on the same addresses, or in another network namespace
   over the same /dev/shm, never meets them);
2. every task makes its group (writing a random token to a file of it)
   and publishes the token;
3. every task publishes whether each peer's token is in its file here,
   and takes the group only if every task said yes.

Sharing is mutual and transitive, so the tasks' answers in round 3 agree
anyway; the round makes that hold where a task could not make its group
or read a token in time too. Before making its group, a task removes the
files of groups whose processes are all gone (`host_memory.remove_stale_groups`).
"""

from __future__ import annotations

import secrets
import time

from absl import logging

from tfdist import errors
from tfdist._internal import coordination
from tfdist.cluster import Address
from tfdist.cluster import ClusterConfig
from tfdist.collectives import host_memory

__all__ = ["TRANSPORTS", "check_transport", "host_group"]

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


def host_group(
    config: ClusterConfig, transport: str, *, timeout_s: float
) -> host_memory.HostGroup | None:
    """This task's host-memory group, or None where buckets take gRPC.

    Every chief and worker must call it, after TF's runtime has started
    (it uses the coordination service), with the same `transport`. It
    blocks until every peer has answered each round (a run id from the
    first task, the tokens, the verdicts), for at most `timeout_s` in all.
    Every task returns a group, or every task None, unless a peer stops
    answering within that bound (a job that then fails on its first step).

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
    peers = [r for r in range(len(tasks)) if r != rank]
    deadline = time.monotonic() + timeout_s
    keys = f"tfdist/host_memory/{_made_groups}"

    def get(key: str) -> str | None:
        return coordination.get_key(key, timeout_s=max(deadline - time.monotonic(), 0.001))

    # A name of this run's own: a job on the same addresses, or one in another
    # network namespace that shares this /dev/shm, never meets these files.
    if rank == 0:
        coordination.set_key(f"{keys}/run", secrets.token_hex(8))
    run = get(f"{keys}/run")
    group = _make_group(run, rank, tasks, timeout_s) if run is not None else None
    agreed = False
    try:
        coordination.set_key(f"{keys}/token/{rank}", group.token if group is not None else _NO_TOKEN)
        tokens = {r: get(f"{keys}/token/{r}") for r in peers}
        sees_all = group is not None and group.shares_memory_with(tokens)
        coordination.set_key(f"{keys}/verdict/{rank}", "1" if sees_all else "0")
        # Every task decides on every verdict: one that saw a token late still agrees.
        agreed = sees_all and all(get(f"{keys}/verdict/{r}") == "1" for r in peers)
    finally:
        if group is not None and not agreed:
            group.close()
    if agreed:
        logging.info("tfdist: gradients cross the %d workers of this host through shared memory.", len(tasks))
        return group
    if transport == "host_memory":
        raise errors.ConfigError(
            f"transport='host_memory' needs every chief and worker to share "
            f"{host_memory.DIRECTORY}; {config.task.name} and its peers do not all "
            "see each other's files there (tasks in separate containers or namespaces?). "
            "Use transport='auto' or 'grpc', or give the tasks one /dev/shm."
        )
    logging.info("tfdist: the workers do not share %s; gradients cross them over gRPC.", host_memory.DIRECTORY)
    return None


def _make_group(run: str, rank: int, tasks: list, timeout_s: float) -> host_memory.HostGroup | None:
    """This task's group of run `run`, or None (logged) where it cannot make one."""
    if not host_memory.available():
        return None
    try:
        host_memory.remove_stale_groups()  # What crashed jobs left: any whose processes are gone.
        return host_memory.HostGroup(
            run, rank, len(tasks), timeout_s=timeout_s, peer_names=[t.name for t in tasks]
        )
    except (OSError, errors.ConfigError) as e:
        logging.warning("tfdist: cannot make a host-memory group in %s (%s).", host_memory.DIRECTORY, e)
        return None


def _training_tasks(config: ClusterConfig) -> list:
    assert config.cluster is not None
    return [t for t in config.cluster.tasks() if t.task_type in ("chief", "worker")]


def _hosts(config: ClusterConfig) -> list[str]:
    if config.cluster is None:
        return []
    return sorted({Address.parse(config.cluster.address(t)).host for t in _training_tasks(config)})
