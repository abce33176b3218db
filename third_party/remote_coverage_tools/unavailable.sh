#!/bin/sh
echo "bazel coverage is not available offline (remote_coverage_tools stub)" >&2
exit 1
