"""Speed of the model arm's harness: the scripted model (tests/model/chat_server.py) in its own
process over loopback, the arm's whole loop (requests, transcripts, the engine, the rows) in this
one, at concurrency 1 and 4, into fresh folders.

    .venv/bin/python benchmarks/model_harness.py [--seeds 2]

Reports requests/s, the client-side latency of a request (the HTTP round trip through the
`openai` client, the scripted model's work included) and the harness's own overhead per request
at concurrency 1: wall time minus the summed latencies, over the requests.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def serve(queue) -> None:
    from tests.model.chat_server import ChatServer
    server = ChatServer(policy="sop")
    queue.put(server.base_url)
    while True:
        time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    os.environ["TEST_KEY"] = "test-key"
    from agents.model import ModelConfig
    from eval.models.arm import grade_model, run_config

    queue = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(queue,), daemon=True)
    server.start()
    base_url = queue.get(timeout=60)
    config = ModelConfig(model="scripted-model", base_url=base_url, api_key_env="TEST_KEY")
    rc = run_config(config, "public", "stratified", args.seeds, "full")
    try:
        for concurrency in (1, 4):
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                rows = grade_model(config, rc, Path(tmp), concurrency, progress=False)
                wall = time.perf_counter() - started
                latencies = [json.loads(line)["latency_s"]
                             for p in Path(tmp, "transcripts").glob("*.jsonl")
                             for line in p.read_text().splitlines()]
            requests = sum(r["requests"] for r in rows)
            line = (f"concurrency {concurrency}: {len(rows)} episodes, {requests} requests in "
                    f"{wall:.2f} s: {requests / wall:,.0f} requests/s, mean latency "
                    f"{1000 * sum(latencies) / len(latencies):.2f} ms")
            if concurrency == 1:
                line += (f", harness overhead {1000 * (wall - sum(latencies)) / requests:.2f} ms"
                         " a request")
            print(line, flush=True)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
