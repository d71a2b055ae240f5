"""memoryd's HTTP API (FastAPI), for services not written in Python.

`app` builds the application from its dependencies, `auth` maps bearer tokens to the
organization they act for, `models` are the request and response bodies, `metrics` the
request-latency middleware. `memoryd api` runs it under uvicorn.
"""
