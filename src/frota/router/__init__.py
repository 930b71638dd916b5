"""Frota's router: one OpenAI-compatible endpoint in front of a fleet of workers.

The modules follow the path of a request: `app` (the HTTP surface) ->
`admission` (in-flight limit and bounded queue) -> `policies` (which replica)
-> `proxy` (forwarding, retries, streaming passthrough). Beside them:
`discovery` (where the workers are), `health` (whether they are fit to serve),
`metrics` (what the router saw) and `cli` (`frota router`).

Nothing here imports torch or `frota.engine`: the router runs in the same image
as the workers but needs none of their weight.
"""
