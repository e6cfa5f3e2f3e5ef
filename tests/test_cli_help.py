"""Every command's --help prints and exits 0: `python -m course_utils`, each of its commands, the capstone's own
entry point, lesson 08's worker programs and CI's `.ci/prove-perturbed`. argparse %-formats every help string only
when --help is asked for, so a "10%" in one option's help crashed `capstone --help` while every run worked."""

from __future__ import annotations

import importlib
import pathlib
import runpy
import subprocess
import sys

import pytest

from course_utils import __main__ as cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER_PROGRAMS = [
    "course_utils.lessons.scaling_out.multiworker",
    "course_utils.lessons.scaling_out.model_parallel",
    "course_utils.lessons.scaling_out.parameter_server",
]


def _status(func, argv: list[str]) -> int:
    try:
        status = func(argv)
    except SystemExit as stop:  # argparse's --help exits 0
        status = stop.code
    return int(status or 0)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_prints_its_help(command: str, capsys) -> None:
    module_name, func_name = cli.COMMANDS[command].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    status = _status(func, ["--help"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("usage: ") and "--help" in out, out[:300]
    assert "-h, --help" in out or "[-h]" in out


def test_the_top_level_help_lists_every_command(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in cli.COMMANDS:
        assert f"  {command} " in out, f"{command} is missing from `python -m course_utils --help`"


@pytest.mark.parametrize("module", WORKER_PROGRAMS)
def test_worker_programs_print_their_help(module: str, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(module, run_name="__main__")
    assert stop.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")


@pytest.mark.parametrize("module", WORKER_PROGRAMS)
def test_a_worker_program_runs_as_main_once(module: str) -> None:
    """``python -m`` imports the lesson's package first: were a worker imported there too, it would run as a second
    copy beside the imported one (runpy's RuntimeWarning), each with its own module state."""
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr[-800:]


def test_capstone_entry_point_help_in_a_fresh_process() -> None:
    """What the README runs: `python -m course_utils.capstone --help` (it crashed on '10%' and '5,000')."""
    done = subprocess.run(
        [sys.executable, "-m", "course_utils.capstone", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert "--validation-examples" in done.stdout and "10%" in done.stdout and "Traceback" not in done.stderr


def test_prove_perturbed_help() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "prove-perturbed"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("usage: ")


def test_every_capstone_option_says_what_it_does():
    from course_utils import capstone

    silent = [a.option_strings[0] for a in capstone.build_parser()._actions if a.option_strings and not a.help]
    assert not silent, f"options without a help text: {silent}"


@pytest.mark.parametrize("command", ["lint", "set-repo", "site"])
def test_a_maintainers_command_outside_a_checkout_says_so_in_one_line(command: str, tmp_path) -> None:
    """lint, set-repo and site live in devtools/, beside course_utils in a checkout, not in the package learners
    install: elsewhere they answer in one line, exit 2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "course_utils", command, "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"{command}: a maintainer's command; it runs from a checkout of the course's "
        "repository (in its root folder, beside course_utils/ and devtools/)"
    )


@pytest.mark.parametrize(
    "command, target, argv",
    [
        ("doctor", "course_utils.doctor:run_checks", ["--offline"]),
        ("lint", "devtools.notebooks:list_notebooks", []),
        ("set-repo", "devtools.notebooks:set_repo", ["someone/fork"]),
    ],
)
def test_ctrl_c_ends_every_command_with_one_line_and_130(command, target, argv, monkeypatch, capsys) -> None:
    """doctor, lint and set-repo end like prove, capstone, cluster and site (course_utils.commandline.run): Ctrl-C is
    `COMMAND: interrupted` and exit 130, not a traceback and 1."""
    module_name, name = target.split(":")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module_name), name, interrupted)
    assert cli.main([command, *argv]) == 130
    assert capsys.readouterr().err.strip() == f"{command}: interrupted"


@pytest.mark.parametrize(
    "argv",
    [
        ["prove", "--frobnicate"],
        ["capstone", "--frobnicate"],
        ["site", "--out", "x", "--frobnicate"],
        ["prove", "--mode", "quick"],
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(argv, capsys) -> None:
    """prove, capstone and site parse with commandline.ArgumentParser: a bad option is `COMMAND: message`, exit 2,
    not argparse's usage block followed by the message."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"{argv[0]}: ") and ("--frobnicate" in err or "quick" in err), err
