"""No hangs: lost, missing and duplicate workers end in tfdist errors, in time.

Every case runs real processes on 127.0.0.1 (`fault_script.py` is the
worker program) and is bounded by a hard kill. Timings asserted are the
product's contract (`timeout_s` plus a margin for process start-up on a
loaded 2-core machine), not performance.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import tensorflow as tf

import tfdist
from tfdist import launch  # Also run as `python -m tfdist.launch`.
from tests.integration import fault_lib
from tfdist import errors

pytestmark = [pytest.mark.multiprocess]

def _run_pair(test: tf.test.TestCase, mode: str) -> tuple[dict, float]:
    """Runs both workers in `mode`; returns worker 0's record and the fault time."""
    out_dir = test.create_tempdir().full_path
    addresses = list(launch.make_local_cluster(launch.JobShape(2)).addresses("worker"))
    tasks = [
        fault_lib.Task(mode, out_dir, fault_lib.tf_config(addresses, index)) for index in range(2)
    ]
    try:
        tasks[0].wait(timeout=fault_lib.JOB_LIMIT_S)
    finally:
        for task in tasks:
            task.kill()
    test.assertNotEqual(tasks[0].returncode, 0, tasks[0].stderr[-3000:])
    if mode.endswith("kill"):
        test.assertEqual(tasks[1].returncode, -9)  # SIGKILL, by its own hand.
    with open(os.path.join(out_dir, "worker:0.json")) as f:
        record = json.load(f)
    with open(os.path.join(out_dir, "killed_at")) as f:
        return record, float(f.read())


class LostWorkerTest(tf.test.TestCase):
    """transport="grpc": TF's collectives, aborted by the peer watchdog."""

    def test_survivor_raises_tfdist_error_naming_killed_worker_in_time(self):
        _assert_lost_worker_1_named_in_time(self, *_run_pair(self, "kill"))

    def test_launcher_exits_non_zero_naming_the_killed_worker(self):
        out_dir = self.create_tempdir().full_path
        result = fault_lib.launch(out_dir, mode="kill")
        self.assertNotEqual(result.returncode, 0)
        # The summary names the task that failed first, and how (the task
        # names alone appear in every launch's start-up lines).
        self.assertIn("task worker:1 was killed by SIGKILL", result.stderr)


def _assert_lost_worker_1_named_in_time(test, record, killed_at):
    test.assertTrue(record["is_lost"], record)
    test.assertEqual(record["task"], "worker:1")
    test.assertIn("task worker:1 is lost", record["message"])
    test.assertLess(record["raised_at"] - killed_at, fault_lib.TIMEOUT_S + fault_lib.MARGIN_S)


def _assert_timeout_naming_worker_1_in_time(test, record, stalled_at):
    test.assertTrue(record["is_timeout"], record)
    test.assertEqual(record["task"], "worker:1", record)
    test.assertIn(f"waited more than timeout_s={fault_lib.TIMEOUT_S:g} s", record["message"])
    test.assertIn("worker:1 (at collective", record["message"])
    test.assertIn("did not arrive", record["message"])
    elapsed = record["raised_at"] - stalled_at
    test.assertGreater(elapsed, fault_lib.TIMEOUT_S - 1)  # Not before the bound...
    test.assertLess(elapsed, fault_lib.TIMEOUT_S + fault_lib.MARGIN_S)  # ...and soon after it.


class MeshFaultTest(tf.test.TestCase):
    """The same bounds under MeshStrategy, whose steps TF's DTensor runs asynchronously."""

    def test_survivor_raises_tfdist_error_naming_killed_worker_in_time(self):
        _assert_lost_worker_1_named_in_time(self, *_run_pair(self, "mesh_kill"))

    def test_peer_of_a_stuck_worker_raises_collective_timeout_in_time(self):
        _assert_timeout_naming_worker_1_in_time(self, *_run_pair(self, "mesh_stall"))


class HostMemoryFaultTest(tf.test.TestCase):
    """The same bounds with the default transport, shared memory here: waits of tfdist's own, not TF's collectives."""

    def test_survivor_raises_tfdist_error_naming_killed_worker_in_time(self):
        record, killed_at = _run_pair(self, "host_kill")
        self.assertEqual(record["transport"], "host_memory")
        _assert_lost_worker_1_named_in_time(self, record, killed_at)

    # In make test-all only (CI's time): the group's own timeout is
    # host_memory_test's; the kill case proves the wiring into fit.
    @pytest.mark.extended
    def test_peer_of_a_stuck_worker_raises_collective_timeout_in_time(self):
        record, stalled_at = _run_pair(self, "host_stall")
        self.assertEqual(record["transport"], "host_memory")
        self.assertTrue(record["is_timeout"], record)
        self.assertEqual(record["task"], "worker:1", record)
        self.assertIn(f"waited more than timeout_s={fault_lib.TIMEOUT_S:g} s; worker:1 did not arrive",
                      record["message"])
        elapsed = record["raised_at"] - stalled_at
        self.assertGreater(elapsed, fault_lib.TIMEOUT_S - 1)
        self.assertLess(elapsed, fault_lib.TIMEOUT_S + fault_lib.MARGIN_S)


