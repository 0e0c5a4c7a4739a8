"""Every option of ``kfoundry actor`` and ``kfoundry run`` reaches the object that uses it: the
options are parsed by the real parser and the actors built by the real ``build_actor``."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.commands.cli import build_parser
from actors.commands.launch import build_actor, run_local_actors
from actors.commands.run import build_spec
from actors.kinds.curator import CuratorActor
from actors.kinds.diagnoser import DiagnoserActor, RuleDiagnose
from actors.kinds.evaluator import EvaluatorActor
from actors.kinds.evaluator_process import child_argv
from actors.kinds.evaluator_runners import GpuRunner, NoopRunner
from actors.kinds.expert import ExpertActor
from actors.kinds.island import IslandActor
from actors.kinds.migrator import MigratorActor
from actors.kinds.registry import default_expert_config
from actors.runtime.errors import ConfigError
from actors.runtime.options import ActorOptions, RunOptions
from gpu_runner.config import IsolationMode
from schemas import ActorKind, DeviceChoice, ExpertConfig, ExpertKind

pytestmark = pytest.mark.timeout(60)

TASK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
URL = "nats://127.0.0.1:1"


def _actor(kind: str, *flags: str, expert_config: ExpertConfig | None = None):  # type: ignore[no-untyped-def]
    """``kfoundry actor KIND FLAGS`` built as the command builds it (not started)."""
    args = build_parser().parse_args(["actor", kind, "--run", "r1", "--island", "i0", *flags])
    options = ActorOptions.from_args(args)
    return build_actor(
        ActorKind(kind), options, url=URL, run_id=args.run, island=args.island, expert_config=expert_config,
        actor_id=args.actor_id,
    )  # fmt: skip


def _run_args(*flags: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", str(TASK), *flags])


def _gpu_runner(actor: object) -> GpuRunner:
    assert isinstance(actor, EvaluatorActor)
    assert isinstance(actor.runner, GpuRunner)
    return actor.runner


@pytest.mark.parametrize("kind", ["evaluator", "diagnoser", "expert", "island", "migrator", "curator"])
def test_version_option_is_announced_by_every_actor_kind(kind: str) -> None:
    assert _actor(kind, "--version", "9.8.7", "--runner", "noop").version == "9.8.7"


@pytest.mark.parametrize("kind", ["evaluator", "diagnoser", "expert", "island", "migrator", "curator"])
def test_id_option_names_every_actor_kind(kind: str) -> None:
    assert _actor(kind, "--id", f"{kind}-named", "--runner", "noop").actor_id == f"{kind}-named"


@pytest.mark.parametrize(
    ("kind", "attribute"),
    [
        ("evaluator", "concurrency"),
        ("diagnoser", "concurrency"),
        ("expert", "concurrency"),
        ("island", "feedback_concurrency"),
        ("curator", "concurrency"),
    ],
)
def test_concurrency_option_reaches_the_actor_that_handles_messages_at_once(kind: str, attribute: str) -> None:
    actor = _actor(kind, "--concurrency", "5", "--runner", "noop")
    assert getattr(actor, attribute) == 5


def test_concurrency_option_for_a_migrator_is_refused_loudly() -> None:
    with pytest.raises(ConfigError) as err:
        _actor("migrator", "--concurrency", "5")
    assert "--concurrency 5" in str(err.value)


def test_wait_for_run_option_reaches_the_actor() -> None:
    assert _actor("diagnoser", "--wait-for-run", "12").wait_for_run_s == 12.0


def test_name_option_chooses_the_expert_served() -> None:
    actor = _actor("expert", "--name", "template-b")
    assert isinstance(actor, ExpertActor)
    assert actor.config.name == "template-b"


def test_island_option_names_the_island() -> None:
    actor = _actor("island", "--island", "i3")
    assert isinstance(actor, IslandActor)
    assert actor.name == "i3"


def test_per_request_option_reaches_the_island() -> None:
    actor = _actor("island", "--per-request", "3")
    assert isinstance(actor, IslandActor)
    assert actor.per_request == 3


def test_eval_concurrency_option_reaches_the_evaluator() -> None:
    actor = _actor("evaluator", "--eval-concurrency", "7", "--runner", "noop")
    assert isinstance(actor, EvaluatorActor)
    assert actor.concurrency == 7


def test_ack_wait_option_reaches_the_evaluator() -> None:
    actor = _actor("evaluator", "--ack-wait", "4.5", "--runner", "noop")
    assert isinstance(actor, EvaluatorActor)
    assert actor.ack_wait_s == 4.5


def test_runner_and_noop_delay_options_choose_the_no_op_runner_and_its_delay() -> None:
    actor = _actor("evaluator", "--runner", "noop", "--noop-delay", "0.25")
    assert isinstance(actor, EvaluatorActor)
    assert isinstance(actor.runner, NoopRunner)
    assert actor.runner.delay_s == 0.25


def test_device_option_reaches_the_gpu_runner() -> None:
    assert _gpu_runner(_actor("evaluator", "--device", "cpu")).service.cfg.device is DeviceChoice.CPU


def test_spares_option_reaches_the_gpu_runner() -> None:
    assert _gpu_runner(_actor("evaluator", "--device", "cpu", "--spares", "5")).service.cfg.spares == 5


def test_host_memory_share_reaches_the_gpu_runner_and_the_evaluators_own_process() -> None:
    """Two runs side by side (``kfoundry bench --parallel 2``) each planned with all of the host's
    available memory: together, up to twice what the plan's headroom allows."""
    assert _gpu_runner(_actor("evaluator", "--device", "cpu")).service.cfg.host_memory_share == 1.0
    runner = _gpu_runner(_actor("evaluator", "--device", "cpu", "--host-memory-share", "0.5"))
    assert runner.service.cfg.host_memory_share == 0.5
    args = _run_args("--device", "cpu", "--host-memory-share", "0.25")
    child = build_parser().parse_args(["actor", "evaluator", *child_argv(ActorOptions.from_args(args), "r1", "strict")])
    assert child.host_memory_share == 0.25
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="--host-memory-share"):
            ActorOptions.from_args(_run_args("--device", "cpu", "--host-memory-share", bad))


