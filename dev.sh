#!/usr/bin/env bash
# One script, three commands (see README):
#   ./dev.sh run    set everything up, then run 3 reach episodes through the simulated Franka FR3
#                   stack (cameras, engine, safety, streamer, arm) in real time: per-episode
#                   success, chunk verdicts, the latency chain, and runs/run.png (commanded vs
#                   measured joints with the verdict timeline); exits non-zero when the policy
#                   executed nothing
#   ./dev.sh test   set everything up, then run the test suite
#   ./dev.sh lerobot-check
#                   optional: build .venv-lerobot (Python 3.12, requirements-lerobot.txt: the real
#                   lerobot and its torch) and round-trip datasets both ways between this runtime
#                   and lerobot; neither the runtime nor its tests need that environment
# Set-up is idempotent: system libraries for offscreen rendering (apt), a virtual environment
# in .venv with the pinned requirements, and this package installed in editable mode.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

setup() {
  # MuJoCo renders offscreen on the CPU through EGL (Mesa llvmpipe).
  if ! ldconfig -p | grep -q 'libEGL_mesa.so.0' || ! ldconfig -p | grep -q 'libGL.so.1'; then
    echo "installing offscreen rendering libraries (libegl1, libegl-mesa0, libgl1, libosmesa6)"
    apt_install libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6
  fi
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv 2>/dev/null || { apt_install python3-venv && "$PYTHON" -m venv .venv; }
  fi
  local stamp=.venv/.requirements.sha
  local want
  want=$(cat requirements.txt requirements-dev.txt requirements-nodeps.txt setup.py | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing pinned requirements into .venv (first run takes a few minutes)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements-dev.txt
    .venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
    .venv/bin/python -m pip install -q --no-deps -e .
    echo "$want" > "$stamp"
  fi
  export PATH="$PWD/.venv/bin:$PATH" MUJOCO_GL="${MUJOCO_GL:-egl}" PYTHONUNBUFFERED=1
  build_interfaces
}

build_interfaces() {
  # tf2_msgs has no pip wheel: its TFMessage (for /tf_static) is built into .venv from
  # interfaces/tf2_msgs with the rosidl generators that requirements-dev.txt pins.
  .venv/bin/python -c "import tf2_msgs.msg" 2>/dev/null && return
  local missing=() python_version
  python_version=$(.venv/bin/python -c "import sys; print('%d.%d' % sys.version_info[:2])")
  command -v cmake >/dev/null || missing+=(cmake)
  command -v g++ >/dev/null || missing+=(g++)
  .venv/bin/python -c "import os, sysconfig
raise SystemExit(not os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
    || missing+=("python$python_version-dev")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing build tools for interfaces/tf2_msgs (${missing[*]})"
    apt_install "${missing[@]}"
  fi
  echo "building tf2_msgs/TFMessage into .venv (interfaces/tf2_msgs)"
  interfaces/build.sh .venv
}

case "${1:-}" in
  run)
    shift
    setup
    # The product path, exactly as `vla-runtime launch sim policy:=true task:=reach` starts it,
    # with the shipped checkpoint.
    exec vla-runtime eval --task reach --episodes 3 --out runs/run.jsonl --plot runs/run.png \
      --no-progress --json "$@"
    ;;
  test)
    shift
    setup
    exec python -m pytest -q -p no:cacheprovider test "$@"
    ;;
  lerobot-check)
    shift
    setup
    # lerobot 0.6.1 needs Python >= 3.12 and torch < 2.12, which the runtime's .venv does not have.
    lerobot_python=${LEROBOT_PYTHON:-$(pyenv which python3.12 2>/dev/null || command -v python3.12 || true)}
    [ -n "$lerobot_python" ] || { echo "lerobot-check needs python3.12 (set LEROBOT_PYTHON)" >&2; exit 2; }
    if [ ! -x .venv-lerobot/bin/python ]; then
      "$lerobot_python" -m venv .venv-lerobot
    fi
    lerobot_stamp=.venv-lerobot/.requirements.sha
    lerobot_want=$(sha256sum requirements-lerobot.txt | cut -d' ' -f1)
    if [ "$(cat "$lerobot_stamp" 2>/dev/null)" != "$lerobot_want" ]; then
      echo "installing requirements-lerobot.txt into .venv-lerobot (torch and lerobot: a few minutes)"
      .venv-lerobot/bin/python -m pip install -q --upgrade pip
      .venv-lerobot/bin/python -m pip install -q -r requirements-lerobot.txt
      echo "$lerobot_want" > "$lerobot_stamp"
    fi
    exec python -m vla_runtime.data.lerobot.roundtrip_check \
      --lerobot-python .venv-lerobot/bin/python "$@"
    ;;
  *)
    echo "usage: $0 run | test | lerobot-check" >&2
    exit 2
    ;;
esac
