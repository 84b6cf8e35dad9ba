"""Daytona's official Python SDK, unmodified, against quarry's Daytona-compatible API.

Run by tests/api/daytona_test.cc with DAYTONA_API_URL (http://HOST:PORT/daytona/api) and
DAYTONA_API_KEY (a quarry API token) set, and for `owners` a second user's token in
QUARRY_OTHER_KEY. Each scenario asserts what Daytona's documentation promises and prints one
line per check; any failure ends it with a traceback and exit status 1.

    sdk_scenarios.py lifecycle | files | owners | refusals
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from daytona import (
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConfig,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    DaytonaValidationError,
    ListSandboxesQuery,
    Resources,
    SandboxState,
)


def check(name: str, condition: bool, detail: object = "") -> None:
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def raises(name: str, error_class: type[BaseException], call, says: str = "") -> BaseException:
    try:
        call()
    except error_class as error:
        check(name, says in str(error), f"{type(error).__name__}: {error}")
        return error
    raise AssertionError(f"{name}: no {error_class.__name__} raised")


def client(key: str | None = None) -> Daytona:
    if key is None:
        return Daytona()  # DAYTONA_API_KEY and DAYTONA_API_URL, as users set them
    return Daytona(DaytonaConfig(api_key=key, api_url=os.environ["DAYTONA_API_URL"]))


def lifecycle() -> None:
    daytona = client()
    suite = uuid.uuid4().hex[:8]
    sandbox = daytona.create(
        CreateSandboxFromSnapshotParams(
            labels={"suite": suite, "role": "worker"},
            env_vars={"GREETING": "hello", "SHARED": "from-create"},
            auto_stop_interval=30,
        )
    )
    check("create: started", sandbox.state == "started", sandbox.state)
    check("create: labels", sandbox.labels.get("suite") == suite, sandbox.labels)
    check("create: auto-stop", sandbox.auto_stop_interval == 30, sandbox.auto_stop_interval)
    check("create: toolbox url", sandbox.toolbox_proxy_url.endswith("/daytona/toolbox"),
          sandbox.toolbox_proxy_url)

    run = sandbox.process.exec("echo out; echo err >&2; exit 3")
    check("exec: exit code", run.exit_code == 3, run.exit_code)
    check("exec: output, stderr too", run.result == "out\nerr\n", repr(run.result))

    run = sandbox.process.exec("pwd; echo $GREETING $SHARED $EXTRA", cwd="/tmp",
                               env={"SHARED": "from-exec", "EXTRA": "x"})
    check("exec: cwd and env", run.result == "/tmp\nhello from-exec x\n", repr(run.result))
    run = sandbox.process.exec("pwd")
    check("exec: home by default", run.result.strip() == "/home/sandbox", repr(run.result))

    started = time.monotonic()
    raises("exec: timeout is the SDK's timeout error", DaytonaTimeoutError,
           lambda: sandbox.process.exec("sleep 30", timeout=1), "command execution timeout")
    check("exec: timeout kills at once", time.monotonic() - started < 10,
          time.monotonic() - started)
    check("exec: still usable after a timeout", sandbox.process.exec("true").exit_code == 0)

    same = daytona.get(sandbox.id)
    check("get: same sandbox", same.id == sandbox.id and same.labels == sandbox.labels,
          same.labels)
    check("get: env", same.env.get("GREETING") == "hello", same.env)

    sandbox.set_labels({"suite": suite, "role": "relabelled"})
    check("labels: replaced", daytona.get(sandbox.id).labels.get("role") == "relabelled")
    sandbox.set_autostop_interval(0)
    sandbox.set_auto_delete_interval(60)
    again = daytona.get(sandbox.id)
    check("intervals: stored", again.auto_stop_interval == 0 and again.auto_delete_interval == 60,
          (again.auto_stop_interval, again.auto_delete_interval))
    sandbox.start()  # already running: nothing to do
    check("start: started", sandbox.state == "started", sandbox.state)

    # Stop ends what runs and keeps the files; start makes it usable again.
    sandbox.fs.upload_file(b"kept\n", "kept.txt")
    sandbox.process.exec("nohup sleep 300 >/dev/null 2>&1 &")
    sandbox.stop()
    check("stop: stopped", sandbox.state == "stopped", sandbox.state)
    check("stop: get says stopped", daytona.get(sandbox.id).state == "stopped")
    stopped = [s.id for s in daytona.list(ListSandboxesQuery(labels={"suite": suite},
                                                             states=[SandboxState.STOPPED]))]
    check("stop: listed as stopped", stopped == [sandbox.id], stopped)
    started = [s.id for s in daytona.list(ListSandboxesQuery(labels={"suite": suite},
                                                             states=[SandboxState.STARTED]))]
    check("stop: not listed as started", started == [], started)
    raises("stop: no command runs in a stopped sandbox", DaytonaError,
           lambda: sandbox.process.exec("true"), "is stopped: start it first")
    raises("stop: a stopped sandbox is not stopped again", DaytonaError, sandbox.stop,
           "Sandbox is not started")
    sandbox.start()
    check("start: started again", sandbox.state == "started", sandbox.state)
    check("start: the files are kept", sandbox.fs.download_file("kept.txt") == b"kept\n")
    sleeping = sandbox.process.exec(
        "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c '^sleep$'")
    check("stop: what ran in the background was ended", sleeping.result.strip() == "0",
          repr(sleeping.result))

    # autoDeleteInterval 0: a stop deletes it, as Daytona does.
    ephemeral = daytona.create(CreateSandboxFromSnapshotParams(auto_delete_interval=0))
    ephemeral.stop()
    check("stop with autoDelete 0: destroyed", ephemeral.state == "destroyed", ephemeral.state)
    raises("stop with autoDelete 0: then get is not found", DaytonaNotFoundError,
           lambda: daytona.get(ephemeral.id))

    sandbox.delete()
    raises("delete: then get is not found", DaytonaNotFoundError,
           lambda: daytona.get(sandbox.id))
    listed = [s.id for s in daytona.list(ListSandboxesQuery(labels={"suite": suite}))]
    check("delete: not listed", listed == [], listed)


def files() -> None:
    daytona = client()
    sandbox = daytona.create()
    try:
        blob = bytes(range(256)) * 4096 + b"\r\n--not-a-boundary\r\n\x00"
        sandbox.fs.upload_file(blob, "data/blob.bin")
        back = sandbox.fs.download_file("data/blob.bin")
        check("upload, download: binary content", back == blob, (len(back), len(blob)))
        sandbox.fs.upload_file(b"", "/home/sandbox/empty.txt")
        check("upload, download: empty file", sandbox.fs.download_file("empty.txt") == b"")
        run = sandbox.process.exec("sha256sum data/blob.bin | cut -c1-16; stat -c %U data/blob.bin")
        import hashlib
        check("upload: the sandbox sees the file, its own",
              run.result.split() == [hashlib.sha256(blob).hexdigest()[:16], "sandbox"], run.result)

        sandbox.fs.create_folder("work/sub", "750")
        entries = {f.name: f for f in sandbox.fs.list_files("work")}
        check("create folder, list files", "sub" in entries and entries["sub"].is_dir, entries)
        check("create folder: mode", entries["sub"].permissions == "0750",
              entries["sub"].permissions)
        sandbox.fs.upload_file(b"text\n", "work/sub/a.txt")
        listed = sandbox.fs.list_files("work/sub")
        check("list files: a file", [(f.name, f.size, f.is_dir, f.owner) for f in listed] ==
              [("a.txt", 5, False, "sandbox")], listed)
        sandbox.fs.delete_file("work/sub/a.txt")
        check("delete file", sandbox.fs.list_files("work/sub") == [])
        raises("delete: a directory needs recursive", DaytonaError,
               lambda: sandbox.fs.delete_file("work"), "recursive")
        sandbox.fs.delete_file("work", recursive=True)
        raises("list: a missing directory", DaytonaNotFoundError,
               lambda: sandbox.fs.list_files("work"))
        raises("download: a missing file", DaytonaNotFoundError,
               lambda: sandbox.fs.download_file("nope.txt"))
        check("home dir", sandbox.get_user_home_dir() == "/home/sandbox")
    finally:
        sandbox.delete()


def owners() -> None:
    mine, theirs = client(), client(os.environ["QUARRY_OTHER_KEY"])
    suite = uuid.uuid4().hex[:8]
    first = mine.create(CreateSandboxFromSnapshotParams(labels={"suite": suite, "n": "1"}))
    second = mine.create(CreateSandboxFromSnapshotParams(labels={"suite": suite, "n": "2"}))
    other = theirs.create(CreateSandboxFromSnapshotParams(labels={"suite": suite, "n": "3"}))
    try:
        listed = [s.id for s in mine.list(ListSandboxesQuery(labels={"suite": suite}, limit=1))]
        check("list by labels, page by page: only mine", sorted(listed) ==
              sorted([first.id, second.id]), listed)
        listed = [s.id for s in mine.list(ListSandboxesQuery(labels={"suite": suite, "n": "2"}))]
        check("list: every label must match", listed == [second.id], listed)
        listed = [s.id for s in theirs.list(ListSandboxesQuery(labels={"suite": suite}))]
        check("list: the other user sees theirs", listed == [other.id], listed)
        raises("get: another user's is not found", DaytonaNotFoundError,
               lambda: theirs.get(first.id))
    finally:
        for sandbox in (first, second, other):
            sandbox.delete()


def refusals() -> None:
    daytona = client()
    raises("an image quarry does not have", DaytonaValidationError,
           lambda: daytona.create(CreateSandboxFromImageParams(image="python:3.12")),
           "quarry builds no images")
    raises("more memory than a sandbox may have", DaytonaValidationError,
           lambda: daytona.create(CreateSandboxFromImageParams(
               image="quarry", resources=Resources(memory=64))), "the most a sandbox may have")
    # 2^34 GiB is 2^64 bytes: it wrapped to 0 and passed the check.
    raises("so much memory its bytes wrap", DaytonaValidationError,
           lambda: daytona.create(CreateSandboxFromImageParams(
               image="quarry", resources=Resources(memory=2**34))), "the most a sandbox may have")
    raises("an unknown snapshot", DaytonaValidationError,
           lambda: daytona.create(CreateSandboxFromSnapshotParams(snapshot="nope")),
           "Snapshot nope not found")
    sandbox = daytona.create(CreateSandboxFromImageParams(image="quarry",
                                                          resources=Resources(cpu=1, memory=1)))
    try:
        check("resources within the limits", (sandbox.cpu, sandbox.memory) == (1, 1),
              (sandbox.cpu, sandbox.memory))
    finally:
        sandbox.delete()


if __name__ == "__main__":
    {"lifecycle": lifecycle, "files": files, "owners": owners, "refusals": refusals}[sys.argv[1]]()
    print("passed", flush=True)
