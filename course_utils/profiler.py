"""Read a TensorBoard profile: is the training step input-bound or compute-bound (:func:`read_input_bound`), and
what is alive in memory at its peak (:func:`read_memory_profile`)?

Keras' ``TensorBoard(log_dir, profile_batch=(first, last))`` callback writes a profile of a few
training steps (``log_dir/train/plugins/profile/<run>/<host>.xplane.pb``). TensorBoard's profile
plugin (``tensorboard-plugin-profile``, which installs ``xprof``) shows it; :func:`read_input_bound`
reads the same file with the plugin's own converter, so a notebook can print the answer:

* on a TPU or GPU, the plugin's *input pipeline analysis* splits each step into device compute and
  waiting for input ("infeed"/"input" time) and gives its own conclusion — :func:`read_input_bound`
  returns that;
* on a CPU-only host the analysis has no device steps ("No step time measured"), so the same
  question is answered from the profile's trace: the time the step spends in ``IteratorGetNext``
  (waiting for the next batch from ``tf.data``) as a share of the profiled steps' time (Keras
  marks each profiled step as a "Profiled batch" event).

Where the plugin is missing or cannot load (Colab: xprof 2.20.9 needs protobuf >= 6.31, Colab has 5.29), the
trace figure is read from the same file with TensorFlow's own XSpace proto (:func:`_from_xspace`).

Either way the figure is the share of step time spent waiting for input: above about 10–20% the
step is input-bound (make the pipeline faster: lesson 04); near 0 it is compute-bound.

The figure describes the profiled steps only. If the training loop paused before them (a step that compiled, a
garbage collection, a busy machine), a slow pipeline went on filling its buffers meanwhile, and the profiled steps
were fed from them: they look compute-bound. :attr:`ProfileReading.timeline` gives each step's timing — from the
trace, also when it asked for its batch and got it — so a reading can be checked for that (lesson 04's
``profiled_input_share`` does).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

INPUT_BOUND_ABOVE = 0.10  # share of step time waiting for input above which a step counts as input-bound
INSTALL_HINT = "pip install tensorboard-plugin-profile"


class ProfileError(RuntimeError):
    """No profile to read, or no tool to read it with; the message says which and what to do."""


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """One profiled step on the trace's clock (milliseconds from the first profiled step's start): when it began, how
    long it took, how much of it was spent in ``IteratorGetNext``, and when it first asked for its batch and last got
    one (None: no ``IteratorGetNext`` inside the step)."""

    start_ms: float
    step_ms: float
    wait_ms: float
    asked_ms: float | None
    got_ms: float | None


@dataclasses.dataclass(frozen=True)
class ProfileReading:
    input_share: float  # share of the profiled steps' time spent waiting for input (0..1)
    steps: int  # profiled steps the figure comes from
    step_ms: float  # mean step time over them, in milliseconds
    source: str  # which part of the profile the figure came from
    conclusion: str  # the plugin's own words where it has them
    path: str
    timeline: tuple = ()  # a StepTiming per profiled step (from the analysis: no times of asking for a batch)

    @property
    def bound(self) -> str:
        return "input-bound" if self.input_share > INPUT_BOUND_ABOVE else "compute-bound"

    def __str__(self) -> str:
        text = (
            f"{self.bound}: {self.input_share:.1%} of each step waits for input "
            f"({self.steps} profiled steps, {self.step_ms:.1f} ms each; from {self.source})"
        )
        return text + (f"\nprofiler: {self.conclusion}" if self.conclusion else "")


def find_xplanes(log_dir: str) -> list[str]:
    """The newest profile run's ``.xplane.pb`` files under ``log_dir`` (Keras writes one per host)."""
    paths = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise ProfileError(
            f"no profile under {log_dir!r}: train with keras.callbacks.TensorBoard(log_dir, "
            "profile_batch=(first, last)) for a run of more than `last` steps"
        )
    newest = max(os.path.dirname(p) for p in paths)  # run folders are named by date and time
    return sorted(p for p in paths if os.path.dirname(p) == newest)


