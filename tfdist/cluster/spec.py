"""Immutable, validated descriptions of a TF_CONFIG cluster and this task.

Three frozen dataclasses describe what TF_CONFIG says:

- `TaskSpec`: one task of the cluster, `(task_type, task_id)`, named
  `"worker:1"`.
- `ClusterSpec`: the jobs of the cluster, `{"worker": ("host:port", ...)}`.
- `ClusterConfig`: a `ClusterSpec`, the `TaskSpec` of this process and the
  `rpc_layer`; with neither cluster nor task it is the single-process
  `ClusterConfig.local()`.

`Address` parses one `host:port` entry, IPv6 included (`[::1]:2222`).

Every constructor validates its input and raises `ClusterConfigError`, whose
`field` is the dotted TF_CONFIG path of the offending value (`"task.index"`,
`"cluster.worker[1]"`), for a wrong value, and `TypeError` for a Python
argument of the wrong type. `tfdist.cluster.parse_tf_config` builds these
objects from TF_CONFIG text and reports every problem, wrong JSON types
included, as `ClusterConfigError`.

The rules are TensorFlow's (`tensorflow/python/distribute/multi_worker_util`)
made strict and checked up front:

- jobs are among `chief`, `worker`, `ps`, `evaluator`; at most one chief;
  the evaluator, when present, is a job with exactly one address;
- every address is a distinct `host:port` with 1 <= port <= 65535;
- the task's job is in the cluster and its index is in range;
- the training chief is `chief:0`, or `worker:0` when there is no chief job,
  and `num_workers` counts chief and workers, as MultiWorkerMirroredStrategy
  does.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import string
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Literal
from typing import TypeGuard

from tfdist import errors
from tfdist import _validation as validation
from tfdist.cluster import _format

__all__ = [
    "DEFAULT_RPC_LAYER",
    "TASK_TYPES",
    "Address",
    "ClusterConfig",
    "ClusterSpec",
    "TaskSpec",
    "TaskType",
]

#: The job names TensorFlow's multi-worker strategies accept.
TaskType = Literal["chief", "worker", "ps", "evaluator"]

#: Every `TaskType`, in the order jobs are listed and tasks are enumerated.
TASK_TYPES: tuple[TaskType, ...] = ("chief", "worker", "ps", "evaluator")

#: The RPC protocol used when TF_CONFIG names none, as in TensorFlow.
DEFAULT_RPC_LAYER = "grpc"

_MIN_PORT = 1
_MAX_PORT = 65535
# More digits than any valid port; longer strings are never passed to int().
_MAX_PORT_DIGITS = 5
# The longest DNS name.
_MAX_HOST_CHARS = 253
_HOSTNAME_CHARS = frozenset(string.ascii_letters + string.digits + "-._")
_RPC_LAYER_CHARS = frozenset(string.ascii_lowercase + string.digits + "+-._")
# Jobs that may list a single task only.
_SINGLE_TASK_JOBS: tuple[TaskType, ...] = ("chief", "evaluator")

_R = _format.short_repr


def _is_task_type(value: object) -> TypeGuard[TaskType]:
    return isinstance(value, str) and value in TASK_TYPES


def _expected_task_types() -> str:
    return ", ".join(repr(t) for t in TASK_TYPES)


@dataclasses.dataclass(frozen=True)
class Address:
    """A task's network address: a host and a TCP port.

    `host` is a DNS name or IPv4 address (`"10.0.0.1"`, `"worker-0.svc"`), or
    an IPv6 address without brackets (`"::1"`); `str(address)` adds the
    brackets back (`"[::1]:2222"`).

    Attributes:
      host: Host name or IP address, non-empty.
      port: TCP port, 1 <= port <= 65535.

    Example:
      >>> Address.parse("[::1]:2222")
      Address(host='::1', port=2222)
      >>> str(Address("10.0.0.1", 2222))
      '10.0.0.1:2222'
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str):
            raise TypeError(
                f"host must be a str; received host={_R(self.host)} of type "
                f"{type(self.host).__name__}."
            )
        validation.check_int("port", self.port)
        fail = _AddressErrors("address", str(self), field=None)
        _check_host(self.host, fail)
        _check_port(self.port, fail)

    @classmethod
    def parse(cls, text: str) -> Address:
        """Parses `"host:port"`, or `"[ipv6]:port"` for an IPv6 host.

        Args:
          text: The address as written in TF_CONFIG, without a scheme.

        Returns:
          The parsed `Address`.

        Raises:
          TypeError: If `text` is not a str.
          ClusterConfigError: If `text` is not a valid `host:port`: no port,
            a port out of 1..65535, an empty host, an IPv6 host without
            brackets, or a URL scheme such as `grpc://`.

        Example:
          >>> Address.parse("localhost:2222").port
          2222
        """
        return _parse_address(text, name="address", field=None)

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


