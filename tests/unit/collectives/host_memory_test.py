"""tfdist.collectives.host_memory.HostGroup: sums over processes of this host, against numpy.

Each rank of the multi-process cases is a plain Python process (numpy and
the module, no TensorFlow) that sums its seeded arrays over several calls
on two slots of different sizes and writes what it got.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.collectives import host_memory

_MODULE = os.path.abspath(host_memory.__file__)
_CALLS = 5
_SIZES = (1001, 7)  # Slot 0 and slot 1: a size no rank count divides, and one smaller than some.
#: Bound on each rank process, seconds.
_BOUND_S = 60

# A rank: loads the module by path (the package would import TensorFlow).
_RANK = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("host_memory", sys.argv[1])
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
name, rank, size, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
group = host_memory.HostGroup(name, rank, size, timeout_s=30)
results = {}
for call in range(%(calls)d):
    for slot, n in enumerate(%(sizes)r):
        x = np.random.default_rng([rank, call, slot]).standard_normal(n).astype(np.float32)
        results[f"{call}-{slot}"] = group.all_reduce(x, slot)
group.close()
np.savez(out, **results)
"""


def _inputs(rank: int, call: int, slot: int) -> np.ndarray:
    return np.random.default_rng([rank, call, slot]).standard_normal(_SIZES[slot]).astype(np.float32)


class HostGroupProcessesTest(parameterized.TestCase):

    @parameterized.parameters(2, 3)
    def test_every_rank_gets_the_rank_ordered_float32_sum_bit_for_bit(self, size):
        name = f"test-{uuid.uuid4().hex[:12]}"
        out = self.create_tempdir().full_path
        script = _RANK % {"calls": _CALLS, "sizes": _SIZES}
        ranks = [
            subprocess.Popen([sys.executable, "-c", script, _MODULE, name, str(r), str(size),
                              os.path.join(out, f"{r}.npz")], stderr=subprocess.PIPE, text=True)
            for r in range(size)
        ]
        for rank in ranks:
            _, stderr = rank.communicate(timeout=_BOUND_S)
            self.assertEqual(rank.returncode, 0, stderr)
        got = [np.load(os.path.join(out, f"{r}.npz")) for r in range(size)]
        for call in range(_CALLS):
            for slot in range(len(_SIZES)):
                expected = _inputs(0, call, slot)
                for r in range(1, size):
                    expected = expected + _inputs(r, call, slot)  # float32, rank order
                for r in range(size):
                    np.testing.assert_array_equal(got[r][f"{call}-{slot}"], expected)
        self.assertEqual([f for f in os.listdir(host_memory.DIRECTORY) if name in f], [])


class HostGroupErrorsTest(absltest.TestCase):

    def _group(self, **kwargs):
        group = host_memory.HostGroup(
            f"test-{uuid.uuid4().hex[:12]}", 0, 2, peer_names=["worker:0", "worker:1"], **kwargs
        )
        self.addCleanup(group.close)
        return group

    def test_a_peer_that_never_arrives_raises_collective_timeout_naming_it(self):
        group = self._group(timeout_s=0.3)
        start = time.monotonic()
        with self.assertRaisesRegex(errors.CollectiveTimeoutError, r"timeout_s=0.3 s; worker:1 did not arrive") as caught:
            group.all_reduce(np.ones(4, np.float32), 0)
        self.assertEqual(caught.exception.task, "worker:1")
        self.assertLess(time.monotonic() - start, 10)
        with self.assertRaises(errors.CollectiveTimeoutError):  # The group stays failed.
            group.all_reduce(np.ones(4, np.float32), 0)

    def test_abort_from_another_thread_ends_the_wait_with_its_error(self):
        group = self._group(timeout_s=120)
        lost = errors.WorkerUnavailableError("task worker:1 is lost", task="worker:1")
        threading.Timer(0.2, group.abort, args=(lost,)).start()
        start = time.monotonic()
        with self.assertRaises(errors.WorkerUnavailableError) as caught:
            group.all_reduce(np.ones(4, np.float32), 0)
        self.assertIs(caught.exception, lost)
        self.assertLess(time.monotonic() - start, 10)

    def test_a_slot_given_another_size_raises_config_error(self):
        name = f"test-{uuid.uuid4().hex[:12]}"
        groups = [host_memory.HostGroup(name, r, 2, timeout_s=30) for r in range(2)]  # Two ranks, two threads.
        for group in groups:
            self.addCleanup(group.close)
        peer = threading.Thread(target=groups[1].all_reduce, args=(np.ones(4, np.float32), 0))
        peer.start()
        np.testing.assert_array_equal(groups[0].all_reduce(np.ones(4, np.float32), 0), np.full(4, 2.0))
        peer.join()
        with self.assertRaisesRegex(errors.ConfigError, r"slot 0 holds 4 values of float32; received 5"):
            groups[0].all_reduce(np.ones(5, np.float32), 0)

    def test_bad_rank_or_size_raises_config_error(self):
        for rank, size in ((2, 2), (-1, 2), (0, 1)):
            with self.assertRaisesRegex(errors.ConfigError, rf"rank={rank}, size={size}"):
                host_memory.HostGroup("unused", rank, size, timeout_s=1)


