"""devtools.coverage_map: which functions no learner's command entered (issue 49's map of what to move or cut)."""

from __future__ import annotations

import textwrap

from devtools import coverage_map


def test_a_function_counts_as_entered_only_where_a_line_of_its_body_ran(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        textwrap.dedent(
            '''\
            def ran():
                """Its docstring alone does not count."""
                return 1


            def never():
                """Neither does this one's."""
                return 2


            class Box:
                def method(self):
                    return 3

                def other(self):
                    return 4
            '''
        ),
        encoding="utf-8",
    )
    # the lines a run executes: every def line (the module's import), ran's body and Box.method's body
    executed = {1, 3, 6, 11, 12, 13, 15}
    assert coverage_map.functions_never_entered(source, executed) == ["never", "other"]
    # a docstring line alone, executed, is no entry
    assert coverage_map.functions_never_entered(source, {1, 2, 6, 7}) == ["ran", "never", "method", "other"]


def test_the_learners_commands_are_the_readmes_and_a_refused_one_must_exit_2(tmp_path):
    names = [name for name, _ in coverage_map.commands(tmp_path, "smoke", "synthetic", 2, shapes=["tpu"])]
    assert "prove (smoke)" in names and "prove --shape tpu (smoke)" in names
    assert any(name.endswith("(refused)") for name in names)
    argv = dict(coverage_map.commands(tmp_path, "full", "npz:x.npz", 1))["prove (full)"]
    assert argv[argv.index("--mode") + 1] == "full" and argv[argv.index("--data") + 1] == "npz:x.npz"
