"""The quarry serve benchmark's measurements, against a running server (bench/server.sh starts it).

Prints, from one run:
  1. latency of GET /api/v1/conversations at 50 concurrent clients (wrk), beside GET /healthz,
     the floor of the same HTTP path without the history store;
  2. the server's memory idle and while holding 500 idle event streams (target: under 50 MiB
     more than idle);
  3. the server's own overhead per tool step: a step's wall time as the server measured it
     minus the sandbox's exec time (run plus the provider's overhead), over many python cells
     (target: p50 under 2 ms); and the same seen from the client (the cell's whole HTTP
     exchange minus the command's run time).
Nothing is asserted; the machine is shared and noisy, so quote medians.

usage: server_bench.py URL PID [--streams 500] [--cells 200] [--seconds 10]
"""

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlparse


def request(url, method="GET", body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req) as response:
        return response.read()


def stream_events(url, body):
    """POSTs `body` and returns the stream's events (each the data JSON) once it ends."""
    raw = request(url, "POST", body).decode()
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]


def memory_kib(pid):
    """VmRSS and Pss of the server, in KiB."""
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))
    rollup = open(f"/proc/{pid}/smaps_rollup").read()
    pss = int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))
    return rss, pss


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def wrk(url, seconds, clients):
    """p50, p99 (ms) and requests per second of GET url from wrk."""
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "--latency", url],
        check=True, capture_output=True, text=True).stdout

    def ms(text):
        number, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
        return float(number) * {"us": 0.001, "ms": 1, "s": 1000}[unit]

    p50 = ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return p50, p99, rate, int(non2xx.group(1)) if non2xx else 0


def hold_streams(url, conversation, count):
    """Opens `count` event streams of a conversation and waits until each is answered."""
    parsed = urlparse(url)
    sockets = []
    for _ in range(count):
        s = socket.create_connection((parsed.hostname, parsed.port))
        s.sendall(f"GET /api/v1/conversations/{conversation}/events HTTP/1.1\r\n"
                  f"Host: {parsed.netloc}\r\n\r\n".encode())
        sockets.append(s)
    for s in sockets:
        received = b""
        while b"retry:" not in received:
            received += s.recv(4096)
        if not received.startswith(b"HTTP/1.1 200"):
            sys.exit(f"a stream was refused: {received[:200]!r}")
    return sockets


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("pid", type=int)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    api = args.url + "/api/v1"

    for i in range(200):
        request(api + "/conversations", "POST", {"title": f"conversation {i}"})
    print(f"quarry serve, 200 conversations, 2 cores shared by the server and its clients")
    print(f"{'GET, 50 clients, ' + str(args.seconds) + ' s':44}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'req/s':>10}")
    for name, path in [("/api/v1/conversations (a page of 50)", "/api/v1/conversations"),
                       ("/healthz (the floor: no history store)", "/healthz")]:
        p50, p99, rate, errors = wrk(args.url + path, args.seconds, 50)
        print(f"{name:44}{p50:9.2f}{p99:9.2f}{rate:10.0f}"
              + (f"  ({errors} errors)" if errors else ""))

    watched = json.loads(request(api + "/conversations", "POST", {"title": "watched"}))["id"]
    time.sleep(1)
    idle_rss, idle_pss = memory_kib(args.pid)
    streams = hold_streams(args.url, watched, args.streams)
    time.sleep(1)
    held_rss, held_pss = memory_kib(args.pid)
    print(f"\nserver memory, idle:                   RSS {idle_rss / 1024:7.1f} MiB, "
          f"PSS {idle_pss / 1024:7.1f} MiB")
    print(f"server memory, {args.streams} idle streams:      RSS {held_rss / 1024:7.1f} MiB, "
          f"PSS {held_pss / 1024:7.1f} MiB")
    print(f"  {args.streams} idle streams cost {(held_rss - idle_rss) / 1024:.1f} MiB RSS "
          f"({(held_rss - idle_rss) / args.streams:.1f} KiB each); target: under 50 MiB more "
          f"than idle")
    for s in streams:
        s.close()

    cells = json.loads(request(api + "/conversations", "POST", {"title": "cells"}))["id"]
    stream_events(f"{api}/conversations/{cells}/cells", {"kind": "python", "code": "pass"})
    server_overhead, client_overhead, runs = [], [], []
    for _ in range(args.cells):
        started = time.perf_counter()
        events = stream_events(f"{api}/conversations/{cells}/cells",
                               {"kind": "python", "code": "pass"})
        whole = (time.perf_counter() - started) * 1000
        step = next(e for e in events if e["type"] == "tool_finished")
        exec_ms = step["exec"]["run_ms"] + step["exec"]["overhead_ms"]
        server_overhead.append(step["elapsed_ms"] - exec_ms)
        client_overhead.append(whole - step["exec"]["run_ms"])
        runs.append(step["exec"]["run_ms"])
    print(f"\n{args.cells} python cells ('pass'), one after another, in one sandbox:")
    print(f"{'':44}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for name, values in [
            ("step wall time - sandbox exec time (server)", server_overhead),
            ("whole HTTP turn - command run time (client)", client_overhead),
            ("the step's run time in the kernel", runs)]:
        print(f"{name:44}{statistics.median(values):9.2f}{percentile(values, 0.9):9.2f}"
              f"{percentile(values, 0.99):9.2f}")
    print("  target: the server's own overhead per tool step, p50 under 2 ms")


if __name__ == "__main__":
    main()
