"""The package list, beside pyproject.toml (which has everything else): course_utils and its subpackages, plus the
lessons' notebooks from notebooks/ shipped as course_utils/notebooks, which ``prove`` executes when installed."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["course_utils", "course_utils.*"]), "course_utils.notebooks"],
    package_dir={"course_utils.notebooks": "notebooks"},
)
