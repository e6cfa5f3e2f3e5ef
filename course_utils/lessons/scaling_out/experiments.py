"""Lesson 08's experiments and claims: the lesson's localhost clusters (MultiWorkerMirrored workers, the Keras
``fit`` attempt, a worker killed and the cluster resumed, a worker that hangs and one that dies — found or not by
the coordination service's heartbeats, a parameter-server cluster that loses a worker mid-schedule, a model split
over two workers, step time on 1/2/4 workers), and ``claims(results)``, which turns what they wrote into the lesson's
claims; :func:`platform_matrix` runs the preemption demo in one process against a fake GCE metadata
server (:mod:`course_utils.gce`) as on each platform TensorFlow's ``PreemptionCheckpointHandler`` tells apart. The
cluster programs are :mod:`.multiworker`, :mod:`.parameter_server` and :mod:`.model_parallel`; the launcher is
:mod:`course_utils.cluster`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np

from ... import report

# the worker programs (python -m ...), by name: importing them here would import them twice under `python -m`
MW, PS, MP = (f"{__package__}.{name}" for name in ("multiworker", "parameter_server", "model_parallel"))
PREEMPTED_EXIT = 42  # multiworker.PREEMPTED_EXIT (importing it here would load the worker program's module)
COLLECTIVE_TIMEOUT_EXIT = 3  # multiworker.COLLECTIVE_TIMEOUT_EXIT


def _exit_code(message: str | None) -> str:
    """ "exit code N" from the launcher's ClusterError line (its first task to fail), or what happened instead."""
    import re

    found = re.search(r"exited with code (-?\d+)", message or "")
    return f"exit code {found.group(1)}" if found else (message or "every task finished: no notice reached them")


def pipelining(mp: dict) -> tuple[str, list[float]]:
    """§5: the pipelined variant with the most micro-batches (GPipe asks for M ≥ 4 × stages; every micro-batch also
    pays its own dispatch, so the fewest micro-batches gain least) and naive ÷ pipelined step time, round by round."""
    pipe = max((name for name in mp["times_s"] if "micro-batches" in name), key=lambda name: int(name.split()[1]))
    return pipe, [a / b for a, b in zip(mp["times_s"]["split (naive)"], mp["times_s"][pipe])]


# §3's platform matrix: TensorFlow's PreemptionCheckpointHandler as it behaves on each platform it detects (a fake
# GCE metadata server, course_utils.gce, stands in for Google Cloud's), and the recommended pattern of our own. Each
# row: one process (multiworker --single) given a notice after ``term_after`` steps, then the same command again.
PLATFORM_ROWS = (
    {"row": "GCE CPU VM (Colab CPU)", "on_gcp": True, "mode": "preemptible", "notice": "sigterm"},
    {"row": "GCE GPU VM*", "on_gcp": True, "mode": "preemptible", "notice": "sigterm", "gpu": True},
    {"row": "GCE GPU VM*", "on_gcp": True, "mode": "preemptible", "notice": "maintenance", "gpu": True},
    {
        "row": "GCE GPU VM*, grace_period=0",
        "on_gcp": True,
        "mode": "preemptible",
        "notice": "maintenance",
        "gpu": True,
        "grace": 0,
    },
    {"row": "own handler, GCE CPU VM", "on_gcp": True, "mode": "own", "notice": "sigterm"},
    {"row": "own handler, GCE CPU VM", "on_gcp": True, "mode": "own", "notice": "sigkill"},
)
OFF_GCP_ROW = {"row": "off Google Cloud, 1 worker", "on_gcp": False, "mode": "preemptible", "notice": "sigterm"}
SAVE_EVERY = 2  # the own-handler rows' periodic checkpoint interval (steps)
MAINTENANCE_STEP_S = 0.6  # the maintenance rows' pause per step: TensorFlow polls the metadata server once a second


