import pytest

from vla_runtime.core.isolation import claim_domain


def test_claims_are_exclusive_and_released():
    with claim_domain() as first, claim_domain() as second:
        assert first.domain_id != second.domain_id
        with pytest.raises(RuntimeError, match="no free ROS domain"):
            claim_domain(first.domain_id)
        env = first.env(base={})
        assert env == {
            "ROS_DOMAIN_ID": str(first.domain_id),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        }
        assert "ROS_AUTOMATIC_DISCOVERY_RANGE" not in first.env(base={}, localhost_only=False)
    again = claim_domain(first.domain_id)  # released on exit
    again.release()


def test_out_of_range_domain_rejected():
    with pytest.raises(ValueError, match="0..232"):
        claim_domain(500)
