"""The ROS boundary: the node runtime (init, spin loop, shutdown), QoS profiles and the
conversions between ROS messages and the core's types."""
