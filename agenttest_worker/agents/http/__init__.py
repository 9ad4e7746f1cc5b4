"""Agent calls over HTTP, through aiohttp.

- `transport`: a call with retries, timing and bounded bodies;
- `exchange`: one attempt of it, on the loop's one `ClientSession`;
- `streaming`: streamed replies (Server-Sent Events, NDJSON) and their assemblers;
- `urls`: whether an agent's URL can be called, said for the user when it cannot;
- `tls`: the trust and client certificate of an agent's https calls;
- `proxies`: the proxy of each call (the environment's, NO_PROXY with CIDR ranges, or
  the agent's own);
- `network_checks`: both checked when agenttest.yaml is loaded.

The agents package's face (`agenttest_worker.agents`) exports what other packages use.
"""
