"""The node agent's pure helpers (no cluster needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.agent import _dns_names, _selects
from e2e.cluster.podinit import _refuse_mounts_over_the_image
from e2e.cluster.podspec import expand, field_ref, parse_quantity, resource_ref


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "w-0", "namespace": "ns", "uid": "u1", "labels": {"app": "w"}},
        "spec": {"nodeName": "n0", "serviceAccountName": "default"},
        "status": {"podIP": "10.244.0.9", "podIPs": [{"ip": "10.244.0.9"}]},
    }


def test_var_references_expand_like_the_kubelet() -> None:
    env = {"RANK": "1"}
    assert expand("--rank=$(RANK)", env) == "--rank=1"
    assert expand("$$(RANK)", env) == "$(RANK)"
    assert expand("$(MISSING)", env) == "$(MISSING)"


def test_quantities_parse_with_binary_and_decimal_suffixes() -> None:
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("3") == 3


def test_downward_api_fields_resolve_from_the_pod() -> None:
    pod = _pod()
    assert field_ref(pod, "metadata.name") == "w-0"
    assert field_ref(pod, "metadata.labels['app']") == "w"
    assert field_ref(pod, "status.podIP") == "10.244.0.9"
    assert resource_ref({"resources": {"limits": {"memory": "1Gi"}}},
                        {"resource": "limits.memory", "divisor": "1Mi"}, "4") == "1024"
    assert resource_ref({}, {"resource": "limits.cpu"}, "4") == "4"


def test_short_dns_names_only_within_the_viewers_namespace() -> None:
    assert "w-0.svc" in _dns_names("w-0.svc", "ns", "ns")
    assert "w-0.svc" not in _dns_names("w-0.svc", "ns", "other")
    assert _selects({"app": "w"}, {"app": "w", "x": "y"})
    assert not _selects({}, {"app": "w"})


def test_a_volume_over_the_checkout_or_virtualenv_is_refused_by_name() -> None:
    checkout = Path(__file__).resolve().parents[1]
    with pytest.raises(SystemExit, match=f"mounted at {checkout.parent} would hide this checkout"):
        _refuse_mounts_over_the_image([["/src", str(checkout.parent), False]])
    with pytest.raises(SystemExit, match="would hide this virtualenv"):
        _refuse_mounts_over_the_image([["/src", sys.prefix, False]])
    _refuse_mounts_over_the_image([["/src", str(checkout / "no-such-dir" / "data"), True]])
