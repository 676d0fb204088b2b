"""RunMonitor over real DDS: counts, rates in sim and wall clocks, camera latency."""

from __future__ import annotations

import time

import pytest
from rclpy.qos import qos_profile_sensor_data

from vla_runtime.core import topics
from vla_runtime.ros.runtime import BackgroundSpinner as Spinner
from vla_runtime.stack.monitor import RunMonitor, camera_name_of, header_stamp_ns, message_class


def test_helpers_without_dds():
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header

    assert camera_name_of("/vla/cameras/wrist/image_raw") == "wrist"
    assert camera_name_of("/vla/cameras/wrist/camera_info") is None
    assert camera_name_of("/vla/cameras//image_raw") is None
    assert camera_name_of("/joint_states") is None

    assert message_class("sensor_msgs/msg/Image") is Image
    assert message_class("std_msgs/Header") is Header
    with pytest.raises(ValueError):
        message_class("Image")

    image = Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(12))
    image.header.stamp.sec, image.header.stamp.nanosec = 1234, 567_000_000
    image.header.frame_id = "cam"
    assert header_stamp_ns(serialize_message(image)) == 1_234_567_000_000
    assert header_stamp_ns(b"\x00\x01\x00") is None


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_until_settled(monitor, topic, expected, timeout=30.0):
    """Wait for `expected` receipts, or until the count stops moving for a second."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = monitor.report()["topics"].get(topic, {}).get("count", 0)
        if count >= expected:
            return
        if count != last:
            last, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > 1.0:
            return
        time.sleep(0.05)


@pytest.mark.integration
def test_counts_and_rates_in_wall_and_sim_time(rclpy_context):
    import rclpy
    from rosgraph_msgs.msg import Clock
    from std_msgs.msg import Int32

    talker = rclpy.create_node("talker", context=rclpy_context)
    fast_pub = talker.create_publisher(Int32, "/test/fast", 10)
    clock_pub = talker.create_publisher(Clock, topics.CLOCK, 10)
    wall_monitor = RunMonitor(
        ["/test/fast", "/test/never"], context=rclpy_context, node_name="monitor_wall"
    )
    sim_monitor = RunMonitor(
        None,
        context=rclpy_context,
        use_sim_time=True,
        node_name="monitor_sim",
        discovery_period_s=0.2,
    )
    n, period, sim_speed = 100, 0.02, 2.0
    try:
        with Spinner(rclpy_context, [wall_monitor, sim_monitor]):
            wait_for(lambda: fast_pub.get_subscription_count() >= 2, 30, "both monitors")
            wait_for(lambda: clock_pub.get_subscription_count() >= 1, 30, "the sim time source")
            sent = []
            start = time.monotonic()
            for k in range(n):
                # The simulated clock runs at twice wall speed.
                sim_ns = 1_000_000_000 + round(k * period * sim_speed * 1e9)
                clock = Clock()
                clock.clock.sec, clock.clock.nanosec = divmod(sim_ns, 1_000_000_000)
                clock_pub.publish(clock)
                fast_pub.publish(Int32(data=k))
                sent.append(time.monotonic())
                time.sleep(max(0.0, start + (k + 1) * period - time.monotonic()))
            wait_until_settled(wall_monitor, "/test/fast", n)
            wait_until_settled(sim_monitor, "/test/fast", n)
            wall_report, sim_report = wall_monitor.report(), sim_monitor.report()
    finally:
        for node in (wall_monitor, sim_monitor, talker):
            node.destroy_node()

    sent_rate = (n - 1) / (sent[-1] - sent[0])
    fast = wall_report["topics"]["/test/fast"]
    assert fast["type"] == "std_msgs/msg/Int32"
    assert fast["count"] == n
    assert fast["wall_rate_hz"] == pytest.approx(sent_rate, rel=0.3)
    assert fast["rate_hz"] == pytest.approx(sent_rate, rel=0.3)  # ROS time = system time here
    assert wall_report["topics"]["/test/never"] == {
        "type": None,
        "count": 0,
        "rate_hz": 0.0,
        "wall_rate_hz": 0.0,
    }
    assert set(wall_report["topics"]) == {"/test/fast", "/test/never"}
    assert wall_report["cameras"] == {}

    # Discovered without being named; its rate is in sim time, which runs twice as fast.
    fast_sim = sim_report["topics"]["/test/fast"]
    assert fast_sim["count"] == n
    assert fast_sim["wall_rate_hz"] == pytest.approx(sent_rate, rel=0.3)
    assert fast_sim["rate_hz"] == pytest.approx(sent_rate / sim_speed, rel=0.3)
    assert sim_report["topics"][topics.CLOCK]["type"] == "rosgraph_msgs/msg/Clock"


@pytest.mark.integration
def test_stamped_messages_are_rated_on_their_stamps(rclpy_context):
    """/clock arrives in coarse steps (as on a loaded host): receipt times bunch up and would
    read a rate above the publisher's; the stamps give it exactly."""
    import rclpy
    from rclpy.time import Time
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import JointState

    talker = rclpy.create_node("stamped_talker", context=rclpy_context)
    state_pub = talker.create_publisher(JointState, "/test/stamped", 100)
    clock_pub = talker.create_publisher(Clock, topics.CLOCK, 10)
    monitor = RunMonitor(
        ["/test/stamped"], context=rclpy_context, use_sim_time=True, node_name="monitor_stamped"
    )
    n, period_ns, clock_every = 100, 10_000_000, 10  # 100 Hz of sim time, /clock at 10 Hz
    try:
        with Spinner(rclpy_context, [monitor]):
            wait_for(lambda: state_pub.get_subscription_count() >= 1, 30, "the monitor")
            wait_for(lambda: clock_pub.get_subscription_count() >= 1, 30, "the sim time source")
            for k in range(n):
                sim_ns = 1_000_000_000 + k * period_ns
                if k % clock_every == 0:
                    clock = Clock()
                    clock.clock = Time(nanoseconds=sim_ns).to_msg()
                    clock_pub.publish(clock)
                state = JointState(name=["j"], position=[0.0])
                state.header.stamp = Time(nanoseconds=sim_ns).to_msg()
                state_pub.publish(state)
                time.sleep(0.01)
            wait_until_settled(monitor, "/test/stamped", n)
            stamped = monitor.report()["topics"]["/test/stamped"]
    finally:
        monitor.destroy_node()
        talker.destroy_node()
    assert stamped["count"] == n
    assert stamped["rate_hz"] == pytest.approx(100.0, rel=1e-6)


