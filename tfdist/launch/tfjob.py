"""The Kubeflow manifest of a job (`tfdist-launch --emit tfjob`).

    print(tfjob_manifest(["python", "train.py"], JobShape(4, has_chief=True),
                         name="train", image="registry/me/train:1"))

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from tfdist import errors
from tfdist import _validation as validation
from tfdist.cluster import spec
from tfdist.launch import job

__all__ = ["DEFAULT_TFJOB_IMAGE", "DEFAULT_TFJOB_NAME", "tfjob_manifest"]

#: Container image `tfjob_manifest` uses unless told otherwise. It has
#: TensorFlow but neither tfdist nor your script: pass your own image.
DEFAULT_TFJOB_IMAGE = "tensorflow/tensorflow:latest"

#: TFJob name `tfjob_manifest` uses unless told otherwise.
DEFAULT_TFJOB_NAME = "tfdist-job"

# A Kubernetes object name that also works in the Services the operator
# makes from it (RFC 1035 label: starts with a letter, at most 63).
_K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_K8S_NAME_MAX_CHARS = 63
# The label the Kubeflow training operator puts on every pod of a job.
_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
# Appended to the TFJob's name to name its NetworkPolicy.
_POLICY_SUFFIX = "-same-job-only"
# Kubeflow's replica type for each TF_CONFIG job.
_TFJOB_REPLICA_TYPES = {
    "chief": "Chief",
    "worker": "Worker",
    "ps": "PS",
    "evaluator": "Evaluator",
}


def tfjob_manifest(
    command: Sequence[str],
    shape: job.JobShape,
    *,
    name: str = DEFAULT_TFJOB_NAME,
    image: str = DEFAULT_TFJOB_IMAGE,
    restarts: int | None = None,
    timeout_s: float | None = None,
    network_policy: bool = True,
    min_workers: int | None = None,
) -> str:
    """Returns Kubeflow `TFJob` (kubeflow.org/v1) YAML for a job of `shape`.

    Each replica type (Chief, Worker, PS, Evaluator) runs `command` in a
    container named `tensorflow` with `restartPolicy: OnFailure`; the
    Kubeflow training operator writes every pod's TF_CONFIG. Every pod
    template is labelled `training.kubeflow.org/job-name: <name>` (the
    operator sets the same label). `restarts` becomes
    `runPolicy.backoffLimit` and `timeout_s` `runPolicy.activeDeadlineSeconds`
    (rounded up).

    With `network_policy`, a second document follows: a
    `networking.k8s.io/v1` `NetworkPolicy` named `<name>-same-job-only` that
    admits ingress to the job's pods only from the job's own pods (both
    selected by that label). TensorFlow's gRPC servers accept anyone who
    reaches their port; the policy keeps other pods of the cluster out,
    where the cluster's network plugin enforces NetworkPolicies.

    Args:
      command: The program and its arguments, non-empty.
      shape: The job's tasks.
      name: The TFJob's name: lower-case letters, digits and '-', starting
        with a letter, at most 63 characters.
      image: Container image holding TensorFlow, tfdist and the script.
      restarts: Retries of the job after a failure, or `None` for the
        operator's default.
      timeout_s: Deadline for the whole job in seconds, or `None`.
      network_policy: Whether to add the NetworkPolicy document.
      min_workers: An elastic job's fewest workers (`tfdist-launch
        --workers MIN:MAX`). Kubeflow's TFJob cannot carry it: its elastic
        policy (minReplicas/maxReplicas) is PyTorchJob's only, and its
        `enableDynamicWorker` gives each worker a TF_CONFIG without the
        other workers (for parameter-server jobs), which a multi-worker
        job cannot run on. The manifest then runs `shape.num_workers`
        (MAX) replicas and says so in a comment; a pod that is preempted
        or fails is restarted (`OnFailure`) and the script resumes from
        its `tfdist.elastic` state.

    Returns:
      YAML text: one document, or two separated by `---` (its strings are
      JSON-quoted, which YAML reads as is).

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `command` is empty or `name`/`image` is not usable
        in Kubernetes.

    Example:
      >>> text = tfjob_manifest(["python", "train.py"], JobShape(2))
      >>> "kind: TFJob" in text and "kind: NetworkPolicy" in text
      True
    """
    if not isinstance(shape, job.JobShape):
        raise TypeError(
            f"shape must be a JobShape; received shape={shape!r} of type "
            f"{type(shape).__name__}."
        )
    argv = job.check_command(command)
    if not isinstance(name, str) or not isinstance(image, str):
        raise TypeError(
            f"name and image must be str; received name={name!r}, "
            f"image={image!r}."
        )
    if len(name) > _K8S_NAME_MAX_CHARS or not _K8S_NAME.match(name):
        raise errors.LauncherError(
            f"name={name!r} is not a valid TFJob name; expected lower-case "
            "letters, digits and '-', starting with a letter and ending with "
            f"a letter or digit, at most {_K8S_NAME_MAX_CHARS} characters. "
            f"Pass a name such as {DEFAULT_TFJOB_NAME!r}."
        )
    if not image or any(c.isspace() for c in image):
        raise errors.LauncherError(
            f"image={image!r} is not a container image reference; expected "
            "e.g. 'registry.example.com/team/train:1.0'. Pass the image that "
            "holds TensorFlow, tfdist and your script."
        )
    if restarts is not None:
        restarts = validation.check_non_negative_int(
            "restarts", restarts, error=errors.LauncherError
        )
    if timeout_s is not None:
        timeout_s = validation.check_positive_number("timeout_s", timeout_s)
    if not isinstance(network_policy, bool):
        raise TypeError(
            f"network_policy must be a bool; received "
            f"network_policy={network_policy!r}."
        )
    counts = {
        "chief": int(shape.has_chief),
        "worker": shape.num_workers,
        "ps": shape.num_ps,
        "evaluator": int(shape.has_evaluator),
    }
    quote = _yaml_string
    label = f"{_JOB_NAME_LABEL}: {quote(name)}"
    if min_workers is not None:
        min_workers = validation.check_positive_int(
            "min_workers", min_workers, error=errors.LauncherError
        )
    lines = [
        "# Generated by tfdist-launch. The Kubeflow training operator sets",
        "# TF_CONFIG in every replica.",
        "apiVersion: kubeflow.org/v1",
        "kind: TFJob",
        "metadata:",
        f"  name: {quote(name)}",
        "spec:",
    ]
    if min_workers is not None and min_workers < shape.num_workers:
        lines[2:2] = [
            f"# Elastic range {min_workers}:{shape.num_workers} workers: a TFJob has no",
            "# minimum for a multi-worker job (Kubeflow's elastic policy is",
            "# PyTorchJob's; enableDynamicWorker is for parameter-server jobs),",
            f"# so it runs {shape.num_workers} Worker replicas; a preempted or failed pod is",
            "# restarted and its script resumes from tfdist.elastic's state.",
        ]
    if restarts is not None or timeout_s is not None:
        lines.append("  runPolicy:")
        if restarts is not None:
            lines.append(f"    backoffLimit: {restarts}")
        if timeout_s is not None:
            lines.append(f"    activeDeadlineSeconds: {math.ceil(timeout_s)}")
    lines.append("  tfReplicaSpecs:")
    for task_type in spec.TASK_TYPES:
        if not counts[task_type]:
            continue
        lines += [
            f"    {_TFJOB_REPLICA_TYPES[task_type]}:",
            f"      replicas: {counts[task_type]}",
            "      restartPolicy: OnFailure",
            "      template:",
            "        metadata:",
            "          labels:",
            f"            {label}",
            "        spec:",
            "          containers:",
            "            - name: tensorflow",
            f"              image: {quote(image)}",
            "              command:",
        ]
        lines += [f"                - {quote(arg)}" for arg in argv]
    if network_policy:
        lines += [
            "---",
            "# Admits traffic to the job's pods only from the job's own pods:",
            "# TensorFlow's gRPC servers have no authentication. Enforced by",
            "# network plugins that implement NetworkPolicy.",
            "apiVersion: networking.k8s.io/v1",
            "kind: NetworkPolicy",
            "metadata:",
            f"  name: {quote(name + _POLICY_SUFFIX)}",
            "spec:",
            "  podSelector:",
            "    matchLabels:",
            f"      {label}",
            "  policyTypes:",
            "    - Ingress",
            "  ingress:",
            "    - from:",
            "        - podSelector:",
            "            matchLabels:",
            f"              {label}",
        ]
    return "\n".join(lines) + "\n"


def _yaml_string(text: str) -> str:
    # JSON strings (ASCII, with JSON's escapes) are YAML double-quoted scalars.
    return json.dumps(text)
