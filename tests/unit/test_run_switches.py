"""``kfoundry run`` switches reach the run's spec and its report: the ablations, and ``--experts``
with no value (the template expert plus every configured LLM expert)."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.run import build_spec
from actors.report import build_report
from actors.runtime.options import ALL_EXPERTS
from schemas import DeviceChoice

TASK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def _spec(*flags: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(["run", str(TASK), *flags])
    return args, build_spec(args, TASK.read_text(), DeviceChoice.CPU)


@pytest.mark.parametrize("flag", ["--no-experience", "--uniform-experts", "--no-migration", "--no-meta-prompt"])
def test_each_ablation_switch_turns_one_mechanism_off_and_the_report_records_it(flag: str) -> None:
    _, spec = _spec(flag)
    name = flag.removeprefix("--").replace("-", "_")
    assert spec.ablations.active() == (name,)
    assert build_report(spec, []).ablations == (name,)


def test_a_run_without_switches_turns_nothing_off() -> None:
    _, spec = _spec()
    assert spec.ablations.active() == ()
    assert build_report(spec, []).ablations == ()


def test_experts_with_no_value_asks_for_every_configured_llm_expert_beside_the_template() -> None:
    args, spec = _spec("--experts")
    assert args.experts == ALL_EXPERTS
    assert [e.name for e in spec.experts] == ["template"]  # the controller adds the LLM experts from KV
    args, spec = _spec("--experts", "template,gpt")
    assert [e.name for e in spec.experts] == ["template", "gpt"]
    _, spec = _spec()
    assert [e.name for e in spec.experts] == ["template"]
