"""Latency-aware streaming of action chunks (docs/design.md §4), pure logic without ROS.

- `streamer`: `ActionStreamer`, the plan run at the control rate (time model in its doc).
- `lifecycle`: `StreamerLifecycle`, when it starts, holds, resyncs and restarts per episode.
- `config`: `StreamerConfig`, the modes and request policies.
- `plan`: the plan's timed knots and their C1 spline.
- `handover`: how a new chunk takes over the plan (blend, start-up window, splice).
- `requests`: inference requests in flight and the delay they measure.
- `metrics`: what the streamer counts and the figures reported from it.
"""