def _converter():
    try:
        from xprof.convert import raw_to_tool_data  # installed by tensorboard-plugin-profile
    except ImportError:
        try:
            from tensorboard_plugin_profile.convert import raw_to_tool_data  # older plugin releases
        except ImportError as err:
            raise ProfileError(
                f"the TensorBoard profile plugin is not installed ({err.name or err}): "
                f"run `{INSTALL_HINT}`, then this cell again"
            ) from None
    except Exception as err:  # noqa: BLE001 - e.g. protobuf's VersionError: xprof 2.20.9 needs protobuf >= 6.31.1
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        fix = (
            "run `pip install -U 'protobuf>=6.31.1'`, then restart the kernel/runtime"
            if "gencode" in str(err) or "protobuf" in str(err).lower()
            else f"reinstall it: `{INSTALL_HINT}`"
        )
        raise ProfileError(
            f"the TensorBoard profile plugin cannot load ({type(err).__name__}: {first}): {fix}"
        ) from None
    return raw_to_tool_data


def _tool_json(convert, paths: list[str], tool: str):
    data, _ = convert.xspace_to_tool_data(paths, tool, {})
    if not data:
        return None
    return json.loads(data.decode() if isinstance(data, bytes) else data)


def _from_analyzer(tables) -> tuple[float, int, float, str, tuple] | None:
    """(input share, steps, mean step ms, conclusion, timeline) from the input pipeline analysis, if it timed steps
    (its timeline: each step's time and input part, laid end to end; no times of asking for a batch)."""
    for table in tables or []:
        props = table.get("p", {}) if isinstance(table, dict) else {}
        if "input_conclusion" not in props:
            continue
        cols = [c.get("id") for c in table.get("cols", [])]
        rows = [dict(zip(cols, (cell.get("v") for cell in row.get("c", [])))) for row in table.get("rows", [])]
        if not rows:
            return None
        if "stepTimeMs" in cols:  # CPU/GPU ("generic"): a step time and the input part of it per step
            per_step = [(float(r.get("stepTimeMs") or 0.0), float(r.get("infeedTimeMs") or 0.0)) for r in rows]
        elif "tcInfeedTimeMs" in cols:  # TPU: the TensorCore's time split; no step-time column
            parts = [c for c in _TPU_STEP_PARTS if c in cols]
            per_step = [
                (sum(float(r.get(c) or 0.0) for c in parts), float(r.get("tcInfeedTimeMs") or 0.0)) for r in rows
            ]
        else:
            return None
        total, wait = sum(t for t, _ in per_step), sum(w for _, w in per_step)
        if total <= 0:
            return None
        starts = [sum(t for t, _ in per_step[:i]) for i in range(len(per_step))]
        timeline = tuple(StepTiming(start, t, w, None, None) for start, (t, w) in zip(starts, per_step))
        return wait / total, len(rows), total / len(rows), props.get("input_conclusion", ""), timeline
    return None


# A TPU step in xprof's input-pipeline table (GenerateTpuInputPipelineAnalysisDataTable): TensorCore compute, input
# (infeed: waiting for data), output, idle, and host transfer; SparseCore columns run beside them and are not added.
_TPU_STEP_PARTS = ("tcComputeTimeMs", "tcInfeedTimeMs", "tcOutfeedTimeMs", "tcIdleTimeMs", "hostTransferTimeMs")


