"""`frota up [FILE]`: run an InferenceService as local processes (router + every worker rank).

With no FILE it serves the built-in default: SmolLM2-135M-Instruct, one
replica, on CPU. The manifest is validated by the same models as on a
cluster and planned by the same planner; each rank is a `frota worker`
process (ranks of a group meet through torch.distributed on loopback) and one
`frota router` fronts them. Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from frota.api.contract import HTTP_PORT, Env, ServingPath
from frota.local import state
from frota.local.fleet import DEFAULT_LAUNCHER, FleetOptions, LocalFleet, build
from frota.local.idle import WAKE_PATH, IdleScaler
from frota.local.ports import PortInUseError, any_free_port
from frota.local.progress import Progress
from frota.local.supervisor import ManagedProcess, StartupError, Supervisor
from frota.local.topology import LocalTopology, ManifestError, UnsupportedLocally, load, plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="InferenceService manifest (YAML); default: the built-in SmolLM2 fleet")
    parser.add_argument("--runtime", choices=["frota", "vllm"], default=None,
                        help="the engine behind the workers, overriding the manifest's "
                             "spec.runtime.engine (vllm: vLLM's `vllm serve`, found as $FROTA_VLLM "
                             "or on PATH)")
    parser.add_argument("--adapter", action="append", default=[], type=_adapter, metavar="NAME=PATH",
                        help="serve the LoRA adapter (a PEFT directory) at PATH as model NAME; "
                             "repeatable; added to the manifest's spec.adapters")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the router and workers listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=HTTP_PORT, help=f"router port (default: {HTTP_PORT})")
    parser.add_argument("--worker-base-port", type=int, default=None,
                        help="first port tried for workers (default: --port + 1); taken ports are skipped")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="log level of the workers and the router")
    parser.add_argument("--quiet", action="store_true",
                        help="show only frota up's own lines, not the processes' logs")
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds the fleet may take to become ready (default: 600)")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="torch threads per worker rank (default: CPU cores / ranks)")
    parser.add_argument("--scale-to-zero", type=float, default=None, metavar="SECONDS",
                        help="stop the workers after SECONDS without a request; the router "
                             "holds the next request while they start again (default: the "
                             "manifest's spec.autoscaling.scaleToZero when minReplicas is 0)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the processes it would start, and exit")
    parser.add_argument("--print-manifest", action="store_true",
                        help="print the manifest it would serve (the default one without FILE)")
    # Replaces `python -m frota.cli.main` in front of `worker ...`/`router ...`
    # (tests run a fake fleet with it; it also lets one wrap workers in a profiler).
    parser.add_argument("--launcher", default=None, help=argparse.SUPPRESS)


def _adapter(value: str) -> tuple[str, str]:
    """`--adapter NAME=PATH` as (name, path); the name is checked with the manifest."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{value!r}: use NAME=PATH (e.g. sql=./adapters/sql)")
    return name, path


def _fail(message: str, code: int = 1) -> int:
    print(f"frota up: {message}", file=sys.stderr, flush=True)
    return code


def run(args: argparse.Namespace) -> int:
    """Validate, plan, start the fleet, wait until it is ready, and serve until stopped."""
    try:
        isvc = load(args.file, runtime=args.runtime, adapters=args.adapter)
        if args.print_manifest:
            from frota.api.yamlio import dump_all

            sys.stdout.write(dump_all([isvc.to_wire()]))
            return 0
        topology = plan(isvc)
        launcher = tuple(shlex.split(args.launcher)) if args.launcher else DEFAULT_LAUNCHER
        vllm = find_vllm() if topology.runtime == "vllm" else None
        idle = args.scale_to_zero if args.scale_to_zero is not None else topology.idle_seconds
        if idle is not None and idle <= 0:
            raise ManifestError("--scale-to-zero: give the idle time in seconds (more than 0)")
        args.idle_seconds, args.wake_port = idle, any_free_port() if idle else None
        demand_url = f"http://127.0.0.1:{args.wake_port}{WAKE_PATH}" if idle else None
        opts = FleetOptions(host=args.host, port=args.port, worker_base_port=args.worker_base_port,
                            log_level=args.log_level, launcher=launcher,
                            cpu_threads=args.cpu_threads, vllm=vllm or "vllm",
                            demand_url=demand_url,
                            fleet_key_file=str(state.fleet_key_path(args.port)))
        fleet = build(topology, opts)
        if args.dry_run:
            _print_plan(topology, fleet)
            return 0
        if args.launcher is None:
            _check_installed(topology, vllm)
        _convert_models(topology, quiet=args.quiet)
    except ManifestError as exc:
        return _fail(str(exc), 2)
    except (UnsupportedLocally, PortInUseError) as exc:
        return _fail(str(exc))
    try:
        return asyncio.run(_serve(topology, fleet, args))
    except KeyboardInterrupt:  # before the signal handlers were in place
        return 130


