"""tfdist's uses of Keras internals (Keras 3 and tf-keras), in one place.

Four topics: checkpoints written by one task only (Keras 3), recognising
Keras's own training step inside `strategy.run`, scaling the loss that
Keras differentiates (not the one it reports) for exact uneven batches, and
running a step once per microbatch with one optimizer update (the step
method and the optimizer's gradient application replaced on the instance
while the step is traced).

Checkpoints written by one task only. Keras 3's `BackupAndRestore` and
`ModelCheckpoint` have no multi-worker handling: every worker writes the
same files (two h5 writers on one path fail with "unable to lock file";
on separate disks each worker keeps its own copy) and every worker deletes
the backup at the end. tf-keras solves this with per-worker temporary
directories (`distributed_file_utils`); `redirect_non_chief_checkpoints`
does the same for Keras 3 on a non-chief task, for the callbacks of models
built under that task's strategy, while the strategy lives:

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

import collections
import contextlib
import dataclasses
import functools
import inspect
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from tfdist._internal import attributes
from tfdist._internal import tf_keras_sharded

__all__ = [
    "GradientIntercept",
    "clear_fit_start",
    "KerasStep",
    "gradient_aggregation_skipped",
    "adjusts_replica_gradients",
    "computes_metrics_as_keras",
    "gradient_updates_intercepted",
    "gradients_scaled",
    "is_bound_step",
    "keras_step",
    "loss_factor",
    "redirect_non_chief_checkpoints",
    "replaced_attribute",
    "set_fit_start",
    "step_replaced",
]

#: The non-chief strategies alive, each with its task's name ("worker:1").
_NON_CHIEF: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _non_chief_task(callback: Any) -> str | None:
    """The task name when `callback`'s model trains under a registered non-chief strategy."""
    model = getattr(callback, "model", None)
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None:
        return None
    try:
        return _NON_CHIEF.get(strategy)
    except TypeError:  # Not weak-referenceable: not one of ours.
        return None


