"""Building ops under a chosen global seed, without touching the user's (TF private).

TF derives the seeds of ops created without one from its global seed
(`tf.random.set_seed`): eager ops draw an op seed from a generator seeded
by it, and functions traced meanwhile take it as their graph seed. A
`dataset_fn` run under `global_seed(s)` therefore builds the same shuffles
and random ops, with the same seeds, on every worker. `tf.random.set_seed`
cannot be used for this: it also clears TF's kernel caches (resetting the
user's eager random sequences), and the previous global seed could not be
put back.

Private TF API used (tested range: see setup.py): the eager context's
`_seed` and `_rng` attributes (what `tf.random.set_seed` sets).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from tensorflow.python.eager import context as _context

__all__ = ["global_seed"]


@contextlib.contextmanager
def global_seed(seed: int) -> Iterator[None]:
    """Inside, ops built without a seed get seeds derived from `seed`.

    Restores the previous global seed (set or not) and its op-seed sequence
    on exit. Not thread-safe: build nothing random in other threads
    meanwhile.
    """
    context = _context.context()
    saved = (context._seed, getattr(context, "_rng", None))
    context._seed = seed
    context._rng = random.Random(seed)
    try:
        yield
    finally:
        context._seed, context._rng = saved
