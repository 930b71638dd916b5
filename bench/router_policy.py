"""What the prefix-aware policy costs per request over round-robin, with long prompts.

    python bench/router_policy.py                 # 8k-token prompts, 8 workers
    python bench/router_policy.py --tokens 32000 --workers 64

Times what the router does per request for each policy, in this process, on prebuilt
request bodies: build the `RouteRequest`, parse the body when the policy reads it
(prefix-aware does, round-robin does not), and `choose`. Prompts are chat requests of
about `--tokens` tokens (4 characters a token, the router's own estimate): one of
`--tenants` system prompts of a quarter of the prompt, then a distinct history; every
`--hot-every`th request shares one hot system prompt, so the hot window and the spread
over a hot prefix's workers are on the path too. Prints one JSON object: microseconds
of CPU time per request (other processes on the cores do not count), median of
`--repeats` runs of `--requests` requests, min-max beside it; `json_parse` is the body
parse alone, part of prefix-aware's figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from frota.router.health import Worker
from frota.router.policies import (
    PolicyName,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)

PATH = "/v1/chat/completions"
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-test"}


def bodies(args: argparse.Namespace) -> list[bytes]:
    rng = random.Random(args.seed)
    chars = args.tokens * 4

    def text(n: int) -> str:
        words = []
        while sum(len(w) + 1 for w in words) < n:
            words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                 for _ in range(rng.randint(2, 9))))
        return " ".join(words)[:n]

    systems = [f"You are the assistant of tenant {t}. " + text(chars // 4)
               for t in range(args.tenants)]
    hot = "You are the assistant of the busiest app. " + text(chars // 4)
    out = []
    for i in range(args.distinct):
        system = hot if i % args.hot_every == 0 else systems[i % args.tenants]
        history = text(chars - len(system))
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": history[: len(history) // 2]},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": history[len(history) // 2:]}]
        out.append(json.dumps({"model": "m", "messages": messages, "max_tokens": 16,
                               "stream": True}).encode())
    return out


def per_request_us(policy: RoutingPolicy, payloads: list[bytes], workers: list[Worker],
                   num_requests: int) -> float:
    """What the app and the proxy do with the policy for one request, averaged."""
    needs_body = policy.needs_body
    n = len(payloads)
    started = time.process_time()  # CPU time: other processes on the cores do not count
    for i in range(num_requests):
        route = RouteRequest(PATH, payloads[i % n], HEADERS)
        if needs_body:
            route.json  # noqa: B018  # the app parses it before routing
        policy.choose(route, workers)
    return (time.process_time() - started) / num_requests * 1e6


def parse_us(payloads: list[bytes], num_requests: int) -> float:
    """The JSON parse alone, which any policy that reads the body pays."""
    n = len(payloads)
    started = time.process_time()
    for i in range(num_requests):
        RouteRequest(PATH, payloads[i % n], HEADERS).json  # noqa: B018
    return (time.process_time() - started) / num_requests * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8000, help="prompt length in tokens")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--hot-every", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=256, help="distinct request bodies")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the JSON here")
    args = parser.parse_args()

    payloads = bodies(args)
    workers = [Worker(f"http://10.0.0.{i}:8000") for i in range(args.workers)]
    out: dict[str, object] = {
        "mode": "router-policy-cost", "prompt_tokens": args.tokens,
        "body_bytes": round(statistics.mean(len(p) for p in payloads)),
        "workers": args.workers, "requests_per_run": args.requests, "runs": args.repeats,
        "python": sys.version.split()[0]}
    times: dict[str, list[float]] = {}
    policies = {name: make_policy(name) for name in (PolicyName.ROUND_ROBIN,
                                                     PolicyName.PREFIX_AWARE)}
    for policy in policies.values():  # warm: the hot window full, the ring built
        per_request_us(policy, payloads, workers, 200)
    for _ in range(args.repeats):  # interleaved, so drift in the machine hits both
        for name, policy in policies.items():
            times.setdefault(name.value, []).append(
                per_request_us(policy, payloads, workers, args.requests))
        times.setdefault("json_parse", []).append(parse_us(payloads, args.requests))
    for name, values in times.items():
        out[name] = {"us_per_request": round(statistics.median(values), 1),
                     "min_max": [round(min(values), 1), round(max(values), 1)]}
    rr, pa = times[PolicyName.ROUND_ROBIN.value], times[PolicyName.PREFIX_AWARE.value]
    extra = [p - r for p, r in zip(pa, rr, strict=True)]
    out["prefix_aware_minus_round_robin_us"] = round(statistics.median(extra), 1)
    out["target_us"] = 200
    out["meets_target"] = statistics.median(extra) <= 200
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
