"""The run's PyTorch-ops policy in the static gate: which torch calls a candidate may keep.

Under ``reference`` a candidate may leave to PyTorch exactly the operations the reference's own
forward calls: the same functions by qualified name (``torch.nn.functional.gelu``), the same tensor
methods (``.softmax``), ``@``, or a submodule of the same class (``torch.nn.Conv2d``). Its
torch-compute findings for those become ``info``; anything else stays a rejection. At run time the
aten ops the reference dispatches (:func:`gpu_runner.aten_policy.reference_aten_ops`) are admitted.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_runner.aten_policy import ReferenceTraceError, reference_aten_ops
from schemas import CheatRule, Finding, Severity


def admit_reference_ops(
    findings: tuple[Finding, ...], compute_keys: Mapping[int, str], reference_source: str, allowed: frozenset[str]
) -> tuple[tuple[Finding, ...], tuple[str, ...], frozenset[str]]:
    """The findings with the reference's own torch operations (``allowed``, by the gate's names:
    :func:`gpu_runner.gate.forward_torch_ops`) downgraded to ``info``, the names of those kept, and
    the aten ops the forward may dispatch at run time."""
    out: list[Finding] = []
    kept: list[str] = []
    for i, finding in enumerate(findings):
        op = compute_keys.get(i)
        if op is not None and op in allowed:
            out.append(
                finding.model_copy(
                    update={
                        "severity": Severity.INFO,
                        "message": f"{finding.message}: kept in PyTorch (the reference calls {op})",
                    }
                )
            )
            if op not in kept:
                kept.append(op)
        else:
            out.append(finding)
    if allowed and set(kept) >= allowed:
        out.append(
            Finding(
                rule=CheatRule.TORCH_COMPUTE,
                severity=Severity.REJECT,
                message=f"keeps every operation of the reference in PyTorch ({', '.join(sorted(allowed))}): "
                "none is left for its own kernels",
            )
        )
    try:
        admitted = reference_aten_ops(reference_source)
    except ReferenceTraceError as exc:
        admitted = frozenset()
        out.append(
            Finding(
                rule=CheatRule.TORCH_COMPUTE,
                severity=Severity.INFO,
                message=f"the reference's aten ops are unknown ({exc}): no torch compute op is admitted at run time",
            )
        )
    return tuple(out), tuple(kept), admitted
