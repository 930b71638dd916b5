"""The router benchmark's readings: residence from a capture, and the paired verdict."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
import residence
import router as router_bench

ROUTER, WORKER = 8000, 9000
MARKER = (b'"x_stand_in_service": ',)


def _packet(stamp: float, source: int, destination: int, payload: bytes) -> bytes:
    """One pcap record: Ethernet, IPv4 and TCP headers (20 bytes each), then `payload`."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0, 64, 6, 0,
                     b"\x7f\x00\x00\x01", b"\x7f\x00\x00\x01")
    tcp = struct.pack("!HHIIBBHHH", source, destination, 0, 0, 5 << 4, 0x18, 65535, 0, 0)
    frame = b"\x00" * 12 + b"\x08\x00" + ip + tcp + payload
    seconds = int(stamp)
    return struct.pack("<IIII", seconds, round((stamp - seconds) * 1e6), len(frame),
                       len(frame)) + frame


def _capture(path: Path, packets: list[tuple[float, int, int, bytes]]) -> Path:
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    path.write_bytes(header + b"".join(_packet(*p) for p in packets))
    return path


def _request(number: int) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n\r\n"
            b'{"prompt": "hi ' + residence.TAG % number + b'"}')


ANSWER = b'HTTP/1.1 200 OK\r\n\r\n{"x_stand_in_service": 0.6}'


def test_residence_adds_both_legs_of_each_request(tmp_path: Path) -> None:
    # Two clients (ports 1, 2), two upstream connections (3, 4), interleaved.
    path = _capture(tmp_path / "c.pcap", [
        (10.000, 1, ROUTER, _request(0)),
        (10.001, 2, ROUTER, _request(1)),
        (10.003, 3, WORKER, _request(0)),   # request 0 held 3 ms
        (10.004, 4, WORKER, _request(1)),   # request 1 held 3 ms
        (10.004, WORKER, 4, b"HTTP/1.1 200 OK\r\n\r\n"),  # a head without the marker
        (10.600, WORKER, 4, ANSWER),
        (10.650, WORKER, 3, ANSWER),
        (10.651, ROUTER, 2, ANSWER),        # answer 1 held 51 ms
        (10.652, ROUTER, 1, ANSWER),        # answer 0 held 2 ms
        (10.700, ROUTER, 5, ANSWER),        # no request of this capture: left out
    ])
    legs = residence.residence(path, ROUTER, WORKER, MARKER)
    assert sorted(legs.request) == pytest.approx([3.0, 3.0], abs=1e-3)
    assert sorted(legs.answer) == pytest.approx([2.0, 51.0], abs=1e-3)
    assert sorted(legs.total) == pytest.approx([5.0, 54.0], abs=1e-3)


def test_a_request_that_never_reached_the_worker_is_not_counted(tmp_path: Path) -> None:
    path = _capture(tmp_path / "c.pcap", [
        (1.0, 1, ROUTER, _request(7)),
        (1.5, ROUTER, 1, ANSWER),  # the router answered on its own (an error, say)
    ])
    legs = residence.residence(path, ROUTER, WORKER, MARKER)
    assert legs.request == [] and legs.answer == []


@pytest.mark.parametrize(("diffs", "verdict", "interval", "coverage"), [
    ([1.0, 2.0, -3.0, 4.0, 5.0], "tie", [-3.0, 5.0], 0.938),
    ([0.1, 2.0, 3.0, 4.0, 5.0], "worse", [0.1, 5.0], 0.938),
    ([-0.1, -2.0, -3.0, -4.0, -5.0], "better", [-5.0, -0.1], 0.938),
    # 15 passes: the 4th to the 12th of the sorted differences.
    ([float(x) for x in range(1, 16)], "worse", [4.0, 12.0], 0.965),
    ([1.0, 2.0, 3.0], "too few passes", None, None),
])
def test_the_paired_verdict_is_the_sign_tests_interval(
        diffs: list[float], verdict: str, interval: list[float] | None,
        coverage: float | None) -> None:
    judged = router_bench.median_interval(diffs)
    assert judged == {"verdict": verdict, "interval": interval, "coverage": coverage}
