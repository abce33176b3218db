"""The training state `tfdist.elastic` commits and restores: weights, optimizer, position.

    state = TrainingState(model, "/shared/backup", is_writer=True)
    state.commit(Position(epoch=2, step=40, data_epoch=3))   # after a step
    state.restore()          # Position(...) in a new process, or None

Layout of `backup_dir` (the writer's; every task reads it)::

    backup_dir/latest                  "state-7": the committed state
    backup_dir/state-7/position.json   where training was
    backup_dir/state-7/checkpoint.*    tf.train.Checkpoint of the weights
                                       and the optimizer

    backup_dir/survivor-worker-1/      the state a task that survived a
                                       lost peer held (`write_survivor`)

A commit writes a new `state-<n>` directory, then replaces `latest` in one
rename, then deletes older states and every survivor's: a task killed in
the middle of a commit leaves the previous state committed. A survivor
writes its directory under a temporary name and renames it. The state
restored is the newest (most steps done) of the committed one and the
survivors', the committed one on a tie; every task reads the same files,
so every task picks the same. Only the writer (the chief) keeps
files; every other task writes the same checkpoint into a temporary
directory that is deleted at once, so that any collective a save runs
(reading a variable synchronized on read) is run by every task alike.

The checkpoint holds `model.variables` (the weights, trainable and not,
and under Keras 3 the random layers' seed states) and the optimizer (its
iterations and slots), not metrics, so it restores into the same model
built again, under any strategy and any number of workers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from tfdist import errors

__all__ = ["Position", "TrainingState", "variables"]

_LATEST = "latest"
_POSITION = "position.json"
_CHECKPOINT = "checkpoint"
_STATE_DIR = re.compile(r"state-(\d+)")
_SURVIVOR_PREFIX = "survivor-"


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training was when its state was committed.

    Attributes:
      epoch: Keras's epoch (0-based) training resumes in.
      step: Steps of `epoch` already trained (0: the epoch's start).
      data_epoch: The sharder's epoch of `epoch`'s pass when tfdist shards
        the input (`ShardOptions`), else None.
      steps_done: Training steps since the start of the job, all epochs.
    """

    epoch: int
    step: int
    data_epoch: int | None = None
    steps_done: int = 0


