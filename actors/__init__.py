"""Actors of Kernel Foundry: the bus, the actor base, one module per actor kind, and the CLI."""
