"""LLM experts over any OpenAI-compatible endpoint, with evolving meta-prompt sections.

- :mod:`.client`: ``ChatClient`` (retries with seeded jitter, Retry-After, timeouts, usage);
- :mod:`.limiter`: the concurrency limit shared per endpoint URL;
- :mod:`.prompts`: role prompts and the assembly of a request into chat messages;
- :mod:`.extract`: candidate sources out of a reply;
- :mod:`.metaprompt` and :mod:`.directives`: meta-prompt co-evolution per role;
- :mod:`.expert`: ``LLMExpert``, the ``Expert`` implementation;
- :mod:`.redact` and :mod:`.errors`: keeping keys out of text, and the package's errors.
"""

from actors.experts.llm.client import ChatChoice, ChatClient, ChatResult, Endpoint, RetryPolicy
from actors.experts.llm.expert import LLMExpert
from actors.experts.llm.metaprompt import (
    MetaPromptEvolver,
    PromptSection,
    RolePool,
    parse_strategy,
    strategy_tag,
)
from actors.experts.llm.prompts import ROLES, build_messages

__all__ = [
    "ROLES",
    "ChatChoice",
    "ChatClient",
    "ChatResult",
    "Endpoint",
    "LLMExpert",
    "MetaPromptEvolver",
    "PromptSection",
    "RetryPolicy",
    "RolePool",
    "build_messages",
    "parse_strategy",
    "strategy_tag",
]
