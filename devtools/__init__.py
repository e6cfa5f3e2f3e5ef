"""The course's maintainer tools, kept out of the package learners install (``course_utils``).

- ``notebooks``: the notebook lint (``python -m course_utils lint``) and ``set-repo`` (point badges and setup cells at a
  fork);
- ``site``: the offline site, every lesson rendered with its outputs and the report cards side by side
  (``python -m course_utils site``);
- ``coverage_map``: which lines of ``course_utils`` the learners' commands reach (``python -m devtools.coverage_map``).

They run from a checkout of the repository: ``python -m course_utils lint`` there finds this package beside
``course_utils``.
"""
