"""A simulated UR arm publishes its speed scaling like Universal_Robots_ROS2_Driver (percent on
/speed_scaling_state_broadcaster/speed_scaling), settable at run time like the pendant slider."""

from __future__ import annotations

import signal
import time

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from std_msgs.msg import Float64

from vla_runtime.core.speed_scaling import UR_SPEED_SCALING_TOPIC
from vla_runtime.stack.supervisor import module_process

pytestmark = pytest.mark.integration
WAIT_S = 60.0


def test_sim_ur_publishes_speed_scaling_in_percent(rclpy_context, tmp_path):
    import rclpy
    from rclpy.parameter_client import AsyncParameterClient

    proc = module_process(
        "vla_runtime.drivers.sim.node",
        *("robot:=ur5e", "speed_scaling:=0.5", "n_cubes:=1"),
        log_path=tmp_path / "sim_driver.log",
    ).start()
    node = rclpy.create_node("scaling_probe", context=rclpy_context)
    executor = SingleThreadedExecutor(context=rclpy_context)
    executor.add_node(node)
    readings: list[float] = []
    node.create_subscription(Float64, UR_SPEED_SCALING_TOPIC, lambda m: readings.append(m.data), 10)

    def spin_until(condition) -> bool:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not condition():
            executor.spin_once(timeout_sec=0.01)
        return condition()

    try:
        assert spin_until(lambda: readings), "no speed scaling published"
        assert readings[-1] == 50.0
        client = AsyncParameterClient(node, "sim_driver")
        assert client.wait_for_services(timeout_sec=WAIT_S)
        future = client.set_parameters([Parameter("speed_scaling", value=0.0)])
        assert spin_until(future.done) and future.result().results[0].successful
        assert spin_until(lambda: readings[-1] == 0.0)  # the slider at 0: paused
        future = client.set_parameters([Parameter("speed_scaling", value=1.5)])
        assert spin_until(future.done) and not future.result().results[0].successful
    finally:
        executor.shutdown()
        node.destroy_node()
        code, text = proc.stop(signal.SIGTERM, 20.0), proc.output()
    assert code == 0, text
