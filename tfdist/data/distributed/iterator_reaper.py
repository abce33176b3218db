"""Destroys the tf.data iterators tfdist hands out, off the thread that drops them.

Destroying a tf.data iterator whose pipeline has a stage beyond `shuffle`
and `batch` (a `map`, a `prefetch`), with autotuning on (tf.data's
default), waits for the pipeline's autotuning thread to end its current
sleep: 0.2-0.6 s at every other epoch of a sub-second epoch (TF 2.21,
`benchmarks/epoch_boundary.py` shows it with TensorFlow alone). Keras's
`fit` drops each epoch's iterator on the training thread as it creates the
next one, so the next epoch starts that much later; tfdist's input path
adds a `map` and a `prefetch` to every pipeline, so every tfdist epoch
would pay it.

`adopt(iterator)` keeps one reference more to `iterator`; a daemon thread
checks every `_POLL_S` which adopted iterators nothing else holds and
releases them there, so the wait happens off the training thread. An
iterator is never destroyed while anyone else holds it: only its
destruction moves, by up to `_POLL_S`. The thread ends when it holds
nothing and starts again at the next `adopt`; a forked child starts with
none held.

At interpreter exit (`atexit`, while TensorFlow is still loaded) the
thread starts no destruction more, and exit waits (at most `_EXIT_WAIT_S`)
for the one it has under way: Python tearing its modules down under it
ends the process with SIGABRT (the pipeline's functions hold Python stack
traces, and the thread is stopped inside TensorFlow's destructor when it
asks for the interpreter back; seen at the end of a resumed job across
workers, 2026-11-28). The iterators still held then are left undestroyed:
the process frees them as it ends, and destroying them there would cost
exit what the thread saves `fit` (seconds on a loaded machine, where TF's
threads wait to be scheduled), inside a preempted task's grace period.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time
from typing import Any

__all__ = ["adopt"]

#: How often the thread looks for iterators only it holds (seconds).
_POLL_S = 0.05
#: How long exit waits for a destruction under way (seconds): one took up
#: to 4 s beside four busy processes on 2 cores.
_EXIT_WAIT_S = 30.0

_lock = threading.Lock()
#: Notified (under `_lock`) when the thread ends a destruction.
_idle = threading.Condition(_lock)
_held: list[Any] = []
_thread: threading.Thread | None = None
_destroying = False  # Whether the thread is destroying iterators now.
_exiting = False  # Set at exit: no destruction starts after it.


def adopt(iterator: Any) -> Any:
    """Holds `iterator` until nothing else does, then destroys it off this thread.

    Call it from the thread that created `iterator`, right after `iter()`;
    returns `iterator`. Non-blocking.
    """
    global _thread
    with _lock:
        _held.append(iterator)
        if _thread is None:
            _thread = threading.Thread(
                target=_release_dropped, name="tfdist-iterator-reaper", daemon=True
            )
            _thread.start()
    return iterator


def _reference_counts(items: list[Any]) -> list[int]:
    return [sys.getrefcount(item) for item in items]


#: What `_reference_counts` gives for an object that only its list holds.
_ONLY_IN_LIST = _reference_counts([object()])[0]


def _take_dropped() -> list[Any]:
    """Removes from `_held`, and returns, the iterators nothing else references.

    Marks the thread as destroying while the list returned is not empty
    (until `_end_destruction`). Sets `_thread` to None (so that the calling
    thread ends after releasing them) when nothing is left held, or at
    exit (then nothing is returned). Caller: the reaper thread.
    """
    global _thread, _destroying
    with _lock:
        if _exiting:
            _thread = None
            return []
        counts = _reference_counts(_held)
        dropped = [it for it, n in zip(_held, counts) if n <= _ONLY_IN_LIST]
        _held[:] = [it for it, n in zip(_held, counts) if n > _ONLY_IN_LIST]
        if not _held:
            _thread = None
        _destroying = bool(dropped)
        return dropped


def _end_destruction() -> None:
    global _destroying
    with _lock:
        _destroying = False
        _idle.notify_all()


def _release_dropped() -> None:
    while True:
        time.sleep(_POLL_S)
        dropped = _take_dropped()
        last_round = _thread is not threading.current_thread()
        del dropped  # Destroys them here, waiting as long as TF needs.
        _end_destruction()
        if last_round:
            return


def _stop_at_exit() -> None:
    """Stops destructions, waits for the one under way, leaves the rest undestroyed.

    Registered with `atexit`; returns within `_EXIT_WAIT_S`.
    """
    global _exiting
    with _lock:
        _exiting = True
        _idle.wait_for(lambda: not _destroying, timeout=_EXIT_WAIT_S)
        # One reference more than the list's, which module teardown drops:
        # the held iterators outlive the interpreter.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_held))


def _reset_in_child() -> None:
    global _lock, _idle, _thread, _destroying, _exiting
    _lock = threading.Lock()
    _idle = threading.Condition(_lock)
    _held.clear()
    _thread = None
    _destroying = _exiting = False


atexit.register(_stop_at_exit)
os.register_at_fork(after_in_child=_reset_in_child)
