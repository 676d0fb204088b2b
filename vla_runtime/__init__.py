"""Real-time runtime for Vision-Language-Action policies on Franka and UR arms (ROS 2)."""

__version__ = "0.1.0"
