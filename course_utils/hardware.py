"""Which mixed-precision policy suits this hardware, and why: :func:`recommended_policy` (TPU, GPU by compute
capability, CPU), with what it reads — :func:`detect_gpu_compute_capability`, :func:`cpu_bf16_support` (native
bfloat16 instructions in ``/proc/cpuinfo``: ``avx512_bf16``, ``amx_bf16``) and :func:`onednn_bf16_capped`; and
:func:`onednn_bf16_aborts`, the one setting where a bfloat16 op kills the process."""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "KERNEL_PATHS",
    "cpu_bf16_support",
    "detect_gpu_compute_capability",
    "kernel_path",
    "kernel_path_line",
    "onednn_bf16_aborts",
    "onednn_bf16_capped",
    "recommended_policy",
]

# bfloat16 Tensor Cores arrived with NVIDIA Ampere (compute capability 8.0: A100; 8.6/8.9: RTX 30xx, L4; 9.0: H100).
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)


def detect_gpu_compute_capability(gpu: Any = None) -> tuple[int, int] | None:
    """The first (or the given) GPU's compute capability, e.g. ``(7, 5)`` for a T4; ``None`` if unknown.

    Reads ``tf.config.experimental.get_device_details(gpu)["compute_capability"]``.
    """
    import tensorflow as tf

    try:
        if gpu is None:
            gpus = tf.config.list_physical_devices("GPU")
            if not gpus:
                return None
            gpu = gpus[0]
        cc = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    except Exception:  # no details on this build / device
        return None
    return (int(cc[0]), int(cc[1])) if cc else None


def recommended_policy(runtime_or_kind: Any, gpu_compute_capability: Any = None) -> tuple[str, str]:
    """``(policy, why)``: the mixed-precision policy that suits the hardware.

    ``runtime_or_kind``: a runtime from ``course_utils.setup()`` (its ``.kind``) or a kind string
    (``"TPU"``, ``"GPU"``, ``"multi-GPU"``, ``"CPU"``). For GPUs pass ``gpu_compute_capability`` as
    ``(major, minor)``; when it is ``None`` the first visible GPU is asked
    (:func:`detect_gpu_compute_capability`).

    - TPU → ``mixed_bfloat16`` (the MXU multiplies bfloat16 natively; no loss scaling).
    - GPU with compute capability ≥ 8.0 (A100, L4, H100, RTX 30xx and newer) → ``mixed_bfloat16``: bfloat16
      Tensor Cores, float32's range, no loss scaling. By TF 2.20's source (not measured by the course): every op of
      the course's models has a bfloat16 GPU kernel (``TF_CALL_GPU_NUMBER_TYPES`` includes bfloat16), and
      convolutions, batch norm and pooling compute in bfloat16 only from compute capability 8.0
      (``IsBF16SupportedInOps``; below it TensorFlow casts them to float32 and back). An op without a bfloat16 GPU
      kernel runs on the CPU without XLA (tensorflow#59743): ``tf.debugging.set_log_device_placement(True)`` shows
      where each op ran.
    - GPU below 8.0 (T4 — Colab's free GPU —, V100) → ``mixed_float16`` + loss scaling: their Tensor
      Cores have no bfloat16.
    - GPU of unknown capability → ``mixed_float16`` (safe everywhere), with a note.
    - CPU → ``mixed_bfloat16`` (never float16 on a CPU); measure: without native bf16 it is often slower.
    """
    kind = getattr(runtime_or_kind, "kind", runtime_or_kind)
    kind = str(kind)
    if kind == "TPU":
        return "mixed_bfloat16", "TPU: the MXU computes in bfloat16 natively; no loss scaling needed"
    if kind in ("GPU", "multi-GPU"):
        cc = gpu_compute_capability if gpu_compute_capability is not None else detect_gpu_compute_capability()
        if cc is None:
            return "mixed_float16", (
                "GPU of unknown compute capability: mixed_float16 + loss scaling works on every NVIDIA GPU "
                "with Tensor Cores; if it is Ampere or newer (compute capability ≥ 8.0) mixed_bfloat16 uses its "
                "bfloat16 Tensor Cores and needs no loss scaling"
            )
        cc = (int(cc[0]), int(cc[1]))
        if cc >= BF16_MIN_COMPUTE_CAPABILITY:
            return "mixed_bfloat16", (
                f"GPU with compute capability {cc[0]}.{cc[1]} (≥ 8.0, Ampere or newer): bfloat16 Tensor Cores "
                "(TensorFlow's convolutions run in bfloat16 from 8.0 on), float32's range, no loss scaling"
            )
        return "mixed_float16", (
            f"GPU with compute capability {cc[0]}.{cc[1]} (< 8.0, e.g. T4, V100): Tensor Cores have float16 "
            "but no bfloat16; use loss scaling"
        )
    if kind == "CPU":
        return "mixed_bfloat16", (
            "CPU: bfloat16 if any 16-bit type (float16 kernels are very slow on CPUs); without native bf16 "
            "instructions (avx512_bf16/AMX) expect it to be slower than float32 — measure"
        )
    raise ValueError(f"unknown runtime kind {kind!r}; expected 'TPU', 'GPU', 'multi-GPU' or 'CPU'")


