"""Keras internals the parameter-server strategy relies on (Keras 3 and tf-keras).

Neither Keras 3 nor tf-keras (with tfdist's strategy, which keeps it off
TF's ClusterCoordinator path) runs a step anywhere but on the chief. tfdist
takes over, per model instance and only for models built under its
strategy, the functions `fit`, `evaluate` and `predict` call:

1. `calling_model()` finds the model whose `fit`/`evaluate`/`predict` (or
   tf-keras's `*_on_batch`) is calling `strategy.experimental_distribute_dataset`:
   a bounded walk up the Python stack to the frame of one of those Keras
   methods (`TFEpochIterator.__init__` in Keras 3 and the `DataHandler`
   in tf-keras call the strategy from inside them).
2. `install_functions(model, ...)` sets, on that model instance only,
   `make_train_function`, `make_test_function`, `make_predict_function`
   (returning tfdist's functions) and `get_metrics_result` (which Keras
   calls once after an epoch's steps: tfdist's epoch barrier).
3. `make_counters_exact(variables)`: Keras 3's `KerasVariable.assign_add`
   is `self.assign(self + value)`, a read-modify-write that loses
   concurrent updates from several workers (150 steps counted as 126). On
   the given variable instances only, `assign_add`/`assign_sub` become
   TF's atomic `AssignAddVariableOp` on the underlying `tf.Variable`.
   `make_counter_exact(creating_keras3_variable())` does the same, from
   the strategy's variable creator, for every Keras 3 variable created in
   its scope (so custom loops on `ClusterCoordinator` count exactly too).
   Other variables, and other libraries' variables, are untouched.

Private Keras API used (checked by tests/unit/strategies/
parameter_server_keras_test.py, which fails if Keras changes it):

- Keras 3: `keras.src.backend.tensorflow.trainer.TensorFlowTrainer`
  (`fit`, `evaluate`, `predict`, `train_step`, `test_step`,
  `predict_step`), `KerasVariable._value`, `keras.src.backend.common.
  stateless_scope.in_stateless_scope`, the TF backend's
  `core.Variable._initialize` (the frame a variable creation is found
  from), an `EpochIterator`'s `data_adapter.num_batches`;
- tf-keras: `tf_keras.src.engine.training.Model` (`fit`, `evaluate`,
  `predict`, `train_on_batch`, `test_on_batch`, `predict_on_batch`),
  `Model._steps_per_execution`, `Model._train_counter`,
  `Model._test_counter`, `Model._predict_counter`, a `DataHandler`'s
  `_adapter.get_size()`.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from types import CodeType, FrameType
from typing import Any

import tensorflow as tf

__all__ = [
    "KerasCall",
    "calling_model",
    "data_batches",
    "frames_up",
    "increment_step_counter",
    "install_functions",
    "is_keras3_model",
    "make_counters_exact",
    "make_counter_exact",
    "creating_keras3_variable",
    "pin_to_ps",
    "pinned_ps",
    "steps_per_execution",
]

#: How many frames up a stack walk of this module looks (from `experimental_distribute_dataset`,
#: or a step function called by a Keras loop).
_MAX_FRAMES = 12
#: Keras methods that distribute a dataset for one loop, by front end.
_KERAS3_METHODS = ("fit", "evaluate", "predict")
_TF_KERAS_METHODS = (
    "fit",
    "evaluate",
    "predict",
    "train_on_batch",
    "test_on_batch",
    "predict_on_batch",
)
#: Marks a model whose functions are tfdist's (value: the owner object).
_INSTALLED = "_tfdist_parameter_server_loop"
#: Attribute of a Keras 3 variable: the ps task its storage goes to (`pin_to_ps`).
_PINNED = "_tfdist_pinned_ps"


@dataclasses.dataclass(frozen=True)
class KerasCall:
    """A Keras loop that is distributing a dataset.

    Attributes:
      model: The Keras model.
      method: "fit", "evaluate", "predict", or tf-keras's "train_on_batch",
        "test_on_batch", "predict_on_batch".
      keras3: Whether it is a Keras 3 model (else tf-keras).
    """

    model: Any
    method: str
    keras3: bool


def _unwrapped_code(cls: type, name: str) -> CodeType | None:
    function = inspect.unwrap(getattr(cls, name))
    return getattr(function, "__code__", None)


def _method_codes() -> dict[CodeType, tuple[str, bool]]:
    """Code object of each Keras loop method -> (method name, is Keras 3)."""
    codes: dict[CodeType, tuple[str, bool]] = {}
    for module_name, class_name, names, keras3 in (
        ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", _KERAS3_METHODS, True),
        ("tf_keras.src.engine.training", "Model", _TF_KERAS_METHODS, False),
    ):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name in names:
            code = _unwrapped_code(getattr(module, class_name), name)
            if code is not None:
                codes[code] = (name, keras3)
    return codes


def calling_model() -> KerasCall | None:
    """The Keras model whose loop method is on the stack, or None.

    Looks at most `_MAX_FRAMES` frames above the caller of the function
    calling this one, for the frame of Keras's `fit`/`evaluate`/`predict`
    (or tf-keras's `*_on_batch`) and returns its `self`.
    """
    codes = _method_codes()
    if not codes:
        return None
    for frame in frames_up(2):
        found = codes.get(frame.f_code)
        if found is not None:
            model = frame.f_locals.get("self")
            if model is None:
                return None
            return KerasCall(model=model, method=found[0], keras3=found[1])
    return None


def frames_up(skip: int, limit: int = _MAX_FRAMES) -> Iterator[FrameType]:
    """The caller's frames from its `sys._getframe(skip)` up, at most `limit` (a bounded walk)."""
    frame: FrameType | None = sys._getframe(skip + 1)
    for _ in range(limit):
        if frame is None:
            return
        yield frame
        frame = frame.f_back


def data_batches() -> int | None:
    """Batches per pass of the data Keras is distributing, as its data adapter counts them; or None.

    Keras makes a dataset of unknown cardinality from arrays (`fit(x, y)`:
    `tf.data` cannot count through its `flat_map`) but knows its batches.
    Looks at most `_MAX_FRAMES` frames above the caller of the function
    calling this one for the object distributing it: a Keras 3
    `EpochIterator` (its `data_adapter.num_batches`) or a tf-keras
    `DataHandler` (its `_adapter.get_size()`).
    """
    for frame in frames_up(2):
        owner: Any = frame.f_locals.get("self")
        size: Any
        if hasattr(owner, "data_adapter"):  # Keras 3.
            size = getattr(owner.data_adapter, "num_batches", None)
        elif type(owner).__name__ == "DataHandler":  # tf-keras.
            get_size = getattr(getattr(owner, "_adapter", None), "get_size", None)
            size = get_size() if callable(get_size) else None
        else:
            continue
        return size if isinstance(size, int) and size > 0 else None
    return None


def is_keras3_model(model: Any) -> bool:
    """Whether `model` is a Keras 3 model (else tf-keras)."""
    trainer = sys.modules.get("keras.src.backend.tensorflow.trainer")
    return trainer is not None and isinstance(model, trainer.TensorFlowTrainer)


def installed_owner(model: Any) -> Any:
    """The object `install_functions` was given for `model`, or None."""
    return vars(model).get(_INSTALLED)


def install_functions(
    model: Any,
    owner: Any,
    *,
    train: Callable[[Any], Any],
    test: Callable[[Any], Any],
    predict: Callable[[Any], Any],
    metrics_barrier: Callable[[], None],
) -> None:
    """Makes `model`'s loops call tfdist's step functions (this instance only).

    Idempotent per `owner`. `metrics_barrier()` runs before Keras reads the
    metrics after an epoch's steps (never inside a traced function, where
    Keras's own `train_step` reads them too).
    """
    if vars(model).get(_INSTALLED) is owner:
        return
    keras_get_metrics_result = type(model).get_metrics_result

    def make(function: Callable[[Any], Any], attribute: str) -> Callable[..., Any]:
        def make_function(force: bool = False) -> Callable[[Any], Any]:
            del force
            setattr(model, attribute, function)
            return function

        return make_function

    def get_metrics_result() -> Any:
        if not tf.inside_function():
            metrics_barrier()
        return keras_get_metrics_result(model)

    object.__setattr__(model, _INSTALLED, owner)
    for attribute, function in (
        ("train_function", train),
        ("test_function", test),
        ("predict_function", predict),
    ):
        object.__setattr__(model, attribute, None)
        object.__setattr__(
            model, f"make_{attribute}", make(function, attribute)
        )
    object.__setattr__(model, "get_metrics_result", get_metrics_result)


def _exact_assign(variable: Any, keras_method: Callable[[Any], Any], sign: int) -> Callable[[Any], Any]:
    from keras.src.backend.common import stateless_scope

    def assign(value: Any) -> Any:
        target = getattr(variable, "_value", None)
        if stateless_scope.in_stateless_scope() or not isinstance(target, tf.Variable):
            return keras_method(value)  # Not a whole tf.Variable: Keras's own.
        delta = tf.cast(value, target.dtype)
        if delta.shape != target.shape:
            delta = tf.broadcast_to(delta, tf.shape(target))
        if sign > 0:
            result = target.assign_add(delta)
        else:
            result = target.assign_sub(delta)
        return tf.convert_to_tensor(result) if isinstance(result, tf.Variable) else result

    return assign


def make_counters_exact(variables: Iterable[Any]) -> int:
    """Makes `assign_add`/`assign_sub` of these Keras 3 variables atomic.

    Only Keras 3 variables backed by an unpartitioned `tf.Variable` change;
    others (tf-keras's `tf.Variable`s, already atomic) are skipped.
    Idempotent. Returns how many variables changed.
    """
    common = sys.modules.get("keras.src.backend.common.variables")
    if common is None:
        return 0
    changed = 0
    for variable in variables:
        if not isinstance(variable, common.Variable):
            continue
        if "assign_add" in vars(variable) or not isinstance(
            getattr(variable, "_value", None), tf.Variable
        ):
            continue
        _patch_exact(variable)
        changed += 1
    return changed


def make_counter_exact(variable: Any) -> bool:
    """Makes one Keras 3 variable exact (`make_counters_exact`), even before it has a value.

    For a strategy's variable creator, with the variable
    `creating_keras3_variable()` found: its `tf.Variable` is not assigned
    yet, so the patched methods look it up at each call (and use Keras's
    own for anything but a whole `tf.Variable`). So every Keras 3 variable
    created in the strategy's scope (a model's, its optimizer's, a
    metric's) counts exactly wherever it is updated from, custom loops on
    `ClusterCoordinator` included, not only in the Keras loops tfdist
    drives.

    Returns:
      Whether it changed (False if `variable` is None or already exact).
    """
    if variable is None or "assign_add" in vars(variable):
        return False
    _patch_exact(variable)
    return True


def creating_keras3_variable() -> Any:
    """The Keras 3 variable whose `tf.Variable` is being created, or None.

    Called from a strategy's variable creator: looks at most `_MAX_FRAMES`
    frames up for Keras 3's TF-backend `Variable._initialize`.
    """
    core = sys.modules.get("keras.src.backend.tensorflow.core")
    initialize = getattr(getattr(core, "Variable", None), "_initialize", None)
    code = getattr(initialize, "__code__", None)
    if code is None:
        return None
    for frame in frames_up(1):
        if frame.f_code is code:
            return frame.f_locals.get("self")
    return None


def pin_to_ps(variable: Any, index: int) -> None:
    """Marks a Keras 3 variable not created yet (Keras defers it): its `tf.Variable` goes to ps `index`."""
    setattr(variable, _PINNED, index)


def pinned_ps(variable: Any) -> int | None:
    """The ps task `pin_to_ps` marked `variable` (None: no variable, or not marked)."""
    return getattr(variable, _PINNED, None)


def _patch_exact(variable: Any) -> None:
    keras_add = variable.assign_add
    keras_sub = variable.assign_sub
    object.__setattr__(variable, "assign_add", _exact_assign(variable, keras_add, +1))
    object.__setattr__(variable, "assign_sub", _exact_assign(variable, keras_sub, -1))


def steps_per_execution(model: Any) -> int:
    """Batches the model's train/test/predict function takes in the call being made.

    To be called by that function. tf-keras keeps the count in a variable
    (on a ps task under a parameter-server strategy), which its
    `DataHandler` reads before each call and lowers for a last, partial
    group of steps; the handler's `_step_increment` holds the count minus
    one. So it is taken from the `data_handler` of the calling `fit`,
    `evaluate` or `predict` (at most `_MAX_FRAMES` frames up) rather than
    read from the ps again; the variable is read only outside those loops
    (`train_on_batch` ...).
    """
    if is_keras3_model(model):
        return int(model.steps_per_execution)
    variable = getattr(model, "_steps_per_execution", None)
    if variable is None:
        return 1
    for frame in frames_up(1):
        handler: Any = frame.f_locals.get("data_handler")
        if (
            type(handler).__name__ == "DataHandler"
            and getattr(handler, "_steps_per_execution", None) is variable
            and isinstance(getattr(handler, "_step_increment", None), int)
        ):
            return int(handler._step_increment) + 1
    return int(variable.numpy())


def increment_step_counter(model: Any, kind: str, steps: int) -> None:
    """tf-keras's per-loop step counters (`_train_counter` ...), as its own functions do.

    tf-keras's `BackupAndRestore` (with `save_freq` in steps) and
    `_maybe_load_initial_counters_from_ckpt` read `_train_counter`; Keras 3
    has no such counters.
    """
    if is_keras3_model(model):
        return
    counter = getattr(model, f"_{kind}_counter", None)
    if counter is not None:
        counter.assign_add(steps)
