# vla_runtime on ROS 2 Jazzy: ros2_control, the UR driver, ros_gz, launch_testing / launch_pytest,
# the pinned Python requirements and a colcon build of this package. The default command runs
# the launch-file tests.
#
#   docker build -t vla_runtime .
#   docker run --rm vla_runtime                       # launch-file tests
#   docker run --rm -it vla_runtime bash              # a shell with everything sourced
#
# NOT BUILT HERE: the development machine has no container engine and no registry to pull base
# images from. This file is linted (hadolint, test/unit/test_dockerfile.py) but has never been
# built; build it once before relying on it.
#
# Two Python worlds, on purpose: the runtime and its tests run in /opt/vla_runtime/venv with the
# exact pins of requirements.txt (ROS 2 Jazzy's rclpy and messages as pip wheels built against
# numpy 2, as on the development machines); the apt ROS packages (ros2_control, drivers,
# ros_gz) run as their own processes on the system Python, whose message modules are compiled
# against Ubuntu's numpy 1.x. The venv sees apt's pure-Python `launch`, `launch_ros`,
# `launch_testing` and `launch_pytest` through a .pth file that puts apt's ROS site-packages
# after the venv's own even when a sourced setup.bash put them first on PYTHONPATH, so the
# venv's rclpy and messages always win.
FROM ros:jazzy-ros-base

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    MUJOCO_GL=egl \
    PYTHONUNBUFFERED=1 \
    VENV=/opt/vla_runtime/venv

# Franka: franka_ros2 is not Debian-packaged for Jazzy (it is built from source against the
# libfranka that matches the arm's firmware); this runtime drives Franka arms through franky
# (requirements.txt) or a franka_ros2 workspace built on the robot PC (docs/bringup.md).
# Versions of apt packages follow the ROS 2 Jazzy snapshot of the base image; pinning each one
# would break on every sync of the ROS apt repository.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ros-jazzy-ros2-control \
        ros-jazzy-ros2-controllers \
        ros-jazzy-ur \
        ros-jazzy-ros-gz \
        ros-jazzy-launch-pytest \
        ros-jazzy-launch-testing \
        ros-jazzy-launch-testing-ros \
        python3-venv \
        python3-dev \
        cmake \
        g++ \
        git \
        libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/vla_runtime/src/vla_runtime
COPY requirements.txt requirements-dev.txt requirements-nodeps.txt ./

# torch: the CPU wheel (the +cpu build of the pinned version) from PyTorch's index.
RUN python3 -m venv "$VENV" \
    && "$VENV/bin/pip" install --no-cache-dir \
        --extra-index-url https://download.pytorch.org/whl/cpu -r requirements-dev.txt \
    && "$VENV/bin/pip" install --no-cache-dir --no-deps -r requirements-nodeps.txt \
    && purelib="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && printf '%s\n' "import sys; ros = '/opt/ros/jazzy/lib/python3.12/site-packages'; sys.path[:] = [p for p in sys.path if p != ros] + [ros]" \
        > "$purelib/zz_ros_jazzy_apt_last.pth"

COPY . .

# The package twice: editable in the venv (tests, `vla-runtime`) and built by colcon (the
# colcon in the venv, so the installed node executables run on the venv's Python) for
# `ros2 launch vla_runtime ...`.
ENV PATH=$VENV/bin:$PATH
# tf2_msgs for the venv's rclpy (apt's is built for the system Python's numpy), as dev.sh does.
RUN interfaces/build.sh "$VENV" \
    && pip install --no-cache-dir --no-deps -e . \
    && mkdir -p /opt/vla_runtime/ws/src \
    && ln -s /opt/vla_runtime/src/vla_runtime /opt/vla_runtime/ws/src/vla_runtime
WORKDIR /opt/vla_runtime/ws
RUN . /opt/ros/jazzy/setup.bash \
    && colcon build --symlink-install --base-paths src \
    && printf '%s\n' 'source /opt/ros/jazzy/setup.bash' \
        'source /opt/vla_runtime/ws/install/setup.bash' >> /root/.bashrc

WORKDIR /opt/vla_runtime/src/vla_runtime
CMD ["bash", "-c", "source /opt/vla_runtime/ws/install/setup.bash && python -m pytest -q -p no:cacheprovider test/integration/test_launch_files.py"]