def _into_temporary_dir(
    attributes: tuple[str, ...],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Runs a save method with `attributes` (paths) moved to a temp dir, on a non-chief's model."""

    def decorate(save: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(save)
        def save_elsewhere(self: Any, *args: Any, **kwargs: Any) -> Any:
            task_name = _non_chief_task(self)
            if task_name is None:
                return save(self, *args, **kwargs)
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


def _chief_keeps_backup(on_train_end: Callable[..., Any]) -> Callable[..., Any]:
    """`BackupAndRestore.on_train_end`, which on a non-chief's model leaves the backup alone."""

    @functools.wraps(on_train_end)
    def wrapped(self: Any, logs: Any = None) -> Any:
        if _non_chief_task(self) is not None:
            return None
        return on_train_end(self, logs)

    return wrapped


def _checkpoint_targets() -> list[attributes.Target]:
    """Keras 3's checkpoint callbacks' methods; none without Keras 3, or under tf-keras."""
    if "keras.src.callbacks" not in sys.modules and tf_keras_sharded.legacy_keras():
        return []  # tf-keras handles multi-worker checkpoints itself.
    try:
        from keras.src.callbacks import backup_and_restore
        from keras.src.callbacks import model_checkpoint
    except ImportError:
        return []
    backup = backup_and_restore.BackupAndRestore
    checkpoint = model_checkpoint.ModelCheckpoint
    backup_paths = (
        "_weights_path", "_training_metadata_path", "_prev_weights_path",
        "_prev_training_metadata_path",
    )
    return [
        (backup, "_save_model", _into_temporary_dir(backup_paths)),
        (backup, "on_train_end", _chief_keeps_backup),
        (checkpoint, "_save_model", _into_temporary_dir(("filepath",))),
    ]


#: Keras 3's checkpoint callbacks' methods, wrapped while a non-chief strategy lives.
_CHECKPOINT_PATCH = attributes.SharedPatch(_checkpoint_targets)


def redirect_non_chief_checkpoints(strategy: Any, task_name: str) -> Callable[[], None]:
    """Makes Keras 3 checkpoint callbacks of `strategy`'s models write nowhere durable.

    Call on a non-chief task of a multi-worker job, when the strategy is
    made; call the function returned when the strategy is gone (a
    `weakref.finalize`, which must not hold the strategy). Only callbacks
    whose model was built under `strategy` are redirected, at `fit` time
    (`model._distribute_strategy`); every other callback, and Keras's
    classes once every such strategy is released, are as without tfdist.
    Nothing is changed under tf-keras, which handles this itself.
    """
    _NON_CHIEF[strategy] = task_name
    _CHECKPOINT_PATCH.acquire()
    return _CHECKPOINT_PATCH.release


# --------------------------------------------------------------------------
# Where the next `fit` starts (tfdist.elastic's resumption).


class _TfKerasStart:
    """What tf-keras's `fit` asks `model._training_state` for: where to start."""

    def __init__(self, epoch: int, step: int) -> None:
        self._start = (epoch, step)

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int | None, initial_epoch: int, mode: Any = None
    ) -> tuple[int, int]:
        del steps_per_epoch, initial_epoch, mode
        return self._start


def set_fit_start(model: Any, epoch: int, step: int) -> None:
    """Makes the `fit` under way (from `on_train_begin`) start at epoch `epoch`.

    Keras 3: `model._initial_epoch`, which its `fit` reads after
    `on_train_begin` (as its `BackupAndRestore` sets it); the epoch's batches
    are then numbered from 0. tf-keras: `model._training_state`, whose
    counters its `fit` reads after `on_train_begin` (as its multi-worker
    `BackupAndRestore` sets it); it numbers the epoch's batches from `step`.
    Undo with `clear_fit_start` when that `fit` ends.
    """
    if _is_tf_keras_model(model):
        model._training_state = _TfKerasStart(epoch, step)
    else:
        model._initial_epoch = epoch


def clear_fit_start(model: Any) -> None:
    """Undoes `set_fit_start`: the next `fit` starts where its arguments say."""
    if _is_tf_keras_model(model):
        model._training_state = None
    else:
        model._initial_epoch = None


def _is_tf_keras_model(model: Any) -> bool:
    return type(model).__module__.startswith("tf_keras")


# --------------------------------------------------------------------------
# Recognising Keras's own training step inside `strategy.run`.

#: tf-keras's per-step closures (Model.make_train_function and its test and
#: predict twins) that call `model.<kind>_step(data)` inside `strategy.run`.
_TF_KERAS_RUN_STEPS = {
    f"Model.make_{name}_function.<locals>.step_function.<locals>.run_step": kind
    for name, kind in (("train", "train"), ("test", "test"), ("predict", "predict"))
}
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
    tf-keras's `fit` (and `evaluate`, `predict`) call it with a closure
    that calls `model.train_step(data)` (`test_step`, `predict_step`).
    Returns None for anything else (a custom loop's step).
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
    kind = _TF_KERAS_RUN_STEPS.get(qualname)
    if kind is None:
        return None
    training = sys.modules.get("tf_keras.src.engine.training")
    code = getattr(fn, "__code__", None)
    cells = dict(zip(code.co_freevars, getattr(fn, "__closure__", None) or ())) if code else {}
    if training is None or "model" not in cells:
        return None
    model = cells["model"].cell_contents
    method = f"{kind}_step"
    return KerasStep(
        model,
        kind,
        getattr(type(model), method) is getattr(training.Model, method),
        keras3=False,
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
    with attributes.swapped(_replica_loss_factor, "value", factor):
        yield


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
    if _is_keras3_model(model):
        original = optimizer.scale_loss

        def scale_loss(loss: Any) -> Any:
            return original(_scaled(loss))

        with replaced_attribute(optimizer, "scale_loss", scale_loss):
            yield
        return
    original_minimize = optimizer.minimize

    def minimize(loss: Any, *args: Any, tape: Any = None, **kwargs: Any) -> Any:
        if tape is not None:
            with tape:  # Re-entered, so the product is differentiated.
                loss = _scaled(loss)
        return original_minimize(loss, *args, tape=tape, **kwargs)

    with replaced_attribute(optimizer, "minimize", minimize):
        yield


def _is_keras3_model(model: Any) -> bool:
    trainer = sys.modules.get("keras.src.backend.tensorflow.trainer")
    return trainer is not None and isinstance(model, trainer.TensorFlowTrainer)


@contextlib.contextmanager
def replaced_attribute(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Inside, `obj.name` is `value` (set on the instance); restored on exit.

    Bypasses Keras's attribute tracking (`object.__setattr__`), so a
    function put on a layer or optimizer is never tracked as its state.
    """
    missing = object()
    previous = vars(obj).get(name, missing)
    object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        if previous is missing:
            object.__delattr__(obj, name)
        else:
            object.__setattr__(obj, name, previous)


# --------------------------------------------------------------------------
# tf-keras's LossScaleOptimizer under a strategy it does not list.

_TF_KERAS_LOSS_SCALE_MODULE = "tf_keras.src.mixed_precision.loss_scale_optimizer"


#: tfdist strategy classes whose scope is open somewhere: tf-keras's check accepts them.
_LOSS_SCALING_CLASSES: collections.Counter[type] = collections.Counter()
_LOSS_SCALING_LOCK = threading.Lock()


def _accepting_tfdist_classes(original: Callable[[], bool]) -> Callable[[], bool]:
    @functools.wraps(original)
    def supports() -> bool:
        strategy = tf.distribute.get_strategy()
        return bool(original()) or any(isinstance(strategy, cls) for cls in list(_LOSS_SCALING_CLASSES))

    return supports


def _loss_scaling_targets() -> list[attributes.Target]:
    module = sys.modules.get(_TF_KERAS_LOSS_SCALE_MODULE)
    if getattr(module, "strategy_supports_loss_scaling", None) is None:
        return []  # tf-keras not imported: nothing to allow.
    return [(module, "strategy_supports_loss_scaling", _accepting_tfdist_classes)]


#: tf-keras's check, widened while any `loss_scaling_allowed` block is open.
_LOSS_SCALING_PATCH = attributes.SharedPatch(_loss_scaling_targets)


@contextlib.contextmanager
def loss_scaling_allowed(strategy_class: type) -> Iterator[None]:
    """Inside, tf-keras's `LossScaleOptimizer` accepts `strategy_class`.

    tf-keras refuses loss scaling (at construction and at each
    `apply_gradients`) under any strategy but Mirrored, MultiWorkerMirrored
    and OneDevice (`strategy_supports_loss_scaling`): gradients are unscaled
    once per compute replica, which is right only with one copy of each
    variable per replica. A strategy with one replica and one copy of each
    variable (LayerPlacementStrategy) meets that; inside this block the
    check also accepts it, and once every such block (of any thread) is
    left, tf-keras's check is back. Keras 3's optimizer has no such check.
    Nothing happens where tf-keras is not imported.
    """
    with _LOSS_SCALING_PATCH.active():
        with _LOSS_SCALING_LOCK:
            _LOSS_SCALING_CLASSES[strategy_class] += 1
        try:
            yield
        finally:
            with _LOSS_SCALING_LOCK:
                _LOSS_SCALING_CLASSES[strategy_class] -= 1
                if not _LOSS_SCALING_CLASSES[strategy_class]:
                    del _LOSS_SCALING_CLASSES[strategy_class]


# --------------------------------------------------------------------------
# Running a step once per microbatch, with one optimizer update.


def is_bound_step(fn: Callable[..., Any], step: KerasStep) -> bool:
    """Whether `fn` is the model's `<kind>_step` method itself (Keras 3 train/test)."""
    return getattr(fn, "__self__", None) is step.model and getattr(
        fn, "__name__", None
    ) == f"{step.kind}_step"


def step_replaced(step: KerasStep, replacement: Callable[[Any], Any]) -> Any:
    """Inside, `step.model.<kind>_step` is `replacement` (for Keras's closures)."""
    return replaced_attribute(step.model, f"{step.kind}_step", replacement)


#: `intercept(grads, variables, apply)`: what the optimizer does instead of
#: applying `grads` to `variables` (None: the optimizer's own list);
#: `apply(grads, variables)` applies for real.
GradientIntercept = Callable[[list[Any], "list[Any] | None", Callable[..., Any]], Any]


@contextlib.contextmanager
def gradient_updates_intercepted(optimizer: Any, intercept: GradientIntercept) -> Iterator[None]:
    """Inside, every gradient application of `optimizer` goes to `intercept`.

    Keras 3 applies through `optimizer.apply(grads, variables)` (which
    `apply_gradients` calls); tf-keras through `apply_gradients(pairs)`
    (which `minimize` calls). Both are replaced on the instance.
    """
    if hasattr(optimizer, "apply") and hasattr(optimizer, "stateless_apply"):  # Keras 3
        original_apply = optimizer.apply

        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            variables = None if trainable_variables is None else list(trainable_variables)
            return intercept(list(grads), variables, original_apply)

        with replaced_attribute(optimizer, "apply", apply):
            yield
        return
    original_apply_gradients = optimizer.apply_gradients

    def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)

        def apply_pairs(grads: list[Any], variables: list[Any] | None) -> Any:
            return original_apply_gradients(zip(grads, variables or []), *args, **kwargs)

        return intercept([g for g, _ in pairs], [v for _, v in pairs], apply_pairs)

    with replaced_attribute(optimizer, "apply_gradients", apply_gradients):
        yield


#: Each front end's method that sums gradients over the replicas before an
#: update: Keras 3's TF optimizers, tf-keras's optimizers, tf-keras's legacy
#: (OptimizerV2) ones.
_AGGREGATION_METHODS = ("_all_reduce_sum_gradients", "aggregate_gradients", "_aggregate_gradients")
#: Where a wrapping optimizer (a LossScaleOptimizer) keeps the one it wraps.
_INNER_OPTIMIZERS = ("inner_optimizer", "_optimizer")


@contextlib.contextmanager
def gradient_aggregation_skipped(optimizer: Any, skip: Callable[[], bool]) -> Iterator[None]:
    """Inside, while `skip()` is true, `optimizer` applies gradients as given (already summed).

    Keras 3 sums a replica's gradients over the replicas in
    `_all_reduce_sum_gradients`, tf-keras in `aggregate_gradients`
    (`_aggregate_gradients` for legacy optimizers), each called by the
    optimizer that applies them (the inner one of a LossScaleOptimizer).
    For the block, each is replaced on the instance, for the optimizer and
    those it wraps, by one that returns the gradients unchanged when
    `skip()` is true and sums them as before otherwise. Enter in
    cross-replica context; `skip` is asked at each call, from whichever
    thread makes it (a LossScaleOptimizer applies in replica threads of its
    own).
    """
    with contextlib.ExitStack() as stack:
        seen: set[int] = set()
        current = optimizer
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            for name in _AGGREGATION_METHODS:
                original = getattr(current, name, None)
                if callable(original):
                    stack.enter_context(
                        replaced_attribute(current, name, _skippable(original, skip))
                    )
            current = next(
                (
                    inner
                    for inner in (getattr(current, n, None) for n in _INNER_OPTIMIZERS)
                    if inner is not None and hasattr(inner, "apply_gradients")
                ),
                None,
            )
        yield


def _skippable(aggregate: Callable[..., Any], skip: Callable[[], bool]) -> Callable[..., Any]:
    def aggregate_unless_skipped(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if skip():
            return list(grads_and_vars)
        return aggregate(grads_and_vars, *args, **kwargs)

    return aggregate_unless_skipped


def adjusts_replica_gradients(optimizer: Any) -> bool:
    """Whether Keras 3 changes each replica's part of the gradient before summing the parts.

    Keras 3's `apply` clips (`clipnorm`, `clipvalue`, `global_clipnorm`)
    before its TF optimizer sums the replicas' gradients, and its
    LossScaleOptimizer checks finiteness there too: unlike one device,
    which does both to the whole gradient. (tf-keras sums first.)
    """
    if not _is_keras3_optimizer(optimizer):
        return False
    if getattr(optimizer, "inner_optimizer", None) is not None:  # LossScaleOptimizer
        return True
    return any(
        getattr(optimizer, name, None) is not None
        for name in ("clipnorm", "clipvalue", "global_clipnorm")
    )


def _is_keras3_optimizer(optimizer: Any) -> bool:
    base = sys.modules.get("keras.src.optimizers.base_optimizer")
    return base is not None and isinstance(optimizer, base.BaseOptimizer)


def computes_metrics_as_keras(model: Any) -> bool:
    """Whether `model` computes its logged metrics with Keras's own methods.

    Keras's `compute_metrics` (and tf-keras's `get_metrics_result`) read
    only the metrics' state, made from a step's targets and predictions; an
    override may read anything (the optimizer's step count, the weights),
    so it must run after the update, as Keras orders a step.
    """
    if _is_keras3_model(model):
        trainer = sys.modules["keras.src.trainers.trainer"]
        base: Any = trainer.Trainer
    else:
        training = sys.modules.get("tf_keras.src.engine.training")
        if training is None:
            return False
        base = training.Model
    return all(
        getattr(type(model), name, None) is getattr(base, name, None)
        for name in ("compute_metrics", "get_metrics_result")
    )