@pytest.mark.integration
def test_camera_latency_from_image_stamps(rclpy_context):
    import rclpy
    from rclpy.time import Time
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image

    wrist, scene = topics.camera_image("wrist"), topics.camera_image("scene")
    talker = rclpy.create_node("camera_talker", context=rclpy_context)
    wrist_pub = talker.create_publisher(Image, wrist, qos_profile_sensor_data)
    scene_pub = talker.create_publisher(Image, scene, qos_profile_sensor_data)
    clock_pub = talker.create_publisher(Clock, topics.CLOCK, 10)
    wall_monitor = RunMonitor([wrist], context=rclpy_context, node_name="monitor_wall")
    sim_monitor = RunMonitor(
        [scene], context=rclpy_context, use_sim_time=True, node_name="monitor_sim"
    )
    pixels = bytes(224 * 224 * 3)
    n, age_ms = 20, 50.0
    sim_now_ns, sim_stamp_ns = 100_000_000_000, 99_900_000_000  # 100 ms old in sim time

    def image(stamp_ns):
        msg = Image(height=224, width=224, encoding="rgb8", step=224 * 3, data=pixels)
        msg.header.stamp = Time(nanoseconds=stamp_ns).to_msg()
        return msg

    try:
        with Spinner(rclpy_context, [wall_monitor, sim_monitor]):
            wait_for(lambda: wrist_pub.get_subscription_count() >= 1, 30, "the wall monitor")
            wait_for(lambda: scene_pub.get_subscription_count() >= 1, 30, "the sim monitor")
            clock = Clock()
            clock.clock.sec = 100

            def sim_clock_set():
                clock_pub.publish(clock)
                return sim_monitor.get_clock().now().nanoseconds == sim_now_ns

            wait_for(sim_clock_set, 30, "sim time to reach the monitor")
            # Sim time now stands still at 100 s: every scene image is exactly 100 ms old.
            for _ in range(n):
                wall_now_ns = talker.get_clock().now().nanoseconds
                wrist_pub.publish(image(wall_now_ns - round(age_ms * 1e6)))
                scene_pub.publish(image(sim_stamp_ns))
                time.sleep(1.0 / 15)
            wait_until_settled(wall_monitor, wrist, n)
            wait_until_settled(sim_monitor, scene, n)
            wall_report, sim_report = wall_monitor.report(), sim_monitor.report()
    finally:
        for node in (wall_monitor, sim_monitor, talker):
            node.destroy_node()

    assert set(wall_report["cameras"]) == {"wrist"}
    wrist_received = wall_report["topics"][wrist]["count"]
    assert wrist_received >= n // 2  # best effort: a 150 kB image may be lost, not most
    latency = wall_report["cameras"]["wrist"]["latency_ms"]
    assert latency["n"] == wrist_received
    # 50 ms of age plus local transport and queueing; generous bound for a loaded machine.
    assert age_ms <= latency["p50"] <= latency["p99"] <= latency["max"] < age_ms + 2000
    assert wall_report["cameras"]["wrist"]["rate_hz"] > 0

    assert set(sim_report["cameras"]) == {"scene"}
    scene_received = sim_report["topics"][scene]["count"]
    assert scene_received >= n // 2
    sim_latency = sim_report["cameras"]["scene"]["latency_ms"]
    assert sim_latency["n"] == scene_received
    for key in ("p50", "p99", "max", "mean"):
        assert sim_latency[key] == pytest.approx(100.0, abs=1e-6), key
    assert sim_report["cameras"]["scene"]["rate_hz"] == 0.0  # sim time stood still
    assert sim_report["topics"][scene]["wall_rate_hz"] > 0


