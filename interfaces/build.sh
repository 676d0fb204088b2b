#!/usr/bin/env bash
# Builds the interface packages here into a Python environment's prefix (a venv), with the
# rosidl generators installed there from pip: `interfaces/build.sh PREFIX`. Needs cmake, a C++
# compiler and the Python headers. Output goes to PREFIX/build/<package>.log.
set -euo pipefail
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
for package in tf2_msgs; do
  build="$prefix/build/$package"
  mkdir -p "$build"
  if ! { AMENT_PREFIX_PATH="$prefix" cmake -S "$here/$package" -B "$build" -DBUILD_TESTING=OFF \
           -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefix" \
           -DPython3_EXECUTABLE="$prefix/bin/python" \
         && AMENT_PREFIX_PATH="$prefix" cmake --build "$build" -j2 \
         && cmake --install "$build"; } >"$build.log" 2>&1; then
    tail -n 30 "$build.log" >&2
    echo "building interfaces/$package failed (log: $build.log)" >&2
    exit 1
  fi
done
