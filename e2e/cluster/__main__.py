"""CLI for the local e2e cluster.

    python -m e2e.cluster up [--nodes N] [--gpus G]   # build/reuse binaries, start, print KUBECONFIG
    python -m e2e.cluster down                        # stop everything, remove pod networking
    python -m e2e.cluster env                         # print the export line again

The processes keep running after ``up`` returns; ``down`` (or the next
``up``) stops them using the PIDs recorded in the work dir.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from e2e.cluster.controlplane import ClusterOptions, LocalCluster, build_binaries, find_binaries


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m e2e.cluster``."""
    p = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["up", "down", "env"])
    p.add_argument("--nodes", type=int, default=1, help="nodes the agent registers")
    p.add_argument("--gpus", type=int, default=0, help="fake nvidia.com/gpu per node")
    p.add_argument("--work-dir", type=Path, default=None, help="default: e2e/.work")
    args = p.parse_args(argv)
    options = ClusterOptions(nodes=args.nodes, gpus_per_node=args.gpus)
    if args.work_dir:
        options.work_dir = args.work_dir
    if args.command == "down":
        LocalCluster(Path("/nonexistent"), options).stop()
        print("local cluster stopped")
        return 0
    cluster = LocalCluster(find_binaries() or Path("/nonexistent"), options)
    if args.command == "env":
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0
    bin_dir = find_binaries() or build_binaries()
    cluster = LocalCluster(bin_dir, options)
    start = time.monotonic()
    try:
        cluster.start()
    except BaseException as exc:
        cluster.stop()
        print(f"could not start the local cluster: {exc}\n{cluster.log_tails()}", file=sys.stderr)
        return 1
    print(f"local cluster up in {time.monotonic() - start:.1f}s (binaries: {bin_dir})")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={bin_dir}:$PATH   # kubectl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
