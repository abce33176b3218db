"""Stateless per-epoch permutations: the same on every worker, no messages.

Every random choice of the sharder is a pure function of the user's `seed`,
the epoch number and a fixed key, through TF's stateless RNG:

    epoch_seed  = fold_in([seed, DOMAIN], epoch)
    file order  = index_shuffle(0..F-1, fold_in(epoch_seed, FILE_KEY))
    element at position j of window c (positions c*W .. c*W + n_c - 1):
        c*W + index_shuffle(j - c*W, fold_in(fold_in(epoch_seed, scope), c),
                            n_c - 1)

`scope` is `ELEMENT_SCOPE` for the element policy (every pipeline must agree
on one global order) and `FILE_SCOPE + pipeline id` for the file policy
(each pipeline shuffles its own files' records). `index_shuffle` computes
single entries of a permutation, so a pipeline evaluates only the positions
it owns: O(N / num_input_pipelines) per epoch, no N-sized buffer.
"""

from __future__ import annotations

import tensorflow as tf

# Fixed keys that separate the sharder's random streams from each other and
# from anything else seeded with the user's seed.
_DOMAIN = 0x7466_6469_7374  # "tfdist"
_FILE_KEY = 1
ELEMENT_SCOPE = 2
FILE_SCOPE = 1 << 20


def epoch_seed(seed: int, epoch: tf.Tensor | int) -> tf.Tensor:
    """Returns the stateless RNG seed of one epoch.

    Args:
      seed: The user's seed (any int64).
      epoch: Epoch number, int64 scalar (may be a runtime tensor).

    Returns:
      int64 tensor `[2]`.
    """
    base = tf.constant([seed, _DOMAIN], dtype=tf.int64)
    return tf.random.experimental.stateless_fold_in(
        base, tf.cast(epoch, tf.int64)
    )


def sub_seed(seed: tf.Tensor, *keys: tf.Tensor | int) -> tf.Tensor:
    """Folds `keys` into `seed`, one after the other; int64 `[2]`."""
    for key in keys:
        seed = tf.random.experimental.stateless_fold_in(
            seed, tf.cast(key, tf.int64)
        )
    return seed


def file_order(num_files: int, seed: tf.Tensor, *, shuffle: bool) -> tf.Tensor:
    """Returns the epoch's file order: int64 `[num_files]` of file indices."""
    indices = tf.range(num_files, dtype=tf.int64)
    if not shuffle:
        return indices
    return tf.random.experimental.index_shuffle(
        indices,
        sub_seed(seed, _FILE_KEY),
        tf.constant(num_files - 1, dtype=tf.int64),
    )


def window_rows(
    positions: tf.Tensor,
    *,
    window_start: tf.Tensor | int,
    window_size: tf.Tensor | int,
    seed: tf.Tensor,
    shuffle: bool,
) -> tf.Tensor:
    """Maps epoch positions inside one window to row indices of that window.

    Args:
      positions: int64 tensor of any shape: epoch positions in
        `[window_start, window_start + window_size)`, or -1 for padding.
      window_start: Epoch position of the window's first row.
      window_size: Rows of data in the window, >= 1.
      seed: The window's seed (`sub_seed(epoch_seed, scope, window)`).
      shuffle: Whether to permute within the window (else keep order).

    Returns:
      int64 tensor shaped like `positions`: a row in `[0, window_size)`, or
      `window_size` (the index of the zero row appended after the data) for
      padding.
    """
    window_size = tf.cast(window_size, tf.int64)
    local = positions - tf.cast(window_start, tf.int64)
    is_real = positions >= 0
    if shuffle:
        flat = tf.reshape(tf.where(is_real, local, 0), [-1])
        # index_shuffle rejects an empty index vector (a resumed epoch with
        # nothing left); one dummy entry, cut off after, avoids that.
        permuted = tf.random.experimental.index_shuffle(
            tf.concat([flat, tf.zeros([1], tf.int64)], axis=0),
            seed,
            window_size - 1,
        )[:-1]
        local = tf.reshape(permuted, tf.shape(positions))
    return tf.where(is_real, local, window_size)
