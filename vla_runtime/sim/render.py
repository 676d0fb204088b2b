"""Offscreen rendering of one simulated camera from the published scene XML and qpos stream.

Each camera renders in its own process from its own copy of the model, so rendering never slows
the 1 kHz physics of the driver. MUJOCO_GL defaults to EGL (headless, see the package's
`__init__`).
"""

from __future__ import annotations

import mujoco
import numpy as np

from vla_runtime.core.camera_calibration import pinhole_from_fovy
from vla_runtime.sim.mesh_detail import RENDER_MESH_FACES, simplify_meshes


class SceneRenderer:
    def __init__(
        self, xml: str, camera: str, width: int, height: int, mesh_faces: int = RENDER_MESH_FACES
    ):
        """`mesh_faces`: triangles per mesh at most (`sim.mesh_detail`); 0 = full detail."""
        self.model = mujoco.MjModel.from_xml_string(xml)
        simplify_meshes(self.model, mesh_faces)
        self.data = mujoco.MjData(self.model)
        names = [self.model.camera(i).name for i in range(self.model.ncam)]
        if camera not in names:
            raise ValueError(f"no camera {camera!r} in the scene (cameras: {names})")
        self.camera = camera
        self.width, self.height = int(width), int(height)
        self._camera_id = self.model.camera(camera).id
        # Raises ValueError itself when the size exceeds the model's offscreen buffer.
        self._renderer = mujoco.Renderer(self.model, self.height, self.width)

    def render(self, qpos) -> np.ndarray:
        """An HxWx3 uint8 RGB image of the scene in configuration `qpos`."""
        qpos = np.asarray(qpos, dtype=float)
        if qpos.shape != (self.model.nq,):
            raise ValueError(f"qpos has shape {qpos.shape}, the scene needs ({self.model.nq},)")
        self.data.qpos[:] = qpos
        # Positions of bodies, cameras and lights are all rendering needs: skip dynamics.
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        self._renderer.update_scene(self.data, camera=self._camera_id)
        return self._renderer.render()

    def intrinsics(self) -> np.ndarray:
        """Pinhole K (3x3) of this camera at the rendered size; MuJoCo's fovy is vertical."""
        fovy = float(self.model.cam_fovy[self._camera_id])
        return pinhole_from_fovy(fovy, self.width, self.height)

    def close(self) -> None:
        self._renderer.close()