class StuckWorkerTest(tf.test.TestCase):
    """transport="grpc": TF's collectives, bounded by the peer watchdog's clock."""

    def test_peer_of_a_stuck_worker_raises_collective_timeout_in_time(self):
        _assert_timeout_naming_worker_1_in_time(self, *_run_pair(self, "stall"))

    def test_worker_stuck_before_building_the_model_is_named_in_time(self):
        # The others wait in TF's broadcast of initial variable values,
        # which TF's own collective timeout never bounded.
        _assert_timeout_naming_worker_1_in_time(self, *_run_pair(self, "stall_before_build"))


def _threads_after_collectives(count: int) -> tuple[int, int]:
    """In each task: this process's thread count before and after `count` all-reduces."""
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=300)

    @tf.function
    def step(value):
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(v)),
            args=(value,),
        )

    def threads() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

    one = tf.constant([1.0])
    strategy.experimental_local_results(step(one))[0].numpy()
    before = threads()
    for _ in range(count):
        total = strategy.experimental_local_results(step(one))[0].numpy()
    assert total[0] == 2.0, total
    return before, threads()


def _all_reduce_after_compute(timeout_s: float, compute_s: float) -> float:
    """In each task: one step that computes for `compute_s`, then all-reduces."""
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=timeout_s)

    def slow_identity(v):
        time.sleep(compute_s)
        return v

    @tf.function
    def step(value):
        def replica_fn(v):
            v = tf.py_function(slow_identity, [v], tf.float32)
            v.set_shape([])  # A static shape: tfdist's gradient path.
            return tf.distribute.get_replica_context().all_reduce("SUM", v)

        return strategy.run(replica_fn, args=(value,))

    return float(strategy.experimental_local_results(step(tf.constant(1.0)))[0].numpy())


def _worker_1_never_joins(timeout_s: float, done_path: str) -> dict:
    """In each task: worker 0 all-reduces a float (tfdist's gradient path);
    worker 1 stays alive, answering probes, and never joins: it leaves once
    worker 0 has written `done_path` (or after `timeout_s` + 10 s)."""
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=timeout_s)
    if strategy.cluster_config.task.task_id == 1:
        deadline = time.monotonic() + timeout_s + 10
        while not os.path.exists(done_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        return {}

    @tf.function
    def step(value):
        return strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(v)),
            args=(value,),
        )

    start = time.monotonic()
    try:
        strategy.experimental_local_results(step(tf.constant([1.0])))[0].numpy()
    except Exception as e:  # What the test asserts on.
        return {
            "elapsed": time.monotonic() - start,
            "is_timeout": isinstance(e, errors.CollectiveTimeoutError)
            and isinstance(e, tf.errors.DeadlineExceededError),
            "message": str(e),
        }
    finally:
        open(done_path, "w").close()
    return {"elapsed": time.monotonic() - start, "is_timeout": False, "message": ""}


class CollectiveBoundTest(tf.test.TestCase):
    def test_gradient_all_reduce_a_peer_never_joins_times_out(self):
        timeout_s = 5.0
        done_path = os.path.join(self.create_tempdir().full_path, "worker-0-done")
        record = tfdist.testing.run_local_cluster(
            _worker_1_never_joins, num_workers=2, args=(timeout_s, done_path),
            timeout_s=fault_lib.JOB_LIMIT_S,
        )[0]
        self.assertTrue(record["is_timeout"], record)
        self.assertIn("worker:1", record["message"])
        self.assertGreater(record["elapsed"], timeout_s)
        self.assertLess(record["elapsed"], timeout_s + fault_lib.MARGIN_S)

    def test_compute_before_a_collective_does_not_count_as_waiting(self):
        # Both workers compute for longer than timeout_s before the
        # all-reduce; only time spent in the collective counts.
        per_task = tfdist.testing.run_local_cluster(
            _all_reduce_after_compute, num_workers=2, args=(3.0, 6.0), timeout_s=fault_lib.JOB_LIMIT_S
        )
        self.assertEqual(list(per_task), [2.0, 2.0])


class CollectiveThreadsTest(tf.test.TestCase):
    def test_bounded_collectives_start_no_thread_each(self):
        # TF's per-op collective timeout starts 2 threads per collective that
        # live for the whole timeout (300 s here): +600 after 300 collectives.
        count = 300
        per_task = tfdist.testing.run_local_cluster(
            _threads_after_collectives, num_workers=2, args=(count,), timeout_s=fault_lib.JOB_LIMIT_S
        )
        for before, after in per_task:
            self.assertLess(after - before, count // 10, per_task)


if __name__ == "__main__":
    tfdist.testing.main()
