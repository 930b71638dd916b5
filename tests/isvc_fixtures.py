"""Fluent InferenceService fixtures for planner and builder tests."""

from __future__ import annotations

import copy
from typing import Any

from frota.api import InferenceService


class Spec:
    """Build an InferenceService manifest step by step: Spec("tiny").tensor(3).gpu().build()."""

    def __init__(self, name: str = "tiny", uri: str = "alias:smollm2") -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "frota.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": "llm", "uid": "0b5c1e9a-7f0e-4d1e-9d55-2f9a4c1e0001"},
            "spec": {"model": {"name": uri.split(":")[-1].split("/")[-1], "uri": uri},
                     "resources": {"cpu": "2", "memory": "3Gi"}},
        }

    def set(self, path: str, value: Any) -> Spec:
        node = self.obj
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        return self

    def replicas(self, n: int) -> Spec:
        return self.set("spec.replicas", n)

    def tensor(self, n: int) -> Spec:
        return self.set("spec.parallelism.tensor", n)

    def pipeline(self, n: int) -> Spec:
        return self.set("spec.parallelism.pipeline", n)

    def gpu(self, count: int = 1, memory: str | None = "80Gi") -> Spec:
        acc: dict[str, Any] = {"resourceName": "nvidia.com/gpu", "count": count}
        if memory:
            acc["memory"] = memory
        return self.set("spec.resources.accelerator", acc)

    def disaggregated(self, prefill: int = 1, decode: int = 1) -> Spec:
        return self.set("spec.disaggregation", {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}})

    def manifest(self) -> dict[str, Any]:
        return copy.deepcopy(self.obj)

    def build(self) -> InferenceService:
        return InferenceService.from_manifest(self.manifest())
