"""``python -m course_utils.lessons [--ci-shape SHAPE]``: the lesson ids, space-separated (those CI proves in SHAPE).
``.ci/run`` reads it, so a lesson's manifest alone decides where CI proves it."""

from __future__ import annotations

import argparse
import sys

from . import CI_SHAPES, LESSONS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.lessons", description=__doc__.split("\n")[0])
    parser.add_argument("--ci-shape", choices=CI_SHAPES, help="only the lessons whose manifest lists this shape")
    args = parser.parse_args(argv)
    print(" ".join(lesson.id for lesson in LESSONS if args.ci_shape is None or args.ci_shape in lesson.ci_shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