def _summary(steps: list[tuple[float, float]], gets: list[tuple[float, float]]):
    """(input share, steps, mean step ms, timeline) from the profiled steps' and the ``IteratorGetNext`` events'
    (start, duration) in microseconds; None without steps. The share is every ``IteratorGetNext`` over every step."""
    steps = sorted(s for s in steps if s[1] > 0)
    step_us = sum(d for _, d in steps)
    if not steps or step_us <= 0:
        return None
    origin = steps[0][0]
    timeline = []
    for start, dur in steps:
        inside = [(t, d) for t, d in gets if start <= t <= start + dur]
        timeline.append(
            StepTiming(
                (start - origin) / 1000,
                dur / 1000,
                sum(d for _, d in inside) / 1000,
                (min(t for t, _ in inside) - origin) / 1000 if inside else None,
                (max(t + d for t, d in inside) - origin) / 1000 if inside else None,
            )
        )
    wait_us = sum(d for _, d in gets)
    return min(wait_us / step_us, 1.0), len(steps), step_us / len(steps) / 1000, tuple(timeline)


def _from_trace(trace):
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else (trace or [])
    spans = [
        (str(e.get("name", "")), float(e.get("ts", 0)), float(e.get("dur", 0))) for e in events if e.get("ph") == "X"
    ]
    return _summary(
        [(t, d) for name, t, d in spans if name == "Profiled batch"],
        [(t, d) for name, t, d in spans if name.startswith("IteratorGetNext")],
    )


def _from_xspace(paths: list[str]):
    """:func:`_from_trace`'s figure read straight from the ``.xplane.pb`` files with TensorFlow's own XSpace proto
    (``tensorflow.tsl.profiler.protobuf.xplane_pb2``): no plugin needed. None if TensorFlow has no such module or the
    files hold no profiled steps; raises ProfileError for a file that is not an XSpace."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        return None
    steps, gets = [], []
    for path in paths:
        space = xplane_pb2.XSpace()
        try:
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, OSError: one line
            raise ProfileError(f"{path!r} is not a readable profile ({type(err).__name__}): profile again") from None
        for plane in space.planes:
            names = {key: meta.name for key, meta in plane.event_metadata.items()}
            for line in plane.lines:
                for event in line.events:
                    name = names.get(event.metadata_id, "")
                    span = ((line.timestamp_ns * 1000 + event.offset_ps) / 1e6, event.duration_ps / 1e6)  # µs
                    if name == "Profiled batch":
                        steps.append(span)
                    elif name.startswith("IteratorGetNext"):
                        gets.append(span)
    return _summary(steps, gets)


def read_input_bound(log_dir: str) -> ProfileReading:
    """How much of each profiled training step waited for input, read from the profile in ``log_dir``.

    With TensorBoard's profile plugin: its input pipeline analysis, or its trace viewer on a CPU-only host. Without
    a usable plugin (not installed, or — as on Colab — an xprof built for a newer protobuf): the same trace figure,
    read with TensorFlow's own profile format. Each profiled step's timing comes with it (``timeline``). Raises
    :class:`ProfileError` (one line, with the fix) when there is no profile, or no way to read it.
    """
    paths = find_xplanes(log_dir)
    try:
        convert = _converter()
    except ProfileError:
        traced = _from_xspace(paths)
        if traced is None:
            raise
        share, steps, step_ms, timeline = traced
        return ProfileReading(
            share,
            steps,
            step_ms,
            "the trace, read with TensorFlow's own profile format (TensorBoard's "
            "profile plugin is not usable here): time in IteratorGetNext / time in the step",
            "",
            paths[0],
            timeline,
        )
    analysis = _from_analyzer(_tool_json(convert, paths, "input_pipeline_analyzer"))
    if analysis is not None:
        share, steps, step_ms, conclusion, timeline = analysis
        return ProfileReading(share, steps, step_ms, "the input pipeline analysis", conclusion, paths[0], timeline)
    traced = _from_trace(_tool_json(convert, paths, "trace_viewer"))
    if traced is None:
        raise ProfileError(
            f"the profile in {os.path.dirname(paths[0])!r} has no training steps: profile steps "
            "that run (profile_batch within the epoch's steps, steps_per_execution=1)"
        )
    share, steps, step_ms, timeline = traced
    return ProfileReading(
        share, steps, step_ms, "the trace: time in IteratorGetNext / time in the step", "", paths[0], timeline
    )


# ----------------------------------------------------------------------------------------------
# The memory profile: what is alive at the peak
# ----------------------------------------------------------------------------------------------


UNUSED_PREALLOCATED = "unused preallocated device memory"  # xprof's name for an allocator's reserve at the peak


@dataclasses.dataclass(frozen=True)
class MemoryProfile:
    """TensorBoard's *memory profile* of a profiled span, as numbers: the allocator it watched, the most bytes in use
    at any allocation or free in the span (``peak_bytes``), the tensors alive at that moment, grouped by the op that
    made them and their shape, largest first (``at_peak``: dicts of op, shape, bytes, count), and what the allocator
    held in no tensor then (``reserved_bytes``)."""

    allocator: str
    peak_bytes: int
    at_peak: list
    path: str
    reserved_bytes: int = 0  # held by the allocator at the peak but in no tensor ("unused preallocated device memory")

    def share(self, predicate) -> float:
        """The share of the peak's live bytes in tensors for which ``predicate(entry)`` holds."""
        total = sum(e["bytes"] for e in self.at_peak)
        return sum(e["bytes"] for e in self.at_peak if predicate(e)) / total if total else 0.0


