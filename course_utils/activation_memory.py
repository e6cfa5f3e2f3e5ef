"""Activation-memory tools for lesson 07: few-bit GELU, an output-saving LayerNorm, a chunked logits+loss op.

Three reusable pieces, each keeping less for the backward pass than the plain op does:

- :func:`few_bit_gelu` / :class:`FewBitGELU` — Few-Bit Backward (Novikov et al., 2022, "Few-Bit
  Backward: Quantized Gradients of Nonlinear Activation Functions"). The forward pass is the exact GELU
  (``keras.activations.gelu(x, approximate=False)``, bit for bit). Instead of the input ``x`` (4 bytes
  a number in float32, 2 in bfloat16) the backward keeps only a ``k``-bit code saying which of ``2**k``
  intervals ``x`` falls in, packed into ``uint8``; the backward multiplies the incoming gradient by a
  constant per interval. Boundaries and constants come from :func:`optimal_piecewise_constant`, the
  paper's dynamic program.
- :func:`output_saving_layer_norm` / :class:`OutputSavingLayerNormalization` — Tempo's idea
  (Andoorveedu et al., NeurIPS 2022): LayerNorm's backward computed from its **output** (which the next
  layer keeps anyway, as its matmul input) and one inverse standard deviation per row, not its input.
- :func:`output_saving_gelu` — Tempo's in-place GELU: the backward keeps the output and a 1-bit branch
  mask, and inverts GELU on that branch.
- :class:`Recompute` — recomputation (gradient checkpointing) of any Keras layer or block with
  ``tf.recompute_grad``: the block keeps only its input for the backward pass and recomputes its inside.
  It works inside ``tf.function``, ``fit`` and XLA, where ``keras.RematScope``'s ``"full"``,
  ``"larger_than"`` and ``"list_of_layers"`` modes fail on the TensorFlow backend (keras-team/keras#21207:
  Keras passes ``training=``/``mask=`` as keywords to ``tf.custom_gradient``, which takes keywords only
  eagerly).
- :func:`chunked_dense_cross_entropy` — a large ``hidden @ kernel`` logits matrix and its
  cross-entropy computed in row chunks, each under ``tf.recompute_grad``, so the whole logits matrix is
  never kept for the backward pass.

Plus :func:`make_gelu_stack_step`, a module-level step builder for
:func:`course_utils.memory.measure_peaks_isolated` (a stack of Dense + GELU layers, forward and
backward in one ``tf.function``, with or without XLA).

"""

from __future__ import annotations

import functools
import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "FewBitGELU",
    "OutputSavingLayerNormalization",
    "PiecewiseConstant",
    "Recompute",
    "chunked_dense_cross_entropy",
    "dense_cross_entropy",
    "few_bit_gelu",
    "gelu_derivative",
    "make_cross_entropy_step",
    "make_gelu_stack_step",
    "make_layer_norm_stack_step",
    "optimal_piecewise_constant",
    "output_saving_gelu",
    "output_saving_layer_norm",
    "packed_code_bytes",
    "piecewise_error",
    "uniform_piecewise_constant",
]

SUPPORTED_BITS = (1, 2, 3, 4)


def _check_bits(bits: Any) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or int(bits) not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    return int(bits)


# ----------------------------------------------------------------------------------------------
# The optimal piecewise-constant derivative (the paper's dynamic program)
# ----------------------------------------------------------------------------------------------


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


_ERF = np.frompyfunc(math.erf, 1, 1)


def _Phi(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.asarray(_ERF(np.asarray(x, np.float64) / math.sqrt(2.0)), dtype=np.float64))


def gelu_derivative(x: Any) -> np.ndarray:
    """GELU'(x) for the exact GELU ``x * Phi(x)``: ``Phi(x) + x * phi(x)`` (numpy, float64)."""
    x = np.asarray(x, dtype=np.float64)
    return _Phi(x) + x * _phi(x)


