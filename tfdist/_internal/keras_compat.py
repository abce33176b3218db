"""tfdist's uses of Keras internals (Keras 3 and tf-keras), in one place.

Three topics: checkpoints written by one task only (Keras 3), recognising
Keras's own training step inside `strategy.run`, and scaling the loss that
Keras differentiates (not the one it reports) for exact uneven batches.

Checkpoints written by one task only. Keras 3's `BackupAndRestore` and
`ModelCheckpoint` have no multi-worker handling: every worker writes the
same files (two h5 writers on one path fail with "unable to lock file";
on separate disks each worker keeps its own copy) and every worker deletes
the backup at the end. tf-keras solves this with per-worker temporary
directories (`distributed_file_utils`); `redirect_non_chief_checkpoints`
does the same for Keras 3 on a non-chief task:

- `_save_model` writes into a fresh temporary directory, which is deleted
  right after (the weights are identical on every worker; the chief's
  copy is the checkpoint);
- `BackupAndRestore.on_train_end` leaves the chief's backup alone;
- restoring (`on_train_begin`) still reads the chief's backup, so every
  worker resumes from the same state.

Verified against Keras 3.15 (`keras.src.callbacks`); the patched methods are
private and may move.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

__all__ = [
    "gradients_scaled",
    "keras_train_step",
    "loss_factor",
    "redirect_non_chief_checkpoints",
]

_PATCHED = "_tfdist_non_chief_task"


def _into_temporary_dir(
    attributes: tuple[str, ...], task_name: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Runs a save method with `attributes` (paths) moved to a temp dir."""

    def decorate(save: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(save)
        def save_elsewhere(self: Any, *args: Any, **kwargs: Any) -> Any:
            originals = {name: getattr(self, name) for name in attributes}
            scratch = tempfile.mkdtemp(prefix=f"tfdist-{task_name.replace(':', '-')}-")
            try:
                for name, path in originals.items():
                    setattr(self, name, os.path.join(scratch, os.path.basename(str(path))))
                if hasattr(self, "backup_dir"):
                    originals.setdefault("backup_dir", self.backup_dir)
                    self.backup_dir = scratch
                return save(self, *args, **kwargs)
            finally:
                for name, path in originals.items():
                    setattr(self, name, path)
                shutil.rmtree(scratch, ignore_errors=True)

        return save_elsewhere

    return decorate


def redirect_non_chief_checkpoints(task_name: str) -> bool:
    """Makes Keras 3 checkpoint callbacks of this process write nowhere durable.

    Call once, on a non-chief task of a multi-worker job, before `fit`.
    Idempotent. Returns False (and changes nothing) when Keras 3 is not
    installed; tf-keras handles multi-worker checkpoints itself.
    """
    try:
        from keras.src.callbacks import backup_and_restore
        from keras.src.callbacks import model_checkpoint
    except ImportError:
        return False
    backup = backup_and_restore.BackupAndRestore
    checkpoint = model_checkpoint.ModelCheckpoint
    if getattr(backup, _PATCHED, None) is not None:
        return True
    backup._save_model = _into_temporary_dir(
        ("_weights_path", "_training_metadata_path", "_prev_weights_path",
         "_prev_training_metadata_path"),
        task_name,
    )(backup._save_model)
    backup.on_train_end = lambda self, logs=None: None
    checkpoint._save_model = _into_temporary_dir(("filepath",), task_name)(
        checkpoint._save_model
    )
    setattr(backup, _PATCHED, task_name)
    setattr(checkpoint, _PATCHED, task_name)
    return True


# --------------------------------------------------------------------------
# Recognising Keras's own training step inside `strategy.run`.

#: tf-keras's per-step closure (Model.make_train_function) that calls
#: `model.train_step(data)` inside `strategy.run`.
_TF_KERAS_RUN_STEP = "Model.make_train_function.<locals>.step_function.<locals>.run_step"


def keras_train_step(fn: Callable[..., Any]) -> tuple[Any, bool] | None:
    """Whether `strategy.run(fn, ...)` is a step of Keras's `fit`.

    Keras 3's `fit` calls `strategy.run(model.train_step, (data,))`;
    tf-keras's calls it with a closure that calls `model.train_step(data)`.

    Returns:
      None if `fn` is neither; else `(model, builtin)`, where `builtin` says
      the model's `train_step` is Keras's own (not a user's override, which
      may unpack its data in its own way).
    """
    model = getattr(fn, "__self__", None)
    if model is not None and getattr(fn, "__name__", None) == "train_step":
        trainer = sys.modules.get("keras.src.backend.tensorflow.trainer")
        if trainer is not None and isinstance(model, trainer.TensorFlowTrainer):
            return model, fn.__func__ is trainer.TensorFlowTrainer.train_step
        return None
    if getattr(fn, "__qualname__", None) != _TF_KERAS_RUN_STEP:
        return None
    training = sys.modules.get("tf_keras.src.engine.training")
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    if training is None or "model" not in cells:
        return None
    model = cells["model"].cell_contents
    return model, type(model).train_step is training.Model.train_step


# --------------------------------------------------------------------------
# Scaling only the loss that Keras differentiates.

_replica_loss_factor = threading.local()


@contextlib.contextmanager
def loss_factor(factor: Any) -> Iterator[None]:
    """Inside, the optimizer wrapped by `gradients_scaled` multiplies by `factor`.

    Thread-local: each replica's step (a thread of its own while
    MirroredStrategy traces) sets its own factor.
    """
    previous = getattr(_replica_loss_factor, "value", None)
    _replica_loss_factor.value = factor
    try:
        yield
    finally:
        _replica_loss_factor.value = previous


def _scaled(loss: Any) -> Any:
    factor = getattr(_replica_loss_factor, "value", None)
    return loss if factor is None else loss * tf.cast(factor, loss.dtype)


@contextlib.contextmanager
def gradients_scaled(model: Any) -> Iterator[None]:
    """While tracing `model`'s train step, its gradients come from the scaled loss.

    Keras reports the loss it computed (Keras 3 updates its loss tracker
    before `optimizer.scale_loss`; tf-keras before `optimizer.minimize`) and
    differentiates what the optimizer returns: wrapping those two methods
    of this model's optimizer (on the instance, for the duration of the
    block) multiplies only the differentiated loss by the `loss_factor` of
    the replica, so the reported loss stays the unweighted mean.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        yield
        return
    trainer = sys.modules.get("keras.src.backend.tensorflow.trainer")
    if trainer is not None and isinstance(model, trainer.TensorFlowTrainer):
        name = "scale_loss"
        original = optimizer.scale_loss

        def wrapped(loss: Any) -> Any:
            return original(_scaled(loss))

    else:
        name = "minimize"
        original = optimizer.minimize

        def wrapped(loss: Any, *args: Any, tape: Any = None, **kwargs: Any) -> Any:
            if tape is not None:
                with tape:  # Re-entered, so the product is differentiated.
                    loss = _scaled(loss)
            return original(loss, *args, tape=tape, **kwargs)

    had_own = name in vars(optimizer)
    setattr(optimizer, name, wrapped)
    try:
        yield
    finally:
        if had_own:
            setattr(optimizer, name, original)
        else:
            delattr(optimizer, name)
