"""ament_python package: installs with pip (`pip install -e .`) and builds with colcon."""

from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "vla_runtime"


def requirements(name: str = "requirements.txt") -> list[str]:
    """A pinned list: requirements.txt is offered as the `pip` extra (colcon installs resolve
    ROS packages through package.xml instead, where pip distributions do not exist),
    requirements-fleet.txt as the optional `fleet` extra (Ray Serve)."""
    lines = Path(__file__).with_name(name).read_text().splitlines()
    return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config/stacks", glob("config/stacks/*.yaml")),
        (f"share/{PACKAGE}/config/stacks/parts", glob("config/stacks/parts/*.yaml")),
        (f"share/{PACKAGE}/config/robots", glob("config/robots/*.yaml")),
        (f"share/{PACKAGE}/config/controllers", glob("config/controllers/*.yaml")),
        (f"share/{PACKAGE}/config", ["config/scheduler.yaml"]),
        *[
            (f"share/{PACKAGE}/{d}", glob(f"{d}/*"))
            for d in sorted(glob("checkpoints/*"))
            if Path(d).is_dir()
        ],
    ],
    install_requires=["setuptools"],
    extras_require={"pip": requirements(), "fleet": requirements("requirements-fleet.txt")},
    python_requires=">=3.10",
    zip_safe=True,
    maintainer="vla_runtime developers",
    maintainer_email="vla-runtime@example.org",
    description="Real-time runtime for Vision-Language-Action policies on Franka and UR arms",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "vla-runtime = vla_runtime.cli:main",
            "vla-sim-driver = vla_runtime.drivers.sim.node:main",
            "vla-task-driver = vla_runtime.drivers.sim.task_driver:main",
            "vla-camera = vla_runtime.nodes.camera:main",
            "vla-engine = vla_runtime.nodes.engine:main",
            "vla-streamer = vla_runtime.nodes.streamer:main",
            "vla-safety = vla_runtime.nodes.safety:main",
            "vla-franky-driver = vla_runtime.drivers.franky_driver:main",
            "vla-franky-workcell = vla_runtime.drivers.franky_workcell:main",
            "vla-franka-gripper = vla_runtime.drivers.franka_gripper_bridge:main",
            "vla-ur-driver = vla_runtime.drivers.ur_rtde_driver:main",
            "vla-fault-injector = vla_runtime.testing.fault_injector:main",
            "vla-scheduler = vla_runtime.nodes.scheduler:main",
        ],
    },
)
