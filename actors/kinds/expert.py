"""Expert actor: serves one expert (template or LLM) as a ``nats.micro`` service.

Serves: ``kf.expert.<name>.generate`` (``GenerateRequest`` → ``GenerateReply``) in the queue
        group ``kf-expert-<name>``, so several instances share the load and a new version can
        replace an old one with nothing lost (start the new one, ``kfoundry drain`` the old one:
        the old one finishes every request it took before leaving).
Reads:  the ``kf_experts`` KV bucket, key ``<name>`` (``ExpertConfig``): a change takes effect
        for the next request, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats.errors

from actors.experts.base import Expert
from actors.experts.registry import build_expert
from actors.runtime.base import Actor
from actors.runtime.kv import bucket
from actors.runtime.logs import bound
from schemas import (
    ActorKind,
    Decline,
    DeclineReason,
    ExpertConfig,
    GenerateReply,
    GenerateRequest,
    subjects,
)


class ExpertActor(Actor):
    """One instance of an expert service (see the module docstring)."""

    kind = ActorKind.EXPERT
    description = "Proposes candidate kernels for GenerateRequests"

    def __init__(
        self,
        *,
        nats_url: str,
        config: ExpertConfig,
        expert: Expert | None = None,
        concurrency: int | None = None,
        actor_id: str | None = None,
        version: str | None = None,
        watch_config: bool = True,
    ) -> None:
        super().__init__(
            nats_url=nats_url,
            run_id=None,
            actor_id=actor_id,
            service_name=f"kf-expert-{config.name}",
            version=version,
        )
        self.config = config
        self.expert = expert or build_expert(config)
        self.concurrency = concurrency or config.concurrency
        self.watch_config = watch_config
        self.answered = 0
        self.declined = 0
        self.proposals = 0
        self._watch_task: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await self.bus.serve(
            self.service,
            name="generate",
            subject=subjects.expert_generate(self.config.name),
            request_type=GenerateRequest,
            handler=self.generate,
            queue_group=f"kf-expert-{self.config.name}",
            concurrency=self.concurrency,
        )
        if self.watch_config:
            kv = await bucket(self.bus, subjects.EXPERTS_BUCKET)
            watcher = await kv.watch(self.config.name)
            self._watch_task = asyncio.create_task(self._watch(watcher))

    async def _watch(self, watcher: object) -> None:
        async for entry in watcher:  # type: ignore[attr-defined]
            if entry is None or not entry.value:
                continue
            try:
                config = ExpertConfig.model_validate_json(entry.value)
            except ValueError as exc:
                self.log.error("invalid expert config in KV, keeping the current one", error=str(exc)[:300])
                continue
            if config == self.config:
                continue
            self.apply_config(config)

    def apply_config(self, config: ExpertConfig) -> None:
        """Switch to a new configuration for the next requests."""
        if config.kind is not self.config.kind:
            self.log.error("expert kind cannot change live; start a new actor", new=str(config.kind))
            return
        reconfigure = getattr(self.expert, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(config)
        self.config = config
        self.log.info("expert reconfigured", revision=config.revision, model=config.model)

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        """Answer one request (a typed decline rather than an exception for request trouble)."""
        started = time.perf_counter()
        with bound(run=request.run_id, island=request.island):
            if self.stopping:
                # Drain has begun: the request still gets an answer, never silence.
                self.log.info("answering during drain", request=request.request_id)
            try:
                reply = await self.expert.generate(request)
            except Exception as exc:  # the boundary: a bug in an expert becomes a typed decline
                self.log.exception("expert failed", request=request.request_id)
                reply = GenerateReply(
                    request_id=request.request_id,
                    expert=self.config.name,
                    decline=Decline(reason=DeclineReason.ENDPOINT_ERROR, detail=f"{type(exc).__name__}: {exc}"[:500]),
                )
            reply = reply.model_copy(
                update={"expert_instance": self.actor_id, "elapsed_s": time.perf_counter() - started}
            )
            self.answered += 1
            self.proposals += len(reply.proposals)
            if reply.decline is not None:
                self.declined += 1
            return reply

    async def on_drain(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                await self._watch_task

    async def teardown(self) -> None:
        await self.expert.aclose()

    def extra_stats(self) -> dict[str, float | int | str | None]:
        return {
            "answered": self.answered,
            "declined": self.declined,
            "proposals": self.proposals,
            "expert": self.config.name,
            "config_revision": self.config.revision,
        }
