"""A sum over the worker processes of one host, through shared memory.

    group = HostGroup("job-1a2b", rank=0, size=2, timeout_s=300)
    total = group.all_reduce(x, slot=0)   # every rank, same slots in the same order
    group.close()

What `tfdist.MultiWorkerMirroredStrategy` runs for its cross-worker step
when every worker is on one host (its default `transport="auto"`, or
`transport="host_memory"`), instead of TF's
collective all-reduce over gRPC (2.8-3.5x faster for a 1.6 MB bucket
between 2 local workers; the whole step: benchmarks/RESULTS.md,
"transport=host_memory").

Each slot (one gradient bucket of a step) has a segment in `/dev/shm`
holding, twice over, one input row per rank and a result row. A call:

    1. writes this rank's input row (of the slot's buffer for this call's
       parity);
    2. barrier: every rank has written;
    3. sums its own chunk of the columns over the rows, in rank order, into
       the result row (a reduce-scatter: each rank reads W x n / W values);
    4. barrier: every chunk is summed;
    5. copies the whole result out.

Every rank thus gets the same bits. No third barrier: the next call of the
slot uses the other buffer, and a rank can write this buffer again only
after every rank has passed the barrier of a later call, hence copied this
call's result out.

Whether processes share this memory (one host, one /dev/shm: not two
containers with their own) is not known from addresses alone: each rank
writes a fresh random `token` to a file of the group, the ranks exchange
their tokens by another channel (the strategy uses TF's coordination
service) and `shares_memory_with` checks that the peers' files hold them.
Each rank holds a shared lock on its token file while the group lives, so
`remove_stale_groups` can tell the files of a crashed job's group (no
rank locks them) from a live one's.

A barrier is one byte, its value the sender's rank, written to each peer's
FIFO, then one byte from each peer read from this rank's FIFO; bytes a
faster peer sent for the next barrier wait counted in `_early`. A wait is
bounded by `timeout_s` (`CollectiveTimeoutError` naming the ranks that did
not arrive) and ends at once, raising the given error, when `abort` is
called from another thread (the peer watchdog's verdict on a lost task).

Contract: the ranks of a group call `all_reduce` with the same slots, sizes
and dtypes, in the same order, one call at a time in each process (a
`tf.function` runs its stateful ops in program order). After an error the
group is aborted: every later call raises it again.
"""

from __future__ import annotations

import fcntl
import glob
import mmap
import os
import secrets
import select
import stat
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from tfdist import errors

__all__ = ["DIRECTORY", "HostGroup", "available", "remove_stale_groups"]

#: Where the segments and FIFOs live (a tmpfs on Linux).
DIRECTORY = "/dev/shm"


def available(directory: str | None = None) -> bool:
    """Whether this process can create a group's files in `directory` (default `DIRECTORY`)."""
    directory = DIRECTORY if directory is None else directory
    return os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)


