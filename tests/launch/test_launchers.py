"""Launchers after `--` (`torchpace.launch.launchers`), read with the launcher's own argument parser: the
options kept as written, the program each rank runs, the ranks on this node, and bad commands refused."""

from __future__ import annotations

import sys

import pytest

from torchpace.errors import UsageError
from torchpace.launch.command import parse_python_command, program_sources
from torchpace.compare.scaling import scaled_command


@pytest.mark.parametrize("argv, ranks, nodes, program", [
    (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "3"], 2, 1, ("train.py", ("--lr", "3"))),
    (["torchrun", "--nproc_per_node=4", "--standalone", "-m", "pkg.train"], 4, 1, ("-m pkg.train", ())),
    (["python", "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "8", "t.py"], 8, 2, ("t.py", ())),
    (["/usr/bin/torchrun", "--nproc-per-node", "gpu", "t.py"], None, 1, ("t.py", ())),
    (["torchrun", "t.py"], 1, 1, ("t.py", ())),
])
def test_torchrun_is_read_as_torchrun_reads_itself(argv, ranks, nodes, program):
    command = parse_python_command(argv)
    launcher = command.launcher
    assert (launcher.name, launcher.ranks_per_node, launcher.nnodes) == ("torchrun", ranks, nodes)
    assert (command.training.label, command.training.args) == program
    # torchrun's own options as written, run with torchpace's interpreter through the wrapper of torchrun's main
    assert command.argv("PY")[:3] == ["PY", "-m", "torchpace.launch.torchrun"]
    assert command.argv("PY")[-len(launcher.words):] == list(launcher.words)
    assert command.label == f"torchrun {program[0]}"


def test_accelerate_launch_is_read_with_accelerates_parser():
    pytest.importorskip("accelerate")
    command = parse_python_command(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py", "--x"])
    assert command.launcher.name == "accelerate launch" and command.launcher.ranks_per_node == 2
    assert command.argv("PY") == ["PY", "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                                  "train.py", "--x"]


def test_a_no_python_program_runs_with_torchpaces_interpreter():
    command = parse_python_command(["torchrun", "--no-python", "python", "-u", "train.py"])
    assert command.training.script == "train.py" and command.training.interpreter_args == ("-u",)
    assert command.launcher.words == (sys.executable, "-u", "train.py")


def test_a_fixed_rendezvous_port_on_this_host_is_known():
    assert parse_python_command(["torchrun", "--master-port", "29511", "t.py"]).launcher.master_port == 29511
    assert parse_python_command(["torchrun", "--rdzv-endpoint", "localhost:29600", "t.py"]).launcher.master_port == 29600
    assert parse_python_command(["torchrun", "--standalone", "t.py"]).launcher.master_port is None


@pytest.mark.parametrize("argv, message", [
    (["torchrun", "--bogus", "t.py"], "refused its options (unrecognized arguments: --bogus)"),
    (["torchrun", "--nproc-per-node", "2"], "refused its options"),
    (["torchrun", "--no-python", "./run.sh"], "torchpace measures Python programs"),
    (["torchrun", "--no-python", "python", "-I", "t.py"], "-I (isolated mode)"),
])
def test_bad_launcher_commands_name_what_is_wrong(argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_python_command(argv)


def test_the_inputs_of_a_launched_program_are_its_training_script(tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    files, folders = program_sources(parse_python_command(["torchrun", "--nproc-per-node", "2", "train.py"]), cwd=tmp_path)
    assert files == [("the script", "train.py")] and folders == [("the script's folder", str(tmp_path))]
    with pytest.raises(UsageError, match="'missing.py' not found"):
        program_sources(parse_python_command(["torchrun", "missing.py"]), cwd=tmp_path)


def test_scaling_sets_the_launchers_ranks_and_keeps_every_other_word():
    assert scaled_command(["torchrun", "--standalone", "--nproc_per_node=2", "t.py", "--lr", "1"], 4) == \
        ["torchrun", "--nproc-per-node=4", "--standalone", "t.py", "--lr", "1"]
    assert scaled_command(["python", "-m", "torch.distributed.run", "t.py"], 2) == \
        ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"]
    with pytest.raises(UsageError, match="through a launcher's option"):
        scaled_command(["python", "t.py"], 2)


def test_a_launcher_of_several_nodes_is_refused_before_anything_starts(cli_run, tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('never run')\n")
    done = cli_run("bench", "--", "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "train.py", timeout=120)
    assert done.returncode == 2, done.stderr
    assert "runs the job on 2 nodes" in done.stderr and "this host only" in done.stderr and "never run" not in done.stderr
