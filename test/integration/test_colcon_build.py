"""The ament_python path: `colcon build` installs executables, launch files and stacks where
`ros2 run` / `ros2 launch` look for them, and the installed package finds its stacks."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("colcon") is None, reason="colcon not installed")


def _tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in out.stdout.splitlines() if (REPO / f).is_file()]


def test_colcon_build_installs_a_usable_package(tmp_path):
    src = tmp_path / "src" / "vla_runtime"
    for rel in _tracked_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    build = subprocess.run(
        ["colcon", "build", "--base-paths", "src"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr

    prefix = tmp_path / "install" / "vla_runtime"
    executables = {p.name for p in (prefix / "lib" / "vla_runtime").iterdir()}
    assert {"vla-runtime", "vla-sim-driver", "vla-camera"} <= executables
    share = prefix / "share" / "vla_runtime"
    assert (share / "package.xml").is_file()
    assert {"sim.launch.py", "franka.launch.py", "ur.launch.py"} <= {
        p.name for p in (share / "launch").iterdir()
    }
    assert (prefix / "share/ament_index/resource_index/packages/vla_runtime").is_file()

    site = next((prefix / "lib").glob("python3*/site-packages"))
    env = dict(os.environ, PYTHONPATH=str(site), AMENT_PREFIX_PATH=str(prefix))
    env.pop("VLA_RUNTIME_SHARE", None)
    probe = (
        "import vla_runtime; from vla_runtime.core.paths import share_dir;"
        "from vla_runtime.stack.resolver import resolve_stack;"
        "print(vla_runtime.__file__); print(share_dir());"
        "print(','.join(n.name for n in resolve_stack('sim').nodes))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    module_file, share_path, nodes = out.stdout.split()
    assert module_file.startswith(str(site))
    assert Path(share_path) == share
    assert nodes == "sim_driver,scene_camera,wrist_camera"