class TrainingState:
    """Commits and restores one model's training state in `backup_dir`.

    Contract: every training task builds one for the same model and calls
    `commit` at the same steps (commits may run collectives); `restore`
    before training, after the model and its optimizer are built. Only
    the task with `is_writer` writes `backup_dir`, which every task must
    be able to read (a shared filesystem across machines).

    Args:
      model: A compiled Keras model (Keras 3 or tf-keras).
      backup_dir: Directory of the committed state; created if missing.
      is_writer: Whether this task's commits are kept (the chief).
    """

    def __init__(self, model: Any, backup_dir: str, *, is_writer: bool) -> None:
        self._backup_dir = backup_dir
        self._is_writer = is_writer
        self._model = model

    def _checkpoint(self) -> tf.train.Checkpoint:
        # Made at each use: tf-keras builds a model without an input shape
        # in its first step, after `fit` has started.
        return tf.train.Checkpoint(
            variables=_variables(self._model), optimizer=self._model.optimizer
        )

    def commit(self, position: Position) -> None:
        """Saves the model, its optimizer and `position` as the latest state.

        Blocks until written. After an error, the previously committed
        state is still the latest.
        """
        if not self._is_writer:
            scratch = tempfile.mkdtemp(prefix="tfdist-elastic-")
            try:
                self._checkpoint().write(os.path.join(scratch, _CHECKPOINT))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        os.makedirs(self._backup_dir, exist_ok=True)
        states = self._states()
        name = f"state-{max(states, default=0) + 1}"
        directory = os.path.join(self._backup_dir, name)
        self._checkpoint().write(os.path.join(directory, _CHECKPOINT))
        with open(os.path.join(directory, _POSITION), "w") as f:
            json.dump(dataclasses.asdict(position), f)
        pending = os.path.join(self._backup_dir, f".{_LATEST}-{os.getpid()}")
        with open(pending, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pending, os.path.join(self._backup_dir, _LATEST))
        for number in states:
            shutil.rmtree(
                os.path.join(self._backup_dir, f"state-{number}"), ignore_errors=True
            )
        # Survivors' states are older now, and so is what a killed survivor's write left.
        for name in self._survivors(include_unfinished=True):
            shutil.rmtree(os.path.join(self._backup_dir, name), ignore_errors=True)

    def write_survivor(self, task: str, position: Position) -> None:
        """Saves the model's current state as the one `task` held when a peer was lost.

        Any task may call it (not only the writer), each with its own
        `task`; it runs no collective. Replaces that task's earlier
        survivor state in one rename. Blocks until written.
        """
        os.makedirs(self._backup_dir, exist_ok=True)
        final = os.path.join(self._backup_dir, _SURVIVOR_PREFIX + task.replace(":", "-"))
        scratch = tempfile.mkdtemp(prefix="." + _SURVIVOR_PREFIX, dir=self._backup_dir)
        try:
            self._checkpoint().write(os.path.join(scratch, _CHECKPOINT))
            with open(os.path.join(scratch, _POSITION), "w") as f:
                json.dump(dataclasses.asdict(position), f)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        os.replace(scratch, final)

    def restore(self) -> Position | None:
        """Loads the latest committed state into the model; its position, or None if none.

        Raises:
          ConfigError: If a state is committed but the model has no
            variables yet (tf-keras builds a model without an input shape
            only in its first step), or its optimizer cannot be built
            before that step (a legacy tf-keras optimizer).
        """
        directory = self.latest_directory()
        if directory is None:
            return None
        if not _variables(self._model):
            raise errors.ConfigError(
                f"cannot restore the training state in {directory!r}: the model "
                "has no variables yet (tf-keras builds a model without an input "
                "shape in its first training step). Give it its input shape "
                "(keras.Input(shape) as its first layer, or model.build(shape)) "
                "before fit."
            )
        _build_optimizer(self._model)
        self._checkpoint().read(os.path.join(directory, _CHECKPOINT)).assert_existing_objects_matched()
        return _read_position(directory)

    def latest_directory(self) -> str | None:
        """The directory of the state to restore, or None if there is none.

        The newest of the committed state and the survivors' (the most
        steps done; the committed one on a tie, then the first survivor by
        name).
        """
        candidates = []
        try:
            with open(os.path.join(self._backup_dir, _LATEST)) as f:
                candidates.append(f.read().strip())
        except FileNotFoundError:
            pass
        candidates.extend(sorted(self._survivors()))
        if not candidates:
            return None
        directories = [os.path.join(self._backup_dir, name) for name in candidates]
        steps = [_read_position(d).steps_done for d in directories]
        return directories[max(range(len(directories)), key=lambda i: (steps[i], -i))]

    def delete(self) -> None:
        """Removes every committed state (the writer only; others do nothing)."""
        if self._is_writer:
            shutil.rmtree(self._backup_dir, ignore_errors=True)

    def _states(self) -> list[int]:
        try:
            names = os.listdir(self._backup_dir)
        except FileNotFoundError:
            return []
        return [int(m.group(1)) for n in names if (m := _STATE_DIR.fullmatch(n))]

    def _survivors(self, include_unfinished: bool = False) -> list[str]:
        try:
            names = os.listdir(self._backup_dir)
        except FileNotFoundError:
            return []
        prefixes = (_SURVIVOR_PREFIX, "." + _SURVIVOR_PREFIX) if include_unfinished else (_SURVIVOR_PREFIX,)
        return [n for n in names if n.startswith(prefixes)]


def _read_position(directory: str) -> Position:
    with open(os.path.join(directory, _POSITION)) as f:
        return Position(**json.load(f))


def variables(model: Any) -> list[Any]:
    """Every variable the training state holds: the model's and its optimizer's."""
    optimizer_variables = getattr(model.optimizer, "variables", [])
    if callable(optimizer_variables):  # A legacy tf-keras optimizer's method.
        optimizer_variables = optimizer_variables()
    return _variables(model) + list(optimizer_variables)


def _variables(model: Any) -> list[Any]:
    """The model's variables; none while a tf-keras model is unbuilt (it raises then)."""
    try:
        return list(model.variables)
    except ValueError:
        return []


def _build_optimizer(model: Any) -> None:
    """Creates the optimizer's variables now, so that a restore fills them.

    tf-keras creates them in the first training step (inside a
    `tf.function`), too late for the values read before it; Keras 3 has
    usually built them already (`fit` builds before the callbacks start).
    """
    optimizer = model.optimizer
    # Keras 3 says `built`, tf-keras `_built`.
    if getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    if not callable(getattr(optimizer, "build", None)):
        raise errors.ConfigError(
            f"cannot restore the state of optimizer {type(optimizer).__name__}: "
            "its slots are made in the first training step, too late to be "
            "restored (a legacy tf-keras optimizer). Use tf.keras.optimizers "
            "(not .legacy) or Keras 3's optimizers."
        )
    with model.distribute_strategy.scope():
        optimizer.build(model.trainable_variables)