def _exit_text(code: int) -> str:
    import signal

    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def preemption_row(out: str, spec: dict, steps: int = 6, term_after: int = 3) -> dict:
    """One row of §3's platform matrix: the worker program in one process (``--single``) with a fake GCE metadata
    server (``spec['on_gcp']``), run once with a notice after ``term_after`` steps and once more without. Returns how
    run 1 ended, the platform the handler detected, the checkpoints run 1 left, the last step it logged, the step run 2
    resumed after and the metadata paths TensorFlow asked."""
    import re

    from ... import gce, processes

    folder = f"{out}/{re.sub(r'[^A-Za-z0-9]+', '_', spec['row']).strip('_')}_{spec['notice']}"
    ckpt = f"{folder}/ckpt"
    maintenance = spec["notice"] == "maintenance"
    steps = max(steps, 8) if maintenance else steps  # room for a poll (1 s) and the save after it
    base = [
        "--single",
        "--steps",
        str(steps),
        "--out",
        folder,
        "--step-seconds",
        str(MAINTENANCE_STEP_S if maintenance else 0.05),
    ]
    if spec["mode"] == "own":
        base += ["--own-handler", ckpt, "--save-every", str(SAVE_EVERY)]
    else:
        base += ["--preemptible", ckpt] + (["--pretend-gpu"] if spec.get("gpu") else [])
        base += ["--grace-period", str(spec["grace"])] if "grace" in spec else []
    notice_after = 2 if maintenance else term_after
    with gce.FakeMetadataServer(on_gcp=spec["on_gcp"]) as server:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(server.env(), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # as cluster.launch: a setting read at import (one fork server)
        first = processes.run(
            [
                sys.executable,
                "-m",
                MW,
                *base,
                "--term-worker",
                "0",
                "--term-after",
                str(notice_after),
                "--notice",
                spec["notice"],
            ],
            fork=True,
            env=env,
            timeout=180,
            stderr=subprocess.STDOUT,
        )
        saved = sorted(f for f in os.listdir(ckpt) if f.endswith(".index")) if os.path.isdir(ckpt) else []
        with open(f"{folder}/worker0_steps.txt", encoding="utf-8") as f:
            run1 = [int(v) for v in f.read().split()]
        server.maintenance_event = "NONE"  # the restarted VM: no maintenance pending
        second = processes.run(
            [sys.executable, "-m", MW, *base], fork=True, env=env, timeout=180, stderr=subprocess.STDOUT
        )
        asked = sorted(set(p.rsplit("/v1/", 1)[-1] for p in server.requests))
    if second.returncode != 0:
        raise RuntimeError(f"{spec['row']}: run 2 exited with {second.returncode}: {second.stdout[-500:]}")
    platform = next(
        (line.split(": ", 1)[1] for line in first.stdout.splitlines() if line.startswith("platform: ")), "(not used)"
    )
    from . import multiworker

    resumed = int(multiworker.load_result(f"{folder}/worker0.npz")[1]["start"])
    return {
        **spec,
        "notice_after": notice_after,
        "exit": first.returncode,
        "platform": platform,
        "saved": saved,
        "run1_last": run1[-1] if run1 else 0,
        "resumed": resumed,
        "metadata_asked": asked,
    }


def platform_matrix(out: str, steps: int = 6, rows=PLATFORM_ROWS) -> list[dict]:
    """§3: every row of :data:`PLATFORM_ROWS` (:func:`preemption_row`), three at a time (each is one small process;
    three TensorFlow start-ups at once keep two cores busy without starving the notebook)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda spec: preemption_row(out, spec, steps), rows))


def matrix_table(rows: list[dict]) -> list[dict]:
    """§3: the matrix as table rows ("steps trained again": run 1's last step minus the step run 2 resumed after —
    lost work when run 1 was stopped, repeated work when it finished)."""
    return [
        {
            "platform (fake metadata server)": r["row"],
            "TensorFlow detected": r["platform"],
            "notice after step": f"{r['notice_after']} ({r['notice']})",
            "run 1": _exit_text(r["exit"]),
            "checkpoints after run 1": len(r["saved"]),
            "run 1's last step": r["run1_last"],
            "run 2 resumed after": r["resumed"],
            "steps trained again": r["run1_last"] - r["resumed"],
        }
        for r in rows
    ]


FH = "tensorflow/python/distribute/failure_handling/"  # where the cited TensorFlow source lives (2.20)


def matrix_rows(smoke: bool) -> tuple:
    """The rows §3 runs: in smoke mode the two a Colab CPU/TPU runtime meets with a notice (TensorFlow's handler on a
    GCE CPU VM, and our own handler), to stay in the lesson's time budget; in full mode all of :data:`PLATFORM_ROWS`."""
    return tuple(PLATFORM_ROWS[i] for i in (0, 4)) if smoke else PLATFORM_ROWS


_PATCHED = "GPU detection patched (multiworker.pretend_gpu): no GPU here"


def _platform_claim_specs() -> list:
    """(row, notice, claim, source, expected, holds(r), note) for each row of :data:`PLATFORM_ROWS`."""
    return [
        (
            "GCE CPU VM (Colab CPU)",
            "sigterm",
            "On a GCE CPU VM (Colab's CPU runtime) PreemptionCheckpointHandler does nothing: no restore, no watcher, "
            "run() only calls the step; SIGTERM kills the process, nothing saved, the restart begins at step 0",
            f"§3; {FH}failure_handling.py __init__, run",
            "GCE_CPU; killed by SIGTERM; 0 checkpoints; resumed after 0",
            lambda r: r["platform"] == "GCE_CPU" and r["exit"] == -15 and not r["saved"] and r["resumed"] == 0,
            "",
        ),
        (
            "GCE GPU VM*",
            "sigterm",
            "On a GCE GPU VM the handler does not watch SIGTERM (it polls the maintenance event instead): SIGTERM kills "
            "the process, nothing saved",
            f"§3; {FH}failure_handling.py _initialize_for_mirrored_and_multi_worker_mirrored",
            "GCE_GPU; killed by SIGTERM; 0 checkpoints; resumed after 0",
            lambda r: r["platform"] == "GCE_GPU" and r["exit"] == -15 and not r["saved"] and r["resumed"] == 0,
            _PATCHED,
        ),
        (
            "GCE GPU VM*",
            "maintenance",
            "On a GCE GPU VM a maintenance event makes it save once and keep training (grace period 3600 s): the run "
            "ends normally, its last steps after the checkpoint",
            f"§3; {FH}failure_handling_util.py GRACE_PERIOD_GCE",
            "GCE_GPU; exit 0; 1 checkpoint, after the notice; the restart resumes before run 1's last step",
            lambda r: (
                r["platform"] == "GCE_GPU"
                and r["exit"] == 0
                and len(r["saved"]) == 1
                and r["notice_after"] < r["resumed"] < r["run1_last"]
            ),
            _PATCHED,
        ),
        (
            "GCE GPU VM*, grace_period=0",
            "maintenance",
            "... with TerminationConfig(grace_period=0) it saves and exits 143 (not 42); the restart resumes there",
            f"§3; {FH}failure_handling_util.py gce_exit_fn",
            "GCE_GPU; exit 143; 1 checkpoint; resumed after run 1's last step",
            lambda r: (
                r["platform"] == "GCE_GPU"
                and r["exit"] == 143
                and len(r["saved"]) == 1
                and r["resumed"] == r["run1_last"] > r["notice_after"]
            ),
            _PATCHED,
        ),
        (
            "own handler, GCE CPU VM",
            "sigterm",
            "Our own SIGTERM handler + a periodic CheckpointManager works on a GCE CPU VM: SIGTERM → one save after the "
            "next step, exit; the restart resumes there, no step lost",
            "§3",
            "exit 143; resumed after run 1's last step; 0 steps lost",
            lambda r: r["exit"] == 143 and r["resumed"] == r["run1_last"] > r["notice_after"],
            "",
        ),
        (
            "own handler, GCE CPU VM",
            "sigkill",
            f"... and a death without notice (SIGKILL) loses fewer steps than the save interval ({SAVE_EVERY})",
            "§3",
            f"killed by SIGKILL; 0 ≤ steps lost < {SAVE_EVERY}",
            lambda r: r["exit"] == -9 and 0 <= r["run1_last"] - r["resumed"] < SAVE_EVERY,
            "",
        ),
    ]


def _platform_id(row: str, notice: str) -> str:
    """A platform-matrix claim's id: ``08.preemption.gce_cpu_vm_sigterm``."""
    return "08.preemption." + "_".join(re.findall(r"[a-z0-9]+", f"{row} {notice}".lower()))


def _platform_claims(rows: list[dict]) -> list:
    """§3: a claim per row of the platform matrix (a row not run: not measurable here), and the GCE TPU row, which
    cannot run here. No rows: the matrix was not run, no claims."""
    if not rows:
        return []
    out = []
    for row, notice, claim, source, expected, holds, note in _platform_claim_specs():
        r = next((r for r in rows if r["row"] == row and r["notice"] == notice), None)
        if r is None:
            out.append(
                CLAIMS.judge(
                    _platform_id(row, notice),
                    "not run",
                    None,
                    "smoke mode runs only the rows a Colab CPU/TPU runtime meets; full mode "
                    "(`python -m course_utils prove --lessons 08 --mode full`) and "
                    "tests/test_scaling_out.py run every row",
                    claim=claim,
                    source=source,
                    expected=expected,
                )
            )
            continue
        measured = (
            f"{r['platform']}; {_exit_text(r['exit'])}; {len(r['saved'])} checkpoint(s); run 1's last step "
            f"{r['run1_last']}, resumed after {r['resumed']}"
        )
        out.append(
            CLAIMS.judge(
                _platform_id(row, notice), measured, holds(r), note, claim=claim, source=source, expected=expected
            )
        )
    out.insert(
        1,
        CLAIMS.judge(
            "08.gce_tpu_vm_path",
            "not measurable here",
            None,
            "detect_platform() says GCE_TPU only when TensorFlow lists a TPU device; the source sends GCE_TPU and GCE_CPU "
            "down the same branches (the warning in __init__, run() calling the step, save_checkpoint_if_preempted "
            "returning)",
        ),
    )
    return out


COLLECTIVE_TIMEOUT_S = 2.0  # §3: the timeout given to the collectives
HEARTBEAT_TIMEOUT_S = (
    10.0  # the coordination service's default (kDefaultHeartbeatTimeoutMs, XLA coordination_service.cc)
)
SMOKE_HEARTBEAT_S = 4.0  # smoke mode sets this heartbeat timeout (multiworker.set_heartbeat_timeout): a shorter wait
HANG_BEYOND_S = 2.0  # worker 1 hangs this much longer than the heartbeat timeout (> the service's 1 s check), so a hang
# the heartbeats caught would show as an error before it ended


def heartbeat_timeout_s(smoke: bool) -> float | None:
    """§3's heartbeat timeout: TensorFlow's default (None) in full mode, :data:`SMOKE_HEARTBEAT_S` in smoke mode."""
    return SMOKE_HEARTBEAT_S if smoke else None


def detection_bounds_s(heartbeat_s: float) -> tuple[float, float]:
    """How long after a death its peers fail: the heartbeat timeout after the dead worker's last heartbeat (they go
    every timeout / 2: XLA's coordination_service_agent.cc), checked every second (coordination_service.cc
    CheckStaleness), then propagated — timeout / 2 to timeout + 1 s, with a second's margin below and two above;
    never at once."""
    return heartbeat_s / 2 - 1.0, heartbeat_s + 3.0


def stalled_worker(
    out: str,
    timeout_s: float = COLLECTIVE_TIMEOUT_S,
    heartbeat_s: float | None = None,
    stall_after: int = 2,
    runs=("no timeout", "timeout", "dead"),
) -> dict:
    """§3: three 2-worker clusters, overlapped. In two, worker 1 stops after step ``stall_after`` for
    :data:`HANG_BEYOND_S` longer than the heartbeat timeout (``heartbeat_s``; None: TensorFlow's default, 10 s) — a
    hang —, without a collective timeout and with ``timeout_s``; in the third it SIGKILLs itself there (a death),
    without a timeout, and the launcher leaves worker 0 running (``stop_on_failure=False``) to see whether and when
    it notices. Returns worker 0's record of each run — its step times, or the error, its key line and how long the
    failing step waited (for the death, also how long after it) — with the launcher's line about how the run ended
    (None: every task finished), under ``"no timeout"``, ``"timeout"`` and ``"dead"`` (``runs``: which of them).
    Overlapped, because the runs are mostly waiting: the hang outlasts the heartbeat timeout, and the death is found
    after about that long. The two long runs start together, the short one (with a timeout) once the hung worker has
    begun its hang (it writes when), so that its start-up has the cores while the others wait."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ... import cluster

    def folder_of(name: str) -> str:
        return f"{out}/{name.replace(' ', '_')}"

    def run(name: str, timeout: float, die: bool) -> dict:
        folder = folder_of(name)
        message = None
        if name == "timeout" and "no timeout" in runs:  # start once the long run's worker 1 hangs (or after 60 s)
            deadline = time.monotonic() + 60
            while not os.path.exists(f"{folder_of('no timeout')}/worker1_hangs.txt") and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            cluster.launch(
                MW,
                [
                    "--steps",
                    stall_after + 2,
                    "--out",
                    folder,
                    "--stall-worker",
                    1,
                    "--stall-after",
                    stall_after,
                    "--stall-seconds",
                    stall_s,
                    "--collective-timeout",
                    timeout,
                    "--heartbeat-timeout",
                    heartbeat_s or 0,
                ]
                + (["--die"] if die else []),
                workers=2,
                timeout=120,
                log=None,
                stop_on_failure=not die,
            )
        except cluster.ClusterError as err:
            message = str(err).split(" Last output")[0]
        try:
            with open(f"{folder}/worker0_stall.json", encoding="utf-8") as f:
                return dict(json.load(f), message=message)
        except FileNotFoundError:
            raise RuntimeError(
                f"worker 0 wrote no result ({message or 'every task ended'}); run the cell again"
            ) from None

    stall_s = (heartbeat_s or HEARTBEAT_TIMEOUT_S) + HANG_BEYOND_S
    kinds = {"no timeout": (0.0, False), "timeout": (timeout_s, False), "dead": (0.0, True)}
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(run, name, *kinds[name]) for name in runs}
        return {name: future.result() for name, future in futures.items()}


def stall_table(stall: dict) -> list[dict]:
    """§3: one row per run of :func:`stalled_worker`: what worker 1 did, worker 0's steps, how the run ended."""
    rows = []
    for name, run in stall.items():
        after = run["stall_after"]
        what = (
            f"dies (SIGKILL) after step {after}"
            if run.get("dies")
            else f"hangs {run['stall_s']:g} s after step {after}"
        )
        if run["error"]:
            step = f"{run['error']} after {run['waited_s']:.1f} s"
            if run.get("after_death_s") is not None:
                step += f" ({run['after_death_s']:.1f} s after the death)"
        else:
            step = f"{run['step_s'][after]:.1f} s" if len(run["step_s"]) > after else "—"
        rows.append(
            {
                "worker 1": what,
                "collectives": f"timeout {run['timeout_s']:g} s" if run["timeout_s"] else "no timeout",
                "worker 0: steps before": ", ".join(f"{s:.2f} s" for s in run["step_s"][:after]),
                f"worker 0: step {after + 1}": step,
                "why it ended": run.get("error_line", "")[:110] if run["error"] else "",
                "the run": run["message"] or f"all {len(run['step_s'])} steps ran",
            }
        )
    return rows


def time_alone(workers: int, steps: int, out: str) -> dict:
    """§7: ``workers`` processes started together, each training on its own (``--time --alone``: no cluster, no
    communication) while the others do the same: worker 0's step time with the cores shared."""
    from ... import cluster

    cluster.launch(MW, ["--steps", 1, "--time", steps, "--alone", "--out", out], workers=workers, timeout=300, log=None)
    with open(f"{out}/worker0_timing.json", encoding="utf-8") as f:
        return json.load(f)


def step_parts(timings: dict, alone: dict) -> dict:
    """§7: each multi-worker step (ms) split into what was measured: the 1-worker step (compute, cores to itself),
    + core sharing (the same step with that many processes running at once, alone: ``alone[n]``), + the all-reduce
    beyond a 1-worker all-reduce (timed alone in the cluster), + the rest (waiting for the slowest worker, the loss's
    collective, dispatch): what the measured parts leave unexplained."""
    base = timings[1] if 1 in timings else None
    out = {}
    for n, t in sorted(timings.items()):
        if n == 1 or n not in alone or base is None:
            continue
        step, one, shared = t["step_s"] * 1e3, base["step_s"] * 1e3, alone[n]["step_s"] * 1e3
        reduce_extra = max(0.0, (t["all_reduce_s"] - base["all_reduce_s"]) * 1e3)
        out[n] = {
            "step": step,
            "one_worker": one,
            "core_sharing": shared - one,
            "all_reduce": reduce_extra,
            "rest": step - shared - reduce_extra,
        }
    return out


def communication_share(timings: dict, scaling_workers) -> tuple[list[int], list[float]]:
    """§7: the workers timed, and the share of each one's step beyond the 1-worker step."""
    workers = sorted(n for n in timings if n in scaling_workers)
    step_ms = np.array([timings[n]["step_s"] * 1e3 for n in workers])
    return workers, [float(s) for s in 1 - step_ms[0] / step_ms]


def _stall_claim(stall: dict):
    """§3: without a timeout worker 0's step after the stall lasts the whole stall; with one it raises
    DeadlineExceededError about the timeout later (before the stall ends), and the program exits with its code."""
    none, timed = stall["no timeout"], stall["timeout"]
    after, t, w = timed["stall_after"], timed["timeout_s"], timed["stall_s"]
    waited_none = none["step_s"][after] if none["error"] is None and len(none["step_s"]) > after else None
    holds = (
        waited_none is not None
        and waited_none >= 0.9 * w
        and timed["error"] == "DeadlineExceededError"
        and timed["failed_step"] == after + 1
        and 0.95 * t <= timed["waited_s"] < min(w, t + 1.5)
        and f"exited with code {COLLECTIVE_TIMEOUT_EXIT}" in (timed["message"] or "")
    )
    without = (
        f"{waited_none:.1f} s"
        if waited_none is not None
        else f"{none['error'] or 'no step'} at step {none['failed_step']}"
    )
    with_timeout = (
        f"{timed['error']} at step {timed['failed_step']} after {timed['waited_s']:.1f} s; "
        f"{_exit_code(timed['message'])}"
        if timed["error"]
        else "no error"
    )
    return CLAIMS.judge(
        "08.hung_worker_waits", f"{without} / {with_timeout}", holds, step=after + 1, stall=w, low=t, high=t + 1.5
    )


CAS = "tensorflow/python/distribute/collective_all_reduce_strategy.py"  # TensorFlow 2.20


def _heartbeat_claims(stall: dict) -> list:
    """§3: a dead worker is found by the coordination service's heartbeats (no Python health check runs), a hung one
    is not — it is alive and sends them. No ``"dead"`` run (results from before it existed): no claims."""
    if "dead" not in stall:
        return []
    dead, hung = stall["dead"], stall["no timeout"]
    set_ms = int(1000 * (dead.get("heartbeat_s") or 0))  # what the run asked for: 0, TensorFlow's default
    heartbeat = set_ms / 1000 or HEARTBEAT_TIMEOUT_S
    low, high = detection_bounds_s(heartbeat)
    detection = dead.get("detection") or {}
    seconds = dead.get("after_death_s")
    found = (
        dead["error"] == "UnavailableError"
        and "stopped sending heartbeats" in dead.get("error_line", "")
        and seconds is not None
        and low <= seconds <= high
        and f"exited with code {COLLECTIVE_TIMEOUT_EXIT}" in (dead["message"] or "")
        and detection.get("health_check_thread") is False
        and detection.get("coordination_service") == "standalone"
        and detection.get("heartbeat_timeout_ms") == set_ms
    )
    after = hung["stall_after"]
    waited = hung["step_s"][after] if hung["error"] is None and len(hung["step_s"]) > after else None
    not_found = waited is not None and hung["stall_s"] > heartbeat + 1 and waited >= 0.9 * hung["stall_s"]
    measured_dead = (
        f"{dead['error'] or 'no error'}"
        + (f" {seconds:.1f} s after the death" if seconds is not None else "")
        + (" ('stopped sending heartbeats')" if "heartbeats" in dead.get("error_line", "") else "")
        + f"; health-check thread {'on' if detection.get('health_check_thread') else 'off'}; "
        f"coordination service {detection.get('coordination_service') or 'none'}, heartbeat timeout "
        + ("default" if detection.get("heartbeat_timeout_ms") == 0 else f"{detection.get('heartbeat_timeout_ms')} ms")
    )
    return [
        CLAIMS.judge(
            "08.dead_worker_found",
            measured_dead,
            found,
            low=low,
            high=high,
            timeout=f"{heartbeat:g} s (set: smoke mode)" if set_ms else f"default ({HEARTBEAT_TIMEOUT_S:g} s)",
        ),
        CLAIMS.judge(
            "08.hung_worker_not_found",
            f"{waited:.1f} s, no error" if waited is not None else f"{hung['error']} at step {hung['failed_step']}",
            not_found,
            step=after + 1,
            hang=hung["stall_s"],
            heartbeat=heartbeat,
        ),
    ]


def visit_counts(visits: list) -> str:
    """§4: how many examples an evaluation saw once, more than once, never."""
    return f"{visits.count(1)} once, {sum(v > 1 for v in visits)} more than once, {visits.count(0)} never"


def _evaluation_claims(ev: dict) -> list:
    """§4: evaluation scheduled on the workers — one batch per step is exact; a per-worker dataset is not."""
    per_worker, by_batch, n = ev["per-worker dataset"], ev["one batch per step"], ev["examples"]
    exact = all(v == 1 for v in by_batch["visits"]) and by_batch["correct"] == ev["coordinator_correct"]
    one_worker_did_all = all(v == 1 for v in per_worker["visits"])  # every iterator starts at batch 1
    return [
        CLAIMS.judge(
            "08.scheduled_evaluation_exact",
            f"{visit_counts(by_batch['visits'])}; right {by_batch['correct']} vs {ev['coordinator_correct']}",
            exact,
            examples=n,
        ),
        CLAIMS.judge(
            "08.per_worker_evaluation_repeats",
            visit_counts(per_worker["visits"]),
            None if one_worker_did_all else any(v > 1 for v in per_worker["visits"]) and 0 in per_worker["visits"],
            "one worker ran every step this time: exact by chance" if one_worker_did_all else "",
        ),
    ]


def _batch_cost_claim(ev: dict) -> list:
    """§4: batch k by ``skip(k).take(1)`` costs more the larger k; sliced by index it does not. Results from before
    the measurement existed: no claim."""
    cost = ev.get("batch_cost")
    if not cost:
        return []
    last = str(cost["batches"] - 1)
    skip, index = cost["skip(k).take(1)"], cost["slice by index"]
    holds = skip[last] >= 20 * skip["0"] and skip[last] >= 20 * index[last] and index[last] <= 5 * index["0"]
    return [
        CLAIMS.judge(
            "08.skip_take_evaluation_cost",
            f"skip: {skip['0'] * 1e3:.2f} → {skip[last] * 1e3:.1f} ms; by index: "
            f"{index['0'] * 1e3:.2f} → {index[last] * 1e3:.2f} ms",
            holds,
            batches=cost["batches"],
            batch=cost["batch"],
        )
    ]


def _worker_failure_claim(ps: dict) -> list:
    """§4: a worker SIGKILLed mid-schedule — every scheduled step returns, the steps after the kill run on the others,
    a closure that failed on it was put back; the step ran at least once per step. No such run: no claim."""
    lost = ps.get("worker_failure")
    if not lost:
        return []
    survivors_only = bool(lost["second_half"]) and lost["killed"] not in lost["second_half"]
    holds = (
        lost["returned"] == lost["scheduled"]
        and survivors_only
        and lost["put_back"] >= 1
        and lost["executions"] >= lost["scheduled"]
        and lost["grpc_fail_fast"] == "use_caller"
    )
    return [
        CLAIMS.judge(
            "08.ps_worker_killed",
            f"{lost['returned']}/{lost['scheduled']} returned; after the kill on worker(s) "
            f"{sorted(set(lost['second_half']))}; {lost['put_back']} put back; {lost['executions']} executions "
            f"(GRPC_FAIL_FAST={lost['grpc_fail_fast'] or 'unset'})",
            holds,
            scheduled=lost["scheduled"],
        )
    ]


# Every claim of the lesson, declared once: its words, threshold and the function that measures it (claims.json's
# "where": a report card's row leads to the code; the worker programs by name, as MW, PS and MP).
_PROGRAMS = "course_utils.lessons.scaling_out."
MW_TRAIN, PS_MAIN, MP_MAIN = (
    _PROGRAMS + name for name in ("multiworker:train", "parameter_server:main", "model_parallel:main")
)
NAIVE_AT_LEAST = 0.9  # the naive split's step time against one device's: at least this (not meaningfully faster)
CLAIMS = report.LessonClaims(
    "08",
    [
        report.Declared(
            "08.workers_identical_weights",
            "Two MultiWorkerMirrored workers end with identical weights",
            "§1",
            "max |Δ| = 0",
            where=MW_TRAIN,
        ),
        report.Declared(
            "08.workers_equal_one_process",
            "... equal to one process trained on the same global batches",
            "§1",
            "max |Δ| ≤ 1e-6",
            where=_PROGRAMS + "multiworker:single_process_weights",
        ),
        report.Declared(
            "08.workers_read_half",
            "Each worker reads half of every global batch (DATA auto-sharding)",
            "§1; lesson 04",
            "{half} examples each",
            where=MW_TRAIN,
        ),
        report.Declared(
            "08.fit_fails_multiworker",
            "Keras 3 model.fit fails under MultiWorkerMirroredStrategy",
            "§2; keras#20585",
            "a ValueError in fit",
            where=_PROGRAMS + "multiworker:main",
        ),
        report.Declared(
            "08.restart_resumes",
            "A killed worker: the restarted cluster resumes from the checkpoint, no step lost or repeated",
            "§3",
            "steps {first}–{last} once on each worker; equal to one process",
            where="notebook §3",
        ),
        report.Declared(
            "08.preemption_handler_off_cloud",
            "PreemptionCheckpointHandler off Google Cloud: on a SIGTERM "
            "notice every worker saves at one step and exits 42; the restart resumes there, no step lost or "
            "repeated",
            f"§3; {FH}failure_handling.py BorgTerminationConfig",
            "exit code 42; steps {first}–{last} once on each worker, resumed at the same step; equal to one process",
            where="notebook §3",
        ),
        report.Declared(
            "08.preemption.", "{claim}", "{source}", "{expected}", where=preemption_row, optional=True
        ),  # one claim per row of the platform matrix (_platform_claim_specs: its words)
        report.Declared(
            "08.gce_tpu_vm_path",
            "On a GCE TPU VM (Colab's TPU runtime) it takes the GCE CPU VM's path: a warning, nothing else",
            f"§3; {FH}failure_handling.py __init__, run",
            "as on a GCE CPU VM",
            optional=True,
        ),  # cannot run off a TPU VM: read from TensorFlow's source
        report.Declared(
            "08.hung_worker_waits",
            "A hung worker: without a collective timeout the others wait as long as it "
            "hangs; with CommunicationOptions(timeout_seconds=T) their all-reduce fails after T",
            "§3; tf.distribute.experimental",
            "step {step} waits the whole {stall:g} s stall / "
            f"DeadlineExceededError after {{low:g}}–{{high:g}} s, exit code {COLLECTIVE_TIMEOUT_EXIT}",
            where=stalled_worker,
        ),
        report.Declared(
            "08.dead_worker_found",
            "A worker that dies (SIGKILL) is found by the coordination service's "
            "heartbeats: its peers' all-reduce fails with UnavailableError about the heartbeat timeout after "
            "the death; the strategy's own health check (every 30 s) is off",
            f"§3; {CAS} (check_health), XLA coordination_service.cc (kDefaultHeartbeatTimeoutMs)",
            "UnavailableError 'stopped sending heartbeats' {low:g}–{high:g} s after the death, exit code "
            f"{COLLECTIVE_TIMEOUT_EXIT}; health-check thread off; service standalone, timeout {{timeout}}",
            where=stalled_worker,
            optional=True,
        ),
        report.Declared(
            "08.hung_worker_not_found",
            "... a worker that hangs longer than the heartbeat timeout is not "
            "found: it is alive and sends them, so without a collective timeout its peers wait the whole hang",
            "§3",
            "step {step} waits the whole {hang:g} s hang (> {heartbeat:g} s), no error",
            where=stalled_worker,
            optional=True,
        ),
        report.Declared(
            "08.ps_custom_loop_trains",
            "ParameterServerStrategy trains a Keras 3 model with a custom loop; variables on the parameter server",
            "§4",
            "loss falls; variables on /job:ps",
            where=_PROGRAMS + "parameter_server:train",
        ),
        report.Declared(
            "08.fit_fails_ps",
            "Keras 3 model.fit does not run under ParameterServerStrategy",
            "§4",
            "an error",
            where=PS_MAIN,
        ),
        report.Declared(
            "08.scheduled_evaluation_exact",
            "Evaluation scheduled one batch per step sees every example once: the coordinator's accuracy",
            "§4",
            "{examples} once; right: as in the coordinator",
            where=PS_MAIN,
        ),
        report.Declared(
            "08.per_worker_evaluation_repeats",
            "Evaluation from a per-worker dataset (TensorFlow's tutorial) repeats some batches and skips others",
            "§4",
            "some examples more than once, some never",
            where=PS_MAIN,
        ),
        report.Declared(
            "08.skip_take_evaluation_cost",
            "Evaluation batch k by skip(k).take(1) produces the k batches "
            "before it (O(k) a step); sliced by index it costs the same for every k ({batches} batches of "
            "{batch}, with a map)",
            "§4",
            "last batch by skip ≥ 20× the first and ≥ 20× by index; by index, last ≤ 5× first",
            where=PS_MAIN,
            optional=True,
        ),
        report.Declared(
            "08.ps_worker_killed",
            "ParameterServerStrategy: a worker killed mid-schedule — the coordinator "
            "puts its failed step back and the other worker runs it; every scheduled step returns a result, "
            "each run at least once",
            "§4; tensorflow/python/distribute/coordinator/cluster_coordinator.py (schedule, wait_on_failure)",
            "{scheduled}/{scheduled} returned; every step after the kill on another worker; ≥ 1 closure put "
            "back; ≥ {scheduled} executions",
            where=PS_MAIN,
            optional=True,
        ),
        report.Declared(
            "08.model_parallel_same_gradients",
            "A model split over two devices computes the same gradients",
            "§5",
            "max |Δ| ≤ 1e-5 × max |gradient|",
            where=MP_MAIN,
        ),
        report.Declared(
            "08.naive_model_parallel_not_faster",
            "Naive model parallelism is not meaningfully faster than one device",
            "§5",
            "naive step ≥ {threshold} × one device's",
            where=MP_MAIN,
            op=">=",
            threshold=NAIVE_AT_LEAST,
        ),
        report.Declared(
            "08.pipelining_beats_naive",
            "Pipelining micro-batches beats the naive split ({pipe})",
            "§5; GPipe",
            "naive / pipelined > {threshold}",
            where=MP_MAIN,
            op=">",
            threshold=1,
        ),
        report.Declared(
            "08.communication_dominates",
            "With 2+ local workers, most of the step is communication, synchronisation and shared cores (tiny model)",
            "§7",
            "> 50% of the step beyond the 1-worker step",
            where=MW_TRAIN,
        ),
        report.Declared(
            "08.sharing_cores_not_the_cause",
            "Sharing the cores does not explain the 2-worker step: the "
            "cluster adds time the same processes running alone at once do not",
            "§7",
            "2-worker step > 1.2 × the step alone beside another",
            where=time_alone,
        ),
    ],
)


def claims(r: dict) -> list:
    """Lesson 08's claims from the notebook's results."""
    steps = list(range(1, r["cluster_steps"] + 1))
    global_examples = r["cluster_steps"] * r["global_batch"]
    fit_failed = any("model.fit failed: ValueError" in line for line in r["fit_log"])
    committed, ps, mp = r["committed"], r["ps"], r["mp"]
    losses = np.array(ps["losses"])
    k = max(1, len(losses) // 4)
    naive_vs_one = report.Samples([a / b for a, b in zip(mp["times_s"]["split (naive)"], mp["times_s"]["one device"])])
    pipe, pipe_vs_naive = pipelining(mp)
    pipe_vs_naive = report.Samples(pipe_vs_naive)
    workers, comm_share = communication_share({int(n): t for n, t in r["timings"].items()}, r["scaling_workers"])
    parts = step_parts(
        {int(n): t for n, t in r["timings"].items() if int(n) in r["scaling_workers"]},
        {int(n): t for n, t in r["alone"].items()},
    )
    local = r["local_examples"]

    def timed(claim_id, samples, **values):
        """A §5 timing claim: from 3+ interleaved rounds a verdict; from fewer (smoke mode's 2), a difference of
        some percent cannot be told from noise between processes sharing cores: not measurable here."""
        if len(samples.values) >= 3:
            return CLAIMS.judge_samples(claim_id, samples, **values)
        return CLAIMS.judge(
            claim_id,
            samples.format(".2f", "×"),
            None,
            f"{len(samples.values)} timing rounds (smoke mode): too few to tell a difference of some "
            "percent from noise",
            **values,
        )

    return CLAIMS.all(
        [
            CLAIMS.judge("08.workers_identical_weights", f"{r['diff_workers']:.1e}", r["diff_workers"] == 0.0),
            CLAIMS.judge("08.workers_equal_one_process", f"{r['diff_single']:.1e}", r["diff_single"] <= 1e-6),
            CLAIMS.judge(
                "08.workers_read_half",
                f"{local[0]} and {local[1]}",
                local[0] == local[1] == global_examples // 2,
                half=global_examples // 2,
            ),
            CLAIMS.judge("08.fit_fails_multiworker", "ValueError" if fit_failed else "ran", fit_failed),
            CLAIMS.judge(
                "08.restart_resumes",
                f"{committed[0]} / {committed[1]}; max |Δ| {r['diff_resumed']:.1e}",
                r["crash_message"] is not None and committed[0] == committed[1] == steps and r["diff_resumed"] <= 1e-6,
                first=steps[0],
                last=steps[-1],
            ),
            CLAIMS.judge(
                "08.preemption_handler_off_cloud",
                f"{_exit_code(r['notice_message'])}; {r['preempt_steps'][0]} / {r['preempt_steps'][1]}, "
                f"resumed after {r['preempt_resumed'][0]} / {r['preempt_resumed'][1]}; max |Δ| "
                f"{r['diff_preempted']:.1e}",
                r["notice_message"] is not None
                and f"exited with code {PREEMPTED_EXIT}" in r["notice_message"]
                and r["preempt_steps"][0] == r["preempt_steps"][1] == steps
                and r["preempt_resumed"][0] == r["preempt_resumed"][1] >= r["cluster_steps"] // 2
                and r["diff_preempted"] <= 1e-6,
                first=steps[0],
                last=steps[-1],
            ),
            *_platform_claims(r.get("platform_rows", [])),
            _stall_claim(r["stall"]),
            *_heartbeat_claims(r["stall"]),
            CLAIMS.judge(
                "08.ps_custom_loop_trains",
                f"{losses[:k].mean():.3f} → {losses[-k:].mean():.3f}; {', '.join(ps['variable_devices'])}",
                losses[-k:].mean() < losses[:k].mean() and all("/job:ps" in d for d in ps["variable_devices"]),
            ),
            CLAIMS.judge("08.fit_fails_ps", ps["fit"].split(":")[0], ps["fit"] != "runs"),
            *_evaluation_claims(ps["evaluation"]),
            *_batch_cost_claim(ps["evaluation"]),
            *_worker_failure_claim(ps),
            CLAIMS.judge(
                "08.model_parallel_same_gradients",
                f"{max(mp['max_grad_diff'].values()) / mp['grad_scale']:.0e} ×",
                max(mp["max_grad_diff"].values()) <= 1e-5 * mp["grad_scale"],
            ),
            timed("08.naive_model_parallel_not_faster", naive_vs_one),
            timed("08.pipelining_beats_naive", pipe_vs_naive, pipe=pipe)
            if mp.get("stage_cores", 2) >= 2
            else CLAIMS.judge(
                "08.pipelining_beats_naive",
                pipe_vs_naive.format(".2f", "×"),
                None,
                "the two stages' workers share one core here, so they take turns: pipelining gains only when "
                "each stage has a device (or core) of its own",
                pipe=pipe,
            ),
            CLAIMS.judge(
                "08.communication_dominates",
                ", ".join(f"{n}: {s:.0%}" for n, s in zip(workers[1:], comm_share[1:])),
                all(s > 0.5 for s in comm_share[1:]),
            ),
            CLAIMS.judge(
                "08.sharing_cores_not_the_cause",
                f"{parts[2]['step']:.2f} ms in the cluster vs {parts[2]['one_worker'] + parts[2]['core_sharing']:.2f}"
                f" ms alone beside another ({parts[2]['one_worker']:.2f} ms with the cores to itself)"
                if 2 in parts
                else "no 2-worker runs",
                parts[2]["step"] > 1.2 * (parts[2]["one_worker"] + parts[2]["core_sharing"]) if 2 in parts else None,
                "" if 2 in parts else "this mode times no 2-worker cluster",
            ),
        ]
    )
