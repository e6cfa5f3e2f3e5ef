"""course_utils.demo.expect_failure: a failure on purpose prints the real error and lets Run all go on, and a demo
that stops failing (or fails differently) fails its cell. In a real kernel: lesson cells run it under nbval."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from course_utils.demo import DemoDidNotFail, expect_failure, short_path


def test_expected_error_is_printed_with_its_line_and_swallowed(capsys) -> None:
    with expect_failure(ValueError) as caught:
        json.loads("{,}")  # raises inside the standard library
    out = capsys.readouterr().out
    assert isinstance(caught.error, json.JSONDecodeError)
    first, cell_line, library_line = out.strip().splitlines()
    assert first.startswith("✋ Failed as expected — JSONDecodeError: Expecting property name")
    assert "this cell's line" in cell_line and cell_line.endswith(
        'json.loads("{,}")  # raises inside the standard library'
    )
    assert library_line.startswith("   inside json/decoder.py, line ") and library_line.endswith("in raw_decode")


def test_a_demo_that_no_longer_fails_fails_its_cell() -> None:
    with pytest.raises(DemoDidNotFail, match=r"expected KeyError, but the code ran without error"):
        with expect_failure(KeyError):
            {"a": 1}["a"]


def test_another_exception_is_not_swallowed() -> None:
    with pytest.raises(
        DemoDidNotFail, match=r"expected KeyError or IndexError, got ZeroDivisionError: division by zero"
    ) as info:
        with expect_failure(KeyError, IndexError):
            1 / 0  # noqa: B018
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_when_false_the_block_must_run_clean(capsys) -> None:
    with expect_failure(KeyError, when=False):
        pass
    assert "Ran without error, as expected here" in capsys.readouterr().out
    with pytest.raises(DemoDidNotFail, match=r"expected no error here, got KeyError"):
        with expect_failure(KeyError, when=False):
            {}["missing"]


def test_interrupts_pass_through() -> None:
    with pytest.raises(KeyboardInterrupt):
        with expect_failure(Exception):
            raise KeyboardInterrupt


@pytest.mark.parametrize("bad", [(), ("KeyError",), (KeyError, 3), (int,)])
def test_bad_arguments_are_one_clear_error(bad) -> None:
    with pytest.raises(TypeError, match=r"takes one or more exception classes"):
        expect_failure(*bad)


@pytest.mark.parametrize("never", [SystemExit, KeyboardInterrupt, GeneratorExit, BaseException])
def test_an_exception_it_never_catches_is_refused_up_front(never) -> None:
    """expect_failure lets SystemExit and KeyboardInterrupt through (a learner's Ctrl-C must stop the cell):
    accepting expect_failure(SystemExit) promised a catch it never made, and Run all stopped there."""
    with pytest.raises(TypeError, match=r"expect_failure cannot catch .*expect an Exception subclass"):
        expect_failure(never)


def test_an_expected_exception_whose_message_cannot_be_read_is_still_shown(capsys) -> None:
    class Unprintable(ValueError):
        def __str__(self):
            raise RuntimeError("no")

    with expect_failure(ValueError) as demo:
        raise Unprintable()
    out = capsys.readouterr().out
    assert isinstance(demo.error, Unprintable)
    assert "Unprintable: (its message could not be read: RuntimeError in its __str__)" in out, out


def test_long_messages_are_cut_to_their_head(capsys) -> None:
    with expect_failure(RuntimeError):
        raise RuntimeError("\n".join(f"line {i}" for i in range(40)))
    out = capsys.readouterr().out
    assert "\nline 5\n… (34 more lines)\n" in out and "\nline 6\n" not in out


def test_tensorflow_errors_are_named_as_learners_write_them(capsys) -> None:
    tf = pytest.importorskip("tensorflow")
    with expect_failure(tf.errors.InvalidArgumentError):
        tf.debugging.assert_equal(1, 2, message="not equal")
    assert "tf.errors.InvalidArgumentError: " in capsys.readouterr().out


@pytest.mark.parametrize(
    "path, short",
    [
        ("/work/venv/lib/python3.11/site-packages/keras/src/layers/layer.py", "keras/src/layers/layer.py"),
        ("/usr/lib/python3.13/json/decoder.py", "json/decoder.py"),
        ("/home/me/course/course_utils/data.py", "course_utils/data.py"),
        ("/tmp/ipykernel_12/3456.py", "3456.py"),
    ],
)
def test_paths_are_shortened(path: str, short: str) -> None:
    assert short_path(path) == short


def test_run_all_goes_on_in_a_fresh_interpreter(tmp_path) -> None:
    """The cells after a failure on purpose run: a script stands for Run all (any uncaught raise stops it)."""
    script = tmp_path / "lesson.py"
    script.write_text(
        "import os\nfrom course_utils.demo import expect_failure\n"
        "with expect_failure(KeyError):\n    os.environ['COURSE_NOT_SET_ANYWHERE']\n"
        "print('the next cell ran')\n",
        encoding="utf-8",
    )
    env = {**os.environ}
    env.pop("COURSE_NOT_SET_ANYWHERE", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "KeyError: 'COURSE_NOT_SET_ANYWHERE'" in done.stdout
    assert "this cell's line 4: os.environ['COURSE_NOT_SET_ANYWHERE']" in done.stdout
    assert done.stdout.rstrip().endswith("the next cell ran")
