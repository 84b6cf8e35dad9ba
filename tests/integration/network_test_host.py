#!/usr/bin/env python3
"""The test host of the network tests: run inside a network namespace the test makes.

Serves, over HTTP on 8080 and HTTPS on 8443 (a certificate made here, for every name the tests
use), `/hello` and a package index (PEP 503) with one wheel, quarry-probe 1.0, built here. Prints
"ready" once both ports listen.
"""
import base64
import hashlib
import http.server
import io
import os
import ssl
import subprocess
import sys
import threading
import zipfile

NAMES = ["allowed.quarry.test", "denied.quarry.test", "a.wild.quarry.test", "wild.quarry.test"]
PROBE = "quarry_probe-1.0-py3-none-any.whl"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel():
    files = {
        "quarry_probe/__init__.py": b"VALUE = 'probe from the test index'\n",
        "quarry_probe-1.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: quarry-probe\nVersion: 1.0\n",
        "quarry_probe-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: quarry-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join(record_line(name, data) for name, data in files.items())
    record += "\nquarry_probe-1.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("quarry_probe-1.0.dist-info/RECORD", record)
    return out.getvalue()


def make_certificate(directory):
    key, cert = os.path.join(directory, "key.pem"), os.path.join(directory, "cert.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=allowed.quarry.test", "-keyout", key, "-out", cert,
         "-addext", "subjectAltName=" + ",".join("DNS:" + name for name in NAMES)],
        check=True, capture_output=True)
    return key, cert


def main():
    directory = sys.argv[1]
    wheel = make_wheel()
    wheel_hash = hashlib.sha256(wheel).hexdigest()
    pages = {
        "/hello": (b"hello from the test host\n", "text/plain"),
        "/simple/": (b'<a href="/simple/quarry-probe/">quarry-probe</a>\n', "text/html"),
        "/simple/quarry-probe/": (
            f'<a href="/files/{PROBE}#sha256={wheel_hash}">{PROBE}</a>\n'.encode(), "text/html"),
        f"/files/{PROBE}": (wheel, "application/octet-stream"),
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            page = pages.get(self.path)
            if page is None:
                self.send_error(404)
                return
            body, kind = page
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            sys.stderr.write("test host: " + format % args + "\n")

    plain = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler)
    secure = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    key, cert = make_certificate(directory)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
