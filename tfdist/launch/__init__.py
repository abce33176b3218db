"""Run a TF_CONFIG job as local processes, or describe it for a real cluster.

Usage::

    python -m tfdist.launch --workers 2 -- python -u train.py   # tfdist-launch

    shape = tfdist.launch.JobShape(2, num_ps=1, has_chief=True)
    cluster = tfdist.launch.make_local_cluster(shape)        # free ports
    result = tfdist.launch.LocalJob(cluster, ["python", "train.py"],
                                    env=dict(os.environ)).run(timeout_s=600)

Modules, one job each:

- `job`: `JobShape` (the job's tasks), `JobKind` (what ends it: the
  multi-worker or the parameter-server rules), `JobResult`/`TaskResult`/
  `JobOutcome` (how it ended).
- `ports`: `make_local_cluster`, a cluster spec of free 127.0.0.1 ports.
- `hosts`: `cluster_from_hosts`, the cluster of a job on real hosts, and
  hosts files (`HOST slots=N` lines: where `run_local_job(hosts_file=...)`
  places the tasks).
- `remote`: `RemoteShell`, how a task is started on its host (ssh);
  `remote_task` is the end that runs there and relays the signals.
- `tfjob`: `tfjob_manifest`, the Kubeflow TFJob of a job.
- `supervisor`: `LocalJob`, which starts the tasks and decides how the job
  ends; `process` (one task's OS process), `output` (prefixed task output)
  and `isolation` (the job's private network namespace) are its parts;
  `preload` forks Python tasks from a template process that has imported
  their heavy modules once (`LocalJob(preload=...)`).
- `restart`: `run_local_job`, the command line's job: restarts after a
  failure, one deadline, forwarded signals, elastic membership
  (`membership`: `--workers MIN:MAX`, slots and hosts files).
- `cli`: `run_cli`, the `tfdist-launch` command line; `__main__` runs it.

This package imports nothing from TensorFlow.
"""

from __future__ import annotations

from tfdist.launch.cli import run_cli
from tfdist.launch.hosts import cluster_from_hosts
from tfdist.launch.job import JobKind
from tfdist.launch.job import JobOutcome
from tfdist.launch.job import JobResult
from tfdist.launch.job import JobShape
from tfdist.launch.job import TaskResult
from tfdist.launch.ports import free_local_address
from tfdist.launch.ports import make_local_cluster
from tfdist.launch.remote import RemoteShell
from tfdist.launch.restart import run_local_job
from tfdist.launch.supervisor import DEFAULT_GRACE_PERIOD_S
from tfdist.launch.supervisor import DEFAULT_WORKER_RESTARTS
from tfdist.launch.supervisor import LocalJob
from tfdist.launch.tfjob import DEFAULT_TFJOB_IMAGE
from tfdist.launch.tfjob import DEFAULT_TFJOB_NAME
from tfdist.launch.tfjob import tfjob_manifest

__all__ = [
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_TFJOB_IMAGE",
    "DEFAULT_TFJOB_NAME",
    "DEFAULT_WORKER_RESTARTS",
    "JobKind",
    "JobOutcome",
    "JobResult",
    "JobShape",
    "LocalJob",
    "RemoteShell",
    "TaskResult",
    "cluster_from_hosts",
    "free_local_address",
    "make_local_cluster",
    "run_cli",
    "run_local_job",
    "tfjob_manifest",
]
