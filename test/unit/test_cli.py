import json
import subprocess
import sys

import pytest

from vla_runtime.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vla_runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unknown_stack_and_bad_arguments_are_clear_errors(capsys):
    assert main(["launch", "nope"]) == 2
    assert "no stack 'nope'" in capsys.readouterr().err
    assert main(["launch", "sim", "--duration", "1", "seed=3"]) == 2
    assert "name:=value" in capsys.readouterr().err
    assert main(["launch", "sim", "not_an_arg:=1"]) == 2
    assert "has no argument(s) ['not_an_arg']" in capsys.readouterr().err
    assert main(["launch", "ur", "use_mock_hardware:=true"]) == 2
    assert "mock hardware" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["launch", "sim", "--no-such-option"])


def test_bench_sim_prints_one_json_object():
    out = run_cli("bench", "sim", "--json", "--seconds", "0.3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["physics"]["real_time_factor"] > 1.0
    assert set(result["render"]) == {"scene", "wrist"}
    assert result["render"]["scene"]["ms_p50"] > 0


def test_calibrate_without_its_subcommand_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "calibrate scheduler --data DIR" in err and "Traceback" not in err
