"""The state of the last step, kept in memory, and saved by the tasks that survive a lost peer.

    last = LastStep.for_state(variables, strategy)  # None where it cannot hold
    last.keep(position)                            # after every step (may skip)
    last.save(state, task_name)                    # after a peer's loss

Under data parallelism every task holds the whole training state: its
replicas of every variable are equal after each step. When a peer dies,
the survivors' `fit` raises (`WorkerUnavailableError`) in the step that
needed the dead peer; the state each survivor held at the end of its last
step is a committed state in all but name. TensorFlow cannot re-form a
collective group inside a process, so the survivors must restart; each one
writes that state (`TrainingState.write_survivor`), and the next attempt
resumes from the newest state any survivor or commit left: training loses
only the step in flight, not the steps since the last commit (Horovod
Elastic's in-memory commit, with the restart TensorFlow requires).

Why a copy at step ends and not the variables as they are when the
error comes: a step that fails may have updated some state before the
collective that failed (a layer's own counter, a seed generator's state),
and two survivors may have got one step apart (a peer that died after
sending its last collective's data to one of them but not the other). The
copy is one function call that reads every variable's first local replica
into host memory: on a CPU TensorFlow then copies a variable's buffer at
its next update only while the value read is held (copy on write), so a
kept step costs one extra copy of the state; from an accelerator the read
is the copy (device to host), and device memory holds one state as before
(a GPU path not run here: no GPU). Where the survivors are one step apart,
the newest state wins at the restart; both are states of the same
training run.

What it costs, and how often: the call's cost grows with the number of
variables, not the step (0.25 ms for the 14 variables of a 77k-weight MLP
and its momentum on this 2-core machine; the copy about as much again), so
`keep` spends at most `COST_SHARE` of the time on it: after a keep that
took t seconds it skips the step ends of the next t / COST_SHARE seconds.
A step of 25 ms or more is then kept every time; a 1.5 ms step every ~17.
A loss costs the steps since the last keep, which the restart trains again.

Holds only for tfdist's `MultiWorkerMirroredStrategy` on several tasks and
a state whose every variable is mirrored (written alike on every replica):
a variable synchronized on read (summed over replicas when read) would
need a collective to read, which a survivor cannot run. `for_state` returns
None otherwise (a mesh splits variables over tasks; a parameter-server job
keeps them on its ps tasks).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist.elastic import training_state

__all__ = ["COST_SHARE", "LastStep", "replicates_state_over_tasks"]

#: The share of the training time `LastStep.keep` may take (its function
#: call; the copy it causes costs about as much again). 1.0 keeps every step.
COST_SHARE = 0.01


class LastStep:
    """One task's copy of the training state at its last step end.

    Contract: `keep` from the thread that runs `fit`, after each step
    (never during one; it keeps that step or skips it, `COST_SHARE`);
    `save` once, after a step failed for a lost peer, from the same
    thread; it runs no collective. Before the first `keep`, `save` writes
    nothing.

    Args:
      variables: Every variable the training state checkpoints (Keras 3
        variables or `tf.Variable`s, distributed or not), in any order.
      strategy: The strategy they were made under.
    """

    def __init__(self, variables: Sequence[Any], strategy: tf.distribute.Strategy) -> None:
        self._replicas = [
            tuple(strategy.experimental_local_results(v)) for v in map(_tf_variable, variables)
        ]
        firsts = [replicas[0] for replicas in self._replicas]

        def read() -> list[tf.Tensor]:
            values = []
            for variable in firsts:
                # In host memory: on a CPU the same buffer (copied on write),
                # from an accelerator a copy, so device memory holds one state.
                with tf.device(_host_of(variable.device)):
                    values.append(tf.identity(variable.read_value()))
            return values

        self._read = tf.function(read, autograph=False)
        self._read()  # Traced here: the first `keep` would otherwise pause for as long, times 100.
        self._values: list[tf.Tensor] | None = None
        self._position: training_state.Position | None = None
        self._next_keep_s = 0.0  # time.monotonic() from which the next step end is kept.

    @classmethod
    def for_state(cls, variables: Sequence[Any], strategy: Any) -> LastStep | None:
        """A `LastStep` for `variables` if every task holds them whole and mirrored, else None."""
        if not replicates_state_over_tasks(strategy):
            return None
        for variable in map(_tf_variable, variables):
            if variable.synchronization == tf.VariableSynchronization.ON_READ:
                logging.info(
                    "tfdist.elastic: %s is synchronized on read; a lost peer's "
                    "survivors resume from the last commit.", variable.name,
                )
                return None
        return cls(variables, strategy)

    @property
    def position(self) -> training_state.Position | None:
        """The position of the state kept, or None before the first `keep`."""
        return self._position

    def keep(self, position: training_state.Position) -> bool:
        """Takes the current values (the step has ended) as the state at `position`, unless too soon.

        Returns:
          Whether it kept them: False within `COST_SHARE`'s pause after the
          last keep (the state kept is still the earlier one).
        """
        started = time.monotonic()
        if started < self._next_keep_s:
            return False
        self._values = self._read()
        self._position = position
        ended = time.monotonic()
        self._next_keep_s = ended + (ended - started) * (1.0 / COST_SHARE - 1.0)
        return True

    def save(self, state: training_state.TrainingState, task: str) -> training_state.Position | None:
        """Writes the state kept as this task's survivor state; its position, or None if none kept.

        Puts the kept values back into every local replica first (the failed
        step may have changed some), then writes them with the state's
        usual checkpoint. Blocks until written.
        """
        if self._values is None or self._position is None:
            return None
        started = time.monotonic()
        for replicas, value in zip(self._replicas, self._values):
            for replica in replicas:
                replica.assign(value)
        state.write_survivor(task, self._position)
        logging.warning(
            "tfdist.elastic: a peer was lost; this task (%s) saved its state of "
            "epoch %d, step %d in %.2f s: the restart resumes there.",
            task, self._position.epoch, self._position.step, time.monotonic() - started,
        )
        return self._position


def _host_of(device: str) -> str:
    """The CPU of the task that holds `device` (a full device name, or empty: this process's)."""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()


def _tf_variable(variable: Any) -> Any:
    """The `tf.Variable` of a Keras 3 variable (its `value`), or `variable` itself."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def replicates_state_over_tasks(strategy: Any) -> bool:
    """Whether `strategy` is tfdist's multi-worker data parallelism on several tasks."""
    from tfdist.multi_worker import strategy as multi_worker  # Imports TF's strategies.

    if not isinstance(strategy, multi_worker.MultiWorkerMirroredStrategy):
        return False
    cluster = strategy.cluster_config.cluster
    return cluster is not None and cluster.num_workers > 1
