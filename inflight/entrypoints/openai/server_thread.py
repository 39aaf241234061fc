"""Run the server in a background thread of this process (tests, notebooks, benchmarks)."""
from __future__ import annotations

import threading
import time
from typing import Any, Optional

from inflight.entrypoints.openai.api_server import build_app, build_state, make_uvicorn_server
from inflight.entrypoints.openai.http_options import HttpOptions, uvicorn_kwargs
from inflight.entrypoints.openai.serving_common import ServerState


class ServerThread:
    """uvicorn serving an engine on ``host`` at a free port, in a daemon thread.

    ``with ServerThread(engine, "smollm2") as srv: openai.OpenAI(base_url=srv.base_url + "/v1")``.
    Signal handlers are not installed (uvicorn only does so on the main thread).
    """

    def __init__(self, engine: Any, model_name: str, host: str = "127.0.0.1", port: int = 0,
                 shutdown_grace_s: float = 1.0, health_stall_timeout_s: float = 60.0,
                 http: Optional[HttpOptions] = None, **state_kwargs: Any) -> None:
        self.state: ServerState = build_state(engine, model_name, **state_kwargs)
        self.app = build_app(self.state, shutdown_grace_s=shutdown_grace_s,
                             health_stall_timeout_s=health_stall_timeout_s, http=http)
        self.server = make_uvicorn_server(self.app, host, port, log_level="warning",
                                          shutdown_grace_s=shutdown_grace_s, **uvicorn_kwargs(http or HttpOptions()))
        self.host = host
        self.port: Optional[int] = None
        self._thread = threading.Thread(target=self.server.run, name="inflight-uvicorn", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
