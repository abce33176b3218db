"""Tiny task programs and helpers shared by the tfdist.launch tests.

Tasks are `python -c` programs that import nothing from TensorFlow, so each
starts in a few tens of milliseconds. Tasks that must wait for each other
do so through FIFOs, never by sleeping.
"""

from __future__ import annotations

import io
import os
import random
import socket
import sys
import threading

from absl.testing import absltest

from tfdist.cluster import spec
from tfdist.cluster import tf_config
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import ports as ports_lib
from tfdist.launch import supervisor

#: Bound on how long a job may take, far above what it needs: it catches a
#: hang, not a slow machine.
JOB_BOUND_S = 60.0

#: The repository root: on a template's PYTHONPATH, so that it imports
#: `tests.unit.launch.preloaded`.
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

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

# The task's TF_CONFIG and name ("worker:1"), for the programs below.
_TASK = (
    "import json, os, sys\n"
    "config = json.loads(os.environ['TF_CONFIG'])\n"
    "name = f\"{config['task']['type']}:{config['task']['index']}\"\n"
)

#: A non-chief task says it is up: it closes its FIFO argv[1]/<task name>
#: (`fifos_for_every_task`), which blocks until the chief reads it.
ANNOUNCE = _TASK + "open(os.path.join(sys.argv[1], name), 'w').close()\n"

#: The chief waits until every other task has run ANNOUNCE.
AWAIT_OTHERS = _TASK + (
    "for kind, addresses in config['cluster'].items():\n"
    "    for index in range(len(addresses) if kind != 'chief' else 0):\n"
    "        open(os.path.join(sys.argv[1], f'{kind}:{index}')).read()\n"
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

#: A stand-in for ssh, run as `FAKE_RSH + [host, command]`: on host
#: 127.0.0.1 it runs `command` with /bin/sh here, in a login-like
#: environment (HOME and a system PATH only; stdin, stdout, stderr and the
#: exit status pass through, as over ssh); any other host is unreachable,
#: and it exits 255 as ssh does.
FAKE_RSH = (
    sys.executable,
    "-c",
    "import os, sys\n"
    "host, command = sys.argv[1], ' '.join(sys.argv[2:])\n"
    "if host != '127.0.0.1':\n"
    "    sys.stderr.write(f'ssh: connect to host {host} port 22: No route to host\\n')\n"
    "    sys.exit(255)\n"
    "login = {'HOME': os.environ.get('HOME', '/'), 'PATH': '/usr/bin:/bin'}\n"
    "os.execve('/bin/sh', ['/bin/sh', '-c', command], login)\n",
)


def free_port_block(count: int) -> int:
    """A port P such that P .. P+count-1 were all free on 127.0.0.1 (a hosts file's `--port`).

    Like `make_local_cluster`'s ports, they may be taken again before a task
    binds them; the kernel hands out ephemeral ports from the top of its
    range, so a block picked below it is rarely contested.
    """
    for _ in range(100):
        base = random.randrange(20000, 30000)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"found no {count} free consecutive ports on 127.0.0.1 in 100 tries")


def local_cluster(num_workers: int, **kwargs: object) -> spec.ClusterSpec:
    """`make_local_cluster(JobShape(num_workers, **kwargs))`."""
    return ports_lib.make_local_cluster(
        job.JobShape(num_workers, **kwargs)  # type: ignore[arg-type]
    )


def run_job(
    cluster: spec.ClusterSpec,
    command: list[str],
    *,
    timeout_s: float | None = JOB_BOUND_S,
    **kwargs: object,
) -> tuple[job.JobResult, str, str]:
    """Runs a `LocalJob` (`kwargs` for it; `env` defaults to this
    process's); returns its result, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    kwargs.setdefault("env", dict(os.environ))
    local_job = supervisor.LocalJob(
        cluster,
        command,
        stdout=out,
        stderr=err,
        **kwargs,  # type: ignore[arg-type]
    )
    result = local_job.run(timeout_s=timeout_s)
    return result, out.getvalue(), err.getvalue()


def make_fifos(test: absltest.TestCase, *names: str) -> str:
    """A temporary directory holding a FIFO per name."""
    directory = test.create_tempdir().full_path
    for name in names:
        os.mkfifo(os.path.join(directory, name))
    return directory


def fifos_for_every_task(
    test: absltest.TestCase, cluster: spec.ClusterSpec
) -> str:
    """`make_fifos` with one FIFO per task of `cluster`, named `worker:1`."""
    return make_fifos(test, *(task.name for task in cluster.tasks()))


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


_PRINT_TF_CONFIG = "import os\nprint(os.environ['TF_CONFIG'], flush=True)\n"

#: Prints TF_CONFIG; needs a chief and `fifos_for_every_task` in argv[1].
#: The chief exits only after every other task has printed its own, since
#: a job may stop the others as soon as the chief is done.
PRINT_TF_CONFIG_ALL = by_task(
    {
        "chief": _PRINT_TF_CONFIG + AWAIT_OTHERS,
        "*": _PRINT_TF_CONFIG + ANNOUNCE,
    }
)


#: Prints what the task runs with: its TF_CONFIG and network namespace.
PRINT_LIFE = (
    "import os\n"
    "print('life', os.environ['TF_CONFIG'], os.readlink('/proc/self/ns/net'),"
    " flush=True)\n"
)
#: Worker and ps tasks of a parameter-server job: print what they run with, say they serve, block.
SERVE = PRINT_LIFE + ANNOUNCE + BLOCK_FOREVER
#: Ways for `die_once` to die.
EXIT_1 = "sys.exit(1)"
KILL_ITSELF = "import signal; os.kill(os.getpid(), signal.SIGKILL)"


def die_once(die: str) -> str:
    """Runs `die` on the task's first run (creating file argv[2]), then SERVE."""
    return (
        "import os, sys\n"
        "if not os.path.exists(sys.argv[2]):\n"
        "    open(sys.argv[2], 'w').close()\n"
        f"    {die}\n"
    ) + SERVE


def chief_exiting(code: int) -> str:
    """The chief: waits until every other task serves, exits `code`."""
    return AWAIT_OTHERS + f"sys.exit({code})\n"


def parameter_server_job(
    codes: dict[str, str] | None = None, *, chief_exit_code: int = 0
) -> str:
    """A program for every task of a parameter-server job (`by_task`).

    The chief exits `chief_exit_code` once every other task serves; the
    others SERVE; `codes` replaces either for the tasks it names.
    """
    return by_task(
        {"chief": chief_exiting(chief_exit_code), "*": SERVE, **(codes or {})}
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
