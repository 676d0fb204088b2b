"""Rates the runtime assumes unless a stack sets them, written once so that a node's parameter
and the core config it feeds cannot disagree."""

CONTROL_PERIOD_S = 0.004  # 250 Hz: the streamer's and the safety gate's tick
STATE_RATE_HZ = 250.0  # a direct driver's /joint_states
