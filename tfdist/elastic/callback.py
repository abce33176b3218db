"""`Elastic`: the Keras callback that saves on preemption and resumes at the step.

    strategy = tfdist.MultiWorkerMirroredStrategy()   # or any tfdist strategy
    with strategy.scope():
        model = build_model(); model.compile(...)
    model.fit(dataset, epochs=10, callbacks=[tfdist.elastic.Elastic(backup_dir)])

What one `fit` does with it (every task of the job alike):

1. `on_train_begin`: if `backup_dir` holds a committed state, load it into
   the model and its optimizer and start at its position: Keras's epoch,
   and inside it the step, by having the input's next pass start there
   (`tfdist.data.distributed.resume`). Install the SIGTERM handler.
2. Every step end: commit every `save_freq` steps if asked; on a notice
   (SIGTERM to any task), stop at the step every task agrees on
   (`agreement`), commit there and raise `errors.TrainingPreempted`, which
   exits the process with status 143. A stop that falls on an epoch's
   last step commits at the epoch's end (after validation) and raises when
   the next epoch begins, so every callback sees the epoch end; in the
   last epoch it does not raise (training is complete). A parameter-server
   chief also takes a notice that reached a ps task alone, which that task
   posts where the chief looks every `SERVING_NOTICE_POLL_S`
   (`tfdist.parameter_server.serving_notice`).
3. Every epoch end: commit (with `save_freq="epoch"`).
4. `on_train_end`: remove the SIGTERM handler; delete the backup (unless
   `delete_on_completion=False`), as Keras's `BackupAndRestore` does.

A lost peer (tfdist's `MultiWorkerMirroredStrategy`, `save_on_loss`): each
task keeps the state of its last step in memory (`last_step`; every step
when steps are not too short for it); when a step fails for a lost peer,
each surviving task writes that state before the error leaves `fit`, and
the restart resumes from the newest state saved, losing only the step in
flight. Elsewhere a loss resumes from the last commit (`save_freq`).

Exactly once. Each global batch of a tfdist distributed dataset is cut over
all replicas of all workers, so a step's examples are the same whatever
the number of workers: skipping the k steps already trained leaves the rest
of the epoch, re-partitioned over the workers there are now. That is exact
when a pass of the input yields the same batches every time (no shuffle,
or `reshuffle_each_iteration=False`) or when tfdist shuffles
(`ShardOptions`, whose epoch e is a function of the seed and e). A pipeline
that reshuffles on its own draws a new order for the resumed epoch: its
remaining steps are then not the rest of the interrupted epoch's.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import keras_compat
from tfdist._internal import tf_errors
from tfdist.data.distributed import resume
from tfdist.elastic import agreement as agreement_lib
from tfdist.elastic import last_step as last_step_lib
from tfdist.elastic import notice as notice_lib
from tfdist.elastic import training_state
from tfdist.parameter_server import keras_loop

__all__ = ["Elastic", "SERVING_NOTICE_POLL_S"]

#: How often a parameter-server chief looks, at a step end, for a notice that
#: reached one of its ps tasks alone (one remote op per ps task, ~2-3 ms).
SERVING_NOTICE_POLL_S = 0.5


class Elastic(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Saves at a step on preemption (SIGTERM) and resumes from that step.

    Pass it to `fit` of a model built under a tfdist strategy, on every
    task, with the same arguments; run the script under a launcher that
    restarts it (`tfdist-launch --restarts K`, Kubernetes, Slurm). See the
    module docstring for what each callback hook does.

    Contract:
      - `backup_dir` is readable by every task and written by the chief
        only (the `chief` task, else `worker:0`; the only process of a
        one-process strategy). Every task checks at `fit`'s start that it
        found the state the chief found (`ConfigError` if not).
      - Resuming mid-epoch needs the training input to be a dataset (or
        arrays) given to `fit` under a tfdist strategy, which starts its
        pass at the saved step; otherwise `fit` raises `ConfigError` at
        its first step.
      - Under `tfdist.ParameterServerStrategy` the callback runs on the
        chief (the only task in `fit`): it commits once the steps in flight
        have finished, and the worker and ps tasks serve on after SIGTERM
        until the chief has exited (`parameter_server.roles.serve`).
      - The model must be built again the same way (same layers, same
        optimizer) before `fit` resumes it. The number of workers may
        differ: the global batch is the dataset's, whatever the workers.
      - Under tfdist's `MultiWorkerMirroredStrategy` (`save_on_loss`),
        every task may write `backup_dir/survivor-<task>` after a step
        failed for a lost peer; the next `fit` resumes from the newest of
        those and the committed state.
      - Keras numbers the resumed epoch's batches from 0 and ends it after
        the steps left (Keras 3: `model.stop_training` is set after its last
        step and cleared in this callback's `on_epoch_end`; tf-keras numbers
        them from the saved step). Callbacks see the epoch's end as usual.

    Args:
      backup_dir: Directory of the committed state.
      save_freq: "epoch" (commit at every epoch end), a positive int (commit
        every that many steps, not at epoch ends: what a crash, which sends
        no notice, loses at most), or None (commit only on a notice).
      delete_on_completion: Whether a `fit` that runs to its end deletes
        `backup_dir`, so that running the script again trains anew.
      save_on_loss: Under tfdist's `MultiWorkerMirroredStrategy` on several
        tasks, whether each task keeps its state at step ends (a copy of
        the weights and optimizer in memory; at most 1% of the time, so
        every step once steps take ~25 ms or more: `last_step.COST_SHARE`)
        so that the survivors of a lost peer save it and the job resumes
        at the last step kept, not at the last commit. Has no effect
        under other strategies (`last_step` says why).

    Raises:
      ConfigError: If `save_freq` is invalid (at construction); at `fit`'s
        start under TF's parameter-server strategy, or tfdist's with an
        `input_service`; or at `fit`'s first step if a resume point was not
        taken by the input.
      TrainingPreempted: From `fit`, once every task has committed after a
        notice; uncaught, the process exits 143.
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike[str],
        *,
        save_freq: str | int | None = "epoch",
        delete_on_completion: bool = True,
        save_on_loss: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise errors.ConfigError(
                f"backup_dir must be a non-empty path; received "
                f"backup_dir={backup_dir!r}. Pass a directory every task can "
                "read, e.g. backup_dir='/shared/job-1/backup'."
            )
        if not (
            save_freq in ("epoch", None)
            or (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0)
        ):
            raise errors.ConfigError(
                f"save_freq must be 'epoch', a positive number of steps or None; "
                f"received save_freq={save_freq!r}. Pass save_freq='epoch' to "
                "commit at each epoch end, or e.g. save_freq=100."
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_on_completion = bool(delete_on_completion)
        self.save_on_loss = bool(save_on_loss)
        self._notice = notice_lib.PreemptionNotice(is_active=self._inside_fit)
        self._state: training_state.TrainingState | None = None
        self._agreement: agreement_lib.LocalAgreement | agreement_lib.ClusterAgreement = (
            agreement_lib.LocalAgreement()
        )
        self._epoch = 0
        self._step_offset = 0  # Keras 3 numbers a resumed epoch's batches from 0.
        self._resumed_step = 0  # Steps of the first epoch trained before this fit.
        self._epoch_begun = False  # Whether the epoch's pass has produced a batch.
        self._steps_in_epoch = 0
        self._steps_done = 0
        self._since_commit = 0
        self._data_epoch: int | None = None
        self._resume_armed = False
        self._stop_at_epoch_end = False
        self._preempt_at_epoch_begin = False
        self._ends_resumed_epoch = False
        self._keras3 = True  # Set for the model at each fit's start.
        # The last step's state in memory (save_on_loss): whether this fit
        # keeps it, the keeper once the variables exist, the thread of fit.
        self._keeps_last_step = False
        self._last_step: last_step_lib.LastStep | None = None
        self._fit_thread: int | None = None
        self._remove_error_hook: Any = None
        # A parameter-server chief's view of its ps tasks' notices, and when
        # to look next.
        self._serving_notices: Any = None
        self._next_notice_poll_s = 0.0

    @property
    def preemption_requested(self) -> bool:
        """Whether this task has received a notice (SIGTERM or `request_preemption`)."""
        return self._notice.requested

    def request_preemption(self) -> None:
        """Acts as if this task received SIGTERM (any thread)."""
        self._notice.request()

    # Keras hooks.

    def on_train_begin(self, logs: Any = None) -> None:
        del logs
        strategy = self.model.distribute_strategy
        _check_parameter_server(strategy)
        self._keras3 = not type(self.model).__module__.startswith("tf_keras")
        is_writer = bool(getattr(strategy.extended, "should_checkpoint", True))
        self._state = training_state.TrainingState(
            self.model, self.backup_dir, is_writer=is_writer
        )
        self._agreement = _agreement_for(strategy)
        self._preempt_at_epoch_begin = False
        # What an earlier fit that raised left behind (Keras then ends no
        # callback): its start position on the model, an unused resume point.
        keras_compat.clear_fit_start(self.model)
        resume.disarm()
        started = time.monotonic()
        position = self._state.restore()
        latest = self._state.latest_directory()
        self._agreement.check_same_state(
            os.path.basename(latest) if latest else "",
            is_writer=is_writer,
            timeout_s=float(getattr(strategy, "timeout_s", 300.0)),
        )
        if position is not None:
            self._resume(position, time.monotonic() - started)
        self._keep_last_step(strategy)
        self._serving_notices = _serving_notices_for(strategy)
        self._next_notice_poll_s = 0.0
        self._notice.install()
        self._agreement.start()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        del logs
        if not self._epoch_begun:  # The epoch's pass has begun.
            if self._resume_armed:
                self._resume_armed = False
                # Untaken at an epoch's start only costs an endless input its
                # exact order (docs/elastic.md); mid-epoch it would retrain.
                if resume.disarm() and self._steps_in_epoch:
                    raise errors.ConfigError(
                        "Elastic restored a state saved after step "
                        f"{self._steps_in_epoch} of epoch {self._epoch}, but the "
                        "training input did not start there: resuming mid-epoch "
                        "needs a dataset or arrays given to fit under a tfdist "
                        f"strategy; the model trains under "
                        f"{type(self.model.distribute_strategy).__name__}. Build "
                        "the model under a tfdist strategy (tfdist.MirroredStrategy() "
                        "for one machine), or delete the backup in "
                        f"{self.backup_dir!r} to start over."
                    )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        del logs
        done = self._step_offset + batch + 1 if self._keras3 else batch + 1
        if not self._epoch_begun:  # The epoch's pass has produced.
            self._epoch_begun = True
            self._data_epoch = resume.last_epoch()
        self._since_commit += done - self._steps_in_epoch
        self._steps_in_epoch = done
        self._steps_done += 1
        if isinstance(self.save_freq, int) and self._since_commit >= self.save_freq:
            self._commit(self._epoch, done)
        if self._keeps_last_step:
            self._keep(done)
        self._end_resumed_epoch(done)
        self._poll_serving_notices()
        if self._stop_at_epoch_end or not self._agreement.should_stop(
            self._steps_done, self._notice.requested
        ):
            return
        if done == self.params.get("steps"):
            self._stop_at_epoch_end = True  # After validation and epoch-end callbacks.
            return
        self._commit(self._epoch, done)
        self._preempted(self._epoch, done)

    def _end_resumed_epoch(self, done: int) -> None:
        """Ends Keras 3's resumed epoch after its last step (see `on_epoch_end`).

        Keras 3 expects the epoch's full number of steps and would call the
        step once more on the shortened pass; that call fails at the end of
        the data but still advances the optimizer's `iterations` (as Keras 3
        does at the end of any input of unknown length), which would shift
        Adam's or a schedule's arithmetic against an uninterrupted run.
        """
        if self._keras3 and self._step_offset and done == self.params.get("steps"):
            self.model.stop_training = True
            self._ends_resumed_epoch = True

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        del logs
        if self._preempt_at_epoch_begin:
            self._preempt_at_epoch_begin = False
            self._preempted(epoch, 0)
        self._epoch = epoch
        self._epoch_begun = False
        self._steps_in_epoch, self._resumed_step = self._resumed_step, 0

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        del logs
        self._step_offset = 0
        if self._ends_resumed_epoch:
            # `_end_resumed_epoch` stopped the step loop; training goes on.
            # (A callback before this one that stops training in this very
            # epoch is overridden: it stops the next epoch.)
            self._ends_resumed_epoch = False
            self.model.stop_training = False
        if self._data_epoch is not None:
            self._data_epoch += 1
        if self.save_freq == "epoch" or self._stop_at_epoch_end:
            self._commit(epoch + 1, 0)
        if self._stop_at_epoch_end:
            self._stop_at_epoch_end = False
            if epoch + 1 < self.params.get("epochs", epoch + 2):
                # Raised when the next epoch begins, so that the callbacks
                # after this one see this epoch's end too.
                self._preempt_at_epoch_begin = True
            else:
                logging.warning(
                    "tfdist.elastic: a preemption notice came in the last epoch, "
                    "which has ended: training is complete."
                )

    def on_train_end(self, logs: Any = None) -> None:
        del logs
        self._finish()
        if self.delete_on_completion and self._state is not None:
            self._state.delete()

    # Internals.

    def _inside_fit(self, frame: Any) -> bool:
        """Whether `frame` runs inside this model's `fit` (Keras does not end callbacks when `fit` raises)."""
        model = self.model
        while frame is not None:
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
                return True
            frame = frame.f_back
        return False

    def _resume(self, position: training_state.Position, took_s: float) -> None:
        self._epoch = position.epoch
        self._steps_done = position.steps_done
        keras_compat.set_fit_start(self.model, position.epoch, position.step)
        self._resumed_step = position.step
        if position.step:
            self._step_offset = position.step if self._keras3 else 0
        # A sharded input's next pass must be the saved epoch's even from its
        # start; any other input resumes an epoch's start as it is.
        # An endless input read across epochs resumes after every step trained.
        if position.step or position.data_epoch is not None or position.steps_done:
            data_epoch = position.epoch if position.data_epoch is None else position.data_epoch
            resume.arm(resume.ResumePoint(
                epoch=data_epoch, step=position.step, stream_step=position.steps_done))
            self._resume_armed = True
        logging.warning(  # Shown by default: a user must see where training went on.
            "tfdist.elastic: resumed from %s in %.2f s: epoch %d, step %d.",
            self._state.latest_directory() if self._state else self.backup_dir,
            took_s,
            position.epoch,
            position.step,
        )

    def _poll_serving_notices(self) -> None:
        """A parameter-server chief: takes a ps task's notice as its own (every `SERVING_NOTICE_POLL_S`)."""
        now = time.monotonic()
        if self._serving_notices is None or self._notice.requested or now < self._next_notice_poll_s:
            return
        self._next_notice_poll_s = now + SERVING_NOTICE_POLL_S
        task = self._serving_notices.poll()
        if task is not None:
            logging.warning(
                "tfdist.elastic: task %s received a preemption notice; the chief "
                "stops at this step and saves.", task,
            )
            self._notice.request()

    def _keep_last_step(self, strategy: Any) -> None:
        """Starts keeping each step's state if this fit can save it after a loss (`save_on_loss`)."""
        self._stop_keeping()  # A fit that raised elsewhere than in a step left its hook.
        self._keeps_last_step = self.save_on_loss and last_step_lib.replicates_state_over_tasks(strategy)
        if self._keeps_last_step:
            self._fit_thread = threading.get_ident()
            self._remove_error_hook = tf_errors.install_function_error_hook(self._on_function_error)

    def _keep(self, done: int) -> None:
        """Keeps the state after `done` steps of this epoch (the next epoch's start after its last)."""
        if self._last_step is None:
            # Made here: tf-keras makes some variables in its first step.
            self._last_step = last_step_lib.LastStep.for_state(
                training_state.variables(self.model), self.model.distribute_strategy
            )
            if self._last_step is None:
                self._keeps_last_step = False
                return
        if done == self.params.get("steps"):  # As `on_epoch_end` will commit it.
            data_epoch = None if self._data_epoch is None else self._data_epoch + 1
            self._last_step.keep(self._position(self._epoch + 1, 0, data_epoch))
        else:
            self._last_step.keep(self._position(self._epoch, done, self._data_epoch))

    def _stop_keeping(self) -> None:
        if self._remove_error_hook is not None:
            self._remove_error_hook()
            self._remove_error_hook = None
        self._last_step = None

    def _on_function_error(self, error: BaseException) -> None:
        """After a `tf.function` call failed: a lost or stuck peer in fit's thread saves the last step."""
        if (
            self._last_step is None
            or self._state is None
            or not isinstance(error, errors.CollectiveError)
            or threading.get_ident() != self._fit_thread
        ):
            return
        last_step = self._last_step
        # The error ends this fit: the hook goes now, not at the next fit.
        self._stop_keeping()
        task = self.model.distribute_strategy.cluster_config.task.name
        try:
            last_step.save(self._state, task)
        except Exception as e:  # noqa: BLE001 - the loss is the error to raise.
            logging.error("tfdist.elastic: could not save the last step's state: %s", e)

    def _commit(self, epoch: int, step: int) -> None:
        assert self._state is not None
        # A parameter-server chief's loop runs ahead of its steps: the state
        # must hold every step Keras has counted.
        keras_loop.wait_for_steps(self.model)
        # At an epoch end (step 0), on_epoch_end has already moved
        # `_data_epoch` on to the next pass.
        self._state.commit(self._position(epoch, step, self._data_epoch))
        self._since_commit = 0

    def _position(self, epoch: int, step: int, data_epoch: int | None) -> training_state.Position:
        return training_state.Position(
            epoch=epoch, step=step, data_epoch=data_epoch, steps_done=self._steps_done
        )

    def _preempted(self, epoch: int, step: int) -> None:
        self._finish()
        notice_s = self._notice.received_at
        since = f" {time.monotonic() - notice_s:.1f} s after the notice" if notice_s else ""
        message = (
            f"tfdist.elastic: preempted: saved epoch {epoch}, step {step} in "
            f"{self.backup_dir!r}{since}; run the job again to resume there."
        )
        logging.warning(message)
        raise errors.TrainingPreempted(message, epoch=epoch, step=step)

    def _finish(self) -> None:
        keras_compat.clear_fit_start(self.model)  # `_resume`'s, for this fit only.
        self._notice.uninstall()
        self._agreement.stop()
        self._stop_keeping()
        if self._resume_armed:
            self._resume_armed = False
            resume.disarm()