class PiecewiseConstant:
    """``c(x) = values[i]`` for ``boundaries[i-1] <= x < boundaries[i]`` (``len(values) = len(boundaries) + 1``).

    The interval index of ``x`` is ``sum(x >= b for b in boundaries)``: the code the backward keeps.
    """

    def __init__(self, boundaries: Any, values: Any):
        self.boundaries = np.asarray(boundaries, dtype=np.float64)
        self.values = np.asarray(values, dtype=np.float64)
        if self.values.shape != (self.boundaries.size + 1,) or np.any(np.diff(self.boundaries) <= 0):
            raise ValueError("need increasing boundaries and one more value than boundaries")

    def __call__(self, x: Any) -> np.ndarray:
        return self.values[np.searchsorted(self.boundaries, np.asarray(x, np.float64), side="right")]

    def __repr__(self) -> str:
        return (
            f"PiecewiseConstant(boundaries={np.round(self.boundaries, 4).tolist()}, "
            f"values={np.round(self.values, 4).tolist()})"
        )


def _grid(lo: float = -8.0, hi: float = 8.0, cells: int = 1600):
    """Cells of the real line: edges ``lo..hi`` (the two end cells reach to -inf / +inf).

    Returns edges (``cells + 1``), each cell's probability under N(0, 1), and GELU' at the cell's
    conditional mean point (its midpoint; the two infinite end cells use their limits 0 and 1, which
    GELU' equals to within 1e-13 beyond |x| = 8).
    """
    edges = np.linspace(lo, hi, cells + 1)
    cdf = _Phi(edges)
    mass = np.diff(cdf)
    mid = 0.5 * (edges[:-1] + edges[1:])
    value = gelu_derivative(mid)
    # Tails: fold P(x < lo) into the first cell and P(x > hi) into the last (GELU' is ~0 / ~1 there).
    w = np.concatenate([[cdf[0]], mass, [1.0 - cdf[-1]]])
    v = np.concatenate([[0.0], value, [1.0]])
    return edges, w, v


def piecewise_error(pc: PiecewiseConstant, lo: float = -10.0, hi: float = 10.0, points: int = 200_001) -> float:
    """The objective ``E[(GELU'(x) - c(x))**2]`` for ``x ~ N(0, 1)``, by quadrature on a fine grid."""
    x = np.linspace(lo, hi, points)
    w = _phi(x)
    return float(np.sum(w * (gelu_derivative(x) - pc(x)) ** 2) * (x[1] - x[0]))


@functools.lru_cache(maxsize=None)
def optimal_piecewise_constant(bits: int, cells: int = 1600) -> PiecewiseConstant:
    """The ``2**bits``-piece constant approximation of GELU' that minimises ``E[(GELU'(x) - c(x))**2]``, x ~ N(0,1).

    The dynamic program of Novikov et al. (2022), on a grid of ``cells`` cells over [-8, 8] (boundaries
    can fall on any cell edge): with the cells' probabilities ``w_j`` and GELU' values ``v_j``, the
    best constant on a run of cells is their weighted mean, and its cost is
    ``sum(w v^2) - sum(w v)^2 / sum(w)`` (from prefix sums, O(1) per run).
    ``best[m][j]`` = least cost of covering cells ``0..j-1`` with ``m`` pieces
    = ``min_i best[m-1][i] + cost(i, j)``; ``O(2**bits * cells**2)`` operations, vectorised.
    The objective weighs by the input distribution: errors where inputs are rare cost little.
    """
    bits = _check_bits(bits)
    pieces = 2**bits
    edges, w, v = _grid(cells=int(cells))
    n = w.size
    s0 = np.concatenate([[0.0], np.cumsum(w)])
    s1 = np.concatenate([[0.0], np.cumsum(w * v)])
    s2 = np.concatenate([[0.0], np.cumsum(w * v * v)])
    i = np.arange(n + 1)[:, None]
    j = np.arange(n + 1)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        m0 = s0[None, :] - s0[:, None]
        m1 = s1[None, :] - s1[:, None]
        cost = (s2[None, :] - s2[:, None]) - np.where(m0 > 0, m1 * m1 / np.where(m0 > 0, m0, 1.0), 0.0)
    cost = np.where(j > i, np.maximum(cost, 0.0), np.inf)  # cost[i, j]: one piece over cells i..j-1
    best = cost[0].copy()  # one piece covering cells 0..j-1
    choice = []
    for _ in range(pieces - 1):
        total = best[:, None] + cost
        arg = np.argmin(total, axis=0)
        choice.append(arg)
        best = total[arg, np.arange(n + 1)]
    # Walk back from j = n: the start of each piece.
    cuts, j_ = [], n
    for arg in reversed(choice):
        j_ = int(arg[j_])
        cuts.append(j_)
    cuts = sorted(cuts)
    bounds = [0, *cuts, n]
    values = [(s1[b] - s1[a]) / (s0[b] - s0[a]) for a, b in zip(bounds[:-1], bounds[1:])]
    # Cell c (0-based, in the w/v arrays with the tail cells) starts at edges[c - 1].
    boundaries = [edges[c - 1] for c in cuts]
    return PiecewiseConstant(boundaries, values)


