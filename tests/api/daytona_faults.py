"""A proxy between quarry's Daytona provider and a Daytona-compatible server that breaks the
calls a test asks it to: the faults a provider meets on the way to a remote engine.

    python3 daytona_faults.py UPSTREAM_BASE      (e.g. http://127.0.0.1:8080/daytona)

prints "listening PORT", then forwards every request below /daytona/ to UPSTREAM_BASE, with the
toolboxProxyUrl of every answer pointed back at itself. POST /_faults with a JSON list of rules
[{"method": "POST", "path": "/process/execute", "action": "502", "times": 2}, ...] (the path a
substring of the request's; times -1: always) sets what to break; each request takes the first
rule that matches and still has times left:

  502        answer 502 with an empty body (a proxy that could not reach the daemon)
  429        answer 429 with Retry-After: 1 and Daytona's error body
  409        answer 409 "Sandbox state change in progress"
  408        answer the toolbox's 408 (a command past its timeout)
  hang       read the request, never answer (until the client gives up)
  drop       forward it, then close the connection without the answer (a lost answer)
  creating   forward it, but say the sandbox is still "creating"

GET /_faults answers what each rule matched so far. Standard library only; loopback only.
"""
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.parse

UPSTREAM = urllib.parse.urlsplit(sys.argv[1].rstrip("/"))
rules = []
hits = []
lock = threading.Lock()


def take_rule(method, path):
    with lock:
        for rule in rules:
            if rule.get("method", method) == method and rule["path"] in path and rule["times"] != 0:
                if rule["times"] > 0:
                    rule["times"] -= 1
                hits.append({"method": method, "path": path, "action": rule["action"]})
                return rule["action"]
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def daytona_error(self, status, message, extra=None):
        body = {"statusCode": status, "message": message, "error": "fault", "path": self.path,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body.update(extra or {})
        return json.dumps(body).encode()

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/_faults":
            global rules
            if self.command == "POST":
                with lock:
                    rules = json.loads(body)
                    hits.clear()
                return self.answer(204)
            with lock:
                return self.answer(200, json.dumps(hits).encode(), [("Content-Type", "application/json")])
        action = take_rule(self.command, self.path)
        if action == "502":
            return self.answer(502)
        if action == "429":
            return self.answer(429, self.daytona_error(429, "ThrottlerException: Too Many Requests"),
                               [("Retry-After", "1"), ("Content-Type", "application/json")])
        if action == "409":
            return self.answer(409, self.daytona_error(409, "Sandbox state change in progress"),
                               [("Content-Type", "application/json")])
        if action == "408":
            return self.answer(408, self.daytona_error(408, "command execution timeout",
                                                       {"code": "REQUEST_TIMEOUT"}),
                               [("Content-Type", "application/json")])
        if action == "hang":
            time.sleep(3600)
            return None
        # Forward, below the upstream's base: /daytona/... -> UPSTREAM/...
        target = UPSTREAM.path + self.path[len("/daytona"):]
        connection = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=600)
        headers = {name: value for name, value in self.headers.items()
                   if name.lower() not in ("host", "connection", "content-length")}
        connection.request(self.command, target, body=body, headers=headers)
        upstream = connection.getresponse()
        data = upstream.read()
        if action == "drop":
            self.close_connection = True
            return None
        kind = upstream.getheader("Content-Type", "")
        if kind.startswith("application/json") and data:
            document = json.loads(data)
            own = f"http://127.0.0.1:{self.server.server_address[1]}/daytona/toolbox"
            for item in document.get("items", [document]) if isinstance(document, dict) else document:
                if isinstance(item, dict) and "toolboxProxyUrl" in item:
                    item["toolboxProxyUrl"] = own
                    if action == "creating":
                        item["state"] = "creating"
            data = json.dumps(document).encode()
        passed = [(name, value) for name, value in upstream.getheaders()
                  if name.lower() not in ("content-length", "connection", "transfer-encoding")]
        return self.answer(upstream.status, data, passed)

    do_GET = do_POST = do_PUT = do_DELETE = handle_any


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