class _AddressErrors:
    """Builds the ClusterConfigError for a bad address `name`=`text`."""

    def __init__(self, name: str, text: str, field: str | None) -> None:
        self._name = name
        self._text = text
        self._field = field

    def __call__(self, problem: str, fix: str) -> errors.ClusterConfigError:
        return errors.ClusterConfigError(
            f"{self._name}={_R(self._text)} {problem}; expected 'host:port' "
            f"with {_MIN_PORT} <= port <= {_MAX_PORT}, such as "
            f"'10.0.0.1:2222' or '[::1]:2222'. {fix}",
            field=self._field,
        )


def _check_host(host: str, fail: _AddressErrors) -> None:
    """Raises `fail(...)` unless `host` is a DNS name or IP address."""
    if not host:
        raise fail("has an empty host", "Put the task's host name first.")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise fail(
                f"has host {_R(host)}, which is not a valid IPv6 address",
                "Correct the IPv6 address, or use a host name.",
            ) from None
    elif len(host) > _MAX_HOST_CHARS or not _HOSTNAME_CHARS.issuperset(host):
        raise fail(
            f"has host {_R(host)}, which is not a host name or IP address "
            f"(at most {_MAX_HOST_CHARS} of the characters A-Z a-z 0-9 - . _)",
            "Remove spaces and other characters from the host.",
        )


def _check_port(port: int, fail: _AddressErrors) -> None:
    if not _MIN_PORT <= port <= _MAX_PORT:
        raise fail(
            f"has port {_R(port)}, which is out of range",
            "Use the TCP port this task listens on, such as 2222.",
        )


def _parse_address(text: str, *, name: str, field: str | None) -> Address:
    """Parses `text`; errors name it `name` and carry `field`."""
    if not isinstance(text, str):
        raise TypeError(
            f"{name} must be a str; received {name}={_R(text)} of type "
            f"{type(text).__name__}."
        )
    fail = _AddressErrors(name, text, field)
    if "://" in text:
        raise fail(
            "includes a URL scheme",
            "Drop the 'scheme://' prefix; set the protocol with rpc_layer.",
        )
    if text.startswith("["):  # "[ipv6]:port"
        host, bracket, port_text = text[1:].partition("]")
        if not bracket:
            raise fail("has an unclosed '['", "Close it with ']'.")
        if not port_text.startswith(":"):
            raise fail(
                "has no ':port' after the bracketed IPv6 host",
                "Append ':<port>', as in '[::1]:2222'.",
            )
        port_text = port_text[1:]
        if host and ":" not in host:
            raise fail(
                f"has host {_R(host)} in brackets, which is not IPv6",
                "Drop the brackets around a host name or IPv4 address.",
            )
    elif text.count(":") > 1:
        raise fail(
            "has more than one ':'",
            "Write an IPv6 host in brackets, as in '[::1]:2222'.",
        )
    else:
        host, colon, port_text = text.partition(":")
        if not colon:
            raise fail("has no port", "Append ':<port>'.")
    _check_host(host, fail)
    if not port_text:
        raise fail("has no port after ':'", "Append the port number.")
    if not all("0" <= c <= "9" for c in port_text):
        raise fail(
            f"has port {_R(port_text)}, which is not a number",
            "Write the port as decimal digits.",
        )
    significant = port_text.lstrip("0") or "0"
    # More digits than any port is out of range; never pass those to int().
    if len(significant) > _MAX_PORT_DIGITS:
        raise fail(
            f"has port {_R(port_text)}, which is out of range",
            "Use the TCP port this task listens on, such as 2222.",
        )
    port = int(significant)
    _check_port(port, fail)
    return Address(host, port)


