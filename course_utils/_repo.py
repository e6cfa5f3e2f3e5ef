"""Where the course lives on GitHub: the one place badges and setup cells take their URL from.

Change it with `python -m course_utils set-repo OWNER/NAME [--ref REF]`, which rewrites this file,
every notebook's badge and setup cell, and the README badges; `pytest` checks they all agree.
"""

REPO = "tpu-course/memory-efficient-tf"
REF = "v2026.11.4"
