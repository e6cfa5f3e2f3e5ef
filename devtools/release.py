"""Releases: what the tag the notebooks pin provides, and the command that cuts one.

    python -m course_utils release 2026.11.1      # from a checkout; then commit, tag v2026.11.1 and push the tag

Every setup cell installs ``course_utils`` at a release tag (``course_utils/_repo.py``'s REF), not at main. A notebook
on main that uses a helper newer than that tag runs in a checkout (and in every test) and fails in Colab at its first
import. So a release records what its ``course_utils`` provides — every module, the names in it, each callable's
parameters — in :data:`API_FILE`, and :func:`release_problems` checks every ``course_utils`` name the notebooks use,
and every keyword they pass, against that record. A notebook that needs a new helper needs a new release.

What it cannot see: a helper that kept its name and parameters but changed what it does, and instance attributes
(``runtime.strategy``); the notebooks' own run in a checkout covers the first only for main's code.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils import commandline

from .notebooks import ROOT, cell_source, list_notebooks, read_repo_settings, set_repo

API_FILE = Path("devtools") / "release_api.json"
"""The record of the release the notebooks pin, relative to the repository root."""
PACKAGE = "course_utils"
VERSION_RE = re.compile(r"(\d{4})\.(\d{1,2})\.(\d+)")
"""Calendar versions: YYYY.MM.N (the month whose stack the course was checked on; N counts that month's releases)."""


# ----------------------------------------------------------------------------------------------
# What a package provides
# ----------------------------------------------------------------------------------------------


def _params(obj: Any) -> list[str] | None:
    """A callable's parameter names (``**`` last where it takes any keyword), None where Python cannot say."""
    import inspect

    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    names = [
        p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)
    ]
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        names.append("**")
    return names


def _entry(obj: Any, package: str) -> Any:
    """``null`` for a value, a parameter list for a function, ``{"call": ..., "attrs": {...}}`` for a class (the
    attributes the package's own classes define; what it inherits from Keras or ``Exception`` is left out)."""
    import inspect

    if inspect.isclass(obj):
        attrs = {}
        for name in dir(obj):
            owner = next((k for k in obj.__mro__ if name in vars(k)), None)
            if not name.startswith("_") and str(getattr(owner, "__module__", "")).startswith(package):
                value = getattr(obj, name, None)
                attrs[name] = _params(value) if callable(value) else None
        return {"call": _params(obj), "attrs": attrs}
    if callable(obj):
        return _params(obj)
    return None


def record_api(package: str = PACKAGE) -> dict[str, Any]:
    """Every module of ``package`` (its ``__main__`` modules left out: they run on import) -> its names: a
    submodule as ``"module"``, the package's own functions and classes with their parameters, anything else (a value,
    another library's function) as ``null``.

    Imports all of them: run it in a process of its own (:func:`record_api_in_subprocess`)."""
    import importlib
    import inspect
    import pkgutil

    root = importlib.import_module(package)
    names = [package] + [
        info.name
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}.")
        if not info.name.endswith(".__main__")
    ]
    modules: dict[str, Any] = {}
    for name in sorted(names):
        module = importlib.import_module(name)
        modules[name] = {
            attr: (
                "module"
                if inspect.ismodule(value)
                else _entry(value, package)
                if str(getattr(value, "__module__", "")).startswith(package)
                else None
            )
            for attr, value in sorted(vars(module).items())
            if not attr.startswith("__") or attr == "__version__"
        }
    return {"package": package, "version": getattr(root, "__version__", None), "modules": modules}


