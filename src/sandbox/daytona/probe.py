# quarry's probe around one command in a remote (Daytona) sandbox: runs the command in a
# session of its own, keeps at most LIMIT bytes of its stdout and of its stderr, kills its
# process group after TIMEOUT seconds, and prints one report line for quarry: the exit status,
# the output, run time, CPU time (the command and every child it waited for), peak memory
# (its cgroup's peak, reset for the command where the sandbox allows it, else the largest
# child's resident set), the memory limit (the tightest on its cgroup and those above) and OOM
# kills (its cgroup's oom_kill count before and after).
#
#   python3 -I -S -c PROBE LIMIT TIMEOUT -- ARGV...
#
# -I -S: no site module, user site or PYTHON* variables, so it starts in about half the time
# (no .pth file of the sandbox's packages runs) and the command's environment cannot change it.
# Nor does it import subprocess (threading and more): the command starts with posix_spawn.
# Running commands are listed in /tmp/quarry-probe/<pid> (their process group), for quarry's
# stop_commands. Only the standard library: it runs in whatever Python the sandbox has.
import json
import os
import selectors
import signal
import sys
import time

MARKER = "\x1equarry-probe "
STATE = "/tmp/quarry-probe"


def own_cgroup():
    """This process's memory cgroup directory as the sandbox mounts it (v2, else v1's memory
    hierarchy), and the mount's root; the root alone where the path is not visible."""
    try:
        with open("/proc/self/cgroup") as file:
            lines = file.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root = "/sys/fs/cgroup"
        elif "memory" in controllers.split(","):
            root = "/sys/fs/cgroup/memory"
        else:
            continue
        if os.path.exists(os.path.join(root, "memory.events" if controllers == "" else "memory.oom_control")):
            own = os.path.normpath(root + path)
            return (own if os.path.isdir(own) else root), root
    return None, None


CGROUP, CGROUP_ROOT = own_cgroup()


def read(name, directory=None):
    try:
        with open(os.path.join(directory or CGROUP, name)) as file:
            return file.read()
    except (OSError, TypeError):
        return None


def oom_kills():
    text = read("memory.events") or read("memory.oom_control")
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


def memory_limit():
    """The tightest limit on this cgroup and those above it."""
    limits, directory = [], CGROUP
    while directory and directory.startswith(CGROUP_ROOT):
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = read(name, directory)
            if text and text.strip().isdigit() and int(text) < 1 << 60:
                limits.append(int(text))
        if directory == CGROUP_ROOT:
            break
        directory = os.path.dirname(directory)
    return min(limits) if limits else 0


def reset_peak():
    """The cgroup's peak memory, reset to now for this command; None where it cannot be reset
    (then the largest child's resident set is the peak)."""
    for name, reset in (("memory.peak", b"reset"), ("memory.max_usage_in_bytes", b"0")):
        try:
            file = os.open(os.path.join(CGROUP, name), os.O_RDWR)
        except (OSError, TypeError):
            continue
        try:
            os.write(file, reset)
            return file
        except OSError:
            os.close(file)
    return None


def read_peak(file):
    if file is None:
        return None
    try:
        return int(os.pread(file, 64, 0))
    except (OSError, ValueError):
        return None


def main():
    limit, timeout = int(sys.argv[1]), float(sys.argv[2])
    argv = sys.argv[4:]
    report = {"stdout": "", "stderr": "", "truncated": False}
    os.makedirs(STATE, exist_ok=True)
    oom_before = oom_kills()
    peak = reset_peak()
    start = time.monotonic()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        pid = os.posix_spawnp(argv[0], argv, os.environ, setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_write, 1),
            (os.POSIX_SPAWN_DUP2, err_write, 2)])
    except OSError as error:
        report.update(exit_code=127, stderr=f"{argv[0]}: {error.strerror}\n", run_ms=0)
        print(MARKER + json.dumps(report), flush=True)
        return
    finally:
        os.close(out_write)
        os.close(err_write)
    listed = os.path.join(STATE, str(pid))
    with open(listed, "w") as file:
        file.write(str(pid))
    kept = {"stdout": bytearray(), "stderr": bytearray()}
    selector = selectors.DefaultSelector()
    selector.register(out_read, selectors.EVENT_READ, "stdout")
    selector.register(err_read, selectors.EVENT_READ, "stderr")
    deadline = start + timeout if timeout > 0 else None
    timed_out = False
    while selector.get_map():
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = selector.select(wait)
        if not ready and deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            deadline = None
            continue
        for key, _ in ready:
            chunk = os.read(key.fileobj, 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                continue
            buffer = kept[key.data]
            room = limit - len(buffer)
            if len(chunk) > room:
                report["truncated"] = True
            buffer += chunk[:max(room, 0)]
    # The command's own usage, with every child it waited for.
    _, raw_status, usage = os.wait4(pid, 0)
    status = os.waitstatus_to_exitcode(raw_status)
    run_ms = (time.monotonic() - start) * 1000
    # What the command left running after it closed its output ends with it, as locally.
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.unlink(listed)
    except FileNotFoundError:  # stop_commands took it
        pass
    oom_after = oom_kills()
    cgroup_peak = read_peak(peak)
    report.update(
        stdout=kept["stdout"].decode("utf-8", "replace"),
        stderr=kept["stderr"].decode("utf-8", "replace"),
        exit_code=status if status >= 0 else 128 - status,
        signal=-status if status < 0 else None,
        timed_out=timed_out,
        run_ms=run_ms,
        cpu_ms=(usage.ru_utime + usage.ru_stime) * 1000,
        peak_memory_bytes=cgroup_peak if cgroup_peak is not None else usage.ru_maxrss * 1024,
        memory_limit_bytes=memory_limit(),
        oom=oom_before is not None and oom_after is not None and oom_after > oom_before,
    )
    print(MARKER + json.dumps(report), flush=True)


main()
