#!/usr/bin/env python3
"""Two kiln binaries measured side by side: `kiln bench MODEL --json` of the OLD and the NEW binary,
alternating run by run (old, new, new, old, old, new ...: each binary goes first half the time),
ROUNDS runs each, on every MODEL. Prints per model and weight format the median prompt and decode
tok/s of each binary and the ratio new / old of the medians, plus the median of the per-round
ratios (each round's new run against the old run next to it).

    python3 scripts/bench_ab.py OLD_KILN NEW_KILN --models M1,M2 [--rounds 6] [--args "--weights bf16,fp8,int4 ..."]

Used for "no speed lost" checks of a refactor (docs/BENCHMARKS.md); a benchmark, never a test."""
import argparse
import json
import statistics
import subprocess
import sys


def bench(kiln, model, extra):
    cmd = [kiln, "bench", model, "--json"] + extra.split()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["weights"]] = (r["prompt_tps"], r["decode_tps"])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--models", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--args", default="--weights bf16,fp8,int4 --prompt 32 --gen 32 --repeat 3")
    a = ap.parse_args()
    for model in a.models.split(","):
        runs = {"old": [], "new": []}
        for r in range(a.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                runs[which].append(bench(a.old if which == "old" else a.new, model, a.args))
            print(f"round {r + 1}/{a.rounds} of {model} done", file=sys.stderr)
        print(f"\n{model}: {a.rounds} alternating runs per binary, `kiln bench {a.args}`")
        print("| weights | prompt tok/s old | new | new/old | decode tok/s old | new | new/old | decode new/old, median of rounds |")
        print("|---|---|---|---|---|---|---|---|")
        for w in runs["old"][0]:
            po = statistics.median(x[w][0] for x in runs["old"])
            pn = statistics.median(x[w][0] for x in runs["new"])
            do = statistics.median(x[w][1] for x in runs["old"])
            dn = statistics.median(x[w][1] for x in runs["new"])
            paired = statistics.median(n[w][1] / o[w][1] for o, n in zip(runs["old"], runs["new"]))
            print(f"| {w} | {po:.1f} | {pn:.1f} | {pn / po:.3f} | {do:.2f} | {dn:.2f} | {dn / do:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