def read_memory_profile(log_dir: str) -> MemoryProfile:
    """The memory profile in ``log_dir`` (``tf.profiler.experimental.start/stop``, or Keras' ``TensorBoard`` callback
    with ``profile_batch``), read with the plugin's own converter (its ``memory_profile`` tool: the Memory Profile page
    in TensorBoard's Profile tab). Of the allocators it watched, the one with the highest peak: a GPU's or TPU's, or on
    a CPU TensorFlow's BFC allocator (which the course turns on; the default CPU allocator keeps no record). Raises
    :class:`ProfileError` (one line, with the fix) when there is no profile, no plugin or no allocator activity."""
    paths = find_xplanes(log_dir)
    data = _tool_json(_converter(), paths, "memory_profile")
    allocators = (data or {}).get("memoryProfilePerAllocator") or {}
    best = None
    for name, profile in allocators.items():
        snapshots = profile.get("memoryProfileSnapshots") or []
        if not snapshots:
            continue
        peak = max(int(s.get("aggregationStats", {}).get("heapAllocatedBytes", 0)) for s in snapshots)
        if best is None or peak > best[1]:
            best = (name, peak, profile)
    if best is None:
        raise ProfileError(
            f"the profile in {os.path.dirname(paths[0])!r} recorded no allocations: on a CPU the "
            "allocator must be TensorFlow's BFC one (TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow "
            "starts; importing course_utils first does it)"
        )
    name, peak, profile = best
    snapshots, special = profile["memoryProfileSnapshots"], profile.get("specialAllocations") or []
    groups: dict = {}
    reserved = 0
    for active in profile.get("activeAllocations") or []:
        index = int(active.get("specialIndex", -1))
        meta = special[index] if index >= 0 else snapshots[int(active["snapshotIndex"])].get("activityMetadata", {})
        key = (meta.get("tfOpName", "?"), meta.get("tensorShape", "?"))
        count = int(active.get("numOccurrences", 1))
        if key[0] == UNUSED_PREALLOCATED:  # the allocator's reserve, not a tensor
            reserved += int(meta.get("allocationBytes", 0)) * count
            continue
        entry = groups.setdefault(key, {"op": key[0], "shape": key[1], "bytes": 0, "count": 0})
        entry["bytes"] += int(meta.get("allocationBytes", 0)) * count
        entry["count"] += count
    at_peak = sorted(groups.values(), key=lambda e: -e["bytes"])
    return MemoryProfile(name, peak, at_peak, os.path.dirname(paths[0]), reserved)
