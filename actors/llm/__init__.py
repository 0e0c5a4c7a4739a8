"""What every user of an LLM endpoint shares: the LLM experts and the LLM diagnoser.

- :mod:`.client`: ``ChatClient`` over ``openai.AsyncOpenAI`` (retries with seeded jitter,
  Retry-After, timeouts, usage);
- :mod:`.limiter`: the concurrency limit shared per endpoint URL;
- :mod:`.prompts`: role prompts, and the sections that render a task, a result and a diagnosis;
- :mod:`.redact`: keeping keys out of text;
- :mod:`.errors`: the package's errors.

Island processes never import this package (they would load the OpenAI SDK for nothing).
"""
