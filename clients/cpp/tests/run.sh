#!/usr/bin/env bash
# Runs the C++ client's tests (make test-cpp): the test binary of every build directory
# given (the plain build and the ASan/UBSan one), each against real owners it starts and
# stops itself (FLUXKV_BIN), under a deadline. Prints how long each took.
#
#   clients/cpp/tests/run.sh BIN/fluxkv BUILD_DIR...
set -euo pipefail
bin=$1
shift
export FLUXKV_BIN=$bin
# The owners' directories: removed here even if a test binary is killed (its owners die
# with it: PR_SET_PDEATHSIG).
FLUXKV_TEST_TMP=$(mktemp -d /tmp/fkv-cpp-run-XXXXXX)
export FLUXKV_TEST_TMP
trap 'rm -rf "$FLUXKV_TEST_TMP"' EXIT
# Sanitizer reports fail the run: UBSan halts at the first finding, ASan checks leaks at exit.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
for dir in "$@"; do
  start=$(date +%s%N)
  if ! timeout --kill-after=10 120 "$dir/fluxkv_tests"; then
    echo "FAILED: $dir/fluxkv_tests" >&2
    status=1
  fi
  ms=$((($(date +%s%N) - start) / 1000000))
  printf '%s: %d.%03d s\n' "$dir/fluxkv_tests" $((ms / 1000)) $((ms % 1000))
done
exit $status