def _address_key(address: Address) -> tuple[str, int]:
    """Identifies an address up to host case and IPv6 spelling."""
    if ":" in address.host:
        return (ipaddress.IPv6Address(address.host).compressed, address.port)
    return (address.host.lower(), address.port)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a cluster: its job (`task_type`) and index (`task_id`).

    Attributes:
      task_type: The job, one of `"chief"`, `"worker"`, `"ps"`, `"evaluator"`.
      task_id: The index of the task within its job, >= 0 (TF_CONFIG's
        `task.index`).

    Example:
      >>> TaskSpec("worker", 1).name
      'worker:1'
    """

    task_type: TaskType
    task_id: int

    def __post_init__(self) -> None:
        if not isinstance(self.task_type, str):
            raise TypeError(
                f"task_type must be a str; received task_type="
                f"{_R(self.task_type)} of type {type(self.task_type).__name__}."
            )
        if not _is_task_type(self.task_type):
            raise errors.ClusterConfigError(
                f"task.type={_R(self.task_type)} is not a job TensorFlow "
                f"knows; expected one of {_expected_task_types()}. Set "
                "task.type to the job of this task in the cluster.",
                field="task.type",
            )
        validation.check_int("task_id", self.task_id)
        if self.task_id < 0:
            raise errors.ClusterConfigError(
                f"task.index={_R(self.task_id)} is negative; expected an "
                "index >= 0 into the task's job. Set task.index to the "
                "position of this task's address in its job's list.",
                field="task.index",
            )

    @property
    def name(self) -> str:
        """The task's name, ``<task_type>:<task_id>``, as in ``worker:1``."""
        return f"{self.task_type}:{self.task_id}"


