#!/usr/bin/env bash
# `make install` works for library users: installs the build into a temporary
# prefix, then builds examples/train_fashion.c against it twice, through
# pkg-config and through CMake's find_package(dtrain), and runs both.
#   tests/install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/dtrain/dtrain.h"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# In a sanitizer build (-DDTRAIN_SANITIZE) the library needs its runtime:
# the examples are built with the same compiler and -fsanitize flag.
cc=${DTRAIN_SANITIZE_CC:-cc}
export CFLAGS="${DTRAIN_SANITIZE_FLAGS:-}" LDFLAGS="${DTRAIN_SANITIZE_FLAGS:-}"
"$cc" $CFLAGS "$src/examples/train_fashion.c" $(pkg-config --cflags --libs dtrain) $LDFLAGS \
   -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/ex_pc"
mkdir "$tmp/cm"
cat > "$tmp/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(consumer C)
find_package(dtrain REQUIRED)
add_executable(ex "$src/examples/train_fashion.c")
target_link_libraries(ex dtrain::dtrain)
CM
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm/b" >/dev/null
for ex in "$tmp/ex_pc" "$tmp/cm/b/ex"; do
    out=$("$ex" "$src/configs/fashion-mlp.ini" train.max_steps=3 train.threads=1)
    echo "$out"
    case "$out" in "steps 3, test accuracy"*) ;; *) echo "unexpected output from $ex" >&2; exit 1;; esac
done
"$tmp/prefix/bin/dtrain" --version
echo "1 passed, 0 failed"
