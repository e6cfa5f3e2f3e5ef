"""Repo-wide pytest setup.

1. Smoke mode for everything the test suite runs. Set at import time, i.e. before collection and
   before nbval starts any kernel, so the notebook kernels (which inherit this environment) run with
   tiny sizes and offline data too. An explicit ``COURSE_SMOKE=0 pytest ...`` is respected.
2. A notebook time budget (CONTRIBUTING.md §5): sums the time nbval spends on each notebook, prints
   a table at the end, and fails the run when one notebook takes longer than
   ``COURSE_NOTEBOOK_BUDGET_S`` (default 90) or all of them together longer than
   ``COURSE_TOTAL_BUDGET_S`` (default 480). The seconds include the kernel's start-up and shutdown:
   nbval starts one kernel per notebook in the setup phase of its first cell and stops it in the
   teardown phase of its last, and all three phases of every cell are counted.
   Budgets are for CI's machine (2 cores; with one usable core, ``taskset -c 0``, the defaults double) and fail
   the run only there: in smoke mode with ``CI=true`` (GitHub Actions sets it; ``.ci/run`` exports it) or
   ``COURSE_ENFORCE_BUDGETS=1``. Elsewhere — a learner checking their install on a slower laptop — the table
   reports each notebook's time against its budget and says what is over, without failing a run in which every
   cell passed. Full mode is never held to them (it downloads real data and trains real sizes).
3. No claim "does not hold" in smoke mode either. Claims are data: every ``report.ClaimsTable`` a
   notebook builds saves its claims as JSON to ``$COURSE_CLAIMS_DIR`` (set here, so the kernels inherit
   it), and a cell that wrote a claim whose verdict is "does not hold" fails, with the claims named. No
   printed output is read. Where smoke sizes cannot show a claim, its verdict must be "not measurable
   here" with the reason. (Full mode and XLA: ``python -m course_utils prove``.)
4. A notebook whose kernel dies (a C++ abort, the out-of-memory killer) fails its cell at once, saying so: nbval
   itself would wait for the dead kernel's reply for ``--nbval-cell-timeout`` (2,000 s) per cell.
"""

from __future__ import annotations

import os

