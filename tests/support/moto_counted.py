"""moto's S3 server (as `python -m moto.server` runs it) counting the bytes of the response bodies it
sends: `GET /__bytes_sent__` answers the count so far. `tools.bench_s3` reads the bytes each tool read from
the bucket this way, at no cost to the tools (a TCP relay counting them costs the client's machine about
0.6 CPU-seconds per GB, which a real object store does not).

    python -m tests.support.moto_counted -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterable, Iterator

#: The path that answers the count (no bucket can be named so).
COUNT_PATH = "/__bytes_sent__"


class BodyBytes:
    """WSGI middleware: `app`, with the length of every body chunk it returns added to `sent`."""

    def __init__(self, app: Callable) -> None:
        self.app = app
        self.sent = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == COUNT_PATH:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [str(self.sent).encode()]
        return self._counted(self.app(environ, start_response))

    def _counted(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in body:
                with self._lock:
                    self.sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def main() -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser(prog="python -m tests.support.moto_counted")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto.server does
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, BodyBytes(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
