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
import dataclasses
import functools
import inspect
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

__all__ = [
    "KerasStep",
    "gradients_scaled",
    "keras_step",
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
#: Keras 3's predict step (TensorFlowTrainer.make_predict_function).
_KERAS3_PREDICT_STEP = "make_predict_function.<locals>.one_step_on_data"


@dataclasses.dataclass(frozen=True)
class KerasStep:
    """A step of Keras's `fit`, `evaluate` or `predict` given to `strategy.run`.

    Attributes:
      model: The Keras model.
      kind: "train", "test" or "predict".
      builtin: Whether it is Keras's own step (a user's `train_step`
        override may unpack its data in its own way).
      keras3: Keras 3 (else tf-keras). Keras 3 averages every logged value
        over all replicas with `strategy.reduce`, one call per value.
    """

    model: Any
    kind: str
    builtin: bool
    keras3: bool = True


def keras_step(fn: Callable[..., Any]) -> KerasStep | None:
    """Which step of Keras `fn` is, when `strategy.run(fn, ...)` is Keras's.

    Keras 3 calls `strategy.run(model.train_step, (data,))` (and
    `test_step`), and its predict step is a closure over the model;
    tf-keras's `fit` calls it with a closure that calls
    `model.train_step(data)`. Returns None for anything else (a custom
    loop's step).
    """
    trainer = sys.modules.get("keras.src.backend.tensorflow.trainer")
    model = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", None)
    if trainer is not None and isinstance(model, trainer.TensorFlowTrainer):
        if name in ("train_step", "test_step"):
            builtin_fn = getattr(trainer.TensorFlowTrainer, name)
            function = getattr(fn, "__func__", None)
            return KerasStep(model, name[: -len("_step")], function is builtin_fn)
        return None
    qualname = getattr(fn, "__qualname__", "") or ""
    if trainer is not None and qualname.endswith(_KERAS3_PREDICT_STEP):
        # Wrapped by Keras (functools.wraps; a tf.function under jit_compile).
        inner = inspect.unwrap(getattr(fn, "python_function", fn))
        inner = inspect.unwrap(getattr(inner, "python_function", inner))
        code = getattr(inner, "__code__", None)
        cells = dict(zip(code.co_freevars, inner.__closure__ or ())) if code else {}
        if "self" in cells:
            return KerasStep(cells["self"].cell_contents, "predict", True)
        return None
    if qualname != _TF_KERAS_RUN_STEP:
        return None
    training = sys.modules.get("tf_keras.src.engine.training")
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    if training is None or "model" not in cells:
        return None
    model = cells["model"].cell_contents
    return KerasStep(
        model, "train", type(model).train_step is training.Model.train_step, keras3=False
    )


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
    keras3 = trainer is not None and isinstance(model, trainer.TensorFlowTrainer)
    name = "scale_loss" if keras3 else "minimize"
    original = getattr(optimizer, name)

    def wrapped(loss: Any, *args: Any, tape: Any = None, **kwargs: Any) -> Any:
        if keras3:  # scale_loss(loss)
            return original(_scaled(loss), *args, **kwargs)
        if tape is not None:  # minimize(loss, var_list, tape=tape)
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
