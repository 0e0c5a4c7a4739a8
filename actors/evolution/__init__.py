"""Evolution policies without I/O: MAP-Elites archive, parent selection, credit per (diagnosis,
expert), stagnation, migration and the island brain that combines them."""
