#!/usr/bin/env python3
"""Runs the fuzzers that scripts/build --fuzz built: each over its seed corpus (fuzz/corpus/NAME,
never written to) and then for a bounded time, reporting like a GoogleTest suite.

  fuzz/run.py --seconds 10 --report build/test-results/fuzz.json   # scripts/test's fuzz suite
  fuzz/run.py --seconds 300 --corpus build-fuzz/corpus             # bench/fuzz.sh

New inputs go to --corpus DIR/NAME when given (kept for the next run), else to a temporary
directory. An input that crashes, leaks, trips UBSan or times out is saved as
build-fuzz/artifacts/NAME-crash-... (or leak-, timeout-, oom-); reproduce it with
build-fuzz/fuzz/NAME_fuzzer FILE."""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def symbolizer():
    """Debian installs llvm-symbolizer as a symlink into /usr/lib/llvm-N/bin, and the sanitizers
    refuse a symlink of that name: they are given its real path."""
    found = shutil.which("llvm-symbolizer") or shutil.which("llvm-symbolizer-19")
    return {"ASAN_SYMBOLIZER_PATH": os.path.realpath(found)} if found else {}


def run_one(name, binary, seconds, corpus_root, artifacts, log):
    seeds = ROOT / "fuzz" / "corpus" / name
    dictionary = ROOT / "fuzz" / f"{name}.dict"
    with tempfile.TemporaryDirectory(prefix=f"quarry-fuzz-{name}-") as scratch:
        work = pathlib.Path(corpus_root) / name if corpus_root else pathlib.Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        command = [str(binary), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
                   "-print_final_stats=1", f"-artifact_prefix={artifacts}/{name}-"]
        if dictionary.exists():
            command.append(f"-dict={dictionary}")
        # The first directory receives new inputs; the seeds are only read.
        command += [str(work), str(seeds)]
        start = time.monotonic()
        process = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, errors="replace",
                                 env=dict(os.environ, UBSAN_OPTIONS="print_stacktrace=1", **symbolizer()))
        elapsed = time.monotonic() - start
    log.write(f"== {name}: {' '.join(command)}\n{process.stdout}\n")
    runs = re.search(r"stat::number_of_executed_units: (\d+)", process.stdout)
    result = {"name": name, "runs": int(runs.group(1)) if runs else 0, "seconds": elapsed}
    if process.returncode != 0:
        saved = re.findall(r"Test unit written to (\S+)", process.stdout)
        summary = re.findall(
            r"^(?:  what\(\): .*|.*runtime error: .*|.*_fuzzer: .*|==\d+==ERROR: .*|SUMMARY: .*)$",
            process.stdout, re.MULTILINE)
        result["failure"] = "; ".join(summary[:2] or [f"exit status {process.returncode}"]) + (
            f" (input: {saved[-1]})" if saved else "")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10, help="time per fuzzer after its seeds")
    parser.add_argument("--build-dir", default=str(ROOT / "build-fuzz"))
    parser.add_argument("--corpus", help="keep new inputs in CORPUS/NAME (outside the repository)")
    parser.add_argument("--report", help="write a GoogleTest-style JSON report here")
    parser.add_argument("--log", help="the fuzzers' full output (default: BUILD_DIR/fuzz.log)")
    parser.add_argument("names", nargs="*", help="fuzzers to run (default: all)")
    args = parser.parse_args()

    binaries = sorted((pathlib.Path(args.build_dir) / "fuzz").glob("*_fuzzer"))
    names = [b.name.removesuffix("_fuzzer") for b in binaries]
    if not names:
        sys.exit(f"fuzz/run.py: no fuzzers in {args.build_dir}/fuzz; run scripts/build --fuzz")
    unknown = set(args.names) - set(names)
    if unknown:
        sys.exit(f"fuzz/run.py: no fuzzer named {', '.join(sorted(unknown))} (have: {', '.join(names)})")
    artifacts = pathlib.Path(args.build_dir) / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)

    results = []
    with open(args.log or pathlib.Path(args.build_dir) / "fuzz.log", "w") as log:
        for name, binary in zip(names, binaries):
            if args.names and name not in args.names:
                continue
            result = run_one(name, binary, args.seconds, args.corpus, artifacts, log)
            results.append(result)
            if "failure" in result:
                print(f"[  FAILED  ] {name}: {result['failure']}", flush=True)
            else:
                print(f"[  PASSED  ] {name}: {result['runs']} runs in {result['seconds']:.0f} s",
                      flush=True)

    if args.report:
        tests = []
        for result in results:
            test = {"name": result["name"], "classname": "fuzz", "status": "RUN",
                    "result": "COMPLETED", "time": f"{result['seconds']:.1f}s",
                    "runs": result["runs"]}
            if "failure" in result:
                test["failures"] = [{"failure": result["failure"], "type": ""}]
            tests.append(test)
        failed = sum(1 for t in tests if "failures" in t)
        with open(args.report, "w") as f:
            json.dump({"tests": len(tests), "failures": failed, "name": "AllTests",
                       "testsuites": [{"name": "fuzz", "tests": len(tests), "failures": failed,
                                       "testsuite": tests}]}, f, indent=2)
    sys.exit(1 if any("failure" in r for r in results) else 0)


if __name__ == "__main__":
    main()
