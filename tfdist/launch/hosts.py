"""The cluster of a job whose tasks run on real hosts (`--print-tf-config`).

    cluster = cluster_from_hosts(["10.0.0.1:2222", "10.0.0.2:2222"],
                                 JobShape(2))

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job

__all__ = ["cluster_from_hosts"]


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
