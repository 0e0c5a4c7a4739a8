"""LLM experts over any OpenAI-compatible endpoint (the client itself is in :mod:`actors.llm`).

- :mod:`.expert`: ``LLMExpert``, the ``Expert`` implementation;
- :mod:`.extract`: candidate sources out of a reply.

The meta-prompt sections the island evolves for them live in :mod:`actors.evolution.metaprompt`.
"""

from actors.experts.llm.expert import LLMExpert

__all__ = ["LLMExpert"]