def find_vllm() -> str | None:
    """The `vllm` command the vllm runtime runs: $FROTA_VLLM, else `vllm` on PATH."""
    return os.environ.get("FROTA_VLLM") or shutil.which("vllm")


def _convert_models(topology: LocalTopology, quiet: bool) -> None:
    """HF-layout copies of image-baked models for runtimes that need them, made once."""
    for alias, directory in topology.conversions:
        if (Path(directory) / "config.json").is_file():
            continue
        if not quiet:
            print(f"frota up: converting {alias} for {topology.runtime} into {directory} "
                  "(once; `frota convert`)", file=sys.stderr, flush=True)
        from frota.engine.loader.export import export_hf

        # Written beside its final name and renamed, so an interrupted run leaves no half model.
        partial = Path(directory + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        export_hf(alias, partial, verbose=False)
        partial.rename(directory)


def _check_installed(topology: LocalTopology, vllm: str | None = None) -> None:
    """The worker needs the engine extra; parallel ranks need a worker that supports them;
    the vllm runtime needs vLLM."""
    if topology.runtime == "vllm" and vllm is None:
        raise UnsupportedLocally(
            "runtime vllm needs vLLM: `pip install vllm` (GPU), or vLLM's CPU build with "
            "scripts/vllm-env.sh; or set FROTA_VLLM to a `vllm` command"
        )
    for module, what in (("torch", "torch (the engine extra)"), ("frota.server.cli", "frota worker"),
                         ("frota.router.cli", "frota router")):
        if importlib.util.find_spec(module) is None:
            raise UnsupportedLocally(
                f"{what} is not installed: run `pip install -e '.[engine]'` "
                "(scripts/up.sh does it for you)"
            )
    if topology.max_world_size > 1:
        help_text = subprocess.run([*DEFAULT_LAUNCHER, "worker", "--help"],
                                   capture_output=True, text=True).stdout
        if "--tensor-parallel-size" not in help_text:
            raise UnsupportedLocally(
                f"this manifest shards a replica over {topology.max_world_size} ranks and this "
                "`frota worker` has no --tensor-parallel-size yet; set spec.parallelism to 1"
            )


def _print_plan(topology: LocalTopology, fleet: LocalFleet) -> None:
    print(f"# {topology.name}: {topology.mode}, {len(topology.groups)} group(s), "
          f"router on {fleet.url}")
    for note in topology.notes:
        print(f"# note: {note}")
    for group in fleet.groups:
        for proc in group.processes:
            rank_env = {k: v for k, v in proc.env.items()
                        if k in (Env.RANK, Env.WORLD_SIZE, Env.MASTER_ADDR, Env.MASTER_PORT)}
            env = " ".join(f"{k}={v}" for k, v in sorted(rank_env.items()))
            print(f"{proc.name}: {env + ' ' if env else ''}{shlex.join(proc.argv)}")


async def _serve(topology: LocalTopology, fleet: LocalFleet, args: argparse.Namespace) -> int:
    names = ["up", *(p.name for g in fleet.groups for p in g.processes)]
    progress = Progress(names, show_logs=not args.quiet)
    fleet_state = state.FleetState(name=topology.name, model=topology.served_model_name,
                                   url=fleet.url, port=args.port)

    def on_event(kind: str, member: ManagedProcess, detail: str) -> None:
        progress.event(kind, member, detail)
        _save_state(fleet_state, sup)  # `frota status` sees loading processes too

    sup = Supervisor(fleet.groups, on_event=on_event, on_log=progress.log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def request_stop(signame: str) -> None:
        if stop.is_set():  # a second Ctrl-C: no more waiting
            progress.info(f"{signame} again: killing everything now")
            sup.kill_all_now()
            return
        progress.info(f"{signame}: stopping (again to kill at once)")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, request_stop, sig.name)

    progress.info(f"{topology.name}: {topology.mode.lower()}, {len(fleet.worker_groups)} worker "
                  f"group(s), {sum(len(g.processes) for g in fleet.worker_groups)} worker "
                  f"process(es), router on {fleet.url}")
    for note in topology.notes:
        progress.info(f"note: {note}")
    started = time.monotonic()
    state.write_fleet_key(args.port)  # a new key each run: nothing outlives the fleet
    start = asyncio.create_task(sup.start(args.ready_timeout))
    stopped = asyncio.create_task(stop.wait())
    supervise: asyncio.Task[None] | None = None
    idle: IdleScaler | None = None
    try:
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            start.cancel()
            return 0
        try:
            start.result()
        except StartupError as exc:
            if args.quiet:
                for member in sup.processes:
                    if list(member.log_tail) == exc.log_tail:
                        progress.tail(member.spec.name, exc.log_tail)
            return _fail(str(exc))
        _save_state(fleet_state, sup)
        _print_banner(topology, fleet, time.monotonic() - started)
        supervise = asyncio.create_task(sup.supervise())
        if args.idle_seconds:
            idle = IdleScaler(sup, [g.name for g in fleet.worker_groups], f"{fleet.url}{ServingPath.METRICS}",
                              args.idle_seconds, args.ready_timeout, on_change=progress.info)
            await idle.start(args.wake_port)
            idle.run()
            progress.info(f"scale to zero: the workers stop after {args.idle_seconds:g} s "
                          "without a request and start again on the next one")
        await stopped
        return 0
    finally:
        if idle is not None:
            await idle.stop()
        if supervise is not None:
            supervise.cancel()
        await sup.stop()
        state.remove(args.port)
        state.fleet_key_path(args.port).unlink(missing_ok=True)
        progress.info("stopped; all processes ended")


def _save_state(fleet_state: state.FleetState, sup: Supervisor) -> None:
    fleet_state.processes = [
        state.ProcessState(
            name=m.spec.name, role=m.spec.role, replica=m.spec.replica, rank=m.spec.rank,
            pid=m.pid, port=m.spec.port,
            url=m.spec.ready_url.rsplit("/", 1)[0] if m.spec.ready_url else None,
            ready_path="/" + m.spec.ready_url.rsplit("/", 1)[1] if m.spec.ready_url else ServingPath.READY,
            is_ready=m.is_ready, num_restarts=m.num_restarts,
        )
        for m in sup.processes
    ]
    state.write(fleet_state)


def _print_banner(topology: LocalTopology, fleet: LocalFleet, seconds: float) -> None:
    base = f"{fleet.url}/v1"
    model = topology.served_model_name
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello"}],
                       "max_tokens": 32})
    python = (f'from openai import OpenAI; c = OpenAI(base_url="{base}", api_key="none"); '
              f'r = c.chat.completions.create(model="{model}", messages=[{{"role": "user", '
              f'"content": "Say hello"}}], max_tokens=32); print(r.choices[0].message.content)')
    print(f"""
Frota is serving {model} at {base} (ready in {seconds:.1f} s)

  curl {base}/chat/completions -H 'Content-Type: application/json' \\
    -d '{body}'

  python -c '{python}'

  frota status --port {fleet.url.rsplit(":", 1)[1]}    # replicas, queues, KV cache, tokens/s
  Ctrl-C stops the fleet.
""", flush=True)
