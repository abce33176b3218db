"""The program each task of `tfdist.testing.run_local_cluster` runs.

    python /path/to/tfdist/testing/_local_task.py CALL_FILE RESULT_DIR TASK

It is run as a script, not with `-m`, so that a task whose function needs
no TensorFlow does not import it (`-m` would import `tfdist.testing`,
which imports TensorFlow) unless the caller preloads it: by default
`run_local_cluster` forks every task from a template process that has
imported TensorFlow (`tfdist.launch.preload`), which runs this script as
`python` would.

- CALL_FILE holds two pickles: a header of plain data (the parent's
  `sys.path`, the function's module, qualified name and, for `__main__`,
  file) and then the arguments, which are unpickled once `sys.path` is the
  parent's.
- chief/worker TASK (`"worker:1"`): calls `fn(*args)` and writes
  `RESULT_DIR/<task>.pkl` (atomically): `("ok", value)` or `("error",
  type name, message, traceback text, pickled exception or None)`. Exits 0
  on success, 1 on error.
- ps TASK: starts a `tf.distribute.Server` for its task from TF_CONFIG and
  blocks in `join()` until the parent kills it; or, when the header's
  `serve_ps` is false (a parameter-server job), calls `fn` as the other
  tasks do (a tfdist parameter-server strategy serves there).
"""

from __future__ import annotations

import os
import sys

if (
    __name__ == "__main__"
    and sys.path
    and sys.path[0] == os.path.dirname(os.path.abspath(__file__))
):
    # Running a script puts its own directory, tfdist/testing/, first on
    # sys.path; it is no package root, so take it off before any import.
    del sys.path[0]

import importlib  # noqa: E402
import importlib.util  # noqa: E402
import pickle  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

# The name a function's `__main__` module is imported under in a task, so
# that its `if __name__ == "__main__":` block does not run again.
MAIN_MODULE_ALIAS = "__tfdist_main__"


def result_path(result_dir: str, task_name: str) -> str:
    """Returns where task `task_name` (`"worker:1"`) writes its result."""
    return os.path.join(result_dir, task_name.replace(":", "-") + ".pkl")


def _load_function(header: dict[str, Any]) -> Callable[..., Any]:
    module_name = header["module"]
    if module_name == "__main__":
        location = importlib.util.spec_from_file_location(
            MAIN_MODULE_ALIAS, header["main_file"]
        )
        if location is None or location.loader is None:
            raise ImportError(
                f"cannot import the parent's __main__ module from "
                f"{header['main_file']!r}"
            )
        module = importlib.util.module_from_spec(location)
        # Pickles of the parent's __main__ objects look for "__main__".
        sys.modules[MAIN_MODULE_ALIAS] = sys.modules["__main__"] = module
        location.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in header["qualname"].split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def _write(path: str, payload: bytes) -> None:
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(payload)
    os.replace(temporary, path)  # Atomic: the parent never reads half.


def _serve_ps() -> None:
    import tensorflow as tf  # type: ignore[import-untyped]  # ps tasks only.

    from tfdist import cluster

    config = cluster.parse_tf_config()
    assert config.cluster is not None and config.task is not None
    server = tf.distribute.Server(
        tf.train.ClusterSpec(config.cluster.to_dict()),
        job_name=config.task.task_type,
        task_index=config.task.task_id,
        protocol=config.rpc_layer,
        start=True,
    )
    server.join()  # Blocks until the parent kills this task.


def _type_name(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def main(argv: Sequence[str]) -> int:
    """Runs one task; returns the process exit status."""
    call_file, result_dir, task_name = argv
    with open(call_file, "rb") as f:
        header = pickle.load(f)
        sys.path[:] = header["sys_path"]
        if task_name.startswith("ps:") and header.get("serve_ps", True):
            _serve_ps()
            return 0
        try:
            fn = _load_function(header)
            args = pickle.load(f)
            payload = pickle.dumps(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent.
            try:
                exception: bytes | None = pickle.dumps(e)
            except Exception:  # noqa: BLE001 - an unpicklable exception.
                exception = None
            error = (
                "error",
                _type_name(type(e)),
                str(e),
                traceback.format_exc(),
                exception,
            )
            _write(result_path(result_dir, task_name), pickle.dumps(error))
            return 1
    _write(result_path(result_dir, task_name), payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
