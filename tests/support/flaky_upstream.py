"""A real OpenAI-compatible HTTP server on 127.0.0.1 whose every answer can fail on demand,
including the model list (which the openai adapter's load and every status sync read). It
can go away (`close()`) and come back (`start()`) on the same port, to play an unreachable
server."""

import threading

from tests.support.local_server import Handler, LocalServer
from tests.support.openai_upstream import model_list, reply, stream_chunks


class FlakyUpstream(LocalServer):
    def __init__(self, models: list[str]) -> None:
        self.models = list(models)
        self.fail_listing: list[tuple[int, str]] = []  # (status, message) served in order
        self.fail_next: list[tuple[int, str]] = []  # the same, for inference
        self.listing_gate: threading.Event | None = None  # when set: listing waits for it
        self.cut_streams = 0  # this many streamed answers stop after their first chunk
        self.inferences = 0
        super().__init__()

    def handler(self) -> type[Handler]:
        upstream = self

        class FlakyHandler(Handler):
            def fail_from(self, script: list[tuple[int, str]]) -> bool:
                if not script:
                    return False
                status, message = script.pop(0)
                self.send_json(status, {"error": {"message": message}})
                return True

            def do_GET(self) -> None:
                if upstream.listing_gate is not None:
                    upstream.listing_gate.wait(timeout=30)
                if self.fail_from(upstream.fail_listing):
                    return
                self.send_json(200, model_list(upstream.models))

            def do_POST(self) -> None:
                body = self.read_json()
                upstream.inferences += 1
                if self.fail_from(upstream.fail_next):
                    return
                if not body.get("stream"):
                    self.send_json(200, reply(self.path, body))
                elif upstream.cut_streams:
                    upstream.cut_streams -= 1
                    # The first chunk, then the connection drops: no [DONE].
                    self.send_sse(stream_chunks(body["model"])[:1], done=False)
                else:
                    self.send_sse(stream_chunks(body["model"]))

        return FlakyHandler

    def close(self) -> None:
        if self.listing_gate is not None:
            self.listing_gate.set()  # a held listing finishes rather than wait out its timeout
        super().close()
