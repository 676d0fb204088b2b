"""`vla-runtime launch` refuses a policy without a checkpoint on a real arm before starting
anything (one line, exit 2); in simulation it only warns."""

from __future__ import annotations

from vla_runtime.cli import main


def test_checkpoint_less_policy_is_refused_on_a_real_arm(capsys):
    assert main(["launch", "franka", "policy:=true", "robot_ip:=172.16.0.2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without checkpoint:=DIR would drive a real arm" in err[0]
    assert main(["launch", "ur", "policy:=true"]) == 2
