"""Real-time runtime for Vision-Language-Action policies on Franka and UR arms (ROS 2)."""

import os

# Offscreen rendering works on headless hosts with EGL; MuJoCo picks its GL back end when it is
# first imported, so the choice is made here, before any module of the package imports it.
os.environ.setdefault("MUJOCO_GL", "egl")

__version__ = "0.1.0"
