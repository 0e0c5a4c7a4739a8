"""Seeded, plausible experience records and queries, for tests and the retrieval benchmark.

Records combine a task family (ops and input shapes of KernelBench-like problems), a diagnosis
from the fixed taxonomy, an expert and one of its strategies, a description written from that
strategy's template with tuning parameters, and an outcome. They are not real run data; they
give the index and the ranking realistic vocabulary, repetition and spread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schemas import DiagnosisCategory, EvalStatus, Experience, ExperienceQuery, TaskSignature, TensorSpec

_TASKS: tuple[tuple[tuple[str, ...], tuple[tuple[int, ...], ...]], ...] = (
    (("matmul",), ((1024, 1024), (1024, 1024))),
    (("linear", "relu"), ((128, 4096),)),
    (("linear", "gelu", "dropout"), ((64, 8192),)),
    (("conv2d", "relu"), ((16, 3, 224, 224),)),
    (("conv2d", "batch_norm", "relu"), ((32, 64, 56, 56),)),
    (("conv_transpose2d", "tanh"), ((16, 32, 64, 64),)),
    (("softmax",), ((4096, 4096),)),
    (("layer_norm",), ((256, 1024),)),
    (("rms_norm",), ((512, 4096),)),
    (("gelu",), ((16384, 4096),)),
    (("sum",), ((128, 16384),)),
    (("cumsum",), ((128, 32768),)),
    (("argmax",), ((256, 8192),)),
    (("max_pool2d",), ((16, 64, 112, 112),)),
    (("matmul", "add", "sigmoid"), ((512, 512), (512, 512))),
    (("scaled_dot_product_attention",), ((8, 16, 512, 64), (8, 16, 512, 64), (8, 16, 512, 64))),
    (("mse_loss",), ((4096, 1024), (4096, 1024))),
    (("group_norm", "silu"), ((32, 128, 32, 32),)),
)
_DTYPES = ("float32", "float32", "float32", "float16", "bfloat16")
_STRATEGIES: dict[str, tuple[tuple[str, str], ...]] = {
    "memory": (
        ("vectorize", "vectorised loads and stores with BLOCK_SIZE={b} so each thread moves 16 bytes"),
        ("coalesce", "reordered the loop so consecutive threads read consecutive addresses, {w} warps"),
        ("single_pass", "fused the two reduction passes into one read of the input, BLOCK_SIZE={b}"),
    ),
    "fusion": (
        ("fuse_epilogue", "fused the activation into the {op} epilogue, removing one kernel launch"),
        ("fuse_all", "one kernel for the whole forward: {ops}, intermediates kept in registers"),
        ("persistent", "persistent kernel over tiles with {w} warps to cut launch overhead"),
    ),
    "tiling": (
        ("tile", "tiled the {op} with BLOCK_M={m} BLOCK_N={n} BLOCK_K={k}, {s} pipeline stages"),
        ("split_k", "split-K with {k} slices and an atomic reduction for the skinny {op}"),
        ("swizzle", "grouped tile ordering (GROUP_M={m}) for better L2 reuse in the {op}"),
    ),
    "algorithm": (
        ("online_softmax", "online softmax: running max and sum in one pass, BLOCK_SIZE={b}"),
        ("welford", "Welford mean and variance in a single pass over each row of the {op}"),
        ("tensor_cores", "tl.dot on {dt} tiles with fp32 accumulation to use tensor cores"),
    ),
    "repair": (
        ("mask", "masked the tail: offsets < n_elements on every load and store of the {op}"),
        ("accumulate_fp32", "accumulate in float32 and cast once at the end to fix precision"),
        ("fix_grid", "grid computed with triton.cdiv so the last partial block of the {op} runs"),
    ),
    "template": (
        ("elementwise", "template elementwise kernel for {ops}, BLOCK_SIZE={b}, {w} warps"),
        ("reduction", "template row reduction for the {op}, one program per row, BLOCK_SIZE={b}"),
        ("matmul", "template blocked matmul BLOCK_M={m} BLOCK_N={n} BLOCK_K={k}"),
    ),
}
_CATEGORIES = tuple(DiagnosisCategory)


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _signature(rng: np.random.Generator, family: int, dtype: str) -> TaskSignature:
    ops, shapes = _TASKS[family]
    scale = int(rng.choice([1, 1, 2, 4]))
    inputs = tuple(TensorSpec(shape=(s[0] * scale, *s[1:]), dtype=dtype) for s in shapes)
    return TaskSignature(ops=ops, inputs=inputs, outputs=(inputs[0],))


def synthetic_experience(rng: np.random.Generator, *, run_id: str = "synthetic") -> Experience:
    """One plausible record drawn with ``rng``."""
    family = int(rng.integers(len(_TASKS)))
    dtype = _pick(rng, _DTYPES)
    sig = _signature(rng, family, dtype)
    expert = _pick(rng, tuple(_STRATEGIES))
    strategy, template = _STRATEGIES[expert][int(rng.integers(3))]
    params: dict[str, int | float | str | bool] = {
        "BLOCK_SIZE": int(rng.choice([128, 256, 512, 1024, 2048])),
        "num_warps": int(rng.choice([2, 4, 8])),
        "num_stages": int(rng.choice([2, 3, 4])),
    }
    description = template.format(
        b=params["BLOCK_SIZE"],
        w=params["num_warps"],
        s=params["num_stages"],
        m=int(rng.choice([32, 64, 128])),
        n=int(rng.choice([32, 64, 128, 256])),
        k=int(rng.choice([16, 32, 64])),
        op=sig.ops[0],
        ops=" + ".join(sig.ops),
        dt=dtype,
    )
    status = EvalStatus.CORRECT if rng.random() < 0.6 else EvalStatus(_pick(rng, tuple(EvalStatus)))
    parent = float(rng.uniform(0.2, 2.0)) if rng.random() < 0.8 else None
    child = float(max(parent or 1.0, 0.1) * rng.lognormal(0.0, 0.3)) if status is EvalStatus.CORRECT else None
    return Experience(
        run_id=run_id,
        task_id=f"task{family:02d}",
        signature=sig,
        candidate_id=f"c{int(rng.integers(1 << 40)):x}",
        parent_id=None if parent is None else f"p{int(rng.integers(1 << 40)):x}",
        diagnosis=None if parent is None else _CATEGORIES[int(rng.integers(len(_CATEGORIES)))],
        expert=expert,
        strategy=strategy,
        status=status,
        parent_fitness=parent,
        child_fitness=child,
        description=description,
        params=params,
    )


def synthetic_experiences(n: int, *, seed: int, runs: int = 8) -> list[Experience]:
    """``n`` records spread over ``runs`` run ids (``run0``...), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [synthetic_experience(rng, run_id=f"run{int(rng.integers(runs))}") for _ in range(n)]


def synthetic_queries(n: int, *, seed: int, k: int = 10) -> list[ExperienceQuery]:
    """``n`` queries for the same task families, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        family = int(rng.integers(len(_TASKS)))
        category = _CATEGORIES[int(rng.integers(len(_CATEGORIES)))]
        sig = _signature(rng, family, _pick(rng, _DTYPES))
        hint = f"{category.family} problem in the {sig.ops[-1]}: what made similar kernels faster?"
        out.append(ExperienceQuery(signature=sig, diagnosis=category, text=hint, k=k))
    return out
