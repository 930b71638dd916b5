"""A trivial child process for supervisor tests: an HTTP server with a /ready probe.

Usage: python child_server.py PORT [--ready-after S] [--exit-code N --exit-after S]
[--ignore-term] [--grandchild PIDFILE]. Real processes, not mocks: the
supervisor's signals, process groups and probes are exercised for real.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--unhealthy-after", type=float, default=None,
                        help="/health answers 500 from this many seconds on")
    parser.add_argument("--grandchild", default=None, help="start a sleeper; write its pid here")
    args = parser.parse_args()
    started = time.monotonic()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args.grandchild, "w") as f:
            f.write(str(sleeper.pid))
    if args.exit_after is not None:
        def bye() -> None:
            time.sleep(args.exit_after)
            print("child: exiting on purpose", flush=True)
            os._exit(args.exit_code)
        threading.Thread(target=bye, daemon=True).start()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            age = time.monotonic() - started
            status = 503 if self.path == "/ready" and age < args.ready_after else 200
            if self.path == "/health" and args.unhealthy_after is not None:
                status = 500 if age >= args.unhealthy_after else 200
            body = f"pid {os.getpid()}\n".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"child: serving on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