def record_api_in_subprocess(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Any]:
    """:func:`record_api` in a fresh Python whose first path entry is ``root`` (the checkout being released)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from devtools.release import record_api; "
        "print(json.dumps(record_api(sys.argv[2])))"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(root), package], capture_output=True, text=True, cwd=root, env=env, timeout=600
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"recording {package}'s API failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def dump_record(record: dict[str, Any]) -> str:
    """The record as JSON, one line per module (a release's diff shows which modules changed)."""
    lines = [
        f"  {json.dumps(name)}: {json.dumps(names, sort_keys=True)}"
        for name, names in sorted(record["modules"].items())
    ]
    head = {k: v for k, v in record.items() if k != "modules"}
    return json.dumps(head, sort_keys=True)[:-1] + ', "modules": {\n' + ",\n".join(lines) + "\n}}\n"


def read_record(root: Path = ROOT) -> dict[str, Any]:
    return json.loads((Path(root) / API_FILE).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------------
# What the notebooks use
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """One use of a ``course_utils`` name in a notebook: ``dotted`` (``course_utils.demo.expect_failure``), where
    (``cell 4, line 2``), and for a call the keywords it passes."""

    dotted: str
    where: str
    keywords: tuple[str, ...] | None = None


class _Uses(ast.NodeVisitor):
    """The package's names a notebook's code reaches through its imports, in source order; a name bound again
    (``data = ...``, a parameter) stops standing for the package's inside its scope."""

    def __init__(self, package: str):
        self.package = package
        self.alias: dict[str, str] = {}
        self.uses: list[Use] = []
        self.where = ""

    def _ours(self, module: str | None) -> bool:
        return bool(module) and (module == self.package or module.startswith(self.package + "."))

    def _add(self, dotted: str, node: ast.AST, keywords: tuple[str, ...] | None = None) -> None:
        self.uses.append(Use(dotted, f"{self.where}, line {getattr(node, 'lineno', '?')}", keywords))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if self._ours(a.name):
                self._add(a.name, node)
                if a.asname:
                    self.alias[a.asname] = a.name
                else:
                    self.alias[a.name.partition(".")[0]] = a.name.partition(".")[0]
            else:
                self.alias.pop(a.asname or a.name.partition(".")[0], None)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        ours = node.level == 0 and self._ours(node.module)
        for a in node.names:
            bound = a.asname or a.name
            if ours and a.name != "*":
                self._add(f"{node.module}.{a.name}", node)
                self.alias[bound] = f"{node.module}.{a.name}"
            else:
                self.alias.pop(bound, None)

    def _dotted(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.alias:
            return ".".join([self.alias[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            self._add(dotted, node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = self._dotted(node.func)
        if dotted is not None:
            self._add(dotted, node, tuple(k.arg for k in node.keywords if k.arg is not None))
        else:
            self.visit(node.func)
        for child in [*node.args, *[k.value for k in node.keywords]]:
            self.visit(child)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.alias.pop(node.id, None)

    def _scoped(self, node: ast.AST, bound: list[str], body: list[ast.AST]) -> None:
        saved = dict(self.alias)
        for name in bound:
            self.alias.pop(name, None)
        for child in body:
            self.visit(child)
        self.alias = saved

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for child in [*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d]]:
            self.visit(child)
        a = node.args
        bound = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]]
        self._scoped(node, bound, node.body)
        self.alias.pop(node.name, None)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        a = node.args
        bound = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]]
        self._scoped(node, bound, [node.body])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for child in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(child)
        self._scoped(node, [], node.body)
        self.alias.pop(node.name, None)


def notebook_uses(path: Path, package: str = PACKAGE) -> list[Use]:
    """Every use of ``package``'s names in a notebook's code cells (cells in order; a cell that is not Python, a
    ``!`` or ``%`` line, is skipped)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    visitor = _Uses(package)
    n = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        n += 1
        try:
            tree = ast.parse(cell_source(cell))
        except SyntaxError:
            continue
        visitor.where = f"code cell {n}"
        visitor.visit(tree)
    return visitor.uses


def use_problem(use: Use, record: dict[str, Any]) -> str | None:
    """Why ``record`` lacks what ``use`` needs, or None. The longest module prefix of the dotted name is looked up,
    then the name in it, then (a class) its attribute; a call's keywords are checked against the parameters."""
    modules = record["modules"]
    parts = use.dotted.split(".")
    i = len(parts)
    while i > 0 and ".".join(parts[:i]) not in modules:
        i -= 1
    if i == 0:
        return f"{use.dotted}: no module {parts[0]}"
    module, rest = ".".join(parts[:i]), parts[i:]
    if not rest:
        return None
    entry = modules[module].get(rest[0], "missing")
    if entry == "missing":
        return f"{module} has no {rest[0]}"
    params = entry
    if isinstance(entry, dict):
        params = entry["call"]
        if len(rest) > 1:
            if rest[1] not in entry["attrs"]:
                return f"{module}.{rest[0]} has no attribute {rest[1]}"
            params = entry["attrs"][rest[1]]
        if len(rest) > 2:
            return None
    elif len(rest) > 1:
        return None  # an attribute of a value: not recorded
    if use.keywords and isinstance(params, list) and "**" not in params:
        unknown = [k for k in use.keywords if k not in params]
        if unknown:
            return f"{use.dotted}() takes no {', '.join(unknown)} there"
    return None


def release_problems(root: str | os.PathLike = ROOT) -> list[str]:
    """What the notebooks use that the release they pin does not provide, and a record that is not that release's."""
    root = Path(root)
    try:
        record = read_record(root)
        _, ref = read_repo_settings(root)
    except (OSError, ValueError) as err:
        return [f"{API_FILE.as_posix()}: cannot read: {err}"]
    problems = []
    if ref != f"v{record.get('version')}":
        problems.append(
            f"{API_FILE.as_posix()} records {PACKAGE} {record.get('version')}, but the notebooks pin "
            f"{ref}: `python -m course_utils release VERSION` writes both (CONTRIBUTING.md, Releases)"
        )
    for path in list_notebooks(root):
        rel = path.relative_to(root).as_posix()
        seen = set()
        try:
            uses = notebook_uses(path, record.get("package", PACKAGE))
        except (OSError, ValueError) as err:  # not UTF-8, not JSON: the lint says more
            problems.append(f"{rel}: cannot read it as a notebook ({type(err).__name__})")
            continue
        for use in uses:
            problem = use_problem(use, record)
            if problem and problem not in seen:
                seen.add(problem)
                problems.append(
                    f"{rel} ({use.where}): {problem} in {ref}, the release its setup cell installs; "
                    "a new helper needs a new release (CONTRIBUTING.md, Releases)"
                )
    return problems


# ----------------------------------------------------------------------------------------------
# Cutting a release
# ----------------------------------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    m = VERSION_RE.fullmatch(version)
    if not m or not 1 <= int(m[2]) <= 12:
        raise ValueError(f"invalid version {version!r}: expected YYYY.MM.N, e.g. 2026.11.1")
    return tuple(int(g) for g in m.groups())


def _sub_once(pattern: str, repl: str, text: str, what: str) -> str:
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"{what}: no line matches {pattern!r}")
    return new


def cut_release(
    version: str,
    root: str | os.PathLike = ROOT,
    today: datetime.date | None = None,
    record: dict[str, Any] | None = None,
) -> list[str]:
    """Make the working tree release ``version``: the version in the package, pyproject.toml and CITATION.cff;
    every badge and setup cell at ``v{version}``; the changelog's Unreleased notes under the new heading; the API
    record. Every file is computed before any is written. Returns one line per file changed."""
    import tomllib

    root = Path(root)
    today = today or datetime.date.today()
    current = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    if _version_key(version) <= _version_key(current):
        raise ValueError(f"version {version} is not newer than the current {current}")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    m = re.search(r"^## Unreleased\n(.*?)(?=^## |\Z)", changelog, flags=re.M | re.S)
    if not m or not m[1].strip():
        raise ValueError("CHANGELOG.md has no notes under '## Unreleased': nothing to release")
    edits = {
        "course_utils/__init__.py": (r'^__version__ = "[^"\n]*"$', f'__version__ = "{version}"'),
        "pyproject.toml": (r'^version = "[^"\n]*"$', f'version = "{version}"'),
        "CITATION.cff": (r'^version: "[^"\n]*"$', f'version: "{version}"'),
    }
    writes: dict[str, str] = {}
    for rel, (pattern, repl) in edits.items():
        writes[rel] = _sub_once(pattern, repl, (root / rel).read_text(encoding="utf-8"), rel)
    writes["CITATION.cff"] = _sub_once(
        r'^date-released: "[^"\n]*"$', f'date-released: "{today.isoformat()}"', writes["CITATION.cff"], "CITATION.cff"
    )
    writes["CHANGELOG.md"] = changelog.replace("## Unreleased\n", f"## Unreleased\n\n## {version} ({today})\n", 1)
    record = record if record is not None else record_api_in_subprocess(root)
    record["version"] = version
    writes[API_FILE.as_posix()] = dump_record(record)
    for rel, text in writes.items():
        (root / rel).write_text(text, encoding="utf-8")
    repo, _ = read_repo_settings(root)
    return [f"{rel}: {version}" for rel in writes] + set_repo(repo, f"v{version}", root)


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils release VERSION``: 0 done, 2 bad usage, 130 Ctrl-C (commandline.run)."""
    return commandline.run("release", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils release",
        description="Cut a release from this checkout: bump the version, point every badge and setup cell at its "
        "tag, date the changelog's notes and record the API the notebooks may use. Then commit, tag "
        "vVERSION and push the tag (CONTRIBUTING.md, Releases).",
    )
    parser.add_argument("version", metavar="YYYY.MM.N")
    parser.add_argument("--root", default=str(ROOT), help="repository root (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        changed = cut_release(args.version, Path(args.root))
    except (ValueError, OSError, RuntimeError) as err:
        raise commandline.UsageError(err) from None
    for line in changed:
        print(f"changed {line}")
    problems = release_problems(Path(args.root))
    for problem in problems:
        print(f"still inconsistent: {problem}", file=sys.stderr)
    print(
        f"next: git commit -am 'Release {args.version}' && git tag -a v{args.version} -m 'Release {args.version}' "
        f"&& git push origin main v{args.version}"
    )
    return 1 if problems else 0


__all__ = [
    "API_FILE",
    "Use",
    "cut_release",
    "dump_record",
    "main",
    "notebook_uses",
    "read_record",
    "record_api",
    "record_api_in_subprocess",
    "release_problems",
    "use_problem",
]