def test_an_evaluator_on_the_cpu_keeps_two_spares_and_judges_two_at_once_by_default() -> None:
    actor = _actor("evaluator", "--device", "cpu")
    assert isinstance(actor, EvaluatorActor)
    # not more: every candidate it holds may take a prepared spare and its device memory
    assert (_gpu_runner(actor).service.cfg.spares, actor.concurrency) == (2, 2)
    args = _run_args("--device", "cpu")
    assert build_spec(args, TASK.read_text(), DeviceChoice.CPU).inflight_per_island == 2
    # its own process is sized by itself (the same machine), not told a number
    assert "--spares" not in child_argv(ActorOptions.from_args(args), "r1", "strict")


def test_a_run_on_a_gpu_sizes_in_flight_by_the_evaluators_default() -> None:
    from actors.runtime.gpus import compile_workers_per_gpu, evaluator_sizing

    judged = evaluator_sizing(True, compile_workers_per_gpu(1))[0]
    spec = build_spec(_run_args("--device", "cuda"), TASK.read_text(), DeviceChoice.CUDA)
    assert spec.inflight_per_island == max(2, judged)  # two islands, twice what is judged at once
    chosen = build_spec(_run_args("--device", "cuda", "--eval-concurrency", "6"), TASK.read_text(), DeviceChoice.CUDA)
    assert chosen.inflight_per_island == 6  # the option, not the default


def test_isolation_option_reaches_the_gpu_runner() -> None:
    runner = _gpu_runner(_actor("evaluator", "--device", "cpu", "--isolation", "best-effort"))
    assert runner.service.cfg.isolation is IsolationMode.BEST_EFFORT


