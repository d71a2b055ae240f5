"""LoCoMo (Maharana et al., ACL 2024) as a retrieval benchmark: `python -m bench.locomo`."""