@pytest.mark.integration
def test_newest_stats_values_are_reported(rclpy_context):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    talker = rclpy.create_node("stats_talker", context=rclpy_context)
    pub = talker.create_publisher(DiagnosticArray, topics.STREAMER_STATS, 10)
    monitor = RunMonitor([topics.STREAMER_STATS], context=rclpy_context, node_name="monitor_d")
    try:
        with Spinner(rclpy_context, [monitor]):
            wait_for(lambda: pub.get_subscription_count() >= 1, 30, "the monitor")
            for executed in (10, 20, 30):
                status = DiagnosticStatus(
                    name="streamer",
                    values=[
                        KeyValue(key="executed", value=str(executed)),
                        KeyValue(key="stale_executed", value="0"),
                    ],
                )
                pub.publish(DiagnosticArray(status=[status]))
                time.sleep(0.05)
            wait_until_settled(monitor, topics.STREAMER_STATS, 3)
            report = monitor.report()
    finally:
        monitor.destroy_node()
        talker.destroy_node()
    assert report["topics"][topics.STREAMER_STATS]["count"] == 3
    assert report["diagnostics"][topics.STREAMER_STATS] == {
        "streamer": {"executed": "30", "stale_executed": "0"}
    }


@pytest.mark.integration
def test_safety_events_are_counted_by_kind_and_verdict(rclpy_context):
    import json as json_

    import rclpy
    from std_msgs.msg import String

    talker = rclpy.create_node("events_talker", context=rclpy_context)
    pub = talker.create_publisher(String, topics.SAFETY_EVENTS, 10)
    monitor = RunMonitor([topics.SAFETY_EVENTS], context=rclpy_context, node_name="monitor_e")
    sent = [
        {"event": "chunk", "verdict": "veto"},
        {"event": "chunk", "verdict": "accept"},
        {"event": "chunk", "verdict": "veto"},
        {"event": "command_timeout"},
    ]
    try:
        with Spinner(rclpy_context, [monitor]):
            wait_for(lambda: pub.get_subscription_count() >= 1, 30, "the monitor")
            for event in sent:
                pub.publish(String(data=json_.dumps(event)))
                time.sleep(0.05)
            pub.publish(String(data="not json"))
            wait_until_settled(monitor, topics.SAFETY_EVENTS, 5)
            report = monitor.report()
    finally:
        monitor.destroy_node()
        talker.destroy_node()
    assert report["events"][topics.SAFETY_EVENTS] == {
        "chunk:accept": 1,
        "chunk:veto": 2,
        "command_timeout": 1,
        "unparsable": 1,
    }
