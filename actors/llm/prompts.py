"""Role prompts of the LLM experts and the assembly of a generate request into chat messages.

The system message holds who the model is (a role: memory, fusion, tiling, algorithm, repair or
general), how to write kernels in the language asked for (Triton, or CUDA through
``torch.utils.cpp_extension.load_inline``) and the output contract, including what the
evaluator's static gate refuses. The user message holds the task's reference source, the parent's
source and evaluation, the diagnosis with its evidence and hints, retrieved experiences, the
island's instructions, the evolvable meta-prompt section (``request.meta_prompt``, verbatim) and
the job for this request (first version, repair, or speed-up).
"""

from __future__ import annotations

from actors.diagnosis.counters import describe
from actors.evolution.amdahl import breakdown, breakdown_lines
from actors.experts.precision import precision_text
from actors.llm.redact import shorten
from schemas import (
    Diagnosis,
    EvalResult,
    ExperienceHit,
    ExpertConfig,
    GenerateRequest,
    KernelLanguage,
    Role,
)

ROLES: dict[Role, str] = {
    Role.MEMORY: (
        "You specialise in memory access: coalesced and vectorised loads and stores, reading each "
        "byte once, keeping reused data in registers or shared memory, avoiding intermediate tensors "
        "in global memory, choosing layouts and strides that keep every warp's accesses contiguous."
    ),
    Role.FUSION: (
        "You specialise in fusion: merging chains of elementwise ops, reductions, normalisations and "
        "matmul epilogues into as few kernels as possible, so intermediates never leave registers "
        "and launch overhead disappears."
    ),
    Role.TILING: (
        "You specialise in tiling and parallelism: block sizes, num_warps, num_stages, grid shape, "
        "work per program, occupancy, split-K and persistent kernels, matched to the problem sizes."
    ),
    Role.ALGORITHM: (
        "You specialise in algorithmic rewrites: mathematically equivalent formulations that do less "
        "work or move fewer bytes (online softmax, single-pass statistics, reassociation, exploiting "
        "structure in the reference), without losing accuracy beyond float32 rounding."
    ),
    Role.REPAIR: (
        "You specialise in repairing broken kernels: reading compiler and runtime errors and "
        "correctness evidence, finding the root cause (masking, indexing, shapes, dtypes, races, "
        "numerical stability) and fixing it with the smallest change that keeps the design."
    ),
    Role.GENERAL: ("You write fast, correct GPU kernels and choose whatever optimisation the evidence calls for."),
}
"""Speciality text per role."""

_SYSTEM = (
    "You are an expert GPU kernel engineer taking part in an evolutionary search for faster kernels. "
    "{role}\n\n{language}\n\n{contract}"
)

_LANGUAGE: dict[KernelLanguage, str] = {
    KernelLanguage.TRITON: (
        "Write the kernels in Triton: `import triton` and `import triton.language as tl`, kernels "
        "decorated with `@triton.jit`, launched from `ModelNew.forward` with an explicit grid. Mask "
        "every load and store at the edges (sizes are often not powers of two), accumulate "
        "reductions in float32, and pass strides rather than assuming contiguity unless you call "
        "`.contiguous()` first."
    ),
    KernelLanguage.CUDA: (
        "Write the kernels in CUDA C++ and build them with `torch.utils.cpp_extension.load_inline` "
        "(kernel source and C++ wrapper as Python strings, `functions=[...]` listing the wrappers) at "
        "module import; `ModelNew.forward` calls the compiled functions. Check bounds in every "
        "thread, use float accumulators, and launch on the current stream. CUDA 13: use "
        "`cuda::maximum<>` / `cuda::std::plus<>` (cub::Max and cub::Sum are gone)."
    ),
}