def uniform_piecewise_constant(bits: int, lo: float = -3.0, hi: float = 3.0) -> PiecewiseConstant:
    """A baseline: ``2**bits`` pieces with equally spaced boundaries on [lo, hi], each piece's best constant."""
    bits = _check_bits(bits)
    boundaries = np.linspace(lo, hi, 2**bits + 1)[1:-1]
    edges, w, v = _grid()
    mids = np.concatenate([[edges[0] - 1], 0.5 * (edges[:-1] + edges[1:]), [edges[-1] + 1]])
    idx = np.searchsorted(boundaries, mids, side="right")
    values = [np.sum(w[idx == k] * v[idx == k]) / np.sum(w[idx == k]) for k in range(2**bits)]
    return PiecewiseConstant(boundaries, values)


# ----------------------------------------------------------------------------------------------
# Few-bit GELU
# ----------------------------------------------------------------------------------------------


def _slot_bits(bits: int) -> int:
    """Bits a code occupies in the packed bytes: 1, 2, 4 as they are; 3-bit codes take 4-bit slots.

    Decision for k = 3: a 3-bit code is stored in a 4-bit slot (2 codes a byte), so it costs the same
    memory as k = 4 and is only there to show the fidelity curve. Packing 8 codes into 3 bytes would save
    a further 25% of a small tensor at the price of codes straddling bytes.
    """
    return 4 if bits == 3 else bits


def packed_code_bytes(num_elements: int, bits: int) -> int:
    """Bytes the backward keeps for ``num_elements`` inputs: ``ceil(n / (8 // slot_bits))``."""
    per = 8 // _slot_bits(_check_bits(bits))
    return -(-int(num_elements) // per)


def _pack(codes, bits: int):
    """uint8 codes (flat) -> packed uint8, ``8 // slot`` codes a byte (zero-padded at the end)."""
    slot = _slot_bits(bits)
    per = 8 // slot
    if per == 1:
        return codes
    n = tf.size(codes)
    pad = (-n) % per
    codes = tf.pad(codes, [[0, pad]])
    codes = tf.reshape(codes, [-1, per])
    shifts = tf.constant([slot * i for i in range(per)], tf.uint8)
    return tf.reduce_sum(tf.bitwise.left_shift(codes, shifts), axis=-1)


def _unpack(packed, bits: int, n):
    slot = _slot_bits(bits)
    per = 8 // slot
    if per == 1:
        return packed
    shifts = tf.constant([slot * i for i in range(per)], tf.uint8)
    codes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed[:, None], shifts), tf.constant(2**slot - 1, tf.uint8))
    return tf.reshape(codes, [-1])[:n]


