"""The model every layer shares: facts, memory state, runs, ids, the JSON codec, and the ports.

It imports no other package of the project; `processors`, `store` and `consumers` import it.
"""
