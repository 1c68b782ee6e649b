"""A real S3-compatible server on 127.0.0.1 for the tests: moto's server (its WSGI app, as
``moto_server`` runs it) behind a middleware that counts the body bytes of every GET by object key.

    python tests/s3_server.py PORT_FILE      # serves until killed; writes its port to PORT_FILE

``GET /_bytes`` returns the counts as JSON ({"bytes": {"bucket/key": n}, "gets": {"bucket/key": n}});
``DELETE /_bytes`` resets them.
The count is what the server sent: ranged reads count only their ranges.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from pathlib import Path

from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

SENT: Counter[str] = Counter()
GETS: Counter[str] = Counter()
LOCK = threading.Lock()


def app_with_counts(app):
    def counted(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/_bytes":
            with LOCK:
                if environ["REQUEST_METHOD"] == "DELETE":
                    SENT.clear()
                    GETS.clear()
                body = json.dumps({"bytes": dict(SENT), "gets": dict(GETS)}).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        chunks = app(environ, start_response)
        if environ["REQUEST_METHOD"] != "GET" or environ.get("QUERY_STRING"):
            return chunks  # listings and the like: not object bytes
        key = path.lstrip("/")
        out = []
        for chunk in chunks:
            out.append(chunk)
        with LOCK:
            SENT[key] += sum(len(c) for c in out)
            GETS[key] += 1
        return out

    return counted


def main() -> None:
    port_file = Path(sys.argv[1])
    server = make_server(
        "127.0.0.1",
        0,
        app_with_counts(DomainDispatcherApplication(create_backend_app)),
        threaded=True,
        request_handler=MotoRequestHandler,
    )
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(port_file)  # whole, or absent
    server.serve_forever()


if __name__ == "__main__":
    main()
