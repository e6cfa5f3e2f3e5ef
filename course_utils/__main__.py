"""Command line: `python -m course_utils COMMAND`.

  doctor     check this environment and print the exact fix for each problem
  lint       check every notebook against the course skeleton (maintainers; from a checkout)
  set-repo   point every badge and setup cell at another GitHub repository (forks; from a checkout)
  release    cut a release: version, badges, changelog and the API the notebooks may use (maintainers; checkout)
  capstone   train CIFAR-10 for a time budget (lesson 06; same as `python -m course_utils.capstone`)
  cluster    run a program once per task of a TensorFlow cluster on localhost (lesson 08)
  prove      measure every lesson's claims on this hardware: claims.json and a report card
  site       render every lesson with its outputs, and the report cards side by side, as an offline site (from a
             checkout)

`python -m course_utils COMMAND --help` lists a command's options.
"""

from __future__ import annotations

import sys


COMMANDS = {  # command -> "module:function" taking argv and returning the exit status
    "doctor": "course_utils.doctor:main",
    "lint": "devtools.notebooks:lint_main",
    "set-repo": "devtools.notebooks:set_repo_main",
    "release": "devtools.release:main",
    "capstone": "course_utils.capstone:main",
    "cluster": "course_utils.cluster:main",
    "prove": "course_utils.proof:main",
    "site": "devtools.site:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = COMMANDS
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command: {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    module_name, func_name = commands[argv[0]].split(":")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name.partition(".")[0]:
            raise
        print(
            f"{argv[0]}: a maintainer's command; it runs from a checkout of the course's repository (in its root "
            "folder, beside course_utils/ and devtools/)",
            file=sys.stderr,
        )
        return 2
    func = getattr(module, func_name)
    return int(func(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
