import time

import pytest

from vla_runtime.core.threads import default_threads, thread_env
from vla_runtime.stack.isolation import claim_domain, domains_in_use


def test_claims_are_exclusive_and_released():
    with claim_domain() as first, claim_domain() as second:
        assert first.domain_id != second.domain_id
        with pytest.raises(RuntimeError, match="no free ROS domain"):
            claim_domain(first.domain_id)
        env = first.env(base={})
        assert env == {
            "ROS_DOMAIN_ID": str(first.domain_id),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            **thread_env(default_threads()),  # every node of a stack shares the cores
        }
        assert "ROS_AUTOMATIC_DISCOVERY_RANGE" not in first.env(base={}, localhost_only=False)
    again = claim_domain(first.domain_id)  # released on exit
    again.release()


def test_out_of_range_domain_rejected():
    with pytest.raises(ValueError, match="0..232"):
        claim_domain(500)


def test_domain_of_a_live_process_is_skipped():
    """An orphaned node (no lock held) still publishes on its domain: never claim it."""
    import os
    import subprocess
    import sys

    with claim_domain() as probe:
        free = probe.domain_id
    env = dict(os.environ, ROS_DOMAIN_ID=str(free))
    squatter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        # Popen returns once exec began; /proc/<pid>/environ shows the new environment a moment
        # later (the kernel sets it up after closing the descriptors Popen waits on).
        deadline = time.monotonic() + 10.0
        while free not in domains_in_use() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert free in domains_in_use()
        with claim_domain() as claim:
            assert claim.domain_id != free
    finally:
        squatter.kill()
        squatter.wait()