class HostGroup:
    """`size` processes of one host that sum arrays through shared memory.

    Args:
      name: The group's name, the same in every rank and unique to the job
        (`tfdist` uses a hash of the cluster): its files are
        `DIRECTORY/tfdist-<name>-*`.
      rank: This process's rank, 0 <= rank < size.
      size: Processes in the group, >= 2.
      timeout_s: Bound on each barrier wait, seconds.
      peer_names: How errors name each rank (e.g. "worker:1"); default
        "rank N".
      directory: Where the files live; default `DIRECTORY`.

    Raises:
      ConfigError: For a rank outside [0, size) or a size below 2.
      OSError: If the group's files cannot be created in the directory.
    """

    def __init__(
        self,
        name: str,
        rank: int,
        size: int,
        *,
        timeout_s: float,
        peer_names: Sequence[str] | None = None,
        directory: str | None = None,
    ) -> None:
        if size < 2 or not 0 <= rank < size:
            raise errors.ConfigError(
                f"a host-memory group needs 2 or more ranks and a rank among them; "
                f"received rank={rank!r}, size={size!r}."
            )
        self._prefix = os.path.join(DIRECTORY if directory is None else directory, f"tfdist-{name}")
        self._rank = rank
        self._size = size
        self._timeout_s = timeout_s
        self._names = list(peer_names) if peer_names is not None else [f"rank {r}" for r in range(size)]
        self._early = [0] * size  # Barrier bytes read ahead of their barrier, per sender.
        self._slots: dict[int, tuple[np.ndarray, int]] = {}  # slot -> (buffers, uses)
        self._maps: list[mmap.mmap] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._calls = 0
        self._closed = False
        self._token = secrets.token_hex(16)
        self._fds: list[int] = []  # Closed by close(): FIFOs, the wake pipe, the token file.
        try:
            self._fifos = [self._open_fifo(r) for r in range(size)]
            self._wake_read, self._wake_write = os.pipe()
            self._fds += [self._wake_read, self._wake_write]
            self._fds.append(self._write_token())
        except BaseException:
            self.close()
            raise
        self._own = self._fifos[rank]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def token(self) -> str:
        """This rank's random token, in its file of the group (see `shares_memory_with`)."""
        return self._token

    def shares_memory_with(self, tokens: Mapping[int, str | None]) -> bool:
        """Whether every peer's token, as it published it, is in its file here.

        Call with every other rank's `token` (None for one not received).
        True means each peer wrote into this process's directory, the same
        memory; since sharing is mutual and transitive, every rank of the
        group gets the same answer from the same tokens.
        """
        for rank in range(self._size):
            if rank == self._rank:
                continue
            try:
                with open(self._token_path(rank)) as f:
                    if tokens.get(rank) is None or f.read() != tokens[rank]:
                        return False
            except OSError:  # Absent, or a file this process may not read: not shared.
                return False
        return True

    @property
    def calls(self) -> int:
        """How many `all_reduce` calls have completed in this process."""
        return self._calls

    def all_reduce(self, x: np.ndarray, slot: int) -> np.ndarray:
        """The sum of every rank's `x` (a flat array), the same bits on every rank.

        Blocks until every rank has called it for this use of `slot`.

        Raises:
          CollectiveTimeoutError: If a peer did not arrive within `timeout_s`
            (`err.task` names the first).
          CollectiveError: The error given to `abort`, if it was called.
        """
        with self._lock:
            if self._error is not None:
                raise self._error
            try:
                result = self._all_reduce(np.ascontiguousarray(x).reshape(-1), slot)
            except BaseException as e:
                self._error = e
                raise
            self._calls += 1
            return result

    def abort(self, error: BaseException) -> None:
        """Makes the wait in progress, and every later call, raise `error`. Any thread."""
        if self._error is None:
            self._error = error
        try:
            os.write(self._wake_write, b"!")
        except OSError:
            pass

    def close(self) -> None:
        """Unmaps the segments and removes the group's files (a peer's open files stay valid).

        Idempotent; the group cannot be used after it.
        """
        if self._closed:
            return
        self._closed = True
        for segment in self._maps:
            try:
                segment.close()
            except BufferError:  # A result still viewed by a caller: left to the GC.
                pass
        for rank in range(self._size):  # A peer that never came leaves its files to this rank.
            _remove(self._fifo_path(rank))
            _remove(self._token_path(rank))
        for slot, (buffers, _) in self._slots.items():
            _remove(self._segment_path(slot, buffers.shape[-1], buffers.dtype))
        for fd in self._fds:  # The token file's last: its lock says the group is alive.
            os.close(fd)
        self._fds.clear()
        self._slots.clear()
        self._maps.clear()

    # -- implementation ------------------------------------------------------

    def _all_reduce(self, x: np.ndarray, slot: int) -> np.ndarray:
        buffers, uses = self._buffers(slot, x.shape[0], x.dtype)
        self._slots[slot] = (buffers, uses + 1)
        rows = buffers[uses % 2]  # [size + 1, n]: the inputs, then the result.
        n = x.shape[0]
        lo, hi = self._rank * n // self._size, (self._rank + 1) * n // self._size
        rows[self._rank] = x
        self._barrier()
        chunk = rows[self._size, lo:hi]
        np.copyto(chunk, rows[0, lo:hi])
        for r in range(1, self._size):
            np.add(chunk, rows[r, lo:hi], out=chunk)
        self._barrier()
        return rows[self._size].copy()

    def _buffers(self, slot: int, n: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
        if slot in self._slots:
            buffers, uses = self._slots[slot]
            if buffers.shape[-1] != n or buffers.dtype != dtype:
                raise errors.ConfigError(
                    f"host-memory slot {slot} holds {buffers.shape[-1]} values of "
                    f"{buffers.dtype}; received {n} of {dtype}. Give each shape its own slot."
                )
            return buffers, uses
        shape = (2, self._size + 1, n)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        # Every rank creates or opens the same file and sizes it alike.
        fd = os.open(self._segment_path(slot, n, dtype), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            segment = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self._maps.append(segment)
        return np.frombuffer(segment, dtype=dtype).reshape(shape), 0

    def _barrier(self) -> None:
        for r, fd in enumerate(self._fifos):
            if r != self._rank:
                os.write(fd, bytes([self._rank]))
        missing = {r for r in range(self._size) if r != self._rank}
        for r in list(missing):
            if self._early[r]:
                self._early[r] -= 1
                missing.discard(r)
        deadline = time.monotonic() + self._timeout_s
        while missing:
            left = deadline - time.monotonic()
            ready = select.select([self._own, self._wake_read], [], [], max(left, 0.0))[0] if left > 0 else []
            if self._wake_read in ready:
                assert self._error is not None
                raise self._error
            if not ready:
                names = [self._names[r] for r in sorted(missing)]
                raise errors.CollectiveTimeoutError(
                    f"a host-memory all-reduce of {self._names[self._rank]} waited more "
                    f"than timeout_s={self._timeout_s:g} s; {', '.join(names)} did not "
                    "arrive at it: stuck, far slower, or running other collectives "
                    "(another model, batch size or number of steps). Check that task's "
                    "log; raise timeout_s if one step can legitimately take longer.",
                    task=names[0],
                )
            for sender in os.read(self._own, 4096):
                if sender in missing:
                    missing.discard(sender)
                else:
                    self._early[sender] += 1

    def _open_fifo(self, rank: int) -> int:
        path = self._fifo_path(rank)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            if not stat.S_ISFIFO(os.lstat(path).st_mode):
                raise errors.ConfigError(
                    f"{path} exists and is not a FIFO; remove it (a file of another program?)."
                ) from None
        # Read-write: never blocks on open, and no end-of-file when a peer closes.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._fds.append(fd)
        return fd

    def _write_token(self) -> int:
        """Writes this rank's token file, locked (shared) while the group lives; returns its fd.

        Written under another name and renamed, so the file is never seen
        unlocked (`remove_stale_groups`).
        """
        path = self._token_path(self._rank)
        scratch = f"{path}.{os.getpid()}"
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.write(fd, self._token.encode())
            os.rename(scratch, path)
        except BaseException:
            os.close(fd)
            _remove(scratch)
            raise
        return fd

    def _fifo_path(self, rank: int) -> str:
        return f"{self._prefix}-fifo-{rank}"

    def _token_path(self, rank: int) -> str:
        return f"{self._prefix}-token-{rank}"

    def _segment_path(self, slot: int, n: int, dtype: np.dtype) -> str:
        return f"{self._prefix}-slot-{slot}-{n}-{np.dtype(dtype).name}"


def remove_stale_groups(directory: str | None = None) -> list[str]:
    """Removes the files of groups no live process holds; returns their names.

    A crashed (or killed) job leaves its group's files in `directory`
    (default `DIRECTORY`). A group is live while any of its ranks holds
    the lock on its token file (from construction to `close`, or the
    process's end); a group none of whose token files is locked is
    removed whole. Any process may call it at any time.
    """
    directory = DIRECTORY if directory is None else directory
    live: dict[str, bool] = {}
    for path in glob.glob(os.path.join(glob.escape(directory), "tfdist-*-token-*")):
        prefix = path.rsplit("-token-", 1)[0]
        if "." in os.path.basename(path) or live.get(prefix):
            continue  # A token being written, or a group already known live.
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # Gone, or another user's.
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            live.setdefault(prefix, False)
        except OSError:
            live[prefix] = True
        finally:
            os.close(fd)
    stale = [prefix for prefix, is_live in live.items() if not is_live]
    for prefix in stale:
        for path in glob.glob(glob.escape(prefix) + "-*"):
            _remove(path)
    return [os.path.basename(prefix)[len("tfdist-"):] for prefix in stale]


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # Gone, or another user's (a sticky directory).
        pass
