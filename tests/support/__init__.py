"""Test support in one place.

- `builders`: values (events, facts, runs, seeded memory), the same defaults everywhere;
- `fakes`: stand-ins for what the ports do not cover (embedders, backends, a Kafka consumer,
  a dead-letter sink, observers);
- `inmemory`: memoryd's consumers and read path assembled over the in-memory adapters;
- `deployment`: memoryd on the real Kafka, Postgres and Chroma the fixtures start;
- `fake_gemini`: a local HTTP server that answers like the Gemini API.
"""
