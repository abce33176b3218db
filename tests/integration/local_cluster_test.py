"""Multi-process tests of tfdist.testing.run_local_cluster on 127.0.0.1.

The task functions are at module level so each task process can import
them by name; they import TensorFlow only inside, where they need it.
"""

from __future__ import annotations

import os
import threading

import pytest
from absl.testing import parameterized

import tfdist
from tfdist import errors

pytestmark = pytest.mark.multiprocess

# Each task imports TensorFlow (several seconds on 2 cores); a bound that
# catches hangs, not slow machines.
_TIMEOUT_S = 60.0


def all_reduce_replica_ids() -> dict[str, object]:
    """Sums (replica id + 1) over all replicas with MultiWorkerMirrored."""
    import tensorflow as tf

    config = tfdist.cluster.parse_tf_config()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def replica_value() -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return tf.cast(context.replica_id_in_sync_group + 1, tf.float32)

    per_replica = strategy.run(replica_value)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return {
        "task": config.task.name,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "sum": float(total.numpy()),
    }


def fail_on_worker_one(message: str) -> str:
    """Raises on worker 1; worker 0 waits until it is stopped."""
    config = tfdist.cluster.parse_tf_config()
    if config.task.task_id == 1:
        raise ValueError(message)
    threading.Event().wait()  # Blocks until run_local_cluster stops it.
    return "unreachable"


def block_forever() -> None:
    threading.Event().wait()


def run_op_on_ps() -> tuple[str, float, str | None, str | None]:
    """Runs `20 + 1` on ps:0 through its server; returns it, the thread limits."""
    import tensorflow as tf

    config = tfdist.cluster.parse_tf_config()
    (ps_address,) = config.cluster.addresses("ps")
    # Only the ps task runs a server here: talk to it alone.
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            value = tf.constant(20.0) + 1.0
        with tf.compat.v1.Session(
            f"grpc://{ps_address}", config=session_config
        ) as session:
            result = float(session.run(value))
    return (
        config.task.name,
        result,
        os.environ.get("TF_NUM_INTEROP_THREADS"),
        os.environ.get("TF_NUM_INTRAOP_THREADS"),
    )


class MultiWorkerAllReduceTest(parameterized.TestCase):
    def test_all_reduce_sum_is_on_both_workers(self):
        results = tfdist.testing.run_local_cluster(
            all_reduce_replica_ids, num_workers=2, timeout_s=_TIMEOUT_S
        )

        # One CPU replica per worker: 1 + 2.
        self.assertEqual(
            list(results),
            [
                {"task": "worker:0", "num_replicas_in_sync": 2, "sum": 3.0},
                {"task": "worker:1", "num_replicas_in_sync": 2, "sum": 3.0},
            ],
        )


class FailureTest(parameterized.TestCase):
    def test_child_exception_is_reraised_naming_the_task(self):
        with self.assertRaises(errors.CollectiveError) as raised:
            tfdist.testing.run_local_cluster(
                fail_on_worker_one,
                num_workers=2,
                args=("bad batch",),
                timeout_s=_TIMEOUT_S,
            )

        error = raised.exception
        self.assertEqual(error.task, "worker:1")
        self.assertIsInstance(error.__cause__, ValueError)
        message = str(error)
        self.assertStartsWith(
            message, "task worker:1 raised ValueError: bad batch"
        )
        self.assertIn("Stopped the other task(s): worker:0.", message)
        self.assertIn("raise ValueError(message)", message)  # Traceback.

    def test_timeout_kills_tasks_and_names_them(self):
        with self.assertRaisesRegex(
            errors.CollectiveTimeoutError,
            r"ran past timeout_s=3 with task\(s\) worker:0, worker:1 still "
            r"running",
        ):
            tfdist.testing.run_local_cluster(
                block_forever, num_workers=2, timeout_s=3
            )

    def test_nested_function_raises_type_error(self):
        def nested() -> None:
            pass

        with self.assertRaisesRegex(TypeError, r"cannot be imported by name"):
            tfdist.testing.run_local_cluster(nested)


class ParameterServerTaskTest(parameterized.TestCase):
    def test_ps_serves_ops_until_workers_return_with_thread_limits(self):
        results = tfdist.testing.run_local_cluster(
            run_op_on_ps,
            num_workers=1,
            num_ps=1,
            has_chief=True,
            timeout_s=_TIMEOUT_S,
            env={"TF_NUM_INTRAOP_THREADS": "2"},
        )

        # Inter-op: chief + 1 worker + 1 = 3; intra-op: overridden by env.
        self.assertEqual(
            list(results),
            [("chief:0", 21.0, "3", "2"), ("worker:0", 21.0, "3", "2")],
        )


if __name__ == "__main__":
    tfdist.testing.main()
