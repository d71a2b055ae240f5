"""Tier V in Chroma: the vector index and its reconnecting wrapper."""