class SharedMemoryCheckTest(absltest.TestCase):
    """`shares_memory_with`: a peer's published token must be in its file here (tfdist/multi_worker/transport.py)."""

    def _pair(self, directories):
        name = f"test-{uuid.uuid4().hex[:12]}"
        groups = [host_memory.HostGroup(name, r, 2, timeout_s=1, directory=d) for r, d in enumerate(directories)]
        for group in groups:
            self.addCleanup(group.close)
        return groups

    def test_ranks_in_one_directory_see_each_others_tokens(self):
        first, second = self._pair([None, None])
        self.assertNotEqual(first.token, second.token)
        self.assertTrue(first.shares_memory_with({1: second.token}))
        self.assertTrue(second.shares_memory_with({0: first.token}))

    def test_ranks_in_separate_directories_do_not(self):
        # As two containers with their own /dev/shm; same names, other memory.
        first, second = self._pair([self.create_tempdir().full_path, self.create_tempdir().full_path])
        self.assertFalse(first.shares_memory_with({1: second.token}))
        self.assertFalse(second.shares_memory_with({0: first.token}))

    def test_a_stale_or_missing_token_does_not_count(self):
        first, second = self._pair([None, None])
        self.assertFalse(first.shares_memory_with({1: "0" * 32}))  # A file left by an earlier job.
        self.assertFalse(first.shares_memory_with({1: None}))  # Not published in time.
        self.assertFalse(first.shares_memory_with({1: "-"}))  # A peer that made no group.

    def test_close_removes_the_token_files(self):
        first, second = self._pair([None, None])
        name = os.path.basename(first._token_path(0)).rsplit("-token-", 1)[0]  # noqa: SLF001
        first.close()
        second.close()
        self.assertEqual([f for f in os.listdir(host_memory.DIRECTORY) if f.startswith(name)], [])

    def test_available_needs_a_writable_directory(self):
        self.assertTrue(host_memory.available(self.create_tempdir().full_path))
        self.assertFalse(host_memory.available(os.path.join(self.create_tempdir().full_path, "absent")))


# A rank that dies without closing its group (as a SIGKILLed or SIGTERMed task).
_DIES = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("host_memory", sys.argv[1])
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
host_memory.HostGroup(sys.argv[2], int(sys.argv[3]), 2, timeout_s=1, directory=sys.argv[4])
os._exit(0)
"""


class RemoveStaleGroupsTest(absltest.TestCase):
    """Files of groups whose processes are all gone are removed; a live rank keeps its group's."""

    def _dies(self, name, rank, directory):
        subprocess.run([sys.executable, "-c", _DIES, _MODULE, name, str(rank), directory], check=True, timeout=_BOUND_S)

    def test_a_group_whose_ranks_all_died_is_removed_whole(self):
        directory = self.create_tempdir().full_path
        for rank in range(2):
            self._dies("dead", rank, directory)
        self.assertLen(os.listdir(directory), 4)  # Two FIFOs, two tokens.
        self.assertEqual(host_memory.remove_stale_groups(directory), ["dead"])
        self.assertEqual(os.listdir(directory), [])

    def test_a_group_with_a_live_rank_stays(self):
        directory = self.create_tempdir().full_path
        live = host_memory.HostGroup("live", 0, 2, timeout_s=1, directory=directory)
        self.addCleanup(live.close)
        self._dies("live", 1, directory)  # Its peer died: the group stays while this rank lives.
        self.assertEqual(host_memory.remove_stale_groups(directory), [])
        self.assertLen(os.listdir(directory), 4)
        live.close()
        self.assertEqual(os.listdir(directory), [])


class MarkedErrorTest(absltest.TestCase):
    """A group's error raised inside a `tf.function` (as `fit` runs it) arrives as tfdist's class."""

    def test_timeout_and_loss_in_a_numpy_function_become_tfdist_classes_naming_the_task(self):
        import tensorflow as tf

        from tfdist._internal import tf_errors

        remove = tf_errors.install_function_error_hook(lambda error: None)
        self.addCleanup(remove)
        for error, tf_class in (
            (errors.CollectiveTimeoutError("waited", task="worker:1"), tf.errors.DeadlineExceededError),
            (errors.WorkerUnavailableError("lost", task="worker:1"), tf.errors.UnavailableError),
        ):
            def fail(x, error=error):
                raise tf_errors.marked_op_error(error)

            @tf.function(autograph=False)
            def step(x, fail=fail):
                return tf.numpy_function(fail, [x], tf.float32, stateful=True)

            with self.subTest(error=type(error).__name__):
                with self.assertRaises(type(error)) as caught:
                    step(tf.ones([2]))
                self.assertIsInstance(caught.exception, tf_class)
                self.assertEqual(caught.exception.task, "worker:1")


if __name__ == "__main__":
    absltest.main()
