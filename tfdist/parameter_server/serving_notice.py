"""A ps task's SIGTERM, where the chief can see it: a file on the ps task's host.

    serving_notice.clear(config)           # a ps task, as it starts serving
    serving_notice.post(config)            # a ps task, on SIGTERM
    watch = serving_notice.Watch(config)   # the chief
    watch.poll()                           # "ps:1" once ps:1 has posted, else None

A parameter-server cluster runs no coordination service here, so nothing
carries a notice from a ps task to the chief. Yet a ps task stopped alone
(Kubernetes evicting its pod) must not go before the chief has saved: it
serves on after SIGTERM (`roles.serve`), and the chief must learn of the
notice to stop at a step and save (`tfdist.elastic.Elastic`). The ps task
writes a file in `NOTICE_DIR` of its own host, named for the job's cluster
and the task; the chief lists it with a `MatchingFiles` op placed on that
ps task, which runs in the ps process on its host: one remote op per ps
task per poll (2-3 ms measured on 127.0.0.1), no shared file system needed.

The file's name hashes the whole cluster spec (every address), so jobs on
one host, and attempts on fresh ports, do not see each other's. A ps task
removes its file when it starts serving (one left by a task killed
earlier) and when it exits.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from absl import logging

from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec

__all__ = ["NOTICE_DIR", "Watch", "clear", "path", "post"]

#: Where a ps task writes its notice, on its own host.
NOTICE_DIR = "/tmp"


def path(config: ClusterConfig, task: spec.TaskSpec) -> str:
    """The notice file of `task` in `config`'s cluster, on `task`'s host."""
    assert config.cluster is not None
    digest = hashlib.sha256(f"{config.cluster.to_dict()}|{task.name}".encode()).hexdigest()[:24]
    return os.path.join(NOTICE_DIR, f"tfdist-notice-{digest}")


def post(config: ClusterConfig) -> None:
    """Writes this task's notice file (a temporary file, then a rename).

    Raises:
      OSError: If `NOTICE_DIR` cannot be written.
    """
    assert config.task is not None
    target = path(config, config.task)
    # A fresh file of its own (O_EXCL, mode 0600), never a name someone else
    # may have placed in the shared directory; the rename replaces whatever
    # is at `target` (a link too) without following it.
    fd, scratch = tempfile.mkstemp(prefix=".tfdist-notice-", dir=NOTICE_DIR)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(scratch, target)
    except OSError:
        _remove(scratch)
        raise


def clear(config: ClusterConfig) -> None:
    """Removes this task's notice file, if any."""
    assert config.task is not None
    _remove(path(config, config.task))


def _remove(name: str) -> None:
    try:
        os.remove(name)
    except FileNotFoundError:
        pass
    except OSError as e:  # Another user's file in the shared directory.
        logging.warning("tfdist: cannot remove the notice file %s: %s", name, e)



class Watch:
    """The chief's view of its ps tasks' notices.

    Contract: call `poll` from one thread at a time (the chief's `fit`
    thread); each call runs one function with a remote op per ps task and
    blocks until they answer.

    Args:
      config: The chief's cluster config.
    """

    def __init__(self, config: ClusterConfig) -> None:
        import tensorflow as tf  # Only the chief's poll needs TF.

        assert config.cluster is not None
        self._tasks = [t for t in config.cluster.tasks() if t.task_type == "ps"]
        # An argument, not a constant: Grappler folds a MatchingFiles of a
        # constant pattern at trace time (the op is marked stateless).
        self._patterns = tf.constant([path(config, t) for t in self._tasks])
        devices = [f"/job:ps/replica:0/task:{t.task_id}/device:CPU:0" for t in self._tasks]

        @tf.function(autograph=False)
        def found(patterns: Any) -> Any:
            sizes = []
            for index, device in enumerate(devices):
                with tf.device(device):
                    sizes.append(tf.size(tf.io.matching_files(patterns[index])))
            return tf.stack(sizes)

        self._found = found
        self._error = tf.errors.OpError

    def poll(self) -> str | None:
        """The first ps task that has posted a notice, or None (also when one cannot be reached)."""
        try:
            sizes = self._found(self._patterns).numpy()
        except self._error:
            return None  # An unreachable ps task fails the steps, with its name.
        for task, size in zip(self._tasks, sizes):
            if size:
                return task.name
        return None
