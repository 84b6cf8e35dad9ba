"""The capacity benchmark: many conversations share a few sandboxes through the real API.

Each run starts `quarry serve` (its own state directory, tokens for USERS users, a limit of
--sandboxes sandboxes), then --conversations simulated conversations, spread over the users, each
run --steps short Python cells with a think time of 0.5 to 2 s between them, all at once. A
client told 429 waits the Retry-After it was given and sends again, as a polite client would.
The same load runs twice, side by side: without a warm pool (every sandbox started on a turn's
time) and with one (--warm sandboxes kept ready).

Printed for each run, from the clients' streams and the server's own figures
(GET /api/v1/sandboxes):
  - turns completed and lost (target: 0 lost), and 429s answered;
  - time in the queue for a sandbox, p50 and p99 (sandbox_ready's waited_ms);
  - first-step latency (POST to done of a conversation's first cell), split by whether its
    sandbox came cold or warm; and the acquire after the queue, cold and warm (target: warm
    p50 under 1 ms);
  - evictions, timeouts;
  - host memory per idle sandbox: the unreclaimable memory the host gave up while the last
    sandboxes sat idle, per sandbox, and their init's PSS;
  - what is left once the server stopped: sandboxes, cgroups, mounts, processes (target: none).
Nothing is asserted; the machine is shared and noisy, so quote medians.

usage: capacity_bench.py QUARRY STATE_DIR [--conversations 200] [--users 20] [--steps 3]
                         [--sandboxes 8] [--warm 2]
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def percentile(values, fraction):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


class Client:
    def __init__(self, url, token):
        self.url = url
        self.token = token

    def _request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        return urllib.request.urlopen(request, timeout=600)

    def json(self, method, path, body=None):
        with self._request(method, path, body) as response:
            return json.loads(response.read() or b"null")

    def cell(self, conversation, code):
        """Runs a cell; returns (events, refusals). Retries after 429 as told."""
        refusals = 0
        while True:
            try:
                with self._request("POST", f"/api/v1/conversations/{conversation}/cells",
                                   {"kind": "python", "code": code}) as response:
                    raw = response.read().decode()
                return [json.loads(line[6:]) for line in raw.splitlines()
                        if line.startswith("data: ")], refusals
            except urllib.error.HTTPError as error:
                if error.code != 429:
                    raise
                refusals += 1
                time.sleep(int(error.headers.get("Retry-After", "1")))


def meminfo_kib():
    values = {}
    for line in open("/proc/meminfo"):
        key, rest = line.split(":", 1)
        values[key] = int(rest.split()[0])
    return values


UNRECLAIMABLE = ("AnonPages", "Shmem", "SUnreclaim", "KernelStack", "PageTables", "Percpu")


def unreclaimable_kib():
    info = meminfo_kib()
    return sum(info.get(key, 0) for key in UNRECLAIMABLE)


def pss_kib(pid):
    try:
        rollup = open(f"/proc/{pid}/smaps_rollup").read()
    except OSError:
        return 0
    return int(re.search(r"^Pss:\s+(\d+) kB", rollup, re.M).group(1))


def quarry_cgroups():
    """Every cgroup under a 'quarry' parent, in every hierarchy."""
    found = set()
    for hierarchy in os.listdir("/sys/fs/cgroup"):
        parent = os.path.join("/sys/fs/cgroup", hierarchy, "quarry")
        if os.path.isdir(parent):
            for name in os.listdir(parent):
                if os.path.isdir(os.path.join(parent, name)):
                    found.add(f"{hierarchy}/quarry/{name}")
    return found


def sandbox_mounts(state):
    """Mounts of sandboxes: under the volume, <state>/sandboxes/... (the volume itself, mounted
    once for the state directory, stays for the next run by design)."""
    volume = os.path.join(state, "sandboxes") + "/"
    return {line.split()[4] for line in open("/proc/self/mountinfo")
            if line.split()[4].startswith(volume)}


def init_processes():
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if open(f"/proc/{pid}/comm").read().strip() == "quarry-init":
                    found.add(int(pid))
            except OSError:
                pass
    return found


def run(args, warm):
    state = os.path.join(args.state_dir, f"warm{warm}")
    os.makedirs(state, exist_ok=True)
    config = os.path.join(state, "bench.yml")
    with open(config, "w") as out:
        out.write(f"""server:
  listen: 127.0.0.1:0
  workers: 64