def _serving_notices_for(strategy: Any) -> Any:
    """A `serving_notice.Watch` for tfdist's parameter-server strategy on its chief; else None."""
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return None
    from tfdist.parameter_server import serving_notice

    config = getattr(strategy, "cluster_config", None)
    if config is None or config.cluster is None or config.task is None:
        return None
    return serving_notice.Watch(config)


def _check_parameter_server(strategy: Any) -> None:
    """Raises unless a parameter-server `strategy` is tfdist's, reading the input on the chief."""
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return
    from tfdist.parameter_server import strategy as parameter_server  # Imports TF's.

    if not isinstance(strategy, parameter_server.ParameterServerStrategy):
        raise errors.ConfigError(
            "Elastic supports tfdist's parameter-server strategy, not TF's; the "
            f"model trains under {type(strategy).__name__} (tf.distribute's), "
            "whose Keras loop reads the input on the workers and cannot start an "
            "epoch at a step. Build the model under tfdist.ParameterServerStrategy(), "
            "or use keras.callbacks.BackupAndRestore (it resumes at the epoch)."
        )
    if strategy.input_service is not None:
        raise errors.ConfigError(
            "Elastic cannot resume a parameter-server job whose workers read the "
            f"input from a tf.data service (input_service={strategy.input_service!r}): "
            "a service's pass cannot start at a step. Build the strategy with "
            "input_service=None (the chief reads the input), or use "
            "keras.callbacks.BackupAndRestore (it resumes at the epoch)."
        )