class _JobMap(Mapping[str, tuple[str, ...]]):
    """A read-only, hashable, picklable `{job name: addresses}` mapping."""

    __slots__ = ("_jobs",)

    def __init__(self, jobs: Mapping[str, tuple[str, ...]]) -> None:
        self._jobs = dict(jobs)

    def __getitem__(self, key: str) -> tuple[str, ...]:
        return self._jobs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __hash__(self) -> int:
        return hash(tuple(self._jobs.items()))

    def __repr__(self) -> str:
        return repr(self._jobs)

    def __reduce__(
        self,
    ) -> tuple[type[_JobMap], tuple[dict[str, tuple[str, ...]]]]:
        return (_JobMap, (self._jobs,))


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The jobs of a cluster and the address of every task, validated.

    Jobs are kept in the order chief, worker, ps, evaluator, whatever the
    input order, and each job's addresses as a tuple of the strings given.
    `jobs` is a read-only mapping; the object is hashable and picklable.

    Attributes:
      jobs: `{task_type: ("host:port", ...)}`; at least one job, each with at
        least one address.

    Raises:
      TypeError: If `jobs` is not a mapping of str to a sequence of str.
      ClusterConfigError: If the cluster is empty, names a job other than
        chief, worker, ps or evaluator, lists a job with no addresses, has
        more than one chief or evaluator, or has a malformed or repeated
        address. `field` is the TF_CONFIG path, such as
        `"cluster.worker[1]"`.

    Example:
      >>> cluster = ClusterSpec({"chief": ["h0:2222"], "worker": ["h1:2222"]})
      >>> cluster.num_workers
      2
      >>> cluster.address(TaskSpec("worker", 0))
      'h1:2222'
    """

    jobs: Mapping[str, Sequence[str]]

    def __post_init__(self) -> None:
        jobs = self.jobs
        if not isinstance(jobs, Mapping):
            raise TypeError(
                f"jobs must be a mapping of job name to addresses; received "
                f"jobs={_R(jobs)} of type {type(jobs).__name__}."
            )
        for name in jobs:
            if not isinstance(name, str):
                raise TypeError(
                    f"job names must be str; received {_R(name)} of type "
                    f"{type(name).__name__} in jobs={_R(jobs)}."
                )
            if not _is_task_type(name):
                raise errors.ClusterConfigError(
                    f"cluster has a job named {_R(name)}; expected only "
                    f"{_expected_task_types()}. Rename or remove job "
                    f"{_R(name)}.",
                    field=f"cluster.{name}",
                )
        if not jobs:
            raise errors.ClusterConfigError(
                "cluster={} has no jobs; expected at least one job, as in "
                '{"worker": ["127.0.0.1:2222"]}. List the tasks, or unset '
                "TF_CONFIG to run a single process.",
                field="cluster",
            )
        seen: dict[tuple[str, int], str] = {}
        normalized: dict[str, tuple[str, ...]] = {}
        for task_type in TASK_TYPES:
            if task_type in jobs:
                normalized[task_type] = _check_job(
                    task_type, jobs[task_type], seen
                )
        object.__setattr__(self, "jobs", _JobMap(normalized))

    @property
    def job_names(self) -> tuple[TaskType, ...]:
        """The jobs present, in the order chief, worker, ps, evaluator."""
        return tuple(t for t in TASK_TYPES if t in self.jobs)

    def addresses(self, task_type: str) -> tuple[str, ...]:
        """Returns the addresses of job `task_type`, or `()` if it is absent.

        Args:
          task_type: One of `"chief"`, `"worker"`, `"ps"`, `"evaluator"`.

        Returns:
          The job's `host:port` strings, indexed by `task_id`.

        Raises:
          ClusterConfigError: If `task_type` is not one of the four job names.

        Example:
          >>> ClusterSpec({"worker": ["h0:1", "h1:1"]}).addresses("worker")
          ('h0:1', 'h1:1')
        """
        if not _is_task_type(task_type):
            raise errors.ClusterConfigError(
                f"task_type={_R(task_type)} is not a job TensorFlow knows; "
                f"expected one of {_expected_task_types()}. Pass one of them."
            )
        return tuple(self.jobs.get(task_type, ()))

    def address(self, task: TaskSpec) -> str:
        """Returns the `host:port` of `task`.

        Args:
          task: A task of this cluster.

        Returns:
          The address string exactly as given for the task.

        Raises:
          TypeError: If `task` is not a `TaskSpec`.
          ClusterConfigError: If the task's job is not in the cluster
            (`field="task.type"`) or its index is out of range
            (`field="task.index"`).

        Example:
          >>> ClusterSpec({"worker": ["h0:1"]}).address(TaskSpec("worker", 0))
          'h0:1'
        """
        _check_task_in_cluster(self, task)
        return self.jobs[task.task_type][task.task_id]

    def tasks(self) -> tuple[TaskSpec, ...]:
        """Returns every task: job by job (chief, worker, ps, evaluator).

        Example:
          >>> [t.name for t in ClusterSpec({"worker": ["a:1", "b:1"]}).tasks()]
          ['worker:0', 'worker:1']
        """
        return tuple(
            TaskSpec(task_type, task_id)
            for task_type in self.job_names
            for task_id in range(len(self.jobs[task_type]))
        )

    @property
    def num_tasks(self) -> int:
        """The number of tasks in all jobs."""
        return sum(len(addresses) for addresses in self.jobs.values())

    @property
    def num_workers(self) -> int:
        """Chief plus worker tasks, as MultiWorkerMirroredStrategy counts."""
        return len(self.addresses("chief")) + len(self.addresses("worker"))

    @property
    def num_ps(self) -> int:
        """The number of parameter-server tasks."""
        return len(self.addresses("ps"))

    @property
    def chief_task(self) -> TaskSpec | None:
        """The training chief, ``chief:0``, else ``worker:0``, else `None`.

        This is TensorFlow's rule: without a chief job, worker 0 is chief.
        """
        if "chief" in self.jobs:
            return TaskSpec("chief", 0)
        if "worker" in self.jobs:
            return TaskSpec("worker", 0)
        return None

    def to_dict(self) -> dict[str, list[str]]:
        """Returns the cluster as TF_CONFIG's `"cluster"` value.

        Example:
          >>> ClusterSpec({"worker": ("a:1",)}).to_dict()
          {'worker': ['a:1']}
        """
        return {name: list(addresses) for name, addresses in self.jobs.items()}


def _check_job(
    task_type: TaskType,
    addresses: object,
    seen: dict[tuple[str, int], str],
) -> tuple[str, ...]:
    """Validates one job's address list; records addresses in `seen`."""
    field = f"cluster.{task_type}"
    if isinstance(addresses, (str, bytes)) or not isinstance(
        addresses, Sequence
    ):
        raise TypeError(
            f"{field} must be a sequence of 'host:port' str; received "
            f"{field}={_R(addresses)} of type {type(addresses).__name__}."
        )
    if not addresses:
        raise errors.ClusterConfigError(
            f"{field}=[] lists no tasks; expected at least one 'host:port'. "
            f"Add the task addresses, or remove job {task_type!r}.",
            field=field,
        )
    if task_type in _SINGLE_TASK_JOBS and len(addresses) > 1:
        fix = (
            f"Keep one address in {field} and list the others in "
            "cluster.worker."
            if task_type == "chief"
            else f"Keep one address in {field}; run one evaluator per cluster."
        )
        raise errors.ClusterConfigError(
            f"{field}={_R(list(addresses))} lists {len(addresses)} tasks; "
            f"expected one, since TensorFlow allows at most one {task_type} "
            f"task. {fix}",
            field=field,
        )
    for index, text in enumerate(addresses):
        name = f"{field}[{index}]"
        if not isinstance(text, str):
            raise TypeError(
                f"{name} must be a 'host:port' str; received "
                f"{name}={_R(text)} of type {type(text).__name__}."
            )
        key = _address_key(_parse_address(text, name=name, field=name))
        if key in seen:
            raise errors.ClusterConfigError(
                f"{name}={_R(text)} repeats the address of {seen[key]}; "
                "expected every task to have its own host:port. Give each "
                "task a distinct port or host.",
                field=name,
            )
        seen[key] = name
    return tuple(addresses)


