"""A real Kubernetes control plane from local binaries, for the e2e suite.

``build.sh`` builds the binaries; :class:`LocalCluster` runs them with the node
agent; ``python -m e2e.cluster up|down|env`` drives it from a shell.
"""

from e2e.cluster.controlplane import (
    ClusterOptions,
    LocalCluster,
    build_binaries,
    find_binaries,
)

__all__ = ["ClusterOptions", "LocalCluster", "build_binaries", "find_binaries"]
