#!/usr/bin/env python3
"""Writes the seed corpus of each fuzzer into fuzz/corpus/<fuzzer>/: small, real-looking inputs
(an OpenAI-style event stream, a COPY BINARY stream of several types as PostgreSQL 15 writes it,
init's frames as protocol.cc writes them, a typical config.yml, the scenario files of the tests).
Run it again after changing it; the files it writes are committed. Regression inputs that a
fuzzer found are added to the same directories by hand (named regression-*) and kept."""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(fuzzer, name, data):
    directory = CORPUS / fuzzer
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (directory / name).write_bytes(data)


# ---- sse and stream_assembler: a streamed answer as OpenAI sends it ------------------------

def chunk(delta=None, finish=None, usage=None, choices=True):
    body = {"id": "chatcmpl-9xq1", "object": "chat.completion.chunk", "created": 1718000000,
            "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_c3f2a8", "choices": []}
    if choices:
        body["choices"] = [{"index": 0, "delta": delta or {}, "logprobs": None,
                            "finish_reason": finish}]
    if usage:
        body["usage"] = usage
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


TEXT_ANSWER = [
    chunk({"role": "assistant", "content": "", "refusal": None}),
    chunk({"content": "The median peak"}),
    chunk({"content": " is 1.2 M views (P90: 8.4 M) — "}),
    chunk({"content": "see peaks.html."}),
    chunk(finish="stop"),
    chunk(choices=False, usage={"prompt_tokens": 1843, "completion_tokens": 21,
                                "total_tokens": 1864}),
]
TOOL_ANSWER = [
    chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_Q2x8", "type": "function",
         "function": {"name": "export_query", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"sql\": \"SELECT cat"}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {
        "arguments": "egory_name, max(views) FROM trending_videos GROUP BY 1\", "}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"filename\": \"peaks.parquet\"}"}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "call_R7", "type": "function",
                           "function": {"name": "list_outputs", "arguments": "{}"}}]}),
    chunk(finish="tool_calls"),
]
# llama.cpp and Ollama: tool calls without "index", ids missing, content and tool calls mixed.
LOCAL_ANSWER = [
    json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me"}}]}),
    json.dumps({"choices": [{"index": 0, "delta": {"content": " check."}}]}),
    json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"function": {"name": "run_python", "arguments": "{\"code\": \"print(1)\"}"}}]}}]}),
    json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 9}}),
]
ERROR_CHUNK = json.dumps({"error": {"message": "The server had an error while processing your "
                                               "request.", "type": "server_error"}})


def sse(payloads, newline="\n", done=True):
    text = "".join(f"data: {p}{newline}{newline}" for p in payloads)
    return text + (f"data: [DONE]{newline}{newline}" if done else "")


write("sse", "openai_text", sse(TEXT_ANSWER))
write("sse", "openai_tool_calls", sse(TOOL_ANSWER))
write("sse", "llama_cpp_crlf", sse(LOCAL_ANSWER, newline="\r\n"))
write("sse", "comments_ids_bom",
      "\ufeff: keep-alive\n\nretry: 3000\nid: 1\nevent: message\ndata: "
      + TEXT_ANSWER[1] + "\n\nid: 2\ndata: first line\ndata: second line\r\r"
      + "event: error\ndata: " + ERROR_CHUNK + "\n\n:\n\ndata\n\ndata:[DONE]\n\n")

write("stream_assembler", "openai_text", "\n".join(TEXT_ANSWER) + "\n")
write("stream_assembler", "openai_tool_calls", "\n".join(TOOL_ANSWER) + "\n")
write("stream_assembler", "llama_cpp_tool_calls", "\n".join(LOCAL_ANSWER) + "\n")
write("stream_assembler", "error_mid_stream", TEXT_ANSWER[1] + "\n" + ERROR_CHUNK + "\n")
write("stream_assembler", "complete_answer", json.dumps({
    "id": "chatcmpl-9xq2", "object": "chat.completion", "created": 1718000001,
    "model": "gpt-4o-2024-08-06",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "Exporting."}],
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "query_database", "arguments": "{\"sql\": \"SELECT 1\"}"}}]}}],
    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}) + "\n")
write("stream_assembler", "error_bodies",
      '{"error": "model \\"qwen\\" not found, try pulling it first"}\n'
      '{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}\n'
      '{"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota",'
      ' "code": "insufficient_quota"}}\n')

