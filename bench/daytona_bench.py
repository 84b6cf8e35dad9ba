"""bench/daytona.sh's half with Daytona's SDK: each call timed in the SDK's own process, so a
figure is the HTTP round trip and quarry's work (the SDK's Python included), not a process
start. Prints one line per call: p50 and p90 in milliseconds.

    DAYTONA_API_URL=... DAYTONA_API_KEY=... daytona_bench.py RUNS
"""

from __future__ import annotations

import sys
import time

from daytona import Daytona


def timed(call):
    started = time.perf_counter()
    value = call()
    return value, (time.perf_counter() - started) * 1000


def line(name: str, samples: list[float]) -> None:
    samples = sorted(samples)
    p50, p90 = samples[int(0.5 * (len(samples) - 1))], samples[int(0.9 * (len(samples) - 1))]
    print(f"{name:52} {p50:9.2f} {p90:9.2f}", flush=True)


def main(runs: int) -> None:
    daytona = Daytona()
    daytona.delete(daytona.create())  # the first connection and imports are not measured
    create, execute, delete, whole = [], [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        sandbox, ms = timed(daytona.create)
        create.append(ms)
        result, ms = timed(lambda: sandbox.process.exec("true"))
        assert result.exit_code == 0, result
        execute.append(ms)
        _, ms = timed(sandbox.delete)
        delete.append(ms)
        whole.append((time.perf_counter() - started) * 1000)
    sandbox = daytona.create()
    again = []
    try:
        for _ in range(runs):
            _, ms = timed(lambda: sandbox.process.exec("true"))
            again.append(ms)
    finally:
        sandbox.delete()
    print(f"{'':52} {'p50':>9} {'p90':>9}")
    line("SDK create", create)
    line("SDK process.exec('true'), first in its sandbox", execute)
    line("SDK delete", delete)
    line("SDK create + exec + delete", whole)
    line("SDK process.exec('true') in one sandbox", again)


if __name__ == "__main__":
    main(int(sys.argv[1]))
