"""Task output, copied line by line to the launcher's streams with a prefix.

    output = TaskOutput(sys.stdout, sys.stderr)
    pump = start_pump(process.stdout, "[worker:1] ", "stdout", output)

Each line a task writes reaches the launcher's stdout or stderr prefixed
with the task (`[worker:1] ...`), whole: lines of different tasks never
interleave. A sink that fails (closed, broken pipe) is dropped and output
for it is discarded, so that pumps keep draining the tasks' pipes and no
task blocks on a full pipe.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO
from typing import TextIO

__all__ = ["TaskOutput", "start_daemon", "start_pump"]


class TaskOutput:
    """Where task output goes: one lock for both streams, whole lines only.

    Args:
      stdout: The sink for task stdout lines.
      stderr: The sink for task stderr lines and launcher messages.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self._sinks: dict[str, TextIO | None] = {
            "stdout": stdout,
            "stderr": stderr,
        }
        self._lock = threading.Lock()

    def write_line(self, stream: str, text: str) -> None:
        """Writes `text` and a newline to `stream` ("stdout" or "stderr")."""
        with self._lock:
            sink = self._sinks[stream]
            if sink is None:
                return
            try:
                sink.write(text + "\n")
                sink.flush()
            except (OSError, ValueError):
                self._sinks[stream] = None


def start_daemon(
    name: str, target: Callable[..., None], *args: object
) -> threading.Thread:
    """Starts `target(*args)` in a daemon thread called `name`."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def start_pump(
    pipe: IO[bytes] | None, prefix: str, stream: str, output: TaskOutput
) -> threading.Thread:
    """Copies `pipe` to `output`'s `stream` in a daemon thread, until EOF.

    Args:
      pipe: A task's stdout or stderr pipe; the thread closes it at EOF.
      prefix: Put before every line, e.g. `"[worker:1] "`.
      stream: "stdout" or "stderr".
      output: Where the lines go.

    Returns:
      The thread; it ends once every process holding the pipe's write end
      has exited or closed it.
    """
    return start_daemon(
        f"tfdist-{prefix.strip(' []')}-{stream}",
        _pump,
        pipe,
        prefix,
        stream,
        output,
    )


def _pump(
    pipe: IO[bytes] | None, prefix: str, stream: str, output: TaskOutput
) -> None:
    if pipe is None:
        return
    with pipe:
        for line in iter(pipe.readline, b""):
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            output.write_line(stream, prefix + text)
