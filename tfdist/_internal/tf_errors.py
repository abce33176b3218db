"""tfdist errors raised out of TF's runtime, and only those (TF private).

When tfdist's watchdog gives up on a peer or on an overdue collective, it
aborts this process's collectives (`coordination.abort_collectives`) with
a message that starts with a marker, `[tfdist:<error class> task=<task>]`.
TF raises the aborted collectives' errors from C++: inside a `tf.function`
(Keras's `fit`) or an eager op. This module turns exactly the errors that
carry the marker into tfdist classes that are also TF's class for their
code (`WorkerUnavailableOpError` is a `tfdist.errors.WorkerUnavailableError`
and a `tf.errors.UnavailableError`), so `except` clauses written for
either catch them. Every other error keeps TF's class.

Where the conversion happens:

- eager collectives tfdist launches or watches: at tfdist's own frame
  around them (`as_tfdist_error`, raised from the TF error);
- TF's own error for a collective that failed before tfdist aborted it
  (e.g. gRPC saw the killed peer's connection close first) carries no
  marker; a `Classifier` (the watchdog's) may then name its cause, which
  is put in front of TF's message with the marker;
- `tf.function` calls (`model.fit`, `evaluate`, `predict`): no tfdist
  frame is on that path (Keras 3's `fit` calls its compiled function
  directly and does not enter the strategy's scope), and TF's C++
  exception registry is initialized once, so a library cannot register
  error subclasses. TF passes every function error through
  `InterpolateRuntimeError.__exit__` (which rewrites the message); the
  hook installed here re-classes an error there *only if* its message
  carries the marker, and tells tfdist's callbacks that a function call
  failed. (Raising into the main thread from the watchdog with
  `PyThreadState_SetAsyncExc` was tried and broke pybind11's error
  normalization.)

Private TF API used (tested range: see setup.py):
`atomic_function.InterpolateRuntimeError.__exit__`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import atomic_function as _atomic_function
from tensorflow.python.eager import context as _context

from tfdist import errors

__all__ = [
    "CollectiveTimeoutOpError",
    "WorkerUnavailableOpError",
    "Classifier",
    "abort_message",
    "marked_op_error",
    "as_tfdist_error",
    "install_function_error_hook",
]

_MARKER = re.compile(r"\[tfdist:(\w+) task=([^\]]*)\]")


def _task_in(message: str) -> str | None:
    match = _MARKER.search(message)
    return (match.group(2) or None) if match else None


class _TfdistOpError:
    """TF's constructor, `task` from the message's marker, pickling by message."""

    _tf_class: type[tf.errors.OpError]
    task: str | None = None

    def __init__(self, node_def: Any, op: Any, message: str, *args: Any) -> None:
        self._tf_class.__init__(self, node_def, op, message, *args)  # type: ignore[arg-type]
        self.task = _task_in(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # node_def and op (a graph Operation) do not pickle; the message does.
        return (type(self), (None, None, self.message))  # type: ignore[attr-defined]


class WorkerUnavailableOpError(
    _TfdistOpError, errors.WorkerUnavailableError, tf.errors.UnavailableError
):
    """A lost peer, raised by TF: tfdist's class and TF's `UnavailableError`."""

    _tf_class = tf.errors.UnavailableError


class CollectiveTimeoutOpError(
    _TfdistOpError, errors.CollectiveTimeoutError, tf.errors.DeadlineExceededError
):
    """An overdue collective, raised by TF: tfdist's class and TF's `DeadlineExceededError`."""

    _tf_class = tf.errors.DeadlineExceededError


_CLASSES: dict[str, tuple[type[tf.errors.OpError], type[tf.errors.OpError]]] = {
    # marker name -> (TF's class it replaces, tfdist's class)
    "WorkerUnavailableError": (tf.errors.UnavailableError, WorkerUnavailableOpError),
    "CollectiveTimeoutError": (tf.errors.DeadlineExceededError, CollectiveTimeoutOpError),
}


def abort_message(
    error_class: type[errors.CollectiveError], task: str | None, message: str
) -> str:
    """The abort message that makes TF's errors become `error_class`.

    Args:
      error_class: `tfdist.errors.WorkerUnavailableError` or
        `CollectiveTimeoutError`.
      task: The task to name in `err.task`, or None.
      message: The text users read.
    """
    if error_class.__name__ not in _CLASSES:
        raise ValueError(f"no TF-raised form of {error_class.__name__}")
    return f"[tfdist:{error_class.__name__} task={task or ''}] {message}"


def marked_op_error(error: errors.CollectiveError) -> tf.errors.OpError:
    """`error` as TF's error of its code, with the marker: raised in a `numpy_function`, it reaches `fit` as tfdist's class."""
    name = (
        "WorkerUnavailableError"
        if isinstance(error, errors.WorkerUnavailableError)
        else "CollectiveTimeoutError"
    )
    tf_class, _ = _CLASSES[name]
    return tf_class(None, None, abort_message(getattr(errors, name), error.task, str(error)))


def _tfdist_class(error: BaseException) -> type[tf.errors.OpError] | None:
    if not isinstance(error, tf.errors.OpError):
        return None
    match = _MARKER.search(str(error.message))
    if match is None or match.group(1) not in _CLASSES:
        return None
    tf_class, tfdist_class = _CLASSES[match.group(1)]
    # UnknownError: what TF makes of any error raised in a numpy_function,
    # where tfdist's host-memory transport raises its marked errors.
    return tfdist_class if isinstance(error, (tf_class, tf.errors.UnknownError)) else None


#: Classifies a TF error without the marker: returns an `abort_message` for
#: it (the error then becomes that tfdist class, the message prepended), or
#: None to leave it alone.
Classifier = Callable[[tf.errors.OpError], "str | None"]


def _classified_message(error: tf.errors.OpError, classify: Classifier | None) -> str:
    """`error`'s message, with the classifier's marked explanation in front if any."""
    message = str(error.message)
    if classify is None or _MARKER.search(message):
        return message
    marked = classify(error)
    return message if marked is None else f"{marked}\n{message}"


def wait_for_pending_ops() -> None:
    """Blocks until the ops this process dispatched have run; raises the first error among them.

    TF's DTensor runs a step asynchronously: the call returns at once and
    an error (a lost peer's aborted collective) surfaces only where a
    result is read, which Keras may never do in `fit`.
    """
    _context.async_wait()


def as_tfdist_error(
    error: tf.errors.OpError, classify: Classifier | None = None
) -> tf.errors.OpError:
    """`error` as tfdist's class if it carries (or `classify` gives) the marker.

    Returns a new instance (raise it `from error`) or `error` itself, which
    is never changed.
    """
    message = _classified_message(error, classify)
    candidate = type(error)(error.node_def, error.op, message) if message != str(
        error.message
    ) else error
    tfdist_class = _tfdist_class(candidate)
    if tfdist_class is None:
        return error
    return tfdist_class(error.node_def, error.op, message)


#: Called after any `tf.function` call raises (see the module docstring).
_function_error_callbacks: list[Callable[[BaseException], None]] = []
_classifiers: list[Classifier] = []


def install_function_error_hook(
    on_error: Callable[[BaseException], None], classify: Classifier | None = None
) -> Callable[[], None]:
    """Re-classes tfdist's errors of `tf.function` calls; calls `on_error(error)` on any.

    An error of a `tf.function` call becomes tfdist's class if its message
    carries the marker or `classify` returns a marked message for it (then
    put in front of TF's). `on_error(error)` (the error, re-classed) runs
    in the thread that made the failed call, before the error reaches its
    caller. Must be installed
    before the calls it should affect start (Python binds a `with` block's
    `__exit__` on entry).

    Returns:
      A function that removes `on_error` and `classify` (and the hook, when
      no callback is left: TF's class is then as it was).
    """
    interpolate = _atomic_function.InterpolateRuntimeError
    if not _function_error_callbacks:
        original_exit = interpolate.__exit__

        def exit_with_tfdist_errors(self: Any, typ: Any, exc: Any, tb: Any) -> Any:
            if isinstance(exc, tf.errors.OpError):
                for classify_one in list(_classifiers):
                    message = _classified_message(exc, classify_one)
                    if message != str(exc.message):
                        exc._message = message
                        break
                tfdist_class = _tfdist_class(exc)
                if tfdist_class is not None:
                    exc.__class__ = tfdist_class
                    exc.task = _task_in(str(exc.message))
            if exc is not None:
                for callback in list(_function_error_callbacks):
                    callback(exc)
            return original_exit(self, typ, exc, tb)

        exit_with_tfdist_errors.__wrapped__ = original_exit  # type: ignore[attr-defined]
        interpolate.__exit__ = exit_with_tfdist_errors
    _function_error_callbacks.append(on_error)
    if classify is not None:
        _classifiers.append(classify)

    def uninstall() -> None:
        if on_error in _function_error_callbacks:
            _function_error_callbacks.remove(on_error)
        if classify is not None and classify in _classifiers:
            _classifiers.remove(classify)
        if not _function_error_callbacks:
            hooked = interpolate.__exit__
            interpolate.__exit__ = getattr(hooked, "__wrapped__", hooked)

    return uninstall
