"""Evolution policies without I/O: MAP-Elites archive, parent selection, credit per (diagnosis,
expert), stagnation, migration, the meta-prompt sections of LLM experts (``metaprompt``,
``directives``) and the island brain that combines them."""
