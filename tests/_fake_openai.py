"""A fake OpenAI-compatible chat server on 127.0.0.1 for the regenerate tests and benchmark: scripted faults, latency, stops by
itself."""
import http.server
import json
import threading
import time


def reply(text, tokens=3, finish="stop"):
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"completion_tokens": tokens}}


def echo(n, body):
    "The default answer: the last prompt, echoed."
    return reply(f"echo: {body['messages'][-1]['content']}")


class FakeServer:
    """`with FakeServer(script) as srv:` serves `srv.url`. `script(n, body)` says what the n-th chat request (from 0) gets:
    a dict (200, JSON), ("status", code), ("raw", bytes), "hang" (no answer until the server stops), "drop" (the connection
    closed without a reply), "cut" (half the reply, then closed) or ("drip", seconds) (the reply one byte every `seconds`).
    It stops by itself after `lifetime` seconds."""

    def __init__(self, script=echo, models=None, latency=0.0, lifetime=60.0):
        self.script, self.latency, self.models = script, latency, models or {"data": [{"id": "fake"}]}
        self.requests, self.in_flight, self.max_in_flight = 0, 0, 0
        self.lock, self.stopping = threading.Lock(), threading.Event()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *a): pass

            def send(self, code, data: bytes, cut=False, drip=0.0):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if drip:
                    for i in range(len(data)):
                        if fake.stopping.wait(drip): break
                        self.wfile.write(data[i: i + 1])
                        self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data[: len(data) // 2] if cut else data)
                self.close_connection = cut

            def do_GET(self): self.send(200, json.dumps(fake.models).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    n = fake.requests
                    fake.requests += 1
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.latency)
                    what = fake.script(n, body)
                finally:   # counted out before replying: the client's next request may come before this thread runs on
                    with fake.lock: fake.in_flight -= 1
                if what == "hang":
                    fake.stopping.wait()
                    self.close_connection = True
                elif what == "drop": self.close_connection = True
                elif what == "cut": self.send(200, json.dumps(echo(n, body)).encode(), cut=True)
                elif isinstance(what, tuple) and what[0] == "status": self.send(what[1], b'{"error": {"message": "scripted"}}')
                elif isinstance(what, tuple) and what[0] == "raw": self.send(200, what[1])
                elif isinstance(what, tuple) and what[0] == "drip":
                    self.send(200, json.dumps(echo(n, body)).encode(), drip=what[1])
                else: self.send(200, json.dumps(what).encode())

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads, request_queue_size = True, 1024     # many connections at once (the benchmark)
        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.timer = threading.Timer(lifetime, self.stop)

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.timer.daemon = True
        self.timer.start()
        return self

    def stop(self):
        if self.stopping.is_set(): return
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __exit__(self, *exc):
        self.timer.cancel()
        self.stop()