def few_bit_gelu(x, bits: int = 2):
    """Exact GELU forward; backward from a packed ``bits``-bit code of ``x`` (Few-Bit Backward).

    ``x``: a float tensor of any shape (float32, bfloat16, float16, float64). The backward returns
    ``dy * c(x)`` with ``c`` = :func:`optimal_piecewise_constant` ``(bits)``; it keeps only the packed
    codes (:func:`packed_code_bytes` bytes) and the shape. Works eagerly, in ``tf.function``, and
    under ``jit_compile=True``.
    """
    bits = _check_bits(bits)
    pc = optimal_piecewise_constant(bits)
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"few_bit_gelu needs a float tensor, got {x.dtype.name}")

    @tf.custom_gradient
    def _gelu(x):
        y = keras.activations.gelu(x, approximate=False)
        flat = tf.reshape(x, [-1])
        code = tf.zeros_like(flat, dtype=tf.uint8)
        for b in pc.boundaries:  # sum of comparisons = the interval index (fused under XLA)
            code += tf.cast(flat >= tf.constant(b, flat.dtype), tf.uint8)
        packed = _pack(code, bits)
        shape = tf.shape(x)
        n = tf.size(x)

        def grad(dy):
            codes = tf.cast(_unpack(packed, bits, n), tf.int32)
            slope = tf.gather(tf.constant(pc.values, dy.dtype), codes)
            return dy * tf.reshape(slope, shape)

        return y, grad

    return _gelu(x)


def _gelu_argmin() -> float:
    """Where GELU has its minimum: GELU'(x) = Phi(x) + x phi(x) = 0, by Newton (GELU'' = phi(x) (2 - x^2))."""
    x = -0.75
    for _ in range(50):
        x -= float(gelu_derivative(x)) / (float(_phi(np.float64(x))) * (2 - x * x))
    return x


GELU_ARGMIN = _gelu_argmin()  # -0.7517916...; GELU(GELU_ARGMIN) = -0.16997...
INVERSE_STEPS = 32


def output_saving_gelu(x):
    """Exact GELU whose backward keeps its **output** and a 1-bit mask, not its input (Tempo's in-place GELU).

    GELU is not invertible: it falls from 0 to its minimum -0.16997 at x = -0.75179 and rises after.
    The forward keeps the output ``y`` (which the next layer keeps anyway, as its matmul input) and one
    bit per element, packed 8 a byte: is ``x >= -0.75179`` (the rising branch). The backward finds
    ``x = GELU^-1(y)`` on that branch by 32 bisection steps (in float32) and returns ``dy * GELU'(x)``.
    Tempo (Andoorveedu et al., 2022) does the same with a 1-byte mask and fitted spline polynomials for
    ``GELU'(GELU^-1(y))`` in one CUDA kernel; bisection is slower (32 GELU evaluations in the backward)
    but needs no fitted constants. Accuracy: ``y`` is rounded to its dtype, and near the minimum
    (GELU' = 0) the inverse is ill-conditioned, so the gradient is within ~1e-3 of exact in float32
    (measured max 2e-4 on N(0, 1) inputs), further in bfloat16.
    """
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"output_saving_gelu needs a float tensor, got {x.dtype.name}")

    @tf.custom_gradient
    def _gelu(x):
        y = keras.activations.gelu(x, approximate=False)
        mask = _pack(tf.cast(tf.reshape(x, [-1]) >= tf.constant(GELU_ARGMIN, x.dtype), tf.uint8), 1)
        n = tf.size(x)

        def grad(dy):
            rising = tf.reshape(tf.cast(_unpack(mask, 1, n), tf.bool), tf.shape(y))
            target = tf.cast(y, tf.float32)
            lo = tf.where(rising, tf.constant(GELU_ARGMIN, tf.float32), -12.0)
            hi = tf.where(rising, tf.maximum(target, 0.0) + 1.0, tf.constant(GELU_ARGMIN, tf.float32))

            def bisect(lo, hi):
                mid = 0.5 * (lo + hi)
                below = tf.equal(keras.activations.gelu(mid, approximate=False) < target, rising)
                return tf.where(below, mid, lo), tf.where(below, hi, mid)

            # a loop in the graph, not 32 unrolled copies: tracing and XLA's compile took 2.0 s and 6.7 s unrolled
            # (one step of lesson 07's block net, 2-core AVX2 VM), and the step's peak is the same
            lo, hi = tf.while_loop(lambda lo, hi: True, bisect, (lo, hi), maximum_iterations=INVERSE_STEPS)
            xr = 0.5 * (lo + hi)
            cdf = 0.5 * (1.0 + tf.math.erf(xr * (1.0 / math.sqrt(2.0))))
            slope = cdf + xr * tf.exp(-0.5 * xr * xr) / math.sqrt(2 * math.pi)
            return dy * tf.cast(slope, dy.dtype)

        return y, grad

    return _gelu(x)


