"""``--isolation``: its defaults, and what strict refuses (with how to enable the missing layer)."""

from __future__ import annotations

import pytest

from actors.commands.cli import build_parser
from actors.runtime.options import ActorOptions, isolation_mode
from gpu_runner.config import IsolationMode, RunnerConfig
from gpu_runner.confine.policy import LAYERS, Layers
from gpu_runner.errors import ConfigError
from gpu_runner.sandbox import Isolation, isolation_refusal

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "task.py"], "best-effort"),
        (["run", "task.py", "--experts", "template,gpt"], "strict"),
        (["run", "task.py", "--llm-diagnoser", "gpt"], "strict"),
        (["run", "task.py", "--experts", "gpt", "--isolation", "best-effort"], "best-effort"),
        (["actor", "evaluator", "--run", "r1"], "strict"),
        (["actor", "evaluator", "--run", "r1", "--isolation", "best-effort"], "best-effort"),
    ],
)
def test_isolation_is_strict_whenever_candidates_may_come_from_an_llm(argv: list[str], expected: str) -> None:
    assert isolation_mode(ActorOptions.from_args(build_parser().parse_args(argv))) == expected


def _iso(notes: dict[str, str]) -> Isolation:
    layers = Layers(notes=notes, userns=True, namespaces=True, landlock=True, seccomp=True)
    return Isolation((), notes["network_isolation"], notes["pid_namespace"], None, None, "skipped: x", layers)


def test_strict_isolation_refuses_a_missing_layer_and_says_how_to_enable_it() -> None:
    notes = dict.fromkeys(LAYERS, "held")
    notes["landlock"] = (
        "skipped: not available (ABI 0); enable Landlock: kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y"
    )
    refusal = isolation_refusal(_iso(notes), IsolationMode.STRICT)
    assert refusal is not None
    assert "landlock" in refusal
    assert "CONFIG_SECURITY_LANDLOCK" in refusal
    assert "--isolation best-effort" in refusal
    assert "\n" not in refusal
    assert isolation_refusal(_iso(notes), IsolationMode.BEST_EFFORT) is None


def test_strict_refusal_without_user_namespaces_is_one_line_naming_the_sysctls() -> None:
    from gpu_runner.confine.policy import ENABLE_USERNS

    why = f"skipped: unshare(0x7e020000): Operation not permitted; {ENABLE_USERNS}"
    notes = dict.fromkeys(LAYERS, why)
    notes["landlock"] = notes["seccomp"] = "held"
    layers = Layers(notes=notes, landlock=True, seccomp=True)
    iso = Isolation((), notes["network_isolation"], notes["pid_namespace"], None, None, "skipped: x", layers)
    refusal = isolation_refusal(iso, IsolationMode.STRICT)
    assert refusal is not None
    assert "\n" not in refusal
    assert refusal.startswith("isolation is strict and user_namespace, network_isolation")
    assert "kernel.unprivileged_userns_clone=1" in refusal
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in refusal


def test_strict_isolation_accepts_layers_switched_off_by_config() -> None:
    notes = dict.fromkeys(LAYERS, "held")
    notes["seccomp"] = "skipped: disabled by config"
    assert isolation_refusal(_iso(notes), IsolationMode.STRICT) is None


def test_an_unknown_isolation_mode_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="isolation"):
        RunnerConfig(isolation="paranoid")  # type: ignore[arg-type]
