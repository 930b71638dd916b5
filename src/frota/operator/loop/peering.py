"""The kopf peering object the operator joins, created at start-up when missing.

kopf with ``--peering NAME`` stays paused until the peering object exists. It
cannot ship in manifests/ beside its CRD (one ``kubectl apply`` would create
the object before the CRD is established and fail), so the operator makes it.
kopf logs in (and so hands the operator's client its credentials) only after
the startup handlers have finished, so the startup handler starts this as a
task instead of awaiting it; kopf's peering watch sees the object appear and
resumes the operator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from frota.operator.loop.apply import KubeApi

PEERING_API = "/apis/kopf.dev/v1"
RETRY_SECONDS = 5.0


def peering_objects(name: str, namespaces: list[str] | None) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) of each peering object: one cluster-wide, or one per namespace.

    Namespace globs name no single namespace, so they get none (create those by hand).
    """
    if namespaces is None:
        return [(f"{PEERING_API}/clusterkopfpeerings",
                 {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                  "metadata": {"name": name}})]
    return [
        (f"{PEERING_API}/namespaces/{ns}/kopfpeerings",
         {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
          "metadata": {"name": name, "namespace": ns}})
        for ns in namespaces if not any(c in ns for c in "*?[!")
    ]


async def ensure_peering(name: str, namespaces: list[str] | None, kube: KubeApi,
                         logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Create the peering objects that are missing; retry transient errors until done."""
    for path, obj in peering_objects(name, namespaces):
        while True:
            try:
                created = await kube.create_if_missing(path, obj)
            except kopf.TemporaryError as exc:
                logger.warning(f"creating kopf peering {name!r}: {exc}")
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if created:
                logger.info(f"created kopf peering {obj['kind']} {name!r}")
            break


def start(settings: kopf.OperatorSettings, namespaces: list[str] | None, kube: KubeApi,
          logger: logging.Logger | logging.LoggerAdapter) -> asyncio.Task[None] | None:
    """Start creating the peering objects when the operator runs with ``--peering``."""
    if settings.peering.standalone or not settings.peering.mandatory:
        return None
    return asyncio.get_running_loop().create_task(
        ensure_peering(settings.peering.name, namespaces, kube, logger),
        name="kopf peering creator")
