"""Tiny task programs and helpers shared by the tfdist.launch tests.

Tasks are `python -c` programs that import nothing from TensorFlow, so each
starts in a few tens of milliseconds. Tasks that must wait for each other
do so through FIFOs, never by sleeping.
"""

from __future__ import annotations

import io
import os
import sys
import threading

from absl.testing import absltest

from tfdist.cluster import spec
from tfdist.cluster import tf_config
from tfdist.launch import isolation

#: Bound on how long a job may take, far above what it needs: it catches a
#: hang, not a slow machine.
JOB_BOUND_S = 60.0

BLOCK_FOREVER = "import threading; threading.Event().wait()"

#: Prints "ready" once SIGINT and SIGTERM would end it, then blocks. SIGINT
#: gets the kernel's default action, not Python's KeyboardInterrupt handler:
#: what is tested is that the launcher delivers the signal. (Twice in the
#: full suite, never alone, a task was still alive 30 s after its SIGINT with
#: Python's handler; the cause was not found.)
READY_THEN_BLOCK = (
    "import os, signal, threading; signal.signal(signal.SIGINT, "
    "signal.SIG_DFL); print('ready', os.getpid(), flush=True); "
    "threading.Event().wait()"
)

#: Prints TF_CONFIG. The chief exits only after the ps and evaluator tasks
#: have printed theirs (each closes its FIFO in argv[1] after printing),
#: since the job stops those tasks as soon as the chief and workers are done.
PRINT_TF_CONFIG_ALL = (
    "import json, os, sys\n"
    "print(os.environ['TF_CONFIG'], flush=True)\n"
    "kind = json.loads(os.environ['TF_CONFIG'])['task']['type']\n"
    "if kind in ('ps', 'evaluator'):\n"
    "    open(os.path.join(sys.argv[1], kind), 'w').close()\n"
    "elif kind == 'chief':\n"
    "    for other in ('ps', 'evaluator'):\n"
    "        open(os.path.join(sys.argv[1], other)).read()\n"
)

#: Exits 3 the first time a task runs it (creating the file argv[1]), 0
#: after that.
FAIL_ONCE = (
    "import sys\n"
    "try:\n"
    "    open(sys.argv[1], 'x').close()\n"
    "except FileExistsError:\n"
    "    sys.exit(0)\n"
    "sys.exit(3)\n"
)


def make_fifos(test: absltest.TestCase, *names: str) -> str:
    """A temporary directory holding a FIFO per name (default: ps, evaluator)."""
    directory = test.create_tempdir().full_path
    for name in names or ("ps", "evaluator"):
        os.mkfifo(os.path.join(directory, name))
    return directory


def skip_without_network_namespaces(test: absltest.TestCase) -> None:
    """Skips `test`, saying why, where this OS refuses network namespaces."""
    reason = isolation.unavailable_reason()
    if reason is not None:
        test.skipTest(f"this OS refuses network namespaces: {reason}")


def python(code: str, *args: str) -> list[str]:
    """The command running `code` with this interpreter, with `args`."""
    return [sys.executable, "-c", code, *args]


def by_task(codes: dict[str, str]) -> str:
    """Code that runs `codes["<type>:<index>"]`, or `codes["<type>"]`, or
    `codes["*"]`, chosen from TF_CONFIG; nothing if none matches."""
    return (
        "import json, os\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
        "name = f\"{task['type']}:{task['index']}\"\n"
        f"codes = {codes!r}\n"
        "code = codes.get(name, codes.get(task['type'], codes.get('*')))\n"
        "if code is not None:\n"
        "    exec(code)\n"
    )


def prefixed_tf_configs(out: str) -> dict[str, spec.ClusterConfig]:
    """Parses `[task] {TF_CONFIG}` lines into task name -> config."""
    configs = {}
    for line in out.splitlines():
        prefix, text = line.split(" ", 1)
        configs[prefix.strip("[]")] = tf_config.parse_tf_config(text)
    return configs


class ReadySink(io.StringIO):
    """A StringIO that sets `ready` once `count` lines contain `marker`."""

    def __init__(self, marker: str, count: int) -> None:
        super().__init__()
        self.ready = threading.Event()
        self._marker = marker
        self._remaining = count

    def write(self, text: str) -> int:
        if self._marker in text:
            self._remaining -= 1
            if self._remaining == 0:
                self.ready.set()
        return super().write(text)
