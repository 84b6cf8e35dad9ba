"""quarry's Python kernel: one long-lived interpreter per conversation, inside its sandbox.

quarry starts it with `python -c` and its stdin connected to a unix socket. Frames on that
socket are a 4-byte little-endian length, then UTF-8 JSON. Requests:
  {"type": "hello"}                          -> {"type": "ready", "python": "3.11.7", ...}
  {"type": "run", "code", "filename", "output_dir", "step"}
                                             -> {"type": "done", "status": "ok" | "error" |
                                                 "interrupted", "error", "figures", "names",
                                                 "run_ms", "cpu_ms"}
  {"type": "interrupt"}                      (no answer: the running step gets
                                              KeyboardInterrupt)
The code's output goes to stdout and stderr as it is written, like any command's; a step's
answer comes once all of it is out. The value of a last expression is printed (a DataFrame as
its table), and matplotlib figures left open are saved as PNG files in the output directory.
"""
import ast
import builtins
import importlib.abc
import importlib.util
import json
import os
import queue
import resource
import signal
import struct
import sys
import threading
import time
import traceback
import types

CHANNEL = os.dup(0)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.stdin = open(os.devnull)
MAX_NAMES = 50
MAX_VALUE = 20_000

requests = queue.Queue()
running = threading.Event()
steps_begun = 0  # which step `running` is of
write_lock = threading.Lock()


def send(message):
    # Text from the code (an error's message, a name) may hold lone surrogates, which are no
    # UTF-8: they go as '?' rather than as escapes the host cannot read.
    body = json.dumps(message, ensure_ascii=False).encode("utf-8", errors="replace")
    with write_lock:
        os.write(CHANNEL, struct.pack("<I", len(body)) + body)