_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) without AVX-512: oneDNN has no bfloat16 kernel at all under them.
_ONEDNN_ISAS_BELOW_AVX512 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
# ... and those below its first native bfloat16 one, AVX512_CORE_BF16 (under AVX512_CORE* oneDNN emulates bfloat16,
# slowly; measured on TF 2.20, an AMD EPYC with avx512_bf16)
_ONEDNN_ISAS_WITHOUT_BF16 = _ONEDNN_ISAS_BELOW_AVX512 + ("AVX512_CORE", "AVX512_CORE_VNNI")
# TensorFlow sends bfloat16 ops to oneDNN when the CPU has one of these (IsBF16SupportedByOneDNNOnThisCPU, TF 2.20:
# AVX512F or AVX_NE_CONVERT), whatever ONEDNN_MAX_CPU_ISA says; elsewhere (a laptop's AVX2 CPU) to its own kernels
_TF_BF16_TO_ONEDNN_FLAGS = ("avx512f", "avx_ne_convert")


def _onednn_cap(environ: Any = None) -> str:
    environ = os.environ if environ is None else environ
    return str(environ.get("ONEDNN_MAX_CPU_ISA", "")).strip().upper()


def onednn_bf16_capped(environ: Any = None) -> str | None:
    """``ONEDNN_MAX_CPU_ISA``'s value when it caps oneDNN below native bfloat16 (e.g. ``AVX2``, a laptop's CPU emulated
    on a server), else None: bfloat16 is slower than float32 there, or (see :func:`onednn_bf16_aborts`) fatal."""
    cap = _onednn_cap(environ)
    return cap if cap in _ONEDNN_ISAS_WITHOUT_BF16 else None


def onednn_bf16_aborts(environ: Any = None, cpuinfo_text: str | None = None) -> str | None:
    """``ONEDNN_MAX_CPU_ISA``'s value when the first bfloat16 matmul would abort the process, else None.

    That is a cap without AVX-512 (``AVX2``: a laptop emulated on a server) on a CPU whose own flags make TensorFlow
    send bfloat16 ops to oneDNN (``avx512f``), with oneDNN's custom ops on: the capped oneDNN has no kernel for them
    ("could not create a primitive descriptor", a C++ abort no ``try`` catches; tensorflow#62011). A real AVX2 CPU
    runs them on TensorFlow's own kernels, and so does a process with ``TF_ENABLE_ONEDNN_OPTS=0``."""
    environ = os.environ if environ is None else environ
    cap = _onednn_cap(environ)
    if cap not in _ONEDNN_ISAS_BELOW_AVX512:
        return None
    if str(environ.get("TF_ENABLE_ONEDNN_OPTS", "")).strip().lower() in ("0", "false"):
        return None
    flags = _cpu_flags(cpuinfo_text)
    if flags is None or not any(f in flags for f in _TF_BF16_TO_ONEDNN_FLAGS):
        return None
    return cap


def _cpu_flags(cpuinfo_text: str | None = None) -> set[str] | None:
    """The ``flags`` (x86) or ``Features`` (Arm) of ``/proc/cpuinfo`` (or ``cpuinfo_text``); None if unreadable."""
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo_text = f.read()
        except OSError:
            return None
    flags: set[str] = set()
    seen_flags_line = False
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            seen_flags_line = True
            flags.update(value.split())
    return flags if seen_flags_line else None


def cpu_bf16_support(cpuinfo_text: str | None = None) -> tuple[bool | None, list[str]]:
    """``(supported, flags_found)``: does this CPU advertise native bfloat16 instructions?

    Looks for ``avx512_bf16`` (AVX-512 bfloat16 dot products) or ``amx_bf16`` (AMX, Intel's matrix
    units in Sapphire Rapids and newer) in the ``flags`` lines of ``/proc/cpuinfo`` (or of
    ``cpuinfo_text``). ``supported`` is ``None`` when the flags cannot be read (not Linux).
    """
    flags = _cpu_flags(cpuinfo_text)
    if flags is None:
        return None, []
    found = [f for f in _CPU_BF16_FLAGS if f in flags]
    return bool(found), found


