"""The lessons' manifests: each lesson's ``course_utils/lessons/<name>/lesson.toml`` (its id, title, time, what it
measures, and how it is run: replicas, cost, XLA, cores, CI's stand-in shapes, its own sizes), read into
:data:`LESSONS`. Only the standard library: the config, ``prove``, conftest, ``.ci/run``, the notebook lint and the
README's curriculum table read it without importing a lesson (:mod:`course_utils.lessons` re-exports it).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import tomllib
import types
from pathlib import Path

MANIFEST = "lesson.toml"


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson, as its manifest declares it: its number (``"05"``), title, time and what it measures; the package
    (``module.experiments`` has ``claims(results)``, the table its notebook ends with; ``module.exercises`` its bank);
    and how it is run."""

    id: str
    title: str
    package: str  # course_utils.lessons.<name>
    minutes: int = 30
    measures: str = ""
    advanced: bool = False
    cpu_replicas: int = 1  # on a CPU, split it into this many devices (lessons about replicas)
    # how long it takes, relative to the others, in full mode and in smoke mode (measured on one core each, smoke
    # in the TPU shape, where XLA compiles dominate): prove --jobs starts the longest first
    cost: int = 1
    smoke_cost: int = 1
    xla_notebook: bool = False  # `pytest -m xla` runs its notebook with COURSE_JIT=1
    all_cores: bool = False  # true: the unit tests wait while its notebook runs (conftest), for timings on every core
    ci_shapes: tuple[str, ...] = ()  # the stand-in shapes .ci/run proves it in
    # its own sizes, (name, full, smoke) each: config.get().sizes.<name> in the mode the process runs in
    sizes: tuple[tuple[str, object, object], ...] = ()

    @property
    def name(self) -> str:
        """The folder's name, and the notebook's without its number: ``gradient_accumulation``."""
        return self.package.rpartition(".")[2]

    @property
    def module(self) -> types.ModuleType:
        """The lesson's package (light: its parts load TensorFlow on first use)."""
        return importlib.import_module(self.package)

    @property
    def notebook(self) -> str:
        """The notebook's path in a checkout: ``notebooks/05_gradient_accumulation.ipynb``."""
        return f"notebooks/{self.id}_{self.name}.ipynb"

    @property
    def curriculum_title(self) -> str:
        """The title as the README's curriculum lists it: ``*Advanced:* Activation memory``."""
        return f"*Advanced:* {self.title}" if self.advanced else self.title

    @property
    def experiments(self) -> types.ModuleType:
        return self.module.experiments


_TOP = {"id": str, "title": str, "minutes": int, "measures": str, "advanced": bool}
_RUN = {"cpu_replicas": int, "cost": int, "smoke_cost": int, "xla_notebook": bool, "all_cores": bool, "ci_shapes": list}
CI_SHAPES = ("tpu-1", "gpu")
"""The stand-in shapes ``.ci/run`` proves lessons in (prove --shape)."""


class ManifestError(ValueError):
    """A lesson's manifest that cannot be read: the message names the file and the field."""


def _size_value(path: Path, name: str, mode: str, value: object) -> object:
    if isinstance(value, list):
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ManifestError(f"{path}: sizes.{name}.{mode} must be a number or a list of numbers, not {value!r}")
        return tuple(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{path}: sizes.{name}.{mode} must be a number or a list of numbers, not {value!r}")
    return value


def _sizes(path: Path, table: object) -> tuple[tuple[str, object, object], ...]:
    """``[sizes]``: ``name = { full = X, smoke = Y }`` each, X and Y of one kind (int, float, list of numbers)."""
    if not isinstance(table, dict):
        raise ManifestError(f"{path}: [sizes] must be a table")
    out = []
    for name, modes in table.items():
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ManifestError(f"{path}: sizes.{name}: a size's name is lower_case_with_underscores")
        if not isinstance(modes, dict) or set(modes) != {"full", "smoke"}:
            raise ManifestError(f"{path}: sizes.{name} must be {{ full = ..., smoke = ... }}, not {modes!r}")
        full, smoke = (_size_value(path, name, mode, modes[mode]) for mode in ("full", "smoke"))
        if type(full) is not type(smoke):
            raise ManifestError(f"{path}: sizes.{name}: full ({full!r}) and smoke ({smoke!r}) are of different kinds")
        out.append((name, full, smoke))
    return tuple(out)


PACKAGE = "course_utils.lessons"  # the lessons' packages: course_utils.lessons.<name>
FOLDER = Path(__file__).parent / "lessons"


def read_manifest(path: str | Path, package_prefix: str = PACKAGE) -> Lesson:
    """The :class:`Lesson` that ``<folder>/lesson.toml`` declares; :class:`ManifestError` names what is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ManifestError(f"{path}: cannot read it as TOML: {err}") from None
    fields: dict = {}
    for table, spec in ((data, _TOP), (data.get("run", {}), _RUN)):
        if not isinstance(table, dict):
            raise ManifestError(f"{path}: [run] must be a table")
        unknown = sorted(set(table) - set(spec) - ({"run", "sizes"} if table is data else set()))
        if unknown:
            raise ManifestError(f"{path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(spec)}")
        for key, kind in spec.items():
            if key not in table:
                continue
            value = table[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                what = {int: "a whole number", str: "a string", bool: "true or false", list: "a list"}[kind]
                raise ManifestError(f"{path}: {key} must be {what}, not {value!r}")
            fields[key] = value
    for key in ("id", "title"):
        if key not in fields:
            raise ManifestError(f"{path}: no {key}")
    if not re.fullmatch(r"\d\d", fields["id"]):
        raise ManifestError(f'{path}: id must be two digits, like "09", not {fields["id"]!r}')
    bad = [s for s in fields.get("ci_shapes", []) if s not in CI_SHAPES]
    if bad:
        raise ManifestError(f"{path}: ci_shapes {bad} are not among {list(CI_SHAPES)}")
    fields["ci_shapes"] = tuple(fields.get("ci_shapes", ()))
    fields["sizes"] = _sizes(path, data.get("sizes", {}))
    for key in ("minutes", "cpu_replicas", "cost", "smoke_cost"):
        if key in fields and fields[key] < 1:
            raise ManifestError(f"{path}: {key} must be at least 1, not {fields[key]}")
    return Lesson(package=f"{package_prefix}.{path.parent.name}", **fields)


def discover(folder: str | Path = FOLDER, package_prefix: str = PACKAGE) -> tuple[Lesson, ...]:
    """Every lesson whose folder under ``folder`` has a manifest, in the order of their ids (unique)."""
    found = sorted(
        (read_manifest(p, package_prefix) for p in Path(folder).glob(f"*/{MANIFEST}")), key=lambda lesson: lesson.id
    )
    ids = [lesson.id for lesson in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ManifestError(f"lesson id(s) {', '.join(twice)} declared by more than one manifest under {folder}")
    return tuple(found)


LESSONS: tuple[Lesson, ...] = discover()

BY_ID = {lesson.id: lesson for lesson in LESSONS}
