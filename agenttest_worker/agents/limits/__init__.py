"""What keeps agent calls within bounds: rate limits, back-off, and the circuit breaker.

- `ratelimit`: requests and tokens per second or minute and concurrent calls per agent,
  shared through Redis on a fleet (`limit_scripts`), kept per process (`local_limits`),
  and learned from the provider's 429s where none is configured;
- `provider_limits`: what a provider's reply says of its limits (retry-after, remaining,
  reset);
- `retry`: when and how long to wait before calling an agent again;
- `waiting`: turns waiting for a rate-limit slot or a retry's back-off;
- `breaker`: failing fast on an agent that cannot be reached.
"""
