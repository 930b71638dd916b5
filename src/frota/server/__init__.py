"""The worker's HTTP server: the OpenAI API in front of `frota.engine.AsyncEngine`.

`frota worker` (see `cli.py`) runs it; `app.create_app` builds the aiohttp
application around any object that honours the engine contract in
docs/internals.md, so tests can serve a fake engine.
"""
