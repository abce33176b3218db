"""TF's coordination service and collective-health calls (TF private).

TF's MultiWorkerMirroredStrategy configures the coordination service
itself with no timeouts (a worker that never starts is waited for
forever); tfdist configures it first, with bounds from `timeout_s`, probes
peers and aborts collectives as TF's own (disabled) health-check thread
would, and shares small values between tasks through the service's
key-value store. Private TF API used (tested range: see setup.py):

- `eager.context.context()`: `configure_coordination_service`,
  `_coordination_service_config` (to set `cluster_register_with_barrier`,
  which the configure call does not expose), `check_collective_ops_peer_health`,
  `abort_collective_ops`, `set_config_key_value`, `get_config_key_value`,
  `delete_config_key_value`;
- `coordination_config_pb2.CoordinatedJob`: the job list of that config.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as _coordination_pb2
from tensorflow.python.eager import context as _context

__all__ = [
    "abort_collectives",
    "check_peer_health",
    "configure_coordination_service",
    "delete_key",
    "get_key",
    "set_key",
]


def configure_coordination_service(
    jobs: Sequence[tuple[str, int]],
    leader: str,
    *,
    register_timeout_ms: int,
    heartbeat_timeout_ms: int,
    shutdown_barrier_timeout_ms: int,
) -> None:
    """Configures TF's coordination service as MWMS does, with timeouts.

    Must run before the TF context is initialized (before the strategy is
    built); TF's MultiWorkerMirroredStrategy then keeps this configuration.

    Args:
      jobs: (job name, task count) of the coordinated jobs (chief, worker).
      leader: The service leader, e.g. "/job:chief/replica:0/task:0".
      register_timeout_ms: Bound on waiting for every task to register.
      heartbeat_timeout_ms: A task silent this long is declared dead.
      shutdown_barrier_timeout_ms: Bound on the shutdown barrier at exit.
    """
    _context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        cluster_register_timeout_in_ms=register_timeout_ms,
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        shutdown_barrier_timeout_in_ms=shutdown_barrier_timeout_ms,
        coordinated_jobs=[
            _coordination_pb2.CoordinatedJob(name=name, num_tasks=count)
            for name, count in jobs
        ],
    )
    # Without the barrier, the register timeout does not end the wait for a
    # task that never connects (TF 2.21).
    _context.context()._coordination_service_config.cluster_register_with_barrier = True


def check_peer_health(peer: str, timeout_ms: int) -> None:
    """Raises a `tf.errors.OpError` if collective peer `peer` is not healthy.

    `peer` is "/job:worker/replica:0/task:1"; a restarted peer is unhealthy.
    """
    _context.context().check_collective_ops_peer_health(peer, timeout_ms)


def abort_collectives(message: str, code: int = tf.errors.UNAVAILABLE) -> None:
    """Makes every pending and later collective of this process fail with `code`."""
    _context.context().abort_collective_ops(code, message)


def set_key(key: str, value: str) -> None:
    """Stores `key` in the coordination service's key-value store."""
    _context.context().set_config_key_value(key, value)


def get_key(key: str, *, timeout_s: float) -> str | None:
    """Returns `key` from the coordination service, or None if unset in time."""
    try:
        return str(
            _context.context().get_config_key_value(key, int(timeout_s * 1000))
        )
    except (
        tf.errors.DeadlineExceededError,
        tf.errors.NotFoundError,
        tf.errors.UnavailableError,
    ):
        return None


def delete_key(key: str) -> None:
    """Removes `key` from the coordination service's store (if present)."""
    try:
        _context.context().delete_config_key_value(key)
    except tf.errors.NotFoundError:
        pass
