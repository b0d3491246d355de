"""Rows per second of `regenerate` through `--server`, against the fake server of the tests with a fixed latency per request.

    python tests/bench_regenerate_server.py [--latency 0.5] [--concurrency 1 64 256] [--batch_size 8]

One JSON line per concurrency: rows, seconds, rows/s, the most requests the server saw in flight, and the ideal rows/s
(concurrency / latency). Not a test (pytest does not collect it); the fake server and this client share the CPU."""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake_openai import FakeServer  # noqa: E402

from domino_research.regenerate import OpenAIServer, regenerate  # noqa: E402


def bench(concurrency: int, rows: int, latency: float, batch_size: int) -> dict:
    data = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(rows)]
    with FakeServer(latency=latency, lifetime=900) as srv, tempfile.TemporaryDirectory() as d:
        server = OpenAIServer(srv.url, concurrency=concurrency)
        t0 = time.perf_counter()
        regenerate(server, None, data, Path(d) / "out.jsonl", max_new_tokens=8, batch_size=batch_size, progress=False)
        seconds = time.perf_counter() - t0
        assert len((Path(d) / "out.jsonl").read_text().splitlines()) == rows
    return dict(
        concurrency=concurrency,
        batch_size=batch_size,
        rows=rows,
        seconds=round(seconds, 2),
        rows_per_s=round(rows / seconds, 1),
        max_in_flight=srv.max_in_flight,
        ideal_rows_per_s=round(concurrency / latency, 1),
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latency", type=float, default=0.5, help="seconds the server takes per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--batch_size", type=int, default=8, help="the default of the command line")
    p.add_argument("--rounds", type=int, default=4, help="rows = rounds x concurrency (at least 8)")
    a = p.parse_args()
    for c in a.concurrency: print(json.dumps(bench(c, max(8, a.rounds * c), a.latency, a.batch_size)), flush=True)