def read_exactly(size):
    data = b""
    while len(data) < size:
        chunk = os.read(CHANNEL, size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def interrupt(step):
    """SIGINT to the main thread, where the step runs, again every 0.2 s while that step runs.
    A signal that comes just before a blocking call (a sleep, a read) is taken before the call
    begins and does not end it: only the next one does. Sent to the process instead, it could be
    taken by another thread, which does not end the main thread's call either."""
    while running.is_set() and steps_begun == step:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(0.2)


def reader():
    """Takes requests off the channel; an interrupt is acted on at once."""
    try:
        while True:
            (length,) = struct.unpack("<I", read_exactly(4))
            message = json.loads(read_exactly(length))
            if message.get("type") == "interrupt":
                if running.is_set():
                    threading.Thread(target=interrupt, args=(steps_begun,), daemon=True).start()
            else:
                requests.put(message)
    except (EOFError, OSError, ValueError):
        requests.put(None)  # quarry is gone: so is the kernel


def describe(value):
    """A name's value in a few words: its type, and its shape or length."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    if isinstance(value, types.ModuleType):
        return "module"
    # A DuckDB relation's shape runs its query again: not after every step.
    if kind.__module__.split(".")[0] == "duckdb":
        return name
    try:
        shape = getattr(value, "shape", None)
    except Exception:  # the code's own property, which may fail (a closed connection)
        shape = None
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        return f"{name} {' x '.join(str(n) for n in shape)}"
    if isinstance(value, (list, tuple, dict, set, str, bytes)):
        return f"{name} of {len(value)}"
    return name


def held_names(namespace):
    names = []
    for key, value in namespace.items():
        if key.startswith("_") or key in ("In", "Out"):
            continue
        names.append({"name": key, "type": describe(value)})
        if len(names) == MAX_NAMES:
            break
    return names


def show(value):
    """Prints a last expression's value, as a REPL does; a DataFrame as its table."""
    if value is None:
        return
    try:
        text = str(value) if hasattr(value, "shape") and hasattr(value, "columns") else repr(value)
    except Exception as error:  # a value whose repr fails still ends the step well
        text = f"<{type(value).__name__}: its repr failed: {error}>"
    if len(text) > MAX_VALUE:
        text = text[:MAX_VALUE] + f"\n... ({len(text) - MAX_VALUE} more characters)"
    print(text, flush=True)


class TrackSavefig(importlib.abc.MetaPathFinder):
    """Marks each matplotlib figure the code saves itself, so it is not saved twice."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.figure":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            savefig = module.Figure.savefig

            def tracked(figure, *args, **kwargs):
                figure._quarry_saved = True
                return savefig(figure, *args, **kwargs)

            module.Figure.savefig = tracked

        spec.loader.exec_module = exec_module
        return spec


def save_figures(output_dir, step):
    """Figures the step left open and did not save, saved as PNG: a chart needs no savefig."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    saved = []
    for index, number in enumerate(pyplot.get_fignums(), start=1):
        figure = pyplot.figure(number)
        if getattr(figure, "_quarry_saved", False):
            continue
        path = os.path.join(output_dir, f"figure_{step}_{index}.png" if step else f"figure_{index}.png")
        try:
            figure.savefig(path, dpi=100, bbox_inches="tight")
            saved.append(path)
        except Exception as error:
            print(f"quarry: could not save figure {number}: {error}", file=sys.stderr)
    pyplot.close("all")
    return saved


def print_traceback():
    """The exception being handled, as Python prints it, from the step's code on (the
    kernel's own frame left out)."""
    kind, value, trace = sys.exc_info()
    if trace is not None and trace.tb_frame.f_code is run.__code__:
        trace = trace.tb_next
    traceback.print_exception(kind, value, trace)


def cpu_seconds():
    """The CPU time of this process's threads and of the children it has waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run(request, namespace):
    global steps_begun
    code, filename = request["code"], request.get("filename") or "<cell>"
    # Tracebacks show the lines of the step.
    import linecache
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    status, error = "ok", None
    started, cpu_started = time.perf_counter(), cpu_seconds()
    steps_begun += 1
    running.set()
    try:
        tree = ast.parse(code, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            show(eval(compile(last, filename, "eval"), namespace))
    except KeyboardInterrupt:
        status, error = "interrupted", "KeyboardInterrupt"
        print_traceback()
    except SystemExit as exit:
        status, error = "error", f"SystemExit({exit.code!r}): the kernel goes on"
    except BaseException as exception:
        status = "error"
        error = "".join(traceback.format_exception_only(type(exception), exception)).strip()
        print_traceback()
    finally:
        running.clear()
    run_ms = (time.perf_counter() - started) * 1000
    # Linux adds a thread's CPU time to the process's when the thread next stops or at a tick:
    # a thread still busy from an earlier step brings time of before this one into it. No
    # step takes more than its length on each CPU it may use.
    cpu_ms = min((cpu_seconds() - cpu_started) * 1000, run_ms * len(os.sched_getaffinity(0)))
    figures = save_figures(request.get("output_dir", "."), str(request.get("step", "")))
    sys.stdout.flush()
    sys.stderr.flush()
    return {"type": "done", "status": status, "error": error, "figures": figures,
            "names": held_names(namespace), "run_ms": run_ms, "cpu_ms": cpu_ms}


def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The code's own __main__, so pickling and multiprocessing find what it defines.
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.meta_path.insert(0, TrackSavefig())
    threading.Thread(target=reader, daemon=True).start()
    while True:
        try:
            request = requests.get()
        except KeyboardInterrupt:  # an interrupt that came between steps
            continue
        if request is None:
            return
        try:
            if request.get("type") == "hello":
                send({"type": "ready", "python": sys.version.split()[0], "pid": os.getpid()})
            elif request.get("type") == "run":
                send(run(request, module.__dict__))
            else:
                send({"type": "error", "error": f"unknown request {request.get('type')!r}"})
        except KeyboardInterrupt:  # after the step's code: the answer goes out anyway
            send({"type": "done", "status": "interrupted", "error": "KeyboardInterrupt",
                  "figures": [], "names": held_names(module.__dict__), "run_ms": 0, "cpu_ms": 0})
        except Exception as error:  # the kernel's own part failed on what the code left
            send({"type": "done", "status": "error", "error": f"quarry's kernel: {error!r}",
                  "figures": [], "names": [], "run_ms": 0, "cpu_ms": 0})


main()
