"""How long each request spends inside a router, read from packet timestamps on loopback.

`bench/router.py --overhead --residence` captures the loopback traffic of each router's
passes with tcpdump. A request's residence is the time from its arrival at the router
to its departure for the worker, plus the time from the worker's first answer bytes (a
whole answer, or a stream's head and first event) to the router's passing them on: what
the router itself holds a request, with none of the client's or the worker's time in
it. It is measured from outside, so it reads Frota and vllm-router alike.

Each request carries a number in its prompt (`tag`), which both legs are matched on;
answers are matched by connection, and recognised by the stand-in's service marker
that both the worker's and the router's first answer bytes carry. The capture file is
read here with `struct`: a pcap file is a fixed header and one 16-byte record header per
packet, and only IPv4 and TCP headers need reading.
"""

from __future__ import annotations

import re
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What a request's prompt carries: its number in the pass, fixed width, so that every
# request of a pass has the same size with or without a capture.
TAG = b"(request %06d)"
_TAG_RE = re.compile(rb"\(request (\d{6})\)")
_SNAPLEN = 4096  # a whole stand-in answer or a stream's first event, with its head
_LINKTYPE_ETHERNET, _LINKTYPE_NULL = 1, 0
FLUSH_SECONDS = 1.5


@dataclass
class Legs:
    """Per request, in ms: arrival to departure for the worker (`request`), and the
    worker's first answer bytes to the router's (`answer`)."""

    request: list[float]
    answer: list[float]

    @property
    def total(self) -> list[float]:
        return [a + b for a, b in zip(self.request, self.answer, strict=True)]


class Capture:
    """tcpdump on lo, over the packets with a payload to or from `ports`, while the
    `with` block runs; `cores`: where it runs (the load generator's, so that the router
    under test has its core to itself)."""

    def __init__(self, path: Path, ports: list[int], cores: list[int] | None) -> None:
        ports_filter = " or ".join(f"tcp port {p}" for p in ports)
        payload = "((ip[2:2] - ((ip[0] & 0xf) << 2)) - ((tcp[12] & 0xf0) >> 2)) != 0"
        argv = ["tcpdump", "-i", "lo", "-s", str(_SNAPLEN), "-B", "32768", "-U", "-w",
                str(path), f"({ports_filter}) and {payload}"]
        if cores:
            argv = ["taskset", "-c", ",".join(map(str, cores)), *argv]
        self.path = path
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Capture:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode(errors="replace").strip()
        if "listening on" not in line:  # else it is capturing from here on
            self.proc.wait(timeout=10)
            raise RuntimeError(f"tcpdump could not capture on lo ({line}); it needs "
                               "CAP_NET_RAW, as root has")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.proc is not None
        # tcpdump gets the kernel's packets a block at a time, a block at the latest
        # when its 1 s timeout runs out; it stops without reading what is still there.
        time.sleep(FLUSH_SECONDS)
        self.proc.terminate()
        self.proc.wait(timeout=10)


def packets(path: Path) -> Iterator[tuple[float, int, int, bytes]]:
    """(timestamp, source port, destination port, payload) of each IPv4 TCP packet."""
    data = path.read_bytes()
    if len(data) < 24:
        return
    magic = data[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nanos = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    link_len = {_LINKTYPE_ETHERNET: 14, _LINKTYPE_NULL: 4}[linktype]
    record = struct.Struct(endian + "IIII")
    offset = 24
    while offset + 16 <= len(data):
        seconds, fraction, captured, _ = record.unpack_from(data, offset)
        frame = data[offset + 16:offset + 16 + captured]
        offset += 16 + captured
        ip = frame[link_len:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:  # IPv4, TCP
            continue
        tcp = ip[(ip[0] & 0xF) * 4:]
        source, destination = struct.unpack_from("!HH", tcp)
        payload = tcp[(tcp[12] >> 4) * 4:]
        if payload:
            yield (seconds + fraction / (1e9 if nanos else 1e6), source, destination,
                   payload)


def residence(path: Path, router_port: int, worker_port: int,
              marker: tuple[bytes, ...]) -> Legs:
    """Each request's two legs through the router at `router_port`, from the capture at
    `path`; `marker`: what the worker's and the router's first answer bytes contain."""
    arrived: dict[bytes, float] = {}
    forwarded: dict[bytes, float] = {}
    answered: dict[bytes, float] = {}
    passed_on: dict[bytes, float] = {}
    by_client: dict[int, bytes] = {}  # client-side port -> its request in flight
    by_upstream: dict[int, bytes] = {}  # the router's port to the worker -> likewise
    for stamp, source, destination, payload in packets(path):
        if destination in (router_port, worker_port):
            match = _TAG_RE.search(payload)
            if match is None:
                continue
            tag = match.group(1)
            if destination == router_port:
                arrived[tag], by_client[source] = stamp, tag
            else:
                forwarded[tag], by_upstream[source] = stamp, tag
        elif any(m in payload for m in marker):
            if source == worker_port and destination in by_upstream:
                answered[by_upstream.pop(destination)] = stamp
            elif source == router_port and destination in by_client:
                passed_on[by_client.pop(destination)] = stamp
    tags = [t for t in arrived if t in forwarded and t in answered and t in passed_on]
    return Legs([(forwarded[t] - arrived[t]) * 1000 for t in tags],
                [(passed_on[t] - answered[t]) * 1000 for t in tags])
