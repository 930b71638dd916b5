"""status.modelCache while the Job downloads: the fill pod's /progress (bytes so far, the
source's total), read by the capacity timer into the operator state, shown as
Downloading with bytes and percent."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from frota.cli import cache
from frota.operator.builders.model_cache import COMPONENT
from frota.operator.loop.state import OperatorState
from frota.operator.reports import model_cache_progress as progress
from frota.operator.reports.model_cache_status import model_cache_status

KEY = ("default", "tiny")
JOB = {"metadata": {"name": "j", "uid": "u1"}, "status": {"active": 1}}


def fill_pod(ip: str = "127.0.0.1", phase: str = "Running", component: str = COMPONENT) -> dict:
    return {"metadata": {"labels": {"app.kubernetes.io/component": component}},
            "status": {"phase": phase, "podIP": ip}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_downloading_shows_bytes_total_and_a_floored_percent() -> None:
    status = model_cache_status(JOB, "j", progress={"bytes": 41 << 20, "totalBytes": 100 << 20})
    assert (status.state, status.bytes, status.totalBytes, status.percent) == (
        "Downloading", 41 << 20, 100 << 20, 41)
    assert status.progress == "Downloading 41% (41.0 MiB)"
    almost = model_cache_status(JOB, "j", progress={"bytes": 999, "totalBytes": 1000})
    assert almost.percent == 99  # 100 only once Ready


def test_without_a_total_downloading_shows_bytes_only_and_without_a_reading_nothing() -> None:
    status = model_cache_status(JOB, "j", progress={"bytes": 3 << 20, "totalBytes": None})
    assert (status.bytes, status.percent, status.progress) == (3 << 20, None, "Downloading (3.0 MiB)")
    bare = model_cache_status(JOB, "j")
    assert (bare.bytes, bare.percent, bare.progress) == (None, None, "Downloading")


def test_a_finished_job_ignores_a_stale_reading() -> None:
    job = {**JOB, "status": {"succeeded": 1}}
    status = model_cache_status(job, "j", progress={"bytes": 5, "totalBytes": 10})
    assert (status.state, status.percent, status.progress) == ("Ready", 100, "Ready")


def test_only_running_fill_pods_with_an_ip_are_read() -> None:
    pods = [fill_pod("10.0.0.5"), fill_pod("fd00::7"), fill_pod("10.0.0.6", phase="Pending"),
            fill_pod("10.0.0.8", component="worker"), {"metadata": {}, "status": {"phase": "Running"}}]
    assert progress.fill_pod_urls(pods) == ["http://10.0.0.5:8081/progress", "http://[fd00::7]:8081/progress"]


@pytest.mark.parametrize("text, expected", [
    ('{"bytes": 5, "totalBytes": 10}', {"bytes": 5, "totalBytes": 10}),
    ('{"bytes": 5, "totalBytes": null}', {"bytes": 5, "totalBytes": None}),
    ('{"bytes": -1, "totalBytes": 10}', None), ('{"bytes": true}', None),
    ('{"bytes": 5, "totalBytes": "10"}', None), ("[1]", None), ("<html>", None), ("", None),
])
def test_parse_takes_only_counts(text: str, expected: dict | None) -> None:
    assert progress.parse(text) == expected


async def test_the_timer_reads_the_real_fill_server_pokes_on_news_and_forgets_when_it_ends(
        tmp_path: Path) -> None:
    dest = tmp_path / "key" / "m.gguf"
    dest.parent.mkdir()
    partial = dest.parent / "m.gguf.partial-1"
    partial.write_bytes(b"x" * 700)
    port = free_port()
    server = cache.serve_progress(dest, "hf://org/repo", port, host="127.0.0.1")
    state = OperatorState()
    poked: list = []
    state.poke = poked.append  # type: ignore[method-assign]  # which keys were woken
    await state.open()
    try:
        await progress.refresh(state, KEY, [fill_pod()], port=port)
        assert state.cache_progress[KEY] == {"bytes": 700, "totalBytes": None}
        assert poked == [KEY]
        await progress.refresh(state, KEY, [fill_pod()], port=port)
        assert poked == [KEY]  # no news, no wake-up
        partial.write_bytes(b"x" * 900)
        await progress.refresh(state, KEY, [fill_pod()], port=port)
        assert state.cache_progress[KEY]["bytes"] == 900
        server.shutdown()
        server.server_close()
        await progress.refresh(state, KEY, [fill_pod()], port=port)  # no answer: the last stands
        assert state.cache_progress[KEY]["bytes"] == 900
        assert len(poked) == 2
        await progress.refresh(state, KEY, [], port=port)  # the pod is gone: the Job tells the rest
        assert KEY not in state.cache_progress and len(poked) == 3
    finally:
        await state.close()
