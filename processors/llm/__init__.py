"""LLM adapters: the only part of `processors` that talks to a network."""
