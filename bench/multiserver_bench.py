"""Turns per second and step latency through one or several quarry servers sharing a history.

Each of --conversations clients has a conversation of its own, made through the servers in
turn (client i through server i mod N), and runs python cells (`print(1)`, one step each) until
--cells have run between them; the first cell of each conversation (its sandbox's start) is not
counted. Prints one row: the servers, turns per second over the whole run, the p50 / p99 of
one turn's exchange (POST .../cells until its stream ends) as the client sees it, and turns
that did not complete. Asserts nothing.

usage: multiserver_bench.py URL [URL ...] [--conversations 8] [--cells 400]
"""

import argparse
import json
import threading
import time
import urllib.request


def request(url, method="GET", body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=300) as response:
        return response.read()


def cell(url, conversation):
    """Runs one python cell; its final status."""
    raw = request(f"{url}/api/v1/conversations/{conversation}/cells", "POST",
                  {"kind": "python", "code": "print(1)"}).decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    return events[-1].get("status") if events else None


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--cells", type=int, default=400)
    args = parser.parse_args()

    clients = []
    for i in range(args.conversations):
        url = args.urls[i % len(args.urls)]
        made = json.loads(request(f"{url}/api/v1/conversations", "POST",
                                  {"title": f"bench {i}"}))
        clients.append((url, made["id"]))
    for url, conversation in clients:  # each sandbox started, not counted
        assert cell(url, conversation) == "completed"

    left = [args.cells]
    lock = threading.Lock()
    latencies, failures = [], []

    def work(url, conversation):
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            start = time.perf_counter()
            status = cell(url, conversation)
            elapsed = (time.perf_counter() - start) * 1000
            with lock:
                (latencies if status == "completed" else failures).append(elapsed)

    threads = [threading.Thread(target=work, args=client) for client in clients]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    # One row of bench/multiserver.sh's table: servers, turns/s, p50, p99, failed.
    print(f"{len(args.urls):<10} {len(latencies) / seconds:12.1f} "
          f"{percentile(latencies, 0.5):10.1f} {percentile(latencies, 0.99):10.1f} "
          f"{len(failures):8}")


if __name__ == "__main__":
    main()
