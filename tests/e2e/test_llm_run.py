"""A run with an LLM expert (a real OpenAI-compatible server on loopback) beside the template
expert, chosen by ``--experts`` with no value: the LLM is asked again after it declined, its
candidates are evaluated and its failures diagnosed, the report counts what each expert did, and
the run goes on."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.runtime.nats_server import ServerInfo, start_server, stop_server
from tests.experts.llm_server import BROKEN_MODELNEW, GOOD_MODELNEW, REFERENCE_SOURCE, Chat, ScriptedLLMServer, answer

ROOT = Path(__file__).resolve().parents[2]


async def _kfoundry(*args: str, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "actors.cli", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return int(proc.returncode or 0), out.decode(), err.decode()


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[ServerInfo]:
    """A server of this test alone: ``--experts`` with no value takes every LLM expert configured
    on it, and the session's server holds other tests' configurations."""
    info = start_server(tmp_path / "nats")
    try:
        yield info
    finally:
        stop_server(info.pid)


@pytest.mark.slow  # a whole run with an LLM expert: about 60 s
@pytest.mark.timeout(500)
async def test_llm_expert_takes_part_and_its_failures_are_diagnosed(own_nats: ServerInfo, tmp_path: Path) -> None:
    nats_server = own_nats
    task = tmp_path / "gelu_scale.py"
    # The expert tests' reference at a smaller size: the same kernels and the same masked tail
    # (1023 is no multiple of a block), a sixty-fourth of the interpreter's work per call.
    assert "batch_size = 16\ndim = 16383\n" in REFERENCE_SOURCE
    task.write_text(REFERENCE_SOURCE.replace("batch_size = 16\ndim = 16383\n", "batch_size = 4\ndim = 1023\n"))
    env = dict(os.environ, KFOUNDRY_HOME=str(tmp_path / "home"), KF_TEST_LLM_KEY="sk-e2e-secret-7c1d")
    async with ScriptedLLMServer() as llm:
        llm.push(Chat(("",), refusal="I can't assist with this request."))  # its first answer: a decline
        for _ in range(12):
            llm.push(Chat((answer(BROKEN_MODELNEW),)), Chat((answer(GOOD_MODELNEW),)))
        rc, out, err = await _kfoundry(
            "expert", "set", "llm", "--kind", "llm", "--base-url", llm.base_url, "--model", "scripted-model",
            "--api-key-env", "KF_TEST_LLM_KEY", "--role", "fusion", "--timeout", "20", "--nats", nats_server.url,
            env=env, timeout=60,
        )  # fmt: skip
        assert rc == 0, err
        run_dir = tmp_path / "run"
        rc, out, err = await _kfoundry(
            "run", str(task), "--nats", nats_server.url, "--device", "cpu", "--experts",
            "--islands", "1", "--inflight", "2", "--candidates", "8", "--seconds", "400", "--embedder", "hashing",
            "--run-dir", str(run_dir), "--run-id", "llmrun",
            env=env, timeout=480,
        )  # fmt: skip
        assert rc == 0, out + err[-4000:]
        requests = llm.completions
    assert len(requests) >= 2, "the LLM expert was not asked again after its decline"
    assert requests, "the LLM expert was never asked"
    assert all(r.headers.get("Authorization") == "Bearer sk-e2e-secret-7c1d" for r in requests)
    report = json.loads((run_dir / "report.json").read_text())
    points = [p for island in report["islands"] for p in island["fitness"]]
    by_expert = {p["expert"] for p in points}
    assert {"llm", "template"} <= by_expert, by_expert
    # The scripted replies alternate a kernel that fails and one that works: both kinds were judged.
    llm_statuses = {p["status"] for p in points if p["expert"] == "llm"}
    assert "correct" in llm_statuses, llm_statuses
    assert llm_statuses & {"compile_error", "runtime_error"}, llm_statuses
    # The broken kernel's failure was diagnosed into a category, not passed on raw.
    assert any(k.startswith(("compile.", "runtime.")) for k in report["category_counts"]), report["category_counts"]
    # The key never reached the run's records.
    assert "sk-e2e-secret-7c1d" not in (run_dir / "run.log").read_text()
    assert "sk-e2e-secret-7c1d" not in (run_dir / "report.json").read_text()
    # Each expert's line: the LLM's decline is counted by reason, and it still delivered.
    experts = {row["expert"]: row for row in report["experts"]}
    assert set(experts) == {"template", "llm"}, experts
    assert experts["llm"]["declined_by"] == {"refused": 1}, experts["llm"]
    assert experts["llm"]["correct"] >= 1, experts["llm"]
    # A request cut short by the candidate budget or the run's end is neither a decline nor a candidate.
    assert experts["llm"]["requests"] >= experts["llm"]["declines"] + experts["llm"]["candidates"], experts["llm"]
    assert experts["template"]["candidates"] >= 1, experts["template"]
