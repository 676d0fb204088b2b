import json
import os
import subprocess
import sys

import pytest

from vla_runtime.bench.progress import stdout_to_stderr
from vla_runtime.cli import BENCHMARKS, build_parser, main


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
    assert main(["launch", "ur", "mock_sensor_commands:=true"]) == 2
    assert "mock sensor commands exist only with mock hardware" in capsys.readouterr().err
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


def test_bench_progress_bar_is_on_stderr_only(capsys):
    argv = ["bench", "sim", "--json", "--seconds", "0.5"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1 and json.loads(out)["benchmark"] == "sim"
    assert "bench sim" in err and "100%" in err and "render wrist" in err  # the last phase
    assert main([*argv, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["benchmark"] == "sim"
    assert "bench sim" not in err


def test_what_a_library_writes_to_stdout_during_a_benchmark_goes_to_stderr(capfd):
    with stdout_to_stderr():
        print("from python", flush=True)
        os.write(1, b"from c\n")  # as a library's C code or its own threads write
    print('{"result": 1}')
    out, err = capfd.readouterr()
    assert out == '{"result": 1}\n'
    assert "from python" in err and "from c" in err


def test_every_benchmark_takes_no_progress():
    parser = build_parser()
    for name in BENCHMARKS:
        assert parser.parse_args(["bench", name, "--no-progress"]).no_progress


def test_calibrate_without_its_subcommand_is_a_one_line_usage_error(capsys):
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for procedure in ("intrinsics", "hand-eye", "latency", "scheduler"):
        assert procedure in err


def test_calibrate_help_lists_every_procedure(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for procedure in ("intrinsics", "hand-eye", "latency", "scheduler"):
        assert f"\n    {procedure}" in out


@pytest.mark.parametrize("procedure", ["intrinsics", "hand-eye", "latency"])
def test_calibrate_without_sim_says_what_hardware_needs(procedure, capsys):
    assert main(["calibrate", procedure]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "only --sim runs here" in err


@pytest.mark.parametrize(
    "argv, says",
    [
        ("train --data {missing} --out {tmp}/ckpt".split(), "is not a LeRobot dataset"),
        (
            "train --data {missing} --out {tmp}/ckpt --earlier-frame scene".split(),
            "--earlier-frame: CAMERA:SECONDS with 0 < SECONDS <= 1, not 'scene'",
        ),
        (
            "train --data {missing} --out {tmp}/ckpt --earlier-frame scene:2".split(),
            "CAMERA:SECONDS with 0 < SECONDS <= 1, not 'scene:2'",
        ),
        (
            "collect --task reach --episodes 1 --out {tmp}/ds --recover-from {missing}".split(),
            "is not a checkpoint",
        ),
        (
            "collect --task reach --episodes 1 --out {tmp}/ds --seed 90000".split(),
            "reserved for evaluation",
        ),
        (
            "collect --task reach --episodes 1 --out {tmp}/ds --teacher {missing}".split(),
            "--teacher teaches the branches of --recover-from",
        ),
        (
            (
                "collect --task reach --episodes 1 --out {tmp}/ds --recover-from "
                "checkpoints/vla_tiny_sim --teacher {missing}"
            ).split(),
            "is not a checkpoint",
        ),
        ("eval --task reach --ckpt {missing}".split(), "no such checkpoint directory"),
        ("eval --task reach --episodes 0".split(), "--episodes must be >= 1"),
        ("ab --a backend=torch --b backend=torch --task reach --sim".split(), "nothing to compare"),
        (
            "ab --a backend=torch --b nope=1 --task reach --sim --out {tmp}/ab".split(),
            "has no argument(s) ['nope']",
        ),
        (["bench", "engine", "--device", "cuda:7"], "no such CUDA device here"),
        # the simulator has no Panda model
        (["bench", "faults", "--robot", "panda"], "invalid choice: 'panda'"),
        (["launch", "sim", "seed:=abc"], "argument seed: expected an integer, got 'abc'"),
        (["launch", "sim", "lockstep:=2"], "argument lockstep: expected true or false"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, says, tmp_path, capsys):
    argv = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in argv]
    if "cuda" in argv[-1]:
        torch = pytest.importorskip("torch")
        if torch.cuda.device_count() > 7:
            pytest.skip("this host has a cuda:7")
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit from inside the command
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_run_that_could_not_be_made_is_one_line_and_exit_code_1(monkeypatch, capsys):
    def stack_never_moved(argv):
        raise RuntimeError("the loop did not start moving in 240 s; dead: ['engine']\nmore")

    monkeypatch.setattr("vla_runtime.cli._dispatch", stack_never_moved)
    monkeypatch.delenv("VLA_RUNTIME_TRACEBACK", raising=False)
    assert main(["bench", "faults"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla-runtime bench faults: failed: the loop did not start moving")
    assert len(err.splitlines()) == 1 and "more" not in err


def test_the_fault_bench_offers_the_simulated_arms():
    from vla_runtime.cli import BENCH_OPTIONS
    from vla_runtime.core.robot import SIMULATED_ROBOTS

    assert tuple(BENCH_OPTIONS["robot"][1]["choices"]) == SIMULATED_ROBOTS


def test_stack_arguments_take_the_type_of_their_default():
    from vla_runtime.stack.resolver import resolve_stack

    stack = resolve_stack("sim", {"camera_fps": 10, "seed": 3, "policy": True, "threads": 1})
    camera = next(n for n in stack.nodes if n.name == "scene_camera")
    assert camera.parameters["fps"] == 10.0 and isinstance(camera.parameters["fps"], float)
    driver = next(n for n in stack.nodes if n.name == "sim_driver")
    assert driver.parameters["seed"] == 3 and isinstance(driver.parameters["seed"], int)


def test_each_benchmark_has_its_own_help_and_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "transport", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "serving overhead per path" in out and "--curve" in out and "--ckpt" not in out
    with pytest.raises(SystemExit) as exc:
        main(["bench", "sim", "--ckpt", "x"])  # another benchmark's option
    assert exc.value.code == 2


def test_help_descriptions_are_whole_paragraphs(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "success rate, time to completion and runtime metrics as one JSON object." in out


@pytest.mark.parametrize("command", ["eval", "ab", "train"])
def test_help_answers_without_loading_torch_or_rclpy(command):
    probe = (
        "import sys\nfrom vla_runtime.cli import main\n"
        f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'rclpy', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert f"usage: vla-runtime {command}" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-300:]
