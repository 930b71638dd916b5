"""The compact log: structured and timestamped lines lose their framing, counters are thinned."""

from __future__ import annotations

import io

from frota.local.progress import Progress, compact
from frota.local.supervisor import ManagedProcess, ProcessSpec


def test_json_log_line_becomes_its_message_and_fields():
    line = ('{"ts": "2026-11-30T03:25:47Z", "level": "info", "logger": "frota.server", '
            '"msg": "request finished", "id": "c-1", "status": "ok"}')
    assert compact(line) == ("info", "request finished  id=c-1 status=ok")


def test_logging_module_prefix_is_dropped_and_its_level_kept():
    line = "2026-11-30 03:25:47,492 WARNING frota.router.health: worker ejected: http://w"
    assert compact(line) == ("warning", "worker ejected: http://w")


def test_plain_lines_pass_through():
    assert compact("Traceback (most recent call last):") == (
        "info", "Traceback (most recent call last):")


def test_process_lines_are_prefixed_warnings_marked_and_progress_thinned():
    out = io.StringIO()
    progress = Progress(["worker-0"], stream=out)
    member = ManagedProcess(ProcessSpec(name="worker-0", argv=("x",)))
    for i in range(27, 273, 27):
        progress.log(member, f"[frota.engine] dequantized {i}/272 tensors")
    progress.log(member, "[frota.engine] dequantized 272/272 tensors")
    progress.log(member, '{"level": "error", "msg": "boom"}')
    lines = out.getvalue().splitlines()
    assert all(line.startswith("[worker-0] ") for line in lines)
    assert len(lines) == 6  # 27, 81, 162, 216, 272 and the error
    assert lines[-1] == "[worker-0] ERROR: boom"
