#!/usr/bin/env bash
# Builds the whole tree with sanitizers and runs the whole ctest suite under
# them (`make test-asan`, `make test-tsan`):
#
#   scripts/sanitize-test.sh asan [CTEST ARGS...]   clang, -fsanitize=address,undefined, build-asan/
#   scripts/sanitize-test.sh tsan [CTEST ARGS...]   clang + libomp + Archer, -fsanitize=thread, build-tsan/
#
# Each test writes its reports to BUILD/sanitizer-logs/TEST/ (CMakeLists.txt,
# dt_sanitize_tests). The run fails if a test fails or if any report was
# written, by the test itself or by any process it started; the reports are
# printed at the end. JOBS (default 2) sets the build and ctest parallelism.
#
# Both use clang: gcc's UBSan (in libasan) ignores log_path and prints to
# stderr, where a report from a worker whose failure the test expected would
# go unnoticed; and TSan needs clang's libomp with Archer (CMakeLists.txt).
set -uo pipefail
kind=${1:?usage: scripts/sanitize-test.sh asan|tsan [ctest args]}
shift
src=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-2}
case "$kind" in
    asan) build=${BUILD:-$src/build-asan}; flags=(-DDTRAIN_SANITIZE=address,undefined -DCMAKE_C_COMPILER=clang) ;;
    tsan) build=${BUILD:-$src/build-tsan}; flags=(-DDTRAIN_SANITIZE=thread -DCMAKE_C_COMPILER=clang) ;;
    *) echo "sanitize-test: unknown kind '$kind' (expected asan or tsan)" >&2; exit 2 ;;
esac
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" ${CMAKE_FLAGS:-} >/dev/null || exit 1
cmake --build "$build" -j "$jobs" || exit 1
logs="$build/sanitizer-logs"
rm -rf "$logs"
start=$(date +%s)
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 1200 "$@")
rc=$?
echo "sanitize-test: $kind suite took $(( $(date +%s) - start )) s"
reports=$(find "$logs" -type f 2>/dev/null | sort)
if [ -n "$reports" ]; then
    for f in $reports; do
        t=${f#"$logs"/}
        echo "==== ${t%%/*}: $f"
        cat "$f"
    done
    echo "sanitize-test: $kind: $(echo "$reports" | wc -l) sanitizer report(s) in: $(for f in $reports; do t=${f#"$logs"/}; echo "${t%%/*}"; done | sort -u | tr '\n' ' ')" >&2
    exit 1
fi
[ $rc -eq 0 ] || { echo "sanitize-test: $kind: ctest failed (exit $rc)" >&2; exit $rc; }
echo "sanitize-test: $kind: no sanitizer reports, all tests passed"
