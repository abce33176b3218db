"""One pipeline for all workers: the chief serves each worker its slices.

When copies of the user's pipeline would disagree across workers
(`determinism`), the chief runs the only copy inside TF's tf.data service
(a dispatcher and one tf.data worker in the chief's process) and every
training worker reads from it with *coordinated reads*: the service hands
out elements in rounds, one element per worker per round, and a round is
one global batch:

    chief:   for each global batch of m rows:            # the user's pipeline
                 for w in 0..W-1:                        # one round
                     yield (worker w's replica slices, m, end=False)
             then forever: (empty slices, 0, end=True)   # coordinated reads
                                                         # need an endless input
    worker w: read element w of every round until end=True

So every worker gets its slices of the same global batches (as when each
reads its own deterministic copy: training equals one process reading the
chief's pipeline), every example once per epoch, and all workers run the
same number of steps. Each iterator over the distributed dataset is a new
service job (a new pass over the pipeline: a new epoch, reshuffled as the
user's pipeline reshuffles); every worker creates its iterators in the
same order, so they agree on job names without talking.

The chief publishes the dispatcher's address and each registered dataset's
id in TF's coordination-service key-value store; the other workers wait
for them up to `timeout_s` (`CollectiveTimeoutError` naming the chief).

Costs: the chief does all input work and serializes every batch once per
worker (loopback or network); the other workers do none. The servers
listen on a port of the chief's host (TF's gRPC servers accept
connections on every interface).
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import coordination
from tfdist._internal import input_values
from tfdist._internal import tf_data
from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec as spec_lib
from tfdist.data import splitting
from tfdist.data.distributed import dataset as dataset_lib
from tfdist.data.distributed import elements
from tfdist.data.distributed import split

__all__ = ["ChiefInputService"]

_KEY_PREFIX = "tfdist/input_service"


class ChiefInputService:
    """What the workers of a job agree on for input: seeds, and the chief's service.

    `agreed_seed` gives every worker the same seed for a pipeline that can be
    made to agree (`determinism.seed_shuffles`); `distribute` serves, from
    the chief's tf.data service, a pipeline that only the chief may run.

    Contract: built by a multi-worker strategy on every training task;
    `agreed_seed` and `distribute` must be called by every task for the
    same datasets in the same order (as Keras and a script run on every
    task do). The chief starts the servers on its first `distribute`.
    Non-chief calls block until the chief has published what they need, at
    most `timeout_s`.

    Args:
      config: The cluster, with this task.
      layout: This worker's replicas.
      timeout_s: Bound on waiting for the chief's service and datasets.
    """

    _instances = itertools.count()

    def __init__(
        self, config: ClusterConfig, layout: split.InputLayout, *, timeout_s: float
    ) -> None:
        assert config.cluster is not None and config.task is not None
        chief = config.cluster.chief_task
        assert chief is not None
        self._chief = chief
        self._chief_host = spec_lib.Address.parse(config.cluster.address(chief)).host
        self._layout = layout
        self._is_chief = layout.worker_index == 0
        self._timeout_s = timeout_s
        self._prefix = f"{_KEY_PREFIX}/{next(self._instances)}"
        self._datasets = itertools.count()
        self._seeds = itertools.count()
        self._base_seed: int | None = None
        self._servers: tuple[Any, Any] | None = None
        self._address: str | None = None

    def agreed_seed(self) -> int:
        """A seed every worker gets alike for its next pipeline, random per job.

        The chief draws a base seed once and publishes it; every call (on
        every worker, in the same order) derives the next seed from it.
        Non-chief calls block until the chief published it, at most
        `timeout_s`.
        """
        if self._base_seed is None:
            key = f"{self._prefix}/seed"
            if self._is_chief:
                self._base_seed = secrets.randbits(62)
                coordination.set_key(key, str(self._base_seed))
            else:
                self._base_seed = int(self._wait_for(key, "the input seed"))
        return (self._base_seed + 0x9E3779B97F4A7C15 * next(self._seeds)) % (1 << 62) or 1

    def distribute(
        self, dataset: tf.data.Dataset, nominal_batch_size: int | None
    ) -> tf.distribute.DistributedDataset:
        """Serves `dataset` from the chief; returns this worker's distributed view."""
        layout = self._layout
        rounds = _rounds(dataset, layout)
        index = next(self._datasets)
        key = f"{self._prefix}/dataset/{index}"
        if self._is_chief:
            address = self._start()
            dataset_id = tf.data.experimental.service.register_dataset(
                f"grpc://{address}", rounds, compression=None
            )
            coordination.set_key(key, str(dataset_id.numpy().decode()))
        else:
            address = self._wait_for(f"{self._prefix}/address", "its input service")
            dataset_id = self._wait_for(key, f"input dataset {index}")
        jobs = itertools.count()

        def make_dataset() -> tf.data.Dataset:
            served = tf.data.experimental.service.from_dataset_id(
                processing_mode="parallel_epochs",
                service=f"grpc://{address}",
                dataset_id=dataset_id,
                element_spec=rounds.element_spec,
                job_name=f"tfdist-{self._prefix.rsplit('/', 1)[1]}-{index}-{next(jobs)}",
                consumer_index=layout.worker_index,
                num_consumers=layout.num_workers,
            )
            return served.take_while(
                lambda parts, rows, end: tf.logical_not(end)
            ).map(
                lambda parts, rows, end: tf.nest.map_structure(
                    lambda *leaves: input_values.InputPerReplica(
                        leaves, rows, nominal_batch_size
                    ),
                    *parts,
                )
            )

        spec = make_dataset().element_spec  # Builds a graph node only.
        return dataset_lib.DistributedDataset(
            make_dataset,
            element_spec=spec,
            cardinality=int(dataset.cardinality()),
        )

    def _start(self) -> str:
        """Starts the chief's dispatcher and tf.data worker once; their address."""
        if self._address is not None:
            return self._address
        self._servers, self._address = tf_data.start_local_service(self._chief_host)
        coordination.set_key(f"{self._prefix}/address", self._address)
        return self._address

    def _wait_for(self, key: str, what: str) -> str:
        value = coordination.get_key(key, timeout_s=self._timeout_s)
        if value is None:
            raise errors.CollectiveTimeoutError(
                f"the chief ({self._chief.name}) did not publish {what} within "
                f"timeout_s={self._timeout_s:g} s. The chief serves the input "
                "of pipelines that differ between workers (see the strategy's "
                "log); check the chief's log for why it is behind (every "
                "worker must call fit/evaluate/predict in the same order), or "
                "raise timeout_s.",
                task=self._chief.name,
            )
        return value


def _rounds(dataset: tf.data.Dataset, layout: split.InputLayout) -> tf.data.Dataset:
    """The chief's endless stream: W elements per global batch, then end markers."""
    num_workers = layout.num_workers

    def worker_parts(batch: Any) -> tf.data.Dataset:
        rows = splitting.batch_rows(batch)

        def part(worker: tf.Tensor) -> tuple[Any, tf.Tensor, tf.Tensor]:
            slices = tuple(
                splitting.take_rows(
                    batch,
                    *splitting.slice_bounds(
                        rows,
                        r * num_workers + worker,
                        layout.num_replicas_in_sync,
                    ),
                )
                for r in range(layout.num_local_replicas)
            )
            return slices, rows, tf.constant(False)

        return tf.data.Dataset.range(num_workers).map(part)

    parts = dataset.flat_map(elements.whole_element(dataset.element_spec, worker_parts))
    slices_spec, _, _ = parts.element_spec
    end = tf.data.Dataset.from_tensors(
        (
            tf.nest.map_structure(elements.empty_batch, slices_spec),
            tf.constant(0, tf.int64),
            tf.constant(True),
        )
    ).repeat()
    return parts.concatenate(end)
