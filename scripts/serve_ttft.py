#!/usr/bin/env python3
"""Time to first token of `kiln serve`: starts the server on MODEL, sends ROUNDS streamed completions of
a PROMPT-token prompt (random token ids, different in every request so the prefix cache never
serves one) with max_tokens 1, and prints the time from sending each request to the first streamed
chunk that carries text, and the median. A benchmark, never a test; several binaries are measured
alternately with --kiln OLD,NEW.

    python3 scripts/serve_ttft.py MODEL [--kiln ./kiln,/tmp/kiln_old] [--prompt 2048] [--rounds 3] [--args "--threads 2"]
"""
import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(port, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return
        except Exception:
            time.sleep(0.5)
    sys.exit("server did not become ready")


def model_id(port):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())["data"][0]["id"]


def ttft(port, ids):
    body = json.dumps({"model": model_id(port), "prompt": ids, "max_tokens": 1, "stream": True, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if line.startswith(b"data: {") and b'"text"' in line:
                return time.perf_counter() - t0
    sys.exit("no streamed token")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--kiln", default="./kiln")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--args", default="")
    a = ap.parse_args()
    rng = random.Random(1)
    results = {k: [] for k in a.kiln.split(",")}
    for rnd in range(a.rounds):
        order = list(results) if rnd % 2 == 0 else list(reversed(results))
        for kiln in order:
            port = free_port()
            proc = subprocess.Popen([kiln, "serve", a.model, "--port", str(port)] + a.args.split(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                wait_ready(port, proc)
                ttft(port, [rng.randrange(3, a.vocab) for _ in range(16)])  # warm-up: first-use allocations
                t = ttft(port, [rng.randrange(3, a.vocab) for _ in range(a.prompt)])
                results[kiln].append(t)
                print(f"round {rnd + 1}: {kiln}: TTFT {t * 1e3:.0f} ms for {a.prompt} prompt tokens", flush=True)
            finally:
                proc.terminate()
                proc.wait()
    for kiln, ts in results.items():
        print(f"{kiln}: median TTFT {statistics.median(ts) * 1e3:.0f} ms over {len(ts)} rounds ({a.prompt} tokens)")


if __name__ == "__main__":
    main()
