"""Ordinary models, written as a user writes them (``examples/models``: helper classes, nested
``Sequential``/``ModuleList``, ``torch.cat`` skips, SDPA, an embedding and a stacked LSTM, squeeze
and excitation; a ViT with ``nn.TransformerEncoder`` and a class token, a LLaMA block with RMSNorm,
rotary embeddings, grouped-query heads and SwiGLU, a text CNN over a transposed embedding, a U-Net
decoder's bilinear upsampling and group norms, ``nn.MultiheadAttention``, a pixel-shuffle
super-resolution net; a ConvNeXt block that permutes to channels-last and back, a Swin block's
shifted windows, a Conformer convolution module with its GLU, a temporal convolution net that
chomps its causal padding, a PointNet, a mixer written with ``movedim``/``swapaxes``/``unflatten``;
a BERT-style encoder with a key padding mask, a transformer decoder layer over a memory, a GPT that
numbers its positions with ``torch.arange`` under a causal ``src_mask``, an ``LSTMCell`` walked in a
loop, a DCGAN generator, an ``nn.Transformer`` translation model with its masks; a mixture of
experts routed by ``topk`` and ``torch.gather``, an x-vector with weight-normalised TDNN layers and
standard-deviation pooling, a ResNeXt block with a reflection-padded stem and local response
normalisation; a diffusion U-Net block with a sinusoidal timestep embedding of int64 steps, CLIP's
symmetric loss over ``torch.arange`` labels, a YOLO head's ``meshgrid`` cell grid): the template
expert generates a first candidate for each, and that candidate is correct under the real
evaluator on the CPU (Triton's interpreter). Issue 35 is judged on such models from outside
KernelBench; these are the project's own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.experts.template import Plan, analyse, any_sizes, default_params, render
from actors.experts.template.ir import KeepTorch
from gpu_runner.config import EvalJob, RunnerConfig
from gpu_runner.service import EvaluationService
from schemas import DeviceChoice, EvalStatus, KernelLanguage

MODELS = sorted((Path(__file__).resolve().parents[2] / "examples" / "models").glob("*.py"))


def _first(path: Path) -> str:
    source = path.read_text(encoding="utf-8")
    plan = analyse(source)
    if not isinstance(plan, Plan):  # as the expert does: data movement may stay PyTorch under any policy
        plan = analyse(source, KeepTorch.LAYOUT)
    assert isinstance(plan, Plan), f"{path.stem}: {plan}"
    return render(plan, default_params(plan))


def test_every_ordinary_model_is_covered_by_the_whole_analysis_without_the_fallback() -> None:
    # Data movement (permutations, shuffles, splits, upsampling) is kernels too, so none needs the
    # fallback that leaves the reference's data movement to PyTorch (issue 35). The attention and
    # recurrent families still split heads and steps with PyTorch views of their own (the ViT's,
    # the MultiheadAttention layer's and the LSTM's plans hold such nodes).
    declined = {p.stem: plan for p in MODELS if not isinstance(plan := analyse(p.read_text(encoding="utf-8")), Plan)}
    assert not declined, declined


@pytest.mark.parametrize("name", ["gpt_block", "mlp_mixer"])
def test_a_transformer_blocks_first_candidate_takes_any_batch_and_sequence_length(name: str) -> None:
    # A batched product with one shared weight and a causal attention whose key length moves
    # decide nothing on the moving sizes, so the kernels are written for every size.
    path = next(p for p in MODELS if p.stem == name)
    assert f"def {any_sizes.METHOD}(self" in _first(path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_ordinary_model_is_generated_and_its_first_candidate_is_correct(tmp_path: Path) -> None:
    assert len(MODELS) >= 23, MODELS
    jobs = []
    for path in MODELS:
        jobs.append(
            EvalJob(
                reference_source=path.read_text(encoding="utf-8"),
                candidate_source=_first(path),
                language=KernelLanguage.TRITON,
                timeout_s=600.0,
                candidate_id=path.stem,
            )
        )

    async def evaluate(share: list[EvalJob], work: Path) -> list[tuple[str, EvalStatus, str]]:
        # The verdicts are the point here, not the speedups: the least timing the evaluator allows
        # (one warm-up call, three rounds, no held-out timing). Every trial and held-out shape runs.
        cfg = RunnerConfig(
            device=DeviceChoice.CPU,
            spares=1,
            compile_workers=1,
            timing_budget_s=0.1,
            timing_min_reps=3,
            warmup_min_calls=1,
            warmup_min_s=0.0,
            held_out_timing="off",
            work_dir=work,
        )
        out = []
        async with EvaluationService(cfg) as service:
            for job in share:
                result = await service.evaluate(job)
                out.append((job.candidate_id, result.status, result.summary))
        return out

    async def both() -> list[tuple[str, EvalStatus, str]]:
        # Two evaluators, a half of the models each: the interpreter runs on one core per process.
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        halves = await asyncio.gather(evaluate(jobs[0::2], tmp_path / "a"), evaluate(jobs[1::2], tmp_path / "b"))
        return [r for half in halves for r in half]

    results = asyncio.run(both())
    assert len(results) == len(MODELS)
    wrong = [r for r in results if r[1] is not EvalStatus.CORRECT]
    assert not wrong, wrong