CONTRACT = (
    "Output contract (replies that break it are discarded):\n"
    "- Reply with a short explanation of what you changed and why (two sentences at most), then "
    "exactly one fenced ```python block holding a complete, standalone module.\n"
    "- The module defines `class ModelNew(torch.nn.Module)` with the same constructor arguments as "
    "the reference `Model` and a `forward` with the same inputs and outputs (shape, dtype, device).\n"
    "- Both models are built after the same `torch.manual_seed`: create the reference's parameters "
    "and submodules in `__init__` the same way and in the same order, so the weights come out equal; "
    "read their `.weight`/`.bias` in your kernels, never call the submodules.\n"
    "- The real computation happens in your own kernels. In `forward`, torch only allocates "
    "(`torch.empty`, `empty_like`, `zeros`, `full`), reads metadata and makes views (`.shape`, "
    "`.stride()`, `.contiguous()`, `.view`, `.reshape`); tensor math (`torch.*`/`F.*` ops, `@`, "
    "`.sum()`, `.exp()`, `.float()` and the like) is rejected.\n"
    "- Imports: torch, triton, math, numpy and plain helpers (functools, itertools, typing, "
    "dataclasses, enum, collections) only. The static gate also rejects torch.compile, CUDA graphs, "
    "extra streams or events, try/except fallbacks, threads, subprocesses, ctypes, introspection, "
    "exec/eval, monkeypatching, tensor subclasses, precision flags (TF32, matmul precision), file, "
    "network or environment access, RNG seeding, cuBLAS/cuDNN/CUTLASS or ATen calls from C++, and "
    "defining `Model`, `get_inputs`, `get_init_inputs` or the problem sizes.\n"
    "- Outputs must match the reference within float32 rounding, must not alias the inputs, and "
    "inputs must not be modified.\n"
    "- The candidate is also called at other input shapes the reference accepts (an odd batch, other "
    "spatial or sequence sizes, a batch of one): take sizes from the inputs at run time and mask every "
    "edge. Wrong outputs there make it incorrect; raising an error for a shape it does not support does not."
)

SOURCE_LIMIT = 30_000
LOG_LIMIT = 2_500
EXCERPT_LIMIT = 1_500
MAX_EXPERIENCES = 6


def role_names() -> tuple[str, ...]:
    """The roles an LLM expert may play."""
    return tuple(r.value for r in ROLES)


def system_prompt(role: Role, language: KernelLanguage) -> str:
    """The system message for a role and a kernel language."""
    return _SYSTEM.format(role=ROLES[role], language=_LANGUAGE[language], contract=CONTRACT)