# ---- copy_binary and pg_types: PostgreSQL's binary COPY --------------------------------------

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
HEADER = SIGNATURE + struct.pack(">ii", 0, 0)


def field(value):
    return struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value


def numeric(digits, weight, sign, dscale):
    return struct.pack(">hhHh", len(digits), weight, sign, dscale) + b"".join(
        struct.pack(">h", d) for d in digits)


def array(element_oid, elements, sizes=None):
    has_null = any(e is None for e in elements)
    sizes = sizes or [len(elements)]
    return (struct.pack(">iiI", len(sizes), int(has_null), element_oid)
            + b"".join(struct.pack(">ii", size, 1) for size in sizes)
            + b"".join(field(e) for e in elements))


def interval(micros, days, months):
    return struct.pack(">qii", micros, days, months)


DAY = 86400 * 1000000
# (id int4, name text, views int8, score float8, published timestamptz, ratio numeric(12,2))
ROWS = [
    [struct.pack(">i", 1), "Música en vivo".encode(), struct.pack(">q", 1234567),
     struct.pack(">d", 0.25), struct.pack(">q", 8760 * DAY // 24 * 24 + 3600 * 10**6),
     numeric([12, 3450], 0, 0, 2)],
    [struct.pack(">i", 2), b"Gaming", struct.pack(">q", -5), struct.pack(">d", float("nan")),
     None, numeric([1], 1, 0x4000, 2)],
    [struct.pack(">i", 3), None, None, None, struct.pack(">q", 0), numeric([], 0, 0, 0)],
]
stream = HEADER + b"".join(struct.pack(">h", len(r)) + b"".join(field(v) for v in r)
                           for r in ROWS) + struct.pack(">h", -1)
write("copy_binary", "six_columns", bytes([6]) + stream)
write("copy_binary", "header_extension",
      bytes([1]) + SIGNATURE + struct.pack(">ii", 0, 4) + b"ext!" + struct.pack(">h", 1)
      + field(b"x") + struct.pack(">h", -1))
write("copy_binary", "no_rows", bytes([3]) + HEADER + struct.pack(">h", -1))

# pg_types: one byte choosing the OID (its index in pg_types_fuzzer.cc's kOids), the type
# modifier, then values as (length, bytes).
OIDS = [16, 17, 18, 19, 20, 21, 23, 25, 114, 142, 700, 701, 1042, 1043, 1082, 1083, 1114, 1184,
        1700, 2950, 3802, 1000, 1001, 1002, 1003, 1016, 1005, 1007, 1009, 199, 143, 1021, 1022,
        1014, 1015, 1182, 1183, 1115, 1185, 1231, 2951, 3807, 1186, 1187, 90001, 90002]
ENUM_OID, COMPOSITE_OID = 90001, 90002  # the fuzzer's enum, and (a int4, n numeric, m enum)


def column(oid, values, typmod=-1):
    return bytes([OIDS.index(oid)]) + struct.pack(">i", typmod) + b"".join(field(v) for v in values)


write("pg_types", "bool", column(16, [b"\x01", b"\x00", None]))
write("pg_types", "int8", column(20, [struct.pack(">q", 2**63 - 1), struct.pack(">q", -1)]))
write("pg_types", "int4", column(23, [struct.pack(">i", -2**31), struct.pack(">i", 42)]))
write("pg_types", "float8", column(701, [struct.pack(">d", 3.5), struct.pack(">d", float("inf"))]))
write("pg_types", "float4", column(700, [struct.pack(">f", -0.0)]))
write("pg_types", "text", column(25, ["Müller".encode(), b"", None]))
write("pg_types", "jsonb", column(3802, [b'\x01{"a": [1, 2]}']))
write("pg_types", "uuid", column(2950, [bytes(range(16))]))
write("pg_types", "bytea", column(17, [b"\x00\xff\x10"]))
write("pg_types", "date", column(1082, [struct.pack(">i", 8766), struct.pack(">i", -10957)]))
write("pg_types", "time", column(1083, [struct.pack(">q", 13 * 3600 * 10**6)]))
write("pg_types", "timestamptz", column(1184, [struct.pack(">q", 770000000 * 10**6)]))
write("pg_types", "timestamp", column(1114, [struct.pack(">q", -(2**62))]))
# numeric(12, 2): typmod ((12 << 16) | 2) + 4; 12.345 rounds to 12.35; -10000; 0.
write("pg_types", "numeric_12_2", column(1700, [numeric([12, 3450], 0, 0, 3),
                                                numeric([1], 1, 0x4000, 0), numeric([], 0, 0, 0)],
                                         typmod=((12 << 16) | 2) + 4))
write("pg_types", "numeric_unconstrained",
      column(1700, [numeric([1234, 5678, 9012], 1, 0, 4), numeric([], 0, 0xC000, 0)]))
write("pg_types", "int4_array", column(1007, [array(23, [struct.pack(">i", 7), None,
                                                         struct.pack(">i", 9)]),
                                              struct.pack(">iii", 0, 0, 23)]))
write("pg_types", "text_array", column(1009, [array(25, [b"a", b"bc"])]))
write("pg_types", "numeric_array", column(1231, [array(1700, [numeric([5], 0, 0, 0)])]))
write("pg_types", "numeric_wide", column(1700, [numeric([1], 10, 0, 0), numeric([], 0, 0xD000, 0),
                                              numeric([3333] * 5, -1, 0, 20)]))
write("pg_types", "interval", column(1186, [interval(5, 1, 0), interval(-1, 0, 14), None]))
write("pg_types", "interval_array", column(1187, [array(1186, [interval(0, 3, 0), None])]))
write("pg_types", "int4_grid", column(1007, [array(23, [struct.pack(">i", n) for n in range(6)],
                                                   sizes=[2, 3])]))
write("pg_types", "timestamp_infinity", column(1114, [struct.pack(">q", 2**63 - 1)]))
write("pg_types", "enum", column(ENUM_OID, [b"happy", b"sad", None, b"added later"]))
write("pg_types", "composite", column(COMPOSITE_OID, [
    struct.pack(">i", 3) + struct.pack(">i", 23) + field(struct.pack(">i", 7))
    + struct.pack(">I", 1700) + field(numeric([15], 0, 0, 1))
    + struct.pack(">I", ENUM_OID) + field(b"ok"), None]))

# ---- protocol: init's frames as protocol::send writes them ----------------------------------


def frame(body):
    payload = json.dumps(body, separators=(",", ":")).encode()
    return struct.pack("<I", len(payload)) + payload


SETUP = {
    "type": "setup", "root_dir": "/var/lib/quarry/sandboxes/sb-7f3a/root",
    "lower_dir": "/var/cache/quarry/images/3b1c9e/rootfs",
    "upper_dir": "/var/lib/quarry/volume/sb-7f3a/upper",
    "work_dir": "/var/lib/quarry/volume/sb-7f3a/work",
    "control_socket": "/var/lib/quarry/sandboxes/sb-7f3a/control.sock", "hostname": "sandbox",
    "user_id": 1000, "group_id": 1000, "host_id_base": 1073741824, "home": "/home/sandbox",
    "directories": ["/home/sandbox/data", "/home/sandbox/outputs"],
    "seccomp_filter": bytes([32, 0, 0, 0, 4, 0, 0, 0, 21, 0, 1, 0, 62, 0, 0, 192, 6, 0, 0, 0, 0,
                              0, 255, 127]).hex(),
    "max_processes": 256,
    "cgroup_mounts": [
        {"type": "cgroup2", "options": "", "target": "/sys/fs/cgroup", "aliases": []},
        {"type": "cgroup", "options": "cpu,cpuacct", "target": "/sys/fs/cgroup/cpu,cpuacct",
         "aliases": ["cpu", "cpuacct"]}],
}
write("protocol", "setup_handshake", frame(SETUP) + frame({"type": "userns"})
      + frame({"type": "maps_written"}) + frame({"type": "ready"}))
# A sandbox started from a snapshot made on another: two frozen layers above the image.
write("protocol", "setup_from_snapshot", frame(dict(SETUP, frozen_dirs=[
    "/var/lib/quarry/sandboxes/snapshots/prepared/layer/upper",
    "/var/lib/quarry/sandboxes/snapshots/packages-4f2a9c1e7b3d5a60/layer/upper"])))
write("protocol", "root_exec",
      frame({"type": "exec", "argv": ["/opt/quarry/venv/bin/pip", "install", "--no-index"],
             "env": ["HOME=/root"], "cwd": "/", "root": True})
      + frame({"type": "exit", "status": 0, "run_ns": 2000000}))
write("protocol", "exec_and_exit",
      frame({"type": "exec", "argv": ["/opt/venv/bin/python", "analysis.py"],
             "env": ["PATH=/opt/venv/bin:/usr/bin:/bin", "HOME=/home/sandbox", "LANG=C.UTF-8"],
             "cwd": "/home/sandbox"})
      + frame({"type": "exit", "status": 9, "run_ns": 1234567890}))
write("protocol", "errors",
      frame({"type": "error", "message": "mount('overlay') failed: No such device"})
      + frame({"type": "error"}) + frame({"type": "exit", "status": 256, "run_ns": 0}))

# ---- client_hello: the first bytes of a sandbox's tunnel -----------------------------------

def client_hello(server_name, minimum=None):
    """The ClientHello Python's ssl (OpenSSL) sends first, for `server_name`."""
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if minimum:
        context.minimum_version = context.maximum_version = minimum
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


import ssl as _ssl
write("client_hello", "tls13_pypi", client_hello("pypi.org"))
write("client_hello", "tls12_index", client_hello("files.pythonhosted.org", _ssl.TLSVersion.TLSv1_2))
write("client_hello", "no_server_name", client_hello(None))
write("client_hello", "plain_http", "GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n")
write("client_hello", "wildcard_entry", "*.PythonHosted.org.")

# ---- config, scenario, url: what a user writes ------------------------------------------------

write("config", "empty", "")
write("config", "model_only", "model: {base_url: http://127.0.0.1:11434/v1, name: qwen2.5-coder}\n")
readme = (ROOT / "README.md").read_text()
start = readme.index("```yaml\nsandbox:\n") + len("```yaml\n")
write("config", "readme_full", readme[start:readme.index("```", start)])
write("config", "tuned", """\
sandbox:
  packages: [polars==1.9.0, "duckdb>=1.1", pyarrow]
  resources: {cpus: 0.5, memory: 512MiB, disk: 1.5 GiB, pids: 64}
  exec_timeout: 1m30s
  idle_timeout: 2h
  network: {mode: allowlist, allow: [pypi.example.org]}
  output_limit: 64KiB
  artifacts: {max_file: 10MB, max_step: 10MB, max_conversation: 1TiB}
  local: {volume_size: 8GiB, favordynmods: false}
database:
  url: "postgresql://reader@db.internal:5432/analytics?sslmode=require"
  port: 55433
  statement_timeout: 250ms
conversations: {instance_id: prod-eu.1, context: {budget: 20000, recent_turns: 1}}
model:
  base_url: "https://[::1]:8443/openai/v1?api-version=2024-06-01"
  api_key_env: ""
  temperature: 0.2
  max_retries: 0
server: {listen: "[::1]:8080", workers: 2, shutdown_grace: 0s, max_body: 4MiB}
""")
write("config", "bad_key", "sandbox:\n  resources:\n    memroy: 1GiB\n")

for directory in ("tests/agent/scenarios", "tests/scripted_model/scenarios"):
    for scenario in sorted((ROOT / directory).glob("*.yml")):
        write("scenario", scenario.name, scenario.read_bytes())
write("scenario", "faults_and_choices.yml", """\
description: Every kind of step the scripted model knows.
steps:
  - fail: {status: 429, retry_after: "2", message: Rate limit reached, times: 2}
    expect: {system_contains: [SQL first], tools: [query_database, run_python]}
    delay: 150ms
    chunk_delay: 5ms
    chunk_size: 3
    content: Looking at the data.
    tool_calls:
      - {id: call_a, name: query_database, arguments: {sql: "SELECT 1", limit: 5, ok: true, x: ~}}
      - name: run_python
        arguments_text: '{"code": "print(1)'
  - choose:
      - when: {last_tool_result_contains: [out of memory], last_tool_result_lacks: Traceback}
        content: Rewriting with DuckDB.
        finish_reason: length
      - when: {any_tool_result_contains: exit code 0, last_user_contains: median}
        content: Done.
    otherwise: {content: Nothing matched.}
  - fail: {disconnect: true}
    stall: true
    content: cut
""")

for name, url in {
    "openai": "https://api.openai.com/v1",
    "llama_cpp": "http://127.0.0.1:8080/v1/",
    "ollama": "HTTP://LocalHost:11434/v1",
    "ipv6": "http://[::1]:9000/api/v1",
    "gateway_query": "https://gw.example/openai/deployments/d?api-version=2024-06-01",
    "credentials": "https://user:key@api.example.com/v1",
}.items():
    write("url", name, url)
