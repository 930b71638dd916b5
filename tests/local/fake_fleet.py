"""A stand-in for `frota worker` and `frota router` with the same flags and endpoints.

`frota up --launcher "python fake_fleet.py"` runs it instead of the real
processes, so the tests of `frota up` itself (state file, status, signals,
restarts) run in seconds without torch. Usage: `fake_fleet.py worker ARGS` or
`fake_fleet.py router ARGS`; unknown flags are ignored, as the real ones
would accept them. With FAKE_REAL_ROUTER=1 the router is Frota's own, in front of fake
workers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys

from aiohttp import ClientSession, web


def worker_app(args: argparse.Namespace) -> web.Application:
    tokens = {"n": 0}

    async def ready(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=(
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="fake"} 0.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="fake"} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="fake"} 0.25\n'
            "# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{model_name="fake"}} {tokens["n"]}.0\n'
        ))

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens["n"] += 3
        text = f"hello from {os.getpid()}"
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                     "model": body["model"],
                     "choices": [{"index": 0, "delta": {"content": text},
                                  "finish_reason": "stop"}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
            return resp
        return web.json_response({
            "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        })

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/health", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def router_app(args: argparse.Namespace) -> web.Application:
    workers = args.workers.split(",")
    turn = itertools.cycle(range(len(workers)))

    async def ready(_: web.Request) -> web.Response:
        async with ClientSession() as s:
            for url in workers:
                try:
                    async with s.get(f"{url}/ready") as r:
                        if r.status == 200:
                            return web.Response(text="ok")
                except OSError:
                    pass
        return web.Response(status=503, text="no worker ready")

    async def proxy(request: web.Request) -> web.Response:
        body = await request.read()
        async with ClientSession() as s:
            for _ in workers:
                url = workers[next(turn)]
                try:
                    async with s.post(f"{url}{request.path}", data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        return web.Response(status=r.status, body=await r.read(),
                                            content_type=r.content_type)
                except OSError:
                    continue
        return web.json_response({"error": {"message": "no worker", "type": "unavailable",
                                            "code": 503}}, status=503)

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/health", lambda _: web.Response(text="ok"))
    app.router.add_get("/metrics", lambda _: web.Response(text="frota_router_queue_depth 0\n"))
    app.router.add_post("/v1/chat/completions", proxy)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    print(f"fake: listening on {host}:{port} (rank {os.environ.get('FROTA_RANK', '-')})",
          flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["worker", "router"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", default="")
    parser.add_argument("--fail-on-start", action="store_true")
    args, _ = parser.parse_known_args()
    if os.environ.get("FAKE_REAL_ROUTER") and args.command == "router":
        # fake workers behind Frota's own router (what scale to zero needs: holding, metrics)
        os.execv(sys.executable, [sys.executable, "-m", "frota.cli.main", *sys.argv[1:]])
    if os.environ.get("FAKE_WORKER_FAIL") and args.command == "worker":
        print("fake: cannot load the model", flush=True)
        sys.exit(7)
    app = worker_app(args) if args.command == "worker" else router_app(args)
    if args.command == "worker" and os.environ.get("FROTA_RANK", "0") != "0":
        asyncio.run(asyncio.sleep(3600))  # follower ranks serve no HTTP
        return
    asyncio.run(serve(app, args.host, args.port))


if __name__ == "__main__":
    main()
