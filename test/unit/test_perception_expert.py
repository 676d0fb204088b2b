"""The perception expert as a policy on the in-process simulator: only rendered camera images
and the joint readings reach it; its chunks run a few actions at a time, each next chunk
asked for with the plan still to run, as the streamer does."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from vla_runtime.core import cube_perception
from vla_runtime.core.gripper import opening_from_width
from vla_runtime.data import perception_collect, perception_expert, scene_perception
from vla_runtime.data.perception_expert import (
    HOME,
    MOVE,
    PLACE,
    PerceptionExpert,
    parse_instruction,
)
from vla_runtime.data.reset_plan import START_TOLERANCE_M, random_start
from vla_runtime.engine.policy import Observation, PolicyError
from vla_runtime.sim.env import PHYSICS_STEPS
from vla_runtime.sim.render import SceneRenderer
from vla_runtime.sim.tasks import INSTRUCTIONS, TaskSimulator, is_success

EXECUTE = 4  # actions run per chunk before the next one is asked for


class Loop:
    """Simulator + renderers + the policy, stepped chunk by chunk."""

    def __init__(self, task: str):
        self.policy = PerceptionExpert()
        self.sim = TaskSimulator(task)
        self.renderers = {
            "scene_hd": SceneRenderer(self.sim.xml, "scene", 224, 224),
            "wrist": SceneRenderer(self.sim.xml, "wrist", 96, 96),
        }
        self.names = (*self.sim.robot.joints, self.sim.robot.gripper_joints[0])

    def observe(self, instruction: str, start: float) -> Observation:
        sim = self.sim
        images = {c: r.render(sim.qpos) for c, r in self.renderers.items()}
        state = np.append(sim.arm_positions, sim.gripper_width)
        return Observation(images, state, instruction, sim.time,
                           {c: sim.time for c in images}, start)  # fmt: skip

    def run(self, instruction: str, steps: int, done=None) -> int | None:
        """Run until `done()` or the expert says it finished; the steps taken (None: never)."""
        start, plan = self.sim.time, None
        for chunk in range(steps // EXECUTE):
            result = self.policy.infer(self.observe(instruction, start), plan=plan)
            for row in result.actions[:EXECUTE]:
                command = [*row[:7], opening_from_width(row[7])]
                assert self.sim.set_trajectory(self.names, [command], [0.05]) is None
                self.sim.step(PHYSICS_STEPS)
            plan = result.actions[EXECUTE : EXECUTE + 2]
            if (done is not None and done()) or result.info["expert_finished"]:
                return (chunk + 1) * EXECUTE
        return None

    def close(self) -> None:
        for renderer in self.renderers.values():
            renderer.close()


@pytest.fixture
def loop(request):
    made = Loop(request.param)
    yield made
    made.close()


@pytest.mark.parametrize("loop", ["reach", "pick", "push"], indirect=True)
def test_the_expert_solves_the_task_from_the_cameras(loop):
    sim = loop.sim
    for seed in (1,):
        sim.randomize(seed)
        sim.step(PHYSICS_STEPS)
        instruction = INSTRUCTIONS[sim.task].format(colour=sim.setup.target)
        solved = lambda: is_success(sim.setup, sim.snapshot())  # noqa: E731
        steps = loop.run(instruction, sim.setup.max_steps, solved)
        assert steps is not None, f"{sim.task} seed {seed} failed"


@pytest.mark.parametrize("loop", ["pick"], indirect=True)
def test_the_expert_moves_a_cube_to_a_place_and_returns_home(loop):
    sim = loop.sim
    sim.randomize(4)
    sim.step(PHYSICS_STEPS)
    colour = sim.setup.target
    place = (0.5, -0.12)
    assert loop.run(PLACE.format(colour=colour, x=place[0], y=place[1]), 400) is not None
    cube = sim.snapshot().cubes[colour]
    assert np.linalg.norm(cube[:2] - place) < 0.005
    assert sim.gripper_width > 0.07  # let go
    assert loop.run(HOME, 200) is not None
    assert np.abs(sim.arm_positions - np.array(sim.robot.home)).max() < 0.01


@pytest.mark.parametrize("loop", ["reach"], indirect=True)
def test_an_episode_from_a_random_start_pose_still_solves_the_task(loop):
    sim = loop.sim
    sim.randomize(3)
    sim.step(PHYSICS_STEPS)
    pose = random_start(np.random.default_rng(5))
    x, y, z, yaw = pose
    assert loop.run(MOVE.format(x=x, y=y, z=z, yaw=yaw), 200) is not None
    tcp, rotation = loop.policy.kinematics.tcp_pose(sim.arm_positions)
    assert np.linalg.norm(tcp - pose[:3]) < START_TOLERANCE_M
    assert abs(np.arctan2(rotation[1, 0], rotation[0, 0]) - yaw) < 0.02
    assert np.linalg.norm(tcp - loop.policy.kinematics.tcp_pose(sim.robot.home)[0]) > 0.05
    instruction = INSTRUCTIONS["reach"].format(colour=sim.setup.target)
    solved = lambda: is_success(sim.setup, sim.snapshot())  # noqa: E731
    assert loop.run(instruction, sim.setup.max_steps, solved) is not None


@pytest.mark.parametrize("loop", ["reach"], indirect=True)
def test_a_chunk_follows_the_plan_it_is_given_then_goes_on_without_a_jump(loop):
    sim = loop.sim
    sim.randomize(0)
    sim.step(PHYSICS_STEPS)
    instruction = INSTRUCTIONS["reach"].format(colour=sim.setup.target)
    start = sim.time
    first = loop.policy.infer(loop.observe(instruction, start))
    for row in first.actions[:EXECUTE]:
        sim.set_trajectory(loop.names, [[*row[:7], opening_from_width(row[7])]], [0.05])
        sim.step(PHYSICS_STEPS)
    plan = first.actions[EXECUTE : EXECUTE + 3]
    second = loop.policy.infer(loop.observe(instruction, start), plan=plan)
    np.testing.assert_allclose(second.actions[:3], plan, atol=1e-6)
    steps = np.abs(np.diff(second.actions[2:5, :7], axis=0)).max()
    assert steps < 0.05  # rad per 50 ms step: the continuation joins smoothly


@pytest.mark.parametrize("loop", ["reach"], indirect=True)
def test_a_target_out_of_view_is_refused_not_guessed(loop):
    sim = loop.sim
    sim.randomize(0)
    sim.step(PHYSICS_STEPS)
    observation = loop.observe("touch the red cube", sim.time)
    observation.images = {c: np.zeros_like(i) for c, i in observation.images.items()}
    with pytest.raises(PolicyError, match="not in view"):
        loop.policy.infer(observation)


def test_instructions_are_parsed_or_refused():
    assert parse_instruction("pick up the blue cube").task == "pick"
    place = parse_instruction(PLACE.format(colour="red", x=0.45, y=-0.1))
    assert place.task == "place" and place.colour == "red" and place.place_xy == (0.45, -0.1)
    assert parse_instruction(HOME).task == "home"
    move = parse_instruction(MOVE.format(x=0.4, y=-0.05, z=0.2, yaw=-0.3))
    assert move.task == "move" and move.pose == (0.4, -0.05, 0.2, -0.3)
    for text in ("touch the moving red cube", "pick up the pink cube", "dance"):
        with pytest.raises(PolicyError):
            parse_instruction(text)


def test_nothing_on_the_collection_path_reads_the_simulators_state():
    """The expert, perception and the collector's own classes name no privileged source; the
    referee and the stack set-up, which may, are elsewhere in perception_collect."""
    privileged = ("SIM_SCENE_STATE", "SceneReader", "TaskSimulator", "qpos", "snapshot()",
                  "PhysicsReferee")  # fmt: skip
    sources = [
        inspect.getsource(module)
        for module in (perception_expert, scene_perception, cube_perception)
    ] + [inspect.getsource(perception_collect.CollectorNode),
         inspect.getsource(perception_collect.PerceptionCollector)]  # fmt: skip
    for source in sources:
        assert not [name for name in privileged if name in source]