class FewBitGELU(keras.layers.Layer):
    """Keras layer: ``few_bit_gelu(x, bits)`` in the layer's compute dtype (``mixed_bfloat16`` → bfloat16)."""

    def __init__(self, bits: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.bits = _check_bits(bits)
        optimal_piecewise_constant(self.bits)  # solve the DP now, not inside a trace

    def call(self, inputs):
        return few_bit_gelu(inputs, self.bits)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "bits": self.bits}


# ----------------------------------------------------------------------------------------------
# Output-saving LayerNorm (Tempo)
# ----------------------------------------------------------------------------------------------


def output_saving_layer_norm(x, gamma, beta, epsilon: float = 1e-3):
    """LayerNorm over the last axis whose backward uses its output and one inverse std per row.

    Forward: ``xhat = (x - mean) * rstd``, ``out = gamma * xhat + beta``. The backward keeps ``out``
    (the tensor the next layer keeps anyway) and ``rstd`` (one number per row), and recovers
    ``xhat = (out - beta) / gamma`` (where ``gamma == 0``, xhat is unrecoverable and taken as 0: the
    gradients of ``x`` and of ``beta`` stay exact there, that of ``gamma`` does not).
    Then ``dxhat = dout * gamma`` and ``dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``.
    Statistics are computed in float32 for float16/bfloat16 inputs, as Keras does.
    """
    x = tf.convert_to_tensor(x)
    out_dtype = x.dtype
    calc = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype

    @tf.custom_gradient
    def _ln(x, gamma, beta):
        xc = tf.cast(x, calc)
        g = tf.cast(gamma, calc)
        b = tf.cast(beta, calc)
        mean, var = tf.nn.moments(xc, axes=[-1], keepdims=True)
        rstd = tf.math.rsqrt(var + epsilon)
        out = tf.cast((xc - mean) * rstd * g + b, out_dtype)

        def grad(dout):
            d = tf.cast(dout, calc)
            xhat = tf.math.divide_no_nan(tf.cast(out, calc) - b, g)
            dxhat = d * g
            m1 = tf.reduce_mean(dxhat, axis=-1, keepdims=True)
            m2 = tf.reduce_mean(dxhat * xhat, axis=-1, keepdims=True)
            dx = rstd * (dxhat - m1 - xhat * m2)
            red = list(range(len(x.shape) - 1))
            dgamma = tf.reduce_sum(d * xhat, axis=red)
            dbeta = tf.reduce_sum(d, axis=red)
            return tf.cast(dx, x.dtype), tf.cast(dgamma, gamma.dtype), tf.cast(dbeta, beta.dtype)

        return out, grad

    return _ln(x, tf.convert_to_tensor(gamma), tf.convert_to_tensor(beta))