os.environ.setdefault("COURSE_SMOKE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from course_utils.lessons import LESSONS as _LESSONS  # noqa: E402 - after COURSE_SMOKE; imports no TensorFlow

# where notebooks' claims tables save their claims (course_utils.report.CLAIMS_DIR_VARIABLE)
_CLAIMS_DIR_OWNED = not os.environ.get("COURSE_CLAIMS_DIR", "").strip()  # ours to delete at the end
if _CLAIMS_DIR_OWNED:
    os.environ["COURSE_CLAIMS_DIR"] = tempfile.mkdtemp(prefix="course-claims-")
_CLAIMS_DIR = pathlib.Path(os.environ["COURSE_CLAIMS_DIR"])  # an xdist worker's own subfolder: pytest_configure
_SHARED_DIR = _CLAIMS_DIR  # the controller's folder, which every xdist worker also sees
# claims file -> mtime (ns) when last read; files already there (a COURSE_CLAIMS_DIR kept between runs) are old news
_claims_seen: dict[str, int] = {str(p): p.stat().st_mtime_ns for p in _CLAIMS_DIR.glob("claims-*.json")}


@pytest.fixture
def float32_policy():
    """Run a test under Keras' float32 dtype policy and restore the previous one after it."""
    import keras

    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy(before)


_DEFAULT_NOTEBOOK_BUDGET_S = 90.0
_DEFAULT_TOTAL_BUDGET_S = 480.0

_seconds: dict[str, float] = {}  # notebook path (as in the node id) -> seconds, all phases summed
_over_budget: list[str] = []


BUDGET_CORES = 2  # the budgets are for 2 cores (CI's machine); with fewer usable cores the defaults scale up


def _core_factor() -> float:
    """2 / usable cores when fewer than 2 are usable (``taskset -c 0``, a 1-core VM), else 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or BUDGET_CORES)
    return BUDGET_CORES / cores if cores < BUDGET_CORES else 1.0


def _budget(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    if not value.strip():
        return default * _core_factor()
    try:
        return float(value)
    except ValueError:
        raise pytest.UsageError(f"{name}={value!r} is not a number of seconds") from None


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _smoke() -> bool:
    return _truthy("COURSE_SMOKE")


def _enforced() -> bool:
    """Whether the time budgets fail the run: smoke mode on CI's machine (``CI``) or when asked for."""
    return _smoke() and (_truthy("CI") or _truthy("COURSE_ENFORCE_BUDGETS"))


KERNEL_POLL_S = 2.0  # how often a wait for a notebook kernel's reply checks that the kernel still lives


class KernelDied(RuntimeError):
    pass


def _fail_fast_on_a_dead_kernel() -> None:
    """Wrap nbval's wait for a kernel message: wait in slices of KERNEL_POLL_S, and between them raise KernelDied
    (one line, with the exit code) once the kernel process has ended."""
    try:
        from nbval.kernel import RunningKernel
    except ImportError:  # nbval not installed: no notebooks run
        return
    if getattr(RunningKernel.get_message, "_course_wrapped", False):
        return
    wait = RunningKernel.get_message
    from queue import Empty

    def get_message(self, stream, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Empty
            try:
                return wait(self, stream, timeout=KERNEL_POLL_S if left is None else min(left, KERNEL_POLL_S))
            except Empty:
                if left is not None and left <= KERNEL_POLL_S:
                    raise
                km = getattr(self, "km", None)
                if km is not None and not km.is_alive():
                    code = getattr(getattr(km, "provisioner", None), "exit_code", None)
                    raise KernelDied(
                        f"the notebook's kernel died{f' (exit code {code})' if code is not None else ''} "
                        "while this cell ran: a crash in native code (its last words are in the "
                        "kernel's stderr above) or the out-of-memory killer"
                    ) from None

    get_message._course_wrapped = True
    RunningKernel.get_message = get_message


def pytest_configure(config: pytest.Config) -> None:
    global _CLAIMS_DIR
    _fail_fast_on_a_dead_kernel()
    _budget("COURSE_NOTEBOOK_BUDGET_S", _DEFAULT_NOTEBOOK_BUDGET_S)  # fail early on a typo
    _budget("COURSE_TOTAL_BUDGET_S", _DEFAULT_TOTAL_BUDGET_S)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:  # a pytest-xdist worker: its own claims subfolder (the controller deletes the whole folder)
        _CLAIMS_DIR = _CLAIMS_DIR / worker
        _CLAIMS_DIR.mkdir(exist_ok=True)
        os.environ["COURSE_CLAIMS_DIR"] = str(_CLAIMS_DIR)  # before any kernel starts: the kernels inherit it


MAX_WORKERS = 4  # pytest-xdist workers at most: the notebooks run on one of them, one after another (below)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (requirements-dev.txt)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the default addopts): one worker per usable core (``taskset`` and containers respected, which
    xdist's own count is not), at most :data:`MAX_WORKERS`; with one usable core, none (0: no distribution, the
    tests run in this process as without xdist)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores < 2 else min(cores, MAX_WORKERS)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (requirements-dev.txt)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under pytest-xdist (``-n auto``, the default addopts) the notebooks run on one worker, one after another and
    first (the largest unit of work), while the unit tests, one at a time, keep the other workers busy: no two
    notebooks contend with each other for the cores (a cell's state lives in its notebook's kernel, so a notebook's
    cells must share a worker anyway). (xdist's own
    ``--dist loadgroup`` marks cannot do it under pytest 9: it renames ``item._nodeid``, which pytest 9 no longer
    reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "notebooks" if nodeid.split("::", 1)[0].endswith(".ipynb") else nodeid

    return NotebooksTogether(config, log)


UNIT_TEST_NICENESS = 5  # under xdist, a worker running unit tests yields this much to the one running notebooks
# Notebooks that have the machine to themselves: while one runs, the workers running unit tests wait between tests,
# so its time is its own. A lesson's manifest says it (`all_cores`, false unless set true, in
# course_utils/lessons/<name>/lesson.toml): lesson 04 sets it, whose claims time tf.data pipelines on every core. The
# others run beside the unit tests: a notebook keeps about one core busy (190 s of its 380 core-seconds idle while the
# eight ran alone here), and they took 207 s beside them against 221 s with all eight waited for, the README's
# pytest 7.3 minutes instead of 9.0 (2-vCPU AMD EPYC VM, 2026-12-02). On a 2-vCPU VM the two "cores" may be one
# physical core's two hyperthreads, where a test beside a notebook slows it whatever its priority (a 2-core AVX2 VM,
# 2026-11: lesson 05 took 74 s alone, 92-106 s beside the unit tests); the budgets (90 s each, 480 in all) leave more
# than twice that room now. COURSE_ALL_CORES_NOTEBOOKS (file names, comma-separated) replaces the list. The wait ends
# after ALL_CORES_WAIT_S in all (the notebooks' total budget and a margin), whatever the flag says.
ALL_CORES_NOTEBOOKS = tuple(pathlib.Path(lesson.notebook).name for lesson in _LESSONS if lesson.all_cores)
ALL_CORES_WAIT_S = 600.0
_ALL_CORES_FLAG = _SHARED_DIR / ".a-notebook-uses-every-core"
_niced = False
_raised = False  # this worker raised the flag
_waited_s = 0.0


def _all_cores_notebooks() -> set[str]:
    names = os.environ.get("COURSE_ALL_CORES_NOTEBOOKS")
    return set(ALL_CORES_NOTEBOOKS) if names is None else {n.strip() for n in names.split(",") if n.strip()}


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The notebooks of :data:`ALL_CORES_NOTEBOOKS` first, each in its own order: the unit tests wait only at the
    start of the run, before any has begun, so none that started beside an earlier notebook is still running when
    such a notebook's timings start (lesson 04 read its input-bound check wrong beside a 26 s test that had begun
    during lesson 03). The rest keep their order (a stable sort, the same in every pytest-xdist worker)."""
    every_core = _all_cores_notebooks()

    def first(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if path.endswith(".ipynb") and pathlib.PurePath(path).name in every_core else 1

    items.sort(key=first)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist, a worker's first unit test lowers that worker's priority (``os.nice``; the processes it
    starts inherit it): the notebooks, on their own worker, keep the cores they would have alone, so their times
    stay comparable with their budgets, and the run ends sooner (they are its longest part). The notebooks' worker
    runs them first, before any unit test; while it runs one of :data:`ALL_CORES_NOTEBOOKS` it raises a flag, and
    the unit-test workers wait for it to fall before each test."""
    global _niced, _raised, _waited_s
    if not hasattr(item.config, "workerinput"):
        return
    path = item.nodeid.split("::", 1)[0]
    every_core = path.endswith(".ipynb") and pathlib.PurePath(path).name in _all_cores_notebooks()
    if _raised and not every_core:  # this worker raised the flag, and that notebook is over
        _ALL_CORES_FLAG.unlink(missing_ok=True)
        _raised = False
    if every_core:
        _ALL_CORES_FLAG.touch()
        _raised = True
    if path.endswith(".ipynb"):
        return
    if not _niced:
        _niced = True
        try:
            os.nice(UNIT_TEST_NICENESS)
        except (AttributeError, OSError):  # no nice() here (Windows): the tests run as they are
            pass
    while _waited_s < ALL_CORES_WAIT_S and _ALL_CORES_FLAG.exists():
        time.sleep(0.2)
        _waited_s += 0.2


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):  # an nbval cell item: setup (kernel start), call, teardown
        _seconds[path] = _seconds.get(path, 0.0) + report.duration


