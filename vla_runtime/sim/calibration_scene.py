"""The workcell with a ChArUco board in it, for calibrating its cameras against ground truth.

Built only for calibration: the default scene (`sim.scene`), which the policy was trained on, is
untouched. The board is a thin textured box mounted one of three ways:
- "free": on a free joint, placed anywhere (intrinsics: moved in front of a camera);
- "table": fixed on the table (eye-in-hand: the arm moves the wrist camera around it);
- "flange": fixed to the hand beyond the fingertips, facing along the approach axis
  (eye-to-hand: the arm shows it to the scene camera).
Ground truth comes from MuJoCo: camera frames (converted to the optical frame), fovy, and the
arm's flange from the same forward kinematics the runtime uses (`core.kinematics`).
"""

from __future__ import annotations

import mujoco
import numpy as np

from vla_runtime.core.camera_calibration import pinhole_from_fovy
from vla_runtime.core.charuco import BoardSpec, transform
from vla_runtime.core.kinematics import FRANKA
from vla_runtime.sim.scene import build_scene
from vla_runtime.sim.workcell import SceneConfig

MOUNTS = ("free", "table", "flange")
BOARD_THICKNESS_M = 0.002
TABLE_BOARD_CENTRE = (0.5, 0.0)  # m, base frame: in front of the robot, inside the cube region
FLANGE_BOARD_OFFSET_M = 0.16  # m along the hand's approach axis: clear of the fingertips
# A MuJoCo camera looks along its -z with y up; the optical frame looks along +z with y down.
MUJOCO_TO_OPTICAL = np.diag([1.0, -1.0, -1.0])
# The board frame (charuco.py) in the board geom's frame: the texture's columns run along +x
# and its rows along -y of the geom's +z face, which faces the viewer (board z points into it).


def geom_to_board(spec: BoardSpec) -> np.ndarray:
    """T_geom_board: the board frame's origin at the top-left chessboard corner of the face."""
    half_w, half_h = (s / 2 for s in spec.printed_size_m)
    margin = spec.margin_squares * spec.square_m
    origin = [-half_w + margin, half_h - margin, BOARD_THICKNESS_M / 2]  # the visible face
    return transform(np.diag([1.0, -1.0, -1.0]), origin)


def _quat(rotation: np.ndarray) -> np.ndarray:
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.asarray(rotation, float).flatten())
    return quat


class CalibrationScene:
    """The FR3 workcell with the board mounted as `mount`, rendered offscreen at width x height."""

    def __init__(
        self, mount: str, width: int, height: int, board: BoardSpec = BoardSpec(),
        pixels_per_square: int = 120,
    ) -> None:  # fmt: skip
        if mount not in MOUNTS:
            raise ValueError(f"board mount must be one of {MOUNTS}, got {mount!r}")
        self.mount, self.board, self.width, self.height = mount, board, width, height
        _, xml = build_scene(SceneConfig(n_cubes=0))  # no cubes to hide the board
        spec = mujoco.MjSpec.from_string(xml)
        self._add_board(spec, board.image(pixels_per_square))
        self.model = spec.compile()
        self.data = mujoco.MjData(self.model)
        self.home = np.array(self.model.key("home").qpos, dtype=float)
        self.arm_dof = FRANKA.dof
        self._board_qpos = (
            self.model.jnt_qposadr[self.model.joint("board").id] if mount == "free" else None
        )
        self._renderer = mujoco.Renderer(self.model, height, width)
        self.set_state(self.home[: self.arm_dof])

    def _add_board(self, spec: mujoco.MjSpec, image: np.ndarray) -> None:
        texture = spec.add_texture(
            name="charuco", type=mujoco.mjtTexture.mjTEXTURE_2D,
            width=image.shape[1], height=image.shape[0], nchannel=3,
        )  # fmt: skip
        texture.data = np.repeat(image[:, :, None], 3, axis=2).tobytes()
        material = spec.add_material(name="charuco", texuniform=False, texrepeat=[1, 1])
        material.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "charuco"
        half_w, half_h = (s / 2 for s in self.board.printed_size_m)
        if self.mount == "free":
            parent = spec.worldbody.add_body(name="board", pos=[0.5, 0.0, 0.3])
            parent.add_freejoint(name="board")
            pos, quat = [0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
        elif self.mount == "table":
            parent = spec.worldbody
            pos, quat = [*TABLE_BOARD_CENTRE, BOARD_THICKNESS_M / 2], [1.0, 0.0, 0.0, 0.0]
        else:
            parent = spec.body("hand")
            pos, quat = [0.0, 0.0, FLANGE_BOARD_OFFSET_M], [1.0, 0.0, 0.0, 0.0]
        parent.add_geom(
            name="board", type=mujoco.mjtGeom.mjGEOM_BOX, material="charuco",
            size=[half_w, half_h, BOARD_THICKNESS_M / 2], pos=pos, quat=quat,
            contype=0, conaffinity=0, mass=0.05,
        )  # fmt: skip

    # ------------------------------------------------------------ state

    def set_state(self, arm_q, world_board: np.ndarray | None = None) -> None:
        """Arm joints (the gripper stays open) and, for the free board, T_world_board."""
        qpos = self.home.copy()
        qpos[: self.arm_dof] = arm_q
        if world_board is not None:
            if self._board_qpos is None:
                raise ValueError(f"the {self.mount} board does not move on its own")
            geom = world_board @ np.linalg.inv(self._geom_to_board())
            adr = self._board_qpos
            qpos[adr : adr + 3] = geom[:3, 3]
            qpos[adr + 3 : adr + 7] = _quat(geom[:3, :3])
        self.data.qpos[:] = qpos
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)

    def render(self, camera: str) -> np.ndarray:
        self._renderer.update_scene(self.data, camera=camera)
        return self._renderer.render()

    # ------------------------------------------------------------ ground truth

    def _geom_to_board(self) -> np.ndarray:
        return geom_to_board(self.board)

    def world_board(self) -> np.ndarray:
        geom = self.data.geom("board")
        return transform(geom.xmat.reshape(3, 3), geom.xpos) @ self._geom_to_board()

    def world_camera(self, camera: str) -> np.ndarray:
        """T_world_camera of the optical frame (z forward, y down)."""
        cam = self.data.camera(camera)
        return transform(cam.xmat.reshape(3, 3) @ MUJOCO_TO_OPTICAL, cam.xpos)

    def intrinsics(self, camera: str) -> np.ndarray:
        fovy = float(self.model.cam_fovy[self.model.camera(camera).id])
        return pinhole_from_fovy(fovy, self.width, self.height)

    def flange(self, arm_q) -> np.ndarray:
        """T_base_flange by the runtime's forward kinematics (the base is the world origin)."""
        return FRANKA.joint_frames(np.asarray(arm_q, float))[FRANKA.dof]

    def close(self) -> None:
        self._renderer.close()