def test_library_dir_and_embedder_options_reach_the_curator(tmp_path: Path) -> None:
    actor = _actor("curator", "--library-dir", str(tmp_path / "lib"), "--embedder", "hashing")
    assert isinstance(actor, CuratorActor)
    assert actor.directory == tmp_path / "lib"
    assert actor.prefer == "hashing"


def test_llm_diagnoser_configuration_reaches_the_diagnoser() -> None:
    config = ExpertConfig(
        name="gpt", kind=ExpertKind.LLM, role="diagnoser", base_url="http://127.0.0.1:1/v1", model="m",
    )  # fmt: skip
    actor = _actor("diagnoser", "--llm-diagnoser", "gpt", expert_config=config)
    assert isinstance(actor, DiagnoserActor)
    assert isinstance(actor.diagnose, RuleDiagnose)
    assert actor.diagnose.llm is not None
    assert actor.diagnose.version.endswith("+llm")


def test_eval_timeout_option_of_a_run_reaches_the_gpu_runner_it_builds() -> None:
    args = _run_args("--device", "cpu", "--eval-timeout", "42.5")
    actor = build_actor(ActorKind.EVALUATOR, ActorOptions.from_args(args), url=URL, run_id="r1")
    assert _gpu_runner(actor).timeout_s == 42.5
    assert build_spec(args, TASK.read_text(), DeviceChoice.CPU).eval_timeout_s == 42.5


def test_options_of_a_run_reach_its_evaluator_in_its_own_process() -> None:
    args = _run_args(
        "--device", "cpu", "--runner", "noop", "--noop-delay", "0.5", "--ack-wait", "9", "--spares", "3",
        "--eval-concurrency", "4", "--log-level", "debug",
    )  # fmt: skip
    child = build_parser().parse_args(["actor", "evaluator", *child_argv(ActorOptions.from_args(args), "r1", "strict")])
    for option in ("device", "runner", "noop_delay", "ack_wait", "spares", "eval_concurrency", "log_level"):
        assert str(getattr(child, option)) == str(getattr(args, option)), option
    assert (child.run, child.isolation) == ("r1", "strict")


def _local(*flags: str) -> list[object]:
    args = _run_args("--device", "cpu", "--runner", "noop", "--embedder", "hashing", *flags)
    spec = build_spec(args, TASK.read_text(), DeviceChoice.CPU)
    configs = [default_expert_config("template")]
    return list(run_local_actors(spec, RunOptions.from_args(args), URL, configs, None, []))


def test_evaluators_option_of_a_run_sets_how_many_evaluators_it_starts() -> None:
    assert sum(isinstance(a, EvaluatorActor) for a in _local("--evaluators", "3")) == 3
    assert sum(isinstance(a, EvaluatorActor) for a in _local()) == 1


def test_islands_and_no_migration_options_of_a_run_set_the_islands_and_migrator_it_starts() -> None:
    actors = _local("--islands", "3")
    assert [a.name for a in actors if isinstance(a, IslandActor)] == ["i0", "i1", "i2"]
    assert any(isinstance(a, MigratorActor) for a in actors)
    assert not any(isinstance(a, MigratorActor) for a in _local("--islands", "3", "--no-migration"))


def test_run_options_reach_the_controller() -> None:
    options = RunOptions.from_args(_run_args("--no-local-actors", "--experts", "--connect-timeout", "7"))
    assert (options.local_actors, options.all_llm_experts, options.connect_timeout_s) == (False, True, 7.0)
    assert RunOptions.from_args(_run_args()).local_actors


def test_per_request_option_of_a_run_reaches_its_islands() -> None:
    islands = [a for a in _local("--per-request", "2") if isinstance(a, IslandActor)]
    assert islands
    assert {a.per_request for a in islands} == {2}
