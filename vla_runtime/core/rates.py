"""Rates the runtime assumes unless a stack sets them, written once so that a node's parameter
and the core config it feeds cannot disagree."""

CONTROL_PERIOD_S = 0.004  # 250 Hz: the streamer's and the safety gate's tick
STATE_RATE_HZ = 250.0  # a direct driver's /joint_states
# Closest two points of a chunk may be: closer ones are no motion a controller can follow, and
# at epoch-scale stamps they can fall on the same float64 time (1 ns apart at 1.8e9 s).
MIN_POINT_SPACING_S = 1e-3
