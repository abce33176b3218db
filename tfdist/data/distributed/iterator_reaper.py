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
none held. At interpreter exit the held iterators are released by `atexit`
(while TensorFlow is still loaded).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Any

__all__ = ["adopt"]

#: How often the thread looks for iterators only it holds (seconds).
_POLL_S = 0.05

_lock = threading.Lock()
_held: list[Any] = []
_thread: threading.Thread | None = None


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

    Sets `_thread` to None (so that the calling thread ends after releasing
    them) when nothing is left held. Caller: the reaper thread.
    """
    global _thread
    with _lock:
        counts = _reference_counts(_held)
        dropped = [it for it, n in zip(_held, counts) if n <= _ONLY_IN_LIST]
        _held[:] = [it for it, n in zip(_held, counts) if n > _ONLY_IN_LIST]
        if not _held:
            _thread = None
        return dropped


def _release_dropped() -> None:
    while True:
        time.sleep(_POLL_S)
        dropped = _take_dropped()
        last_round = _thread is not threading.current_thread()
        del dropped  # Destroys them here, waiting as long as TF needs.
        if last_round:
            return


def _release_all() -> None:
    with _lock:
        held = list(_held)
        _held.clear()
    del held


def _reset_in_child() -> None:
    global _lock, _thread
    _lock = threading.Lock()
    _held.clear()
    _thread = None


atexit.register(_release_all)
os.register_at_fork(after_in_child=_reset_in_child)