#: `fit` calls with an Elastic callback in this process so far: every task
#: runs the same ones, so the count names each one's agreement keys alike.
_fits = itertools.count()


def _spans_tasks(strategy: Any) -> bool:
    """Whether `strategy` is one of tfdist's that trains across TF_CONFIG tasks in lockstep."""
    from tfdist.mesh import strategy as mesh  # Imports DTensor.
    from tfdist.multi_worker import strategy as multi_worker  # Imports TF's strategies.

    return isinstance(strategy, (mesh.MeshStrategy, multi_worker.MultiWorkerMirroredStrategy))


def _agreement_for(strategy: Any) -> Any:
    """A `ClusterAgreement` for tfdist's strategies on several tasks (multi-worker, mesh); else local."""
    config = getattr(strategy, "cluster_config", None)
    if config is None or not _spans_tasks(strategy):
        return agreement_lib.LocalAgreement()
    cluster, task = config.cluster, config.task
    if cluster is None or task is None:
        return agreement_lib.LocalAgreement()
    tasks = [t.name for t in cluster.tasks() if t.task_type in ("chief", "worker")]
    if len(tasks) < 2 or task.task_type not in ("chief", "worker"):
        return agreement_lib.LocalAgreement()
    return agreement_lib.ClusterAgreement(task.name, tasks, fit_index=next(_fits))