def _new_claims() -> list[dict]:
    """Claims saved to the claims folder since the last look (a file written or rewritten)."""
    new = []
    for path in sorted(_CLAIMS_DIR.glob("claims-*.json")):
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            continue
        if _claims_seen.get(str(path)) == mtime:
            continue
        _claims_seen[str(path)] = mtime
        try:
            claims = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            new.append(
                {
                    "id": path.name,
                    "claim": f"{path.name} could not be read ({e})",
                    "verdict": "does not hold",
                    "expected": "",
                    "measured": "",
                    "reason": "",
                }
            )
            continue
        new += [c for c in claims if isinstance(c, dict)]
    return new


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if call.when != "call" or not str(item.nodeid).split("::", 1)[0].endswith(".ipynb"):
        return
    from course_utils.report import Verdict

    claims = _new_claims()  # always read, so a table saved by a failing cell is not blamed on the next one
    if not rep.passed or not _smoke():
        return
    failed = []
    for c in claims:
        try:
            verdict = Verdict.read(c.get("verdict"))
        except ValueError as e:  # an unknown word is a failure too, not a pass
            failed.append(f"- {c.get('id') or c.get('claim', '?')}: {e}")
            continue
        if verdict is Verdict.FAILS:
            failed.append(
                f"- {c.get('id') or '(no id) ' + str(c.get('claim', ''))}: expected {c.get('expected', '')}, "
                f"measured {c.get('measured', '')} ({c.get('reason', '')})"[:400]
            )
    if failed:
        rep.outcome = "failed"
        rep.longrepr = (
            "this cell's claims table has a claim that does not hold in smoke mode:\n"
            + "\n".join(failed)
            + "\nwhere smoke sizes cannot show a claim, make its verdict 'not measurable here' with the "
            "reason (holds=None and a note)"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _over_budget.clear()
    if hasattr(session.config, "workerinput"):  # the notebooks' worker is done: no one waits for it any more
        _ALL_CORES_FLAG.unlink(missing_ok=True)
    if not _seconds or not _smoke() or hasattr(session.config, "workerinput"):  # the budgets: the controller's
        return
    per_notebook = _budget("COURSE_NOTEBOOK_BUDGET_S", _DEFAULT_NOTEBOOK_BUDGET_S)
    total_budget = _budget("COURSE_TOTAL_BUDGET_S", _DEFAULT_TOTAL_BUDGET_S)
    for path, seconds in sorted(_seconds.items()):
        if seconds > per_notebook:
            _over_budget.append(
                f"{path} took {seconds:.1f} s, over its budget of {per_notebook:g} s "
                "(COURSE_NOTEBOOK_BUDGET_S): shrink its smoke-mode sizes in course_utils.config"
            )
    total = sum(_seconds.values())
    if total > total_budget:
        _over_budget.append(
            f"all notebooks took {total:.1f} s, over the total budget of {total_budget:g} s (COURSE_TOTAL_BUDGET_S)"
        )
    if _over_budget and _enforced() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CLAIMS_DIR_OWNED:
        import shutil

        shutil.rmtree(_CLAIMS_DIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _seconds:
        return
    tr = terminalreporter
    per_notebook = _budget("COURSE_NOTEBOOK_BUDGET_S", _DEFAULT_NOTEBOOK_BUDGET_S)
    total_budget = _budget("COURSE_TOTAL_BUDGET_S", _DEFAULT_TOTAL_BUDGET_S)
    enforced, smoke = _enforced(), _smoke()
    tr.section("notebook time budget")
    width = max(len("notebook"), *(len(p) for p in _seconds))
    tr.write_line(f"{'notebook':<{width}}  {'seconds':>8}  {'budget':>7}")
    for path, seconds in sorted(_seconds.items()):
        over = smoke and seconds > per_notebook
        tr.write_line(
            f"{path:<{width}}  {seconds:>8.1f}  {per_notebook:>7g}" + ("  OVER" if over else ""),
            red=over and enforced,
            yellow=over and not enforced,
        )
    total = sum(_seconds.values())
    over = smoke and total > total_budget
    tr.write_line(
        f"{'total':<{width}}  {total:>8.1f}  {total_budget:>7g}" + ("  OVER" if over else ""),
        red=over and enforced,
        yellow=over and not enforced,
    )
    tr.write_line("(seconds include kernel start-up and shutdown)")
    if not smoke:
        tr.write_line(f"budgets not applied: COURSE_SMOKE={os.environ.get('COURSE_SMOKE', '')!r} (full mode)")
    elif not enforced:
        tr.write_line(
            "budgets reported, not enforced: they are for CI's 2-core machine (CI=true or "
            "COURSE_ENFORCE_BUDGETS=1 makes them fail the run)"
        )
    for line in _over_budget:
        if enforced:
            tr.write_line(f"NOTEBOOK TIME BUDGET EXCEEDED: {line}", red=True, bold=True)
        else:
            tr.write_line(f"slower than CI's budget here (every cell passed; not a failure): {line}", yellow=True)