model:
  api_key_env: QUARRY_BENCH_NO_MODEL   # no model: questions are refused, cells run
conversations:
  instance_id: capacity-bench
capacity:
  max_sandboxes: {args.sandboxes}
  warm_pool: {{min_idle: {warm}}}
""")
    quarry = [args.quarry, "--config", config, "--state-dir", state, "--log-level", "warn"]
    tokens = {}
    tokens_file = os.path.join(state, "tokens.json")
    if os.path.exists(tokens_file):
        os.remove(tokens_file)
    for i in range(args.users):
        out = subprocess.run(quarry + ["token", "create", f"user{i}"], check=True,
                             capture_output=True, text=True).stdout
        tokens[f"user{i}"] = out.splitlines()[0]

    cgroups_before, inits_before = quarry_cgroups(), init_processes()
    mounts_before = sandbox_mounts(state)
    stdout = open(os.path.join(state, "stdout"), "w")
    log = open(os.path.join(state, "server.log"), "w")
    server = subprocess.Popen(quarry + ["serve"], stdout=stdout, stderr=log)
    url = None
    for _ in range(200):
        text = open(os.path.join(state, "stdout")).read()
        match = re.search(r"serving on (\S+)", text)
        if match:
            url = match.group(1)
            break
        time.sleep(0.05)
    if not url:
        server.kill()
        sys.exit("quarry serve did not start; see " + os.path.join(state, "server.log"))
    if warm:
        time.sleep(1)  # the pool fills
    baseline = unreclaimable_kib()

    results = []
    lock = threading.Lock()

    def conversation(index):
        client = Client(url, tokens[f"user{index % args.users}"])
        rng = random.Random(index)
        conversation_id = client.json("POST", "/api/v1/conversations",
                                      {"title": f"bench {index}"})["id"]
        for step in range(args.steps):
            started = time.monotonic()
            expected = str(sum(range(1000 + step)))
            try:
                events, refusals = client.cell(conversation_id, f"print(sum(range({1000 + step})))")
                status = events[-1].get("status") if events else "no events"
                finished = [e for e in events if e.get("type") == "tool_finished"]
                if status == "completed" and not (finished and finished[0]["ok"]
                                                  and expected in finished[0]["content"]):
                    status = "step failed: " + (finished[0]["content"][:200] if finished else "?")
            except Exception as error:  # a lost turn, whatever the cause
                events, refusals, status = [], 0, f"error: {error}"
            elapsed = (time.monotonic() - started) * 1000
            ready = [e for e in events if e.get("type") == "sandbox"
                     and e.get("kind") == "sandbox_ready"]
            with lock:
                results.append({"step": step, "status": status, "ms": elapsed,
                                "refusals": refusals,
                                "ready": ready[0]["details"] if ready else None})
            time.sleep(rng.uniform(0.5, 2.0))

    started = time.monotonic()
    threads = [threading.Thread(target=conversation, args=(i,))
               for i in range(args.conversations)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started

    # Quiet now: the sandboxes left are idle (or warm).
    time.sleep(1)
    admin = Client(url, tokens["user0"])
    capacity = admin.json("GET", "/api/v1/sandboxes")["capacity"]
    held = sum(capacity["sandboxes"].values())
    idle_kib = (unreclaimable_kib() - baseline) / max(held, 1)
    sandboxes_dir = os.path.join(state, "sandboxes")
    init_pss = []
    for name in os.listdir(sandboxes_dir) if os.path.isdir(sandboxes_dir) else []:
        record = os.path.join(sandboxes_dir, name, "sandbox.json")
        if os.path.exists(record):
            init_pss.append(pss_kib(json.load(open(record))["init_pid"]))

    server.send_signal(signal.SIGTERM)
    server.wait(timeout=120)
    listed = subprocess.run(quarry + ["sandbox", "ls"], capture_output=True, text=True).stdout
    left = {
        "sandboxes": max(0, len(listed.strip().splitlines()) - 1),
        "cgroups": len(quarry_cgroups() - cgroups_before),
        "mounts": len(sandbox_mounts(state) - mounts_before),
        "processes": len(init_processes() - inits_before),
    }

    completed = [r for r in results if r["status"] == "completed"]
    waits = [r["ready"]["waited_ms"] for r in results if r["ready"]]
    first = {"cold": [], "warm": []}
    for r in results:
        if r["step"] == 0 and r["ready"] and r["status"] == "completed":
            first[r["ready"]["start"]].append(r["ms"])
    acquire = {kind: [r["ready"]["acquire_ms"] for r in results
                      if r["ready"] and r["ready"]["start"] == kind] for kind in ("cold", "warm")}
    return {
        "wall_s": wall,
        "turns": len(results),
        "completed": len(completed),
        "lost": len(results) - len(completed),
        "lost_examples": sorted({r["status"] for r in results if r["status"] != "completed"})[:3],
        "refusals": sum(r["refusals"] for r in results),
        "wait_p50": percentile(waits, 0.5),
        "wait_p99": percentile(waits, 0.99),
        "first_cold_p50": percentile(first["cold"], 0.5),
        "first_warm_p50": percentile(first["warm"], 0.5),
        "first_cold_n": len(first["cold"]),
        "first_warm_n": len(first["warm"]),
        "acquire_cold_p50": percentile(acquire["cold"], 0.5),
        "acquire_warm_p50": percentile(acquire["warm"], 0.5),
        "acquire_warm_server_p50": capacity["starts"]["warm_p50_ms"],
        "cold_starts": capacity["starts"]["cold"],
        "warm_starts": capacity["starts"]["warm"],
        "evictions": capacity["evictions"],
        "timeouts": capacity["timeouts"],
        "held_at_end": held,
        "idle_kib": idle_kib,
        "init_pss_kib": statistics.mean(init_pss) if init_pss else float("nan"),
        "left": left,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("quarry")
    parser.add_argument("state_dir")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=8)
    parser.add_argument("--warm", type=int, default=2)
    args = parser.parse_args()

    print(f"{args.conversations} conversations of {args.users} users, {args.steps} python cells "
          f"each (think 0.5-2 s), {args.sandboxes} sandboxes, {os.cpu_count()} cores\n")
    cold = run(args, 0)
    warm = run(args, args.warm)

    def row(label, key, unit="", fmt="{:.2f}"):
        a, b = cold[key], warm[key]
        show = lambda v: (fmt.format(v) if isinstance(v, float) else str(v)) + unit
        print(f"  {label:<44}{show(a):>16}{show(b):>16}")

    print(f"  {'':<44}{'no warm pool':>16}{'warm pool ' + str(args.warm):>16}")
    row("wall time", "wall_s", " s", "{:.1f}")
    row("turns", "turns")
    row("completed", "completed")
    row("lost (target 0)", "lost")
    row("429 answered, then retried", "refusals")
    row("queue wait p50", "wait_p50", " ms")
    row("queue wait p99", "wait_p99", " ms")
    row("first step, cold sandbox: p50", "first_cold_p50", " ms", "{:.1f}")
    row("  (conversations)", "first_cold_n")
    row("first step, warm sandbox: p50", "first_warm_p50", " ms", "{:.1f}")
    row("  (conversations)", "first_warm_n")
    row("acquire after the queue, cold: p50", "acquire_cold_p50", " ms", "{:.3f}")
    row("acquire after the queue, warm: p50 (<1 ms)", "acquire_warm_p50", " ms", "{:.3f}")
    row("cold starts", "cold_starts")
    row("warm starts", "warm_starts")
    row("evictions", "evictions")
    row("queue timeouts", "timeouts")
    row("sandboxes held at the end", "held_at_end")
    row("host memory per idle sandbox", "idle_kib", " KiB", "{:.0f}")
    row("  of which init's PSS", "init_pss_kib", " KiB", "{:.0f}")
    for key in ("sandboxes", "cgroups", "mounts", "processes"):
        print(f"  {'left after stop: ' + key:<44}{cold['left'][key]:>16}{warm['left'][key]:>16}")
    for result, name in ((cold, "no warm pool"), (warm, "warm pool")):
        if result["lost_examples"]:
            print(f"\n  lost turns ({name}): {result['lost_examples']}")


if __name__ == "__main__":
    main()
