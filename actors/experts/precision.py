"""What precision a request's run admits in a candidate's products, for every expert.

Precision parity (``RunSpec.precision`` ``reference``, the default) holds a candidate to the
precision the user's model has at PyTorch's defaults: cuDNN runs fp32 convolutions in TF32, so a
convolution may too; matmuls run in IEEE fp32 (``allow_tf32`` is off by default), so a matmul
may not. The evaluator measures what the reference runs at and judges by that in any case
(``gpu_runner.compare.PrecisionRule``): this is only the experts' first guess.
"""

from __future__ import annotations

from schemas import GenerateRequest, PrecisionMode

CUDNN_PRECISION_KNOBS = ("cudnn.allow_tf32", "fp32_precision")
"""Names a task file would use to set its convolutions' precision itself."""


def tf32_rounding(var: str) -> str:
    """Triton that rounds the fp32 tile ``var`` to TF32 to nearest in place, as cuDNN does
    (``tl.dot``'s own TF32 truncates operands and erred 2.7-3.4x cuDNN's on an H200)."""
    return f"{var} = (({var}.to(tl.int32, bitcast=True) + 0x1000) & -0x2000).to(tl.float32, bitcast=True)"


TF32_ROUNDING = tf32_rounding("x")
"""The rounding of :func:`tf32_rounding` as prompts quote it."""


def tf32_admitted(request: GenerateRequest) -> bool:
    """Whether this request's run admits TF32 convolutions: precision parity and a task file that
    leaves cuDNN at PyTorch's default (TF32 for fp32 convolutions)."""
    if request.precision is not PrecisionMode.REFERENCE:
        return False
    return not any(knob in request.task.source for knob in CUDNN_PRECISION_KNOBS)


def precision_text(request: GenerateRequest) -> str:
    """The prompt's paragraph on the precision a candidate's fp32 products must have."""
    ieee = (
        "fp32 matrix products (`nn.Linear`, `@`, `bmm`) must be IEEE-accurate: `tl.dot(..., "
        "input_precision='ieee')` or the three-pass 'tf32x3'; never bf16 or fp16 inside an fp32 model."
    )
    if not tf32_admitted(request):
        return "## Precision\nJudged at exact precision: " + ieee + " Convolutions too."
    conv = "nn.Conv" in request.task.source or "F.conv" in request.task.source
    if not conv:
        return "## Precision\nJudged at the reference's own precision (PyTorch's defaults): " + ieee
    return (
        "## Precision\nJudged at the reference's own precision (PyTorch's defaults): its convolutions "
        "run in TF32 in cuDNN, so yours may use one TF32 tensor-core pass, with the fp32 operands "
        f"rounded to nearest first ({TF32_ROUNDING}; then `tl.dot(a, b, acc, input_precision='tf32')`: "
        "the dot alone truncates and fails the bar). " + ieee
    )
