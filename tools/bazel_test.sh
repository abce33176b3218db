#!/usr/bin/env bash
# Runs `bazel test //...` offline with Debian's Bazel 4 (`make bazel-test`).
#
#   tools/bazel_test.sh PYTHON [bazel test args...]
#
# Installs bazel-bootstrap and bazel-rules-java with apt-get if missing (needs
# root), runs the tests with PYTHON (the .venv interpreter, which has
# TensorFlow) as the py_* runtime, leaves no Bazel server behind (--batch),
# and ends with a plain "N passed, M failed" line. Stops before Bazel, with
# status 1 and a diff, if BUILD is stale (`python tools/build_gen.py` fixes
# it). Otherwise the status is Bazel's: 0 all passed, 3 a test failed, 1 a
# build error.
set -uo pipefail

python=${1:?usage: tools/bazel_test.sh PYTHON [bazel test args...]}
shift
case "$python" in
  /*) ;;
  *) python="$PWD/$python" ;;
esac

installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}
if ! installed bazel-bootstrap || ! installed bazel-rules-java; then
  echo "Installing Debian's Bazel 4 (bazel-bootstrap, bazel-rules-java)..." >&2
  { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      bazel-bootstrap bazel-rules-java >/dev/null; } ||
    { echo "tools/bazel_test.sh: apt-get install failed (needs root)" >&2; exit 1; }
fi

cd "$(dirname "$0")/.."

# A stale BUILD makes Bazel's results misleading (a missing dep reads as
# "cannot import name ... (most likely due to a circular import)"): stop early.
if ! "$python" tools/build_gen.py --check; then
  echo "0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
PYTHON_BIN_PATH="$python" bazel --batch test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS)' "$log")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test //... exited with status $rc before running tests (see above)"
  failed=1
fi
echo "$passed passed, $failed failed"
exit "$rc"
