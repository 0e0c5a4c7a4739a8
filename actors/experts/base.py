"""The expert seam: one interface behind the template expert and the LLM experts."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from schemas import GenerateReply, GenerateRequest


@runtime_checkable
class Expert(Protocol):
    """Answers a generate request with proposals or a typed decline.

    Implementations never raise for a problem of the request or of a remote endpoint: they
    return a ``GenerateReply`` whose ``decline`` says why. An exception means a bug.
    """

    name: str
    """The service name the expert serves under."""

    async def generate(self, request: GenerateRequest) -> GenerateReply:
        """Produce up to ``request.n`` proposals, or a decline."""
        ...

    async def aclose(self) -> None:
        """Release connections and worker threads."""
        ...
