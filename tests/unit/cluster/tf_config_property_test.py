"""Property tests: parse_tf_config fails only with ClusterConfigError.

Whatever the input (arbitrary text, arbitrary JSON, TF_CONFIG documents with
one field mutated), `parse_tf_config` either returns a `ClusterConfig` or
raises `ClusterConfigError`, within a bounded time; and every valid config
survives `to_json()` / `to_dict()` and parsing unchanged.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable

import hypothesis
from absl.testing import absltest
from hypothesis import strategies as st

from tfdist import errors
from tfdist.cluster import spec
from tfdist.cluster import tf_config

# A few hundred examples run in seconds on 2 cores; the deadline bounds each
# parse (generous for a loaded machine; a parse takes well under 1 ms).
_SETTINGS = hypothesis.settings(
    max_examples=300,
    deadline=datetime.timedelta(milliseconds=500),
    database=None,  # Writes nothing into the source tree.
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)

# JSON objects whose keys are often TF_CONFIG's own, so values get checked.
_DOCUMENTS = st.dictionaries(
    st.sampled_from(["cluster", "task", "rpc_layer"]) | st.text(max_size=10),
    _JSON_VALUES,
    max_size=4,
)

_HOSTS = st.sampled_from(
    ["localhost", "127.0.0.1", "10.0.0.7", "worker-0.svc", "::1", "fe80::1"]
)


@st.composite
def _configs(draw: st.DrawFn) -> spec.ClusterConfig:
    """Valid configs: random jobs, distinct addresses, a task in the cluster."""
    counts = {
        "chief": draw(st.integers(0, 1)),
        "worker": draw(st.integers(0, 4)),
        "ps": draw(st.integers(0, 3)),
        "evaluator": draw(st.integers(0, 1)),
    }
    if not any(counts.values()):
        counts["worker"] = 1
    total = sum(counts.values())
    ports = draw(
        st.lists(
            st.integers(1, 65535), min_size=total, max_size=total, unique=True
        )
    )
    jobs: dict[str, list[str]] = {}
    for task_type, count in counts.items():
        if count:
            jobs[task_type] = [
                str(spec.Address(draw(_HOSTS), ports.pop()))
                for _ in range(count)
            ]
    cluster = spec.ClusterSpec(jobs)
    task = draw(st.sampled_from(cluster.tasks()))
    rpc_layer = draw(st.sampled_from(["grpc", "grpc+verbs", "grpc+mpi"]))
    return spec.ClusterConfig(cluster=cluster, task=task, rpc_layer=rpc_layer)


def _mutate_at(document: object, path: list[object], value: object) -> object:
    """Returns a copy of `document` with the item at `path` set to `value`."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(document, dict):
        copied = dict(document)
        copied[head] = _mutate_at(copied.get(head), rest, value)
        return copied
    if isinstance(document, list) and isinstance(head, int):
        copied_list = list(document)
        copied_list[head % len(copied_list)] = _mutate_at(
            copied_list[head % len(copied_list)], rest, value
        )
        return copied_list
    return value


def _paths(document: object) -> list[list[object]]:
    """Every path into `document`'s dicts and lists, the root included."""
    result: list[list[object]] = [[]]
    if isinstance(document, dict):
        for key, item in document.items():
            result += [[key] + sub for sub in _paths(item)]
    elif isinstance(document, list):
        for index, item in enumerate(document):
            result += [[index] + sub for sub in _paths(item)]
    return result


def _get(document: object, path: list[object]) -> object:
    """Returns the item of `document` at `path` (from `_paths`)."""
    for key in path:
        if isinstance(document, dict):
            document = document[key]
        elif isinstance(document, list) and isinstance(key, int):
            document = document[key]
    return document


def _without(container: object, key: object) -> object:
    """Returns `container` without its item `key`."""
    if isinstance(container, dict):
        return {k: v for k, v in container.items() if k != key}
    if isinstance(container, list):
        return [v for i, v in enumerate(container) if i != key]
    return container


@st.composite
def _near_valid_documents(draw: st.DrawFn) -> object:
    """A valid TF_CONFIG document with one value replaced, added or deleted."""
    document = draw(_configs()).to_dict()
    path = draw(st.sampled_from(_paths(document)))
    action = draw(st.sampled_from(["replace", "add_key", "delete"]))
    if action == "replace":
        return _mutate_at(document, path, draw(_JSON_VALUES))
    if action == "add_key":
        key = draw(st.text(max_size=10))
        return _mutate_at(document, path + [key], draw(_JSON_VALUES))
    if not path:
        return {}
    parent = path[:-1]
    return _mutate_at(
        document, parent, _without(_get(document, parent), path[-1])
    )


class ParseNeverRaisesOtherErrorsTest(absltest.TestCase):
    def _assert_parses_or_raises_cluster_config_error(
        self, parse: Callable[[], spec.ClusterConfig]
    ) -> None:
        try:
            config = parse()
        except errors.ClusterConfigError as e:
            self.assertNotEmpty(str(e))
        else:
            self.assertIsInstance(config, spec.ClusterConfig)

    @_SETTINGS
    @hypothesis.given(text=st.text(max_size=200))
    def test_arbitrary_text_parses_or_raises_cluster_config_error(self, text):
        self._assert_parses_or_raises_cluster_config_error(
            lambda: tf_config.parse_tf_config(text)
        )

    @_SETTINGS
    @hypothesis.given(value=_JSON_VALUES | _DOCUMENTS)
    def test_arbitrary_json_text_parses_or_raises_cluster_config_error(
        self, value
    ):
        text = json.dumps(value)
        self._assert_parses_or_raises_cluster_config_error(
            lambda: tf_config.parse_tf_config(text)
        )

    @_SETTINGS
    @hypothesis.given(value=_DOCUMENTS)
    def test_arbitrary_mapping_parses_or_raises_cluster_config_error(
        self, value
    ):
        self._assert_parses_or_raises_cluster_config_error(
            lambda: tf_config.parse_tf_config(value)
        )

    @_SETTINGS
    @hypothesis.given(document=_near_valid_documents())
    def test_mutated_tf_config_parses_or_raises_cluster_config_error(
        self, document
    ):
        self._assert_parses_or_raises_cluster_config_error(
            lambda: tf_config.parse_tf_config(json.dumps(document))
        )
        if isinstance(document, dict):
            self._assert_parses_or_raises_cluster_config_error(
                lambda: tf_config.parse_tf_config(document)
            )


class RoundTripTest(absltest.TestCase):
    @_SETTINGS
    @hypothesis.given(config=_configs())
    def test_to_json_then_parse_gives_equal_config(self, config):
        self.assertEqual(tf_config.parse_tf_config(config.to_json()), config)

    @_SETTINGS
    @hypothesis.given(config=_configs())
    def test_to_dict_then_parse_gives_equal_config(self, config):
        self.assertEqual(tf_config.parse_tf_config(config.to_dict()), config)


if __name__ == "__main__":
    absltest.main()
