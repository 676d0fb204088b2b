"""Shared fixtures: every test that touches DDS gets its own ROS domain on localhost."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from vla_runtime.core.safety.latch_store import STATE_DIR_ENV
from vla_runtime.stack.isolation import claim_domain


@pytest.fixture
def ros_domain(monkeypatch):
    """Claim a free ROS_DOMAIN_ID and export it (and localhost-only discovery) to this test
    and to every process it starts."""
    with claim_domain() as claim:
        for key, value in claim.env(base={}).items():
            monkeypatch.setenv(key, value)
        yield claim


@pytest.fixture
def rclpy_context(ros_domain):
    """An initialised rclpy context on the test's own domain, shut down afterwards."""
    import rclpy
    from rclpy.context import Context

    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain.domain_id)
    yield ctx
    ctx.try_shutdown()


@pytest.fixture(autouse=True)
def own_state_dir(tmp_path_factory, monkeypatch):
    """Each test keeps its own state that outlives a stack (the safety latch of real-arm
    stacks): a latch one test leaves set must not start the next test's gate latched."""
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("vla_runtime_state")))


@pytest.fixture(scope="module")
def torch_one_thread():
    """One torch thread: tiny models run faster without thread hand-offs on a 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    os.environ.setdefault("MUJOCO_GL", "egl")
    # State that outlives a run (the safety latch of real-arm stacks) goes to a folder of this
    # test run, never to the user's: every node and stack the tests start inherits it.
    state = tempfile.mkdtemp(prefix="vla_runtime_test_state_")
    os.environ[STATE_DIR_ENV] = state
    config.add_cleanup(lambda: shutil.rmtree(state, ignore_errors=True))