# The CPU kernel paths TensorFlow takes, each a different speed for the same model (lesson 06 measures the capstone on
# each): which one runs is TF_ENABLE_ONEDNN_OPTS when it is set, else TensorFlow's default (tensorflow/core/util/
# port.cc, DefaultOneDnnPolicy, TF 2.20): on Linux x86 oneDNN only on a CPU with one of _ONEDNN_DEFAULT_FLAGS; on x86
# Windows always; on macOS (its arm64 build has no oneDNN) never; on Arm Linux only on a Neoverse V1. ``env`` makes
# the path on this course's CI machine (an AVX-512 CPU with avx512_bf16): ``onednn-fp32`` is emulated by capping
# oneDNN at AVX2, with its custom ops kept on (a bfloat16 op would abort the process there: onednn_bf16_aborts).
KERNEL_PATHS = {
    "onednn-bf16": {
        "env": {"TF_ENABLE_ONEDNN_OPTS": "1"},
        "what": "oneDNN with bfloat16 units (AMX or AVX512-BF16)",
        "who": "recent Xeon and EPYC servers: cloud VMs, Colab's CPU runtime when it lands on one",
    },
    "onednn-fp32": {
        "env": {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "what": "oneDNN in float32 (no bfloat16 units)",
        "who": "x86 Windows (oneDNN is on by default there), older Xeons with AVX512_VNNI",
    },
    "eigen": {
        "env": {"TF_ENABLE_ONEDNN_OPTS": "0"},
        "what": "TensorFlow's own kernels (Eigen; oneDNN off)",
        "who": "Linux laptops and desktops without VNNI or AMX, every Mac, Arm Linux",
    },
}

_ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def kernel_path(
    environ: Any = None, cpuinfo_text: str | None = None, platform: str | None = None, machine: str | None = None
) -> tuple[str, str]:
    """``(path, why)``: which of :data:`KERNEL_PATHS` TensorFlow's CPU ops take in a process started with
    ``environ`` (default: this one's) on this CPU — by ``TF_ENABLE_ONEDNN_OPTS``, TensorFlow's default policy for
    the platform and the CPU's flags, and ``ONEDNN_MAX_CPU_ISA``. Without TensorFlow: it reads only the environment
    and ``/proc/cpuinfo`` (or ``cpuinfo_text``)."""
    import platform as _platform
    import sys

    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    machine = (_platform.machine() if machine is None else machine).lower()
    opts = str(environ.get("TF_ENABLE_ONEDNN_OPTS", "")).strip().lower()
    if platform == "darwin":
        return "eigen", "macOS: TensorFlow's macOS build has no oneDNN"
    if opts in ("0", "false"):
        cap = _onednn_cap(environ)
        return "eigen", (
            "TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN's custom ops off"
            + (f", so ONEDNN_MAX_CPU_ISA={cap} caps nothing" if cap else "")
        )
    if opts in ("1", "true"):
        why = "TF_ENABLE_ONEDNN_OPTS=1 turns oneDNN on"
    elif platform.startswith("win"):
        why = "on x86 Windows TensorFlow turns oneDNN on by default"
    elif machine in ("aarch64", "arm64"):
        return (
            "eigen",
            "on Arm Linux TensorFlow turns oneDNN on by default only on a Neoverse V1 (TF_ENABLE_ONEDNN_OPTS=1 to try it)",
        )
    else:
        flags = _cpu_flags(cpuinfo_text)
        found = [f for f in _ONEDNN_DEFAULT_FLAGS if f in (flags or ())]
        if not found:
            seen = (
                "its flags could not be read" if flags is None else "it has none of " + ", ".join(_ONEDNN_DEFAULT_FLAGS)
            )
            return "eigen", f"TensorFlow turns oneDNN on by default only on a CPU with VNNI or AMX, and {seen}"
        why = f"TensorFlow turns oneDNN on by default on this CPU ({', '.join(found)})"
    cap = onednn_bf16_capped(environ)
    if cap:
        return "onednn-fp32", f"{why}; ONEDNN_MAX_CPU_ISA={cap} caps it below its bfloat16 kernels"
    supported, found = cpu_bf16_support(cpuinfo_text)
    if supported:
        return "onednn-bf16", f"{why}; bfloat16 units: {', '.join(found)}"
    return "onednn-fp32", f"{why}; " + (
        "no bfloat16 units (avx512_bf16, amx_bf16)"
        if supported is False
        else "whether it has bfloat16 units could not be read"
    )


def kernel_path_line(environ: Any = None) -> str:
    """One line for a run's log: the kernel path, what it is and why this process takes it."""
    path, why = kernel_path(environ)
    return f"CPU kernels: {path} — {KERNEL_PATHS[path]['what']} ({why})"