def _check_task_in_cluster(cluster: ClusterSpec, task: TaskSpec) -> None:
    if not isinstance(task, TaskSpec):
        raise TypeError(
            f"task must be a TaskSpec; received task={_R(task)} of type "
            f"{type(task).__name__}."
        )
    if task.task_type not in cluster.jobs:
        names = ", ".join(repr(n) for n in cluster.job_names)
        raise errors.ClusterConfigError(
            f"task.type={task.task_type!r} is not a job of the cluster, which "
            f"has jobs {names}; expected one of those. Add job "
            f"{task.task_type!r} to the cluster, or set task.type to one of "
            "its jobs.",
            field="task.type",
        )
    num_tasks = len(cluster.jobs[task.task_type])
    if task.task_id >= num_tasks:
        raise errors.ClusterConfigError(
            f"task.index={_R(task.task_id)} is out of range for job "
            f"{task.task_type!r} with {num_tasks} task(s); expected "
            f"0 <= index <= {num_tasks - 1}. Set task.index to this task's "
            f"position in cluster.{task.task_type}, or add its address there.",
            field="task.index",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """What TF_CONFIG tells one process: the cluster, its task, the protocol.

    Either both `cluster` and `task` are set, or neither: `ClusterConfig()`
    (also spelled `ClusterConfig.local()`) is a single process with no
    cluster, which is what an unset or empty TF_CONFIG means. A local
    config is its own chief, worker 0 of 1.

    Attributes:
      cluster: Every task's address, or `None` for a single process.
      task: This process's task, which must be in `cluster`; `None` exactly
        when `cluster` is.
      rpc_layer: Protocol between tasks, such as `"grpc"`.

    Raises:
      TypeError: If a field has the wrong type.
      ClusterConfigError: If only one of `cluster` and `task` is set, the
        task is not in the cluster (`field` `"task.type"` or
        `"task.index"`), or `rpc_layer` is empty or malformed.

    Example:
      >>> config = ClusterConfig(
      ...     cluster=ClusterSpec({"worker": ["h0:2222", "h1:2222"]}),
      ...     task=TaskSpec("worker", 1),
      ... )
      >>> config.is_chief, config.worker_index, config.num_workers
      (False, 1, 2)
    """

    cluster: ClusterSpec | None = None
    task: TaskSpec | None = None
    rpc_layer: str = DEFAULT_RPC_LAYER

    def __post_init__(self) -> None:
        if self.cluster is not None and not isinstance(
            self.cluster, ClusterSpec
        ):
            raise TypeError(
                f"cluster must be a ClusterSpec or None; received cluster="
                f"{_R(self.cluster)} of type {type(self.cluster).__name__}."
            )
        if self.task is not None and not isinstance(self.task, TaskSpec):
            raise TypeError(
                f"task must be a TaskSpec or None; received task="
                f"{_R(self.task)} of type {type(self.task).__name__}."
            )
        if not isinstance(self.rpc_layer, str):
            raise TypeError(
                f"rpc_layer must be a str; received rpc_layer="
                f"{_R(self.rpc_layer)} of type {type(self.rpc_layer).__name__}."
            )
        if not self.rpc_layer or not _RPC_LAYER_CHARS.issuperset(
            self.rpc_layer
        ):
            raise errors.ClusterConfigError(
                f"rpc_layer={_R(self.rpc_layer)} is not a protocol name; "
                "expected lower-case letters, digits and '+-._', such as "
                f"{DEFAULT_RPC_LAYER!r}. Omit rpc_layer to use "
                f"{DEFAULT_RPC_LAYER!r}.",
                field="rpc_layer",
            )
        if self.cluster is not None and self.task is None:
            raise errors.ClusterConfigError(
                f"TF_CONFIG has a cluster with jobs "
                f"{', '.join(repr(n) for n in self.cluster.job_names)} but "
                "task=None; expected the task this process runs, as in "
                '"task": {"type": "worker", "index": 0}. Add a task.',
                field="task",
            )
        if self.cluster is None and self.task is not None:
            raise errors.ClusterConfigError(
                f"TF_CONFIG has task={self.task.name!r} but cluster=None; "
                "expected the cluster the task belongs to, as in "
                '"cluster": {"worker": ["127.0.0.1:2222"]}. Add the cluster, '
                "or drop the task to run a single process.",
                field="cluster",
            )
        if self.cluster is not None and self.task is not None:
            _check_task_in_cluster(self.cluster, self.task)

    @classmethod
    def local(cls, rpc_layer: str = DEFAULT_RPC_LAYER) -> ClusterConfig:
        """Returns the config of a single process with no cluster.

        Args:
          rpc_layer: Kept for round trips; a single process makes no RPCs.

        Returns:
          `ClusterConfig(cluster=None, task=None, rpc_layer=rpc_layer)`.

        Example:
          >>> ClusterConfig.local().is_chief
          True
        """
        return cls(rpc_layer=rpc_layer)

    @property
    def is_local(self) -> bool:
        """Whether this is a single process with no cluster."""
        return self.cluster is None

    @property
    def is_chief(self) -> bool:
        """Whether this task is chief, by TensorFlow's rule.

        True for a local config, for `chief:0`, for `worker:0` when the cluster
        has no chief job, and, as in TF's `multi_worker_util.is_chief`, for
        the evaluator, which is chief of its own evaluation; false otherwise.
        """
        if self.cluster is None or self.task is None:
            return True
        if self.task.task_type == "evaluator":
            return True
        return self.task == self.cluster.chief_task

    @property
    def worker_index(self) -> int | None:
        """This task's index among the `num_workers` training workers.

        The chief is 0 and worker `i` is `i + 1` when there is a chief job,
        else `i` (TF's `multi_worker_util.id_in_cluster`); a local config is
        0. `None` for ps and evaluator tasks, which are not training workers.
        """
        if self.cluster is None or self.task is None:
            return 0
        if self.task.task_type == "chief":
            return 0
        if self.task.task_type == "worker":
            return self.task.task_id + len(self.cluster.addresses("chief"))
        return None

    @property
    def num_workers(self) -> int:
        """Chief plus worker tasks in the cluster; 1 for a local config."""
        if self.cluster is None:
            return 1
        return self.cluster.num_workers

    @property
    def address(self) -> str | None:
        """This task's address (``host:port``), or `None` for a local config."""
        if self.cluster is None or self.task is None:
            return None
        return self.cluster.address(self.task)

    def to_dict(self) -> dict[str, object]:
        """Returns the config in TF_CONFIG's structure, ready for `json.dumps`.

        `parse_tf_config(config.to_dict()) == config`. A local config gives
        `{"rpc_layer": ...}` only.

        Example:
          >>> ClusterConfig(
          ...     cluster=ClusterSpec({"worker": ["h0:1"]}),
          ...     task=TaskSpec("worker", 0),
          ... ).to_dict()
          {'cluster': {'worker': ['h0:1']}, 'task': {'type': 'worker', \
'index': 0}, 'rpc_layer': 'grpc'}
        """
        result: dict[str, object] = {}
        if self.cluster is not None and self.task is not None:
            result["cluster"] = self.cluster.to_dict()
            result["task"] = {
                "type": self.task.task_type,
                "index": self.task.task_id,
            }
        result["rpc_layer"] = self.rpc_layer
        return result

    def to_json(self, *, indent: int | None = None) -> str:
        """Returns the config as TF_CONFIG text, for a launcher to export.

        Args:
          indent: Passed to `json.dumps`; `None` writes a single line.

        Returns:
          JSON text that `parse_tf_config` turns back into an equal config.

        Example:
          >>> ClusterConfig.local().to_json()
          '{"rpc_layer": "grpc"}'
        """
        return json.dumps(self.to_dict(), indent=indent)
