"""Evolution policies without I/O: MAP-Elites archive, parent selection, credit per (diagnosis,
expert), stagnation, migration, the meta-prompt sections of LLM experts (``metaprompt``,
``directives``), where the time goes and where mutations aim (``amdahl``) and the island brain
that combines them."""