def build_messages(request: GenerateRequest, config: ExpertConfig, role: Role | None = None) -> list[dict[str, str]]:
    """The chat messages for a request: a system message and one user message."""
    named = role or config.role
    role = Role.of(named)
    if role is None or role not in ROLES:
        raise KeyError(f"unknown role {named!r}")
    parts = [_task_section(request), _device_section(request), precision_text(request)]
    if request.parent is not None:
        parts.append(
            f"## Current candidate (the parent, generation {request.parent.generation}, "
            f"by {request.parent.expert}{_strategy(request.parent.proposal.strategy)})\n"
            + _fenced(shorten(request.parent.proposal.source, SOURCE_LIMIT))
        )
    if request.parent_result is not None:
        parts.append(result_section(request.parent_result))
    if request.diagnosis is not None:
        parts.append(diagnosis_section(request.diagnosis))
    if request.experiences:
        parts.append(_experience_section(request.experiences))
    if request.meta_prompt.strip():
        parts.append("## Guidance evolved by this search\n" + request.meta_prompt.strip())
    if request.instructions.strip():
        parts.append("## Instructions from the island\n" + request.instructions.strip())
    parts.append(_job_section(request, role))
    return [
        {"role": "system", "content": system_prompt(role, request.language)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _task_section(request: GenerateRequest) -> str:
    task = request.task
    text = f"## Task: {task.name}\nThe reference (KernelBench format):\n" + _fenced(shorten(task.source, SOURCE_LIMIT))
    if task.signature is not None:
        sig = task.signature
        text += f"\nSignature: {sig.text()}"
        outs = ", ".join(f"{t.dtype}{list(t.shape)}" for t in sig.outputs)
        if outs:
            text += f"; outputs: {outs}"
        if sig.flops is not None:
            text += f"; {sig.flops:,} FLOPs"
        if sig.bytes_moved is not None:
            text += f"; at least {sig.bytes_moved:,} bytes moved"
    return text


def _device_section(request: GenerateRequest) -> str:
    """The GPU the candidate is evaluated on and its limits (the parent's device, else this machine's)."""
    # Imported here: the template package imports torch, which an island (importing this module
    # through the LLM expert) must not pay for.
    from actors.experts.template.hardware import detect

    device = request.parent_result.device if request.parent_result is not None else None
    return "## Target device\n" + detect(device.name if device is not None else None).limits_text()


def result_section(result: EvalResult) -> str:
    """The parent's evaluation: verdict, numbers, findings and (shortened) logs."""
    lines = [f"## Its evaluation: {result.status.value}", result.summary]
    if result.speedup_vs_eager is not None:
        lines.append(f"- speedup vs eager PyTorch: {result.speedup_vs_eager:.3f}x")
    if result.speedup_vs_compiled is not None:
        lines.append(f"- speedup vs torch.compile: {result.speedup_vs_compiled:.3f}x")
    if result.timing is not None:
        lines.append(f"- median {result.timing.median_ms:.4f} ms over {result.timing.reps} runs")
    if result.sol is not None and result.sol.fraction is not None:
        lines.append(f"- reaches {result.sol.fraction:.1%} of speed-of-light ({result.sol.limiter}-bound)")
    if result.profile is not None and result.profile.kernel_launches is not None:
        lines.append(f"- {result.profile.kernel_launches} kernel launches per forward")
    if result.profile is not None and result.profile.counters is not None:
        lines.extend(f"- {line}" for line in describe(result.profile.counters))
    split = breakdown(result)
    if split is not None:
        lines.append("- where the time goes (a kernel can gain the whole forward at most its share of it):")
        lines.extend(f"  - {line}" for line in breakdown_lines(split))
    corr = result.correctness
    if corr is not None and corr.passed_trials < corr.trials:
        lines.append(f"- correctness: {corr.passed_trials}/{corr.trials} trials passed")
        if corr.max_abs_err is not None:
            lines.append(f"- max abs error {corr.max_abs_err:.3g} (atol {corr.atol:g}, rtol {corr.rtol:g})")
        if corr.mismatch_fraction is not None:
            lines.append(f"- {corr.mismatch_fraction:.2%} of elements out of tolerance")
        if corr.first_bad_index is not None:
            lines.append(f"- first bad element at index {list(corr.first_bad_index)}")
        if corr.detail:
            lines.append(f"- {corr.detail}")
    for finding in result.findings:
        where = f" (line {finding.line})" if finding.line is not None else ""
        lines.append(f"- anti-cheat {finding.rule.value} [{finding.severity.value}]{where}: {finding.message}")
    for name, log_text in (("Compiler output", result.compile_log), ("Runtime output", result.runtime_log)):
        if log_text and log_text.strip():
            tail = log_text.strip()[-LOG_LIMIT:]
            lines.append(f"{name} (last {len(tail)} characters):\n" + _fenced(tail, "text"))
    return "\n".join(lines)


def diagnosis_section(diagnosis: Diagnosis) -> str:
    """The diagnosis: category, summary, evidence, hints and distance to speed-of-light."""
    lines = [f"## Diagnosis: {diagnosis.category.value}", diagnosis.summary]
    if diagnosis.evidence:
        lines.append("Evidence:")
        lines.extend(f"- {e}" for e in diagnosis.evidence)
    if diagnosis.hints:
        lines.append("Hints:")
        lines.extend(f"- {h}" for h in diagnosis.hints)
    if diagnosis.sol_distance is not None:
        lines.append(f"Distance to speed-of-light: {diagnosis.sol_distance:.1%} of the bound still to gain.")
    return "\n".join(lines)


def _experience_section(hits: tuple[ExperienceHit, ...]) -> str:
    lines = ["## Experience from earlier candidates (what was tried and what it did)"]
    for i, hit in enumerate(hits[:MAX_EXPERIENCES], start=1):
        exp = hit.experience
        under = exp.diagnosis.value if exp.diagnosis is not None else "a first version"
        delta = exp.delta
        effect = f"fitness change {delta:+.3f}" if delta is not None else "no fitness measured"
        lines.append(
            f"{i}. Under {under}, {exp.expert}{_strategy(exp.strategy)} tried: {exp.description} "
            f"-> {exp.status.value}, {effect} (utility {hit.utility:.2f}, similarity {hit.score:.2f})"
        )
        if exp.source_excerpt.strip():
            lines.append(_fenced(shorten(exp.source_excerpt.strip(), EXCERPT_LIMIT)))
    return "\n".join(lines)


def _job_section(request: GenerateRequest, role: Role) -> str:
    lang = "Triton" if request.language is KernelLanguage.TRITON else "CUDA (load_inline)"
    diag = request.diagnosis
    status = request.parent_result.status.value if request.parent_result is not None else None
    if request.parent is None:
        job = f"Write a first {lang} version of ModelNew for this reference."
    elif diag is not None and diag.category.family in ("compile", "runtime", "incorrect", "rejected"):
        job = (
            f"The current candidate failed ({diag.category.value}). Fix that failure first, keeping "
            "what works; then make it as fast as you safely can."
        )
    elif status is not None and status != "correct":
        job = f"The current candidate failed ({status}). Fix it, keeping what works."
    else:
        job = f"Make the current candidate faster while keeping it correct, in {lang}."
    if role is Role.REPAIR and request.parent is not None:
        job += " Prefer the smallest change that removes the root cause."
    if request.n > 1:
        job += " Each answer you give is evaluated separately: make them genuinely different."
    return f"## Your job\n{job}\nFollow the output contract: one ```python block with the complete module."


def _strategy(strategy: str) -> str:
    return f" ({strategy})" if strategy else ""


def _fenced(text: str, lang: str = "python") -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{text}\n{fence}"