class OutputSavingLayerNormalization(keras.layers.Layer):
    """Keras layer: LayerNorm over the last axis (``epsilon=1e-3`` like Keras') with an output-saving backward."""

    def __init__(self, epsilon: float = 1e-3, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.gamma = self.add_weight(name="gamma", shape=(dim,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(dim,), initializer="zeros")

    def call(self, inputs):
        return output_saving_layer_norm(inputs, self.gamma, self.beta, self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


# ----------------------------------------------------------------------------------------------
# Chunked logits + cross-entropy
# ----------------------------------------------------------------------------------------------


def dense_cross_entropy(hidden, kernel, labels):
    """Mean sparse softmax cross-entropy of ``hidden @ kernel`` (the unchunked reference)."""
    logits = tf.matmul(hidden, kernel)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def chunked_dense_cross_entropy(hidden, kernel, labels, chunks: int = 4):
    """:func:`dense_cross_entropy`'s value and gradients, the ``[N, V]`` logits built ``chunks`` row blocks at a time.

    The forward pass runs the blocks in a ``tf.while_loop`` and keeps only the summed loss; the backward pass (a
    ``tf.custom_gradient``) loops over the blocks again, recomputing one block's logits at a time to differentiate
    it. A real loop (``parallel_iterations=1``) is what bounds the peak to one block's logits: with one
    ``tf.recompute_grad`` per block in a Python loop, every block receives its gradient at once and the executor —
    and XLA, which schedules the whole step (measured: no saving on one core) — may recompute all of them together.
    ``hidden``: ``[N, D]``, ``kernel``: ``[D, V]``, ``labels``: ``[N]`` ints; ``N`` must be known when tracing.
    Blocks have ``ceil(N / chunks)`` rows; the last is padded with rows that carry no loss and get no gradient.
    """
    hidden = tf.convert_to_tensor(hidden)
    kernel = tf.convert_to_tensor(kernel)
    labels = tf.convert_to_tensor(labels)
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ValueError(f"chunks must be a positive integer, got {chunks!r}")
    n = hidden.shape[0]
    if n is None:
        raise ValueError("chunked_dense_cross_entropy needs the number of rows known when tracing")
    chunks = min(int(chunks), n)
    size = -(-n // chunks)  # rows per block
    pad = chunks * size - n
    dim, dtype = hidden.shape[1], hidden.dtype
    weights = tf.reshape(tf.concat([tf.ones([n], dtype), tf.zeros([pad], dtype)], 0), [chunks, size])
    block_labels = tf.reshape(tf.pad(labels, [[0, pad]]), [chunks, size])

    @tf.custom_gradient
    def summed_loss(h, k):
        blocks = tf.reshape(tf.pad(h, [[0, pad], [0, 0]]), [chunks, size, dim])

        def forward(i, total):
            logits = tf.matmul(blocks[i], k)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=block_labels[i], logits=logits)
            return i + 1, total + tf.reduce_sum(loss * weights[i])

        _, total = tf.while_loop(
            lambda i, _: i < chunks, forward, (tf.constant(0), tf.constant(0.0, dtype)), parallel_iterations=1
        )

        def grad(upstream):
            def backward(i, d_kernel, d_hidden):
                scale = (weights[i] * upstream)[:, None]  # padded rows get no gradient
                with tf.GradientTape() as tape:
                    logits = tf.matmul(blocks[i], k)
                    tape.watch(logits)
                    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=block_labels[i], logits=logits)
                d_logits = tape.gradient(loss, logits)  # softmax − one-hot from the fused op: one block-sized buffer
                return (
                    i + 1,
                    d_kernel + tf.matmul(blocks[i] * scale, d_logits, transpose_a=True),
                    d_hidden.write(i, tf.matmul(d_logits, k, transpose_b=True) * scale),
                )

            _, d_kernel, d_hidden = tf.while_loop(
                lambda i, *_: i < chunks,
                backward,
                (tf.constant(0), tf.zeros_like(k), tf.TensorArray(dtype, size=chunks)),
                parallel_iterations=1,
            )
            return tf.reshape(d_hidden.stack(), [chunks * size, dim])[:n], d_kernel

        return total, grad

    return summed_loss(hidden, kernel) / tf.cast(n, dtype)


# ----------------------------------------------------------------------------------------------
# A step to measure
# ----------------------------------------------------------------------------------------------


def make_gelu_stack_step(
    activation: str = "exact",
    bits: int = 2,
    jit: bool = False,
    batch: int = 256,
    width: int = 512,
    depth: int = 6,
    seed: int = 0,
):
    """A stack of ``depth`` Dense(width) + GELU layers; returns a ``tf.function`` doing forward + backward.

    ``activation``: ``"exact"`` (``keras.layers.Activation`` with exact GELU), ``"few_bit"``
    (:class:`FewBitGELU` with ``bits``) or ``"output_saving"`` (:func:`output_saving_gelu`).
    ``jit``: compile with XLA. The step returns the loss and the
    gradients (so nothing is pruned). For :func:`course_utils.memory.measure_peaks_isolated`.
    """
    if activation not in ("exact", "few_bit", "output_saving"):
        raise ValueError(f"activation must be 'exact', 'few_bit' or 'output_saving', got {activation!r}")
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((width,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(width))
        if activation == "few_bit":
            layers.append(FewBitGELU(bits))
        elif activation == "output_saving":
            layers.append(keras.layers.Activation(output_saving_gelu))
        else:
            layers.append(keras.layers.Activation(lambda t: keras.activations.gelu(t, approximate=False)))
    return _square_loss_step(keras.Sequential(layers), tf.random.normal([batch, width], seed=seed), jit)


def _square_loss_step(model, x, jit: bool):
    """One forward + backward of mean(model(x)²) in a tf.function (XLA when ``jit``): the measured step."""

    @tf.function(jit_compile=bool(jit))
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        return loss, tape.gradient(loss, model.trainable_variables)

    return step


class Recompute(keras.layers.Layer):
    """Wraps a layer (or a functional block) so its inside is recomputed in the backward pass.

    ``Recompute(block)(x)`` returns ``block(x)``; for the backward pass it keeps only ``x`` (and reads
    the weights again), and ``tf.recompute_grad`` runs ``block`` a second time to differentiate it.
    Gradients equal the plain block's; memory drops by what the block keeps inside; time grows by
    one more forward pass of the block. ``training`` reaches the block through a closure, not as a
    keyword of the recomputed function (``tf.custom_gradient`` takes keywords only eagerly). Do not
    wrap layers with random ops (dropout: the recomputation draws a new mask) or state updates
    (BatchNormalization's moving averages would update twice).
    """

    def __init__(self, layer, **kwargs):
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(
                f"Recompute wraps a Keras layer or model (e.g. a functional block), got "
                f"{type(layer).__name__}; for a plain function use tf.recompute_grad(fn)"
            )
        super().__init__(**kwargs)
        self.layer = layer

    def build(self, input_shape):
        if not self.layer.built:
            self.layer.build(input_shape)

    def call(self, inputs, training=None):
        return tf.recompute_grad(lambda x: self.layer(x, training=training))(inputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def compute_output_spec(self, inputs, training=None):
        return self.layer.compute_output_spec(inputs)


def make_cross_entropy_step(
    chunks: int = 0, jit: bool = False, rows: int = 2048, dim: int = 64, classes: int = 4096, seed: int = 0
):
    """Logits ``[rows, classes]`` + cross-entropy, forward and backward in one ``tf.function``.

    ``chunks=0``: :func:`dense_cross_entropy` (the whole logits matrix); ``chunks>=1``:
    :func:`chunked_dense_cross_entropy`. The step returns the loss and both gradients. For
    :func:`course_utils.memory.measure_peaks_isolated`.
    """
    g = tf.random.Generator.from_seed(seed)
    hidden = g.normal([rows, dim])
    kernel = tf.Variable(g.normal([dim, classes]) * 0.1)
    labels = g.uniform([rows], 0, classes, dtype=tf.int32)

    @tf.function(jit_compile=bool(jit))
    def step():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            if chunks:
                loss = chunked_dense_cross_entropy(hidden, kernel, labels, chunks)
            else:
                loss = dense_cross_entropy(hidden, kernel, labels)
        return loss, tape.gradient(loss, [hidden, kernel])

    return step


def make_layer_norm_stack_step(
    norm: str = "keras", jit: bool = False, batch: int = 512, width: int = 256, depth: int = 6, seed: int = 0
):
    """``depth`` blocks of Dense(width) + LayerNorm; returns a ``tf.function`` doing forward + backward.

    ``norm``: ``"keras"`` (``keras.layers.LayerNormalization``) or ``"output_saving"``
    (:class:`OutputSavingLayerNormalization`). For :func:`course_utils.memory.measure_peaks_isolated`.
    """
    if norm not in ("keras", "output_saving"):
        raise ValueError(f"norm must be 'keras' or 'output_saving', got {norm!r}")
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((width,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(width))
        layers.append(
            OutputSavingLayerNormalization() if norm == "output_saving" else keras.layers.LayerNormalization()
        )
    return _square_loss_step(keras.Sequential(layers), tf.random.normal([batch, width], seed=seed), jit)
