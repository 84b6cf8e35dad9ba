"""Holds the HTTP exchanges the API tests recorded against the OpenAPI document.

The API tests (tests/api) write every request they make to the real server, and its answer,
to build/test-results/api/exchanges.jsonl. This checker finds the documented operation of each
exchange by method and path template, checks that its status and content type are documented
for that operation, and validates its JSON body (or, for a Server-Sent Events stream, the data
of each event) against the documented schema with JSON Schema 2020-12, the dialect of
OpenAPI 3.1. It also checks that every documented operation was answered with a 2xx at least
once, so that neither the document nor the server can change without the other.

    check_openapi.py OPENAPI_YAML EXCHANGES_JSONL [--report FILE.json]

Prints one line per failure and a summary line; exits 1 if anything failed. With --report,
also writes the result in the JSON shape GoogleTest writes: one test per documented operation,
and one named `exchanges` for exchanges that match no operation.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from dataclasses import dataclass
from urllib.parse import quote

import yaml
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DOCUMENT_URI = "urn:quarry:openapi"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
ERROR_SCHEMA = "/components/schemas/Error"
SERVED_DOCUMENT_PATH = "/api/openapi.json"
EVENT_ID = re.compile(r"^([0-9]+)-([0-9]+)$")
RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-](\d{2}):(\d{2}))$"
)
MAX_PROBLEMS = 3  # per body or stream; the rest are counted in one line
MAX_MESSAGE = 200
EXCHANGES_TEST = "exchanges"
REQUIRED_KEYS = ("test", "method", "target", "status")
# The Daytona-compatible API answers Daytona's contract, not quarry's: its paths and shapes are
# Daytona's (docs/daytona.md; its SDK's own models are what tests/api/daytona_test.cc holds it
# to), so they are not in quarry's OpenAPI document and are not checked against it.
DAYTONA_PREFIX = "/daytona/"


@dataclass
class Operation:
    """One documented method of one documented path."""

    method: str
    template: str
    pointer: str  # JSON pointer of the operation object in the document
    spec: dict
    exercised: bool = False

    @property
    def name(self) -> str:
        return f"{self.method} {self.template}"


def escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def template_pattern(template: str) -> re.Pattern:
    """`/api/v1/conversations/{id}` as a regular expression: a parameter is one non-empty
    segment, as the server's router has it."""
    parts = re.split(r"(\{[^/{}]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def is_date_time(value: object) -> bool:
    """RFC 3339 date-time, as `format: date-time` means (standard library only)."""
    if not isinstance(value, str):
        return True
    match = RFC3339.match(value)
    if not match:
        return False
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        datetime.datetime(year, month, day, hour, minute, min(second, 59))
    except ValueError:
        return False
    offset_hour, offset_minute = match.group(9), match.group(10)
    return offset_hour is None or (int(offset_hour) < 24 and int(offset_minute) < 60)


def format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    checker.checks("date-time")(is_date_time)
    return checker


class Document:
    """The OpenAPI document: its operations, and validators for the schemas in it."""

    def __init__(self, contents: dict):
        self.contents = contents
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(DOCUMENT_URI, resource)
        self.checker = format_checker()
        self.validators: dict[str, Draft202012Validator] = {}
        self.operations = list(self._operations())
        self.templates = sorted(
            {(op.template, template_pattern(op.template)) for op in self.operations},
            key=lambda entry: (entry[0].count("{"), entry[0]),
        )

    def _operations(self):
        for template, item in (self.contents.get("paths") or {}).items():
            for method in HTTP_METHODS:
                if method in item:
                    pointer = f"/paths/{escape_pointer(template)}/{method}"
                    yield Operation(method.upper(), template, pointer, item[method])

    def template_for(self, path: str) -> str | None:
        """The documented path template `path` matches; a literal one before a templated one."""
        for template, pattern in self.templates:
            if pattern.fullmatch(path):
                return template
        return None

    def operation(self, method: str, template: str) -> Operation | None:
        for op in self.operations:
            if op.method == method and op.template == template:
                return op
        return None

    def at(self, pointer: str):
        node = self.contents
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            node = node[int(token)] if isinstance(node, list) else node[token]
        return node

    def resolve(self, pointer: str) -> tuple[str, dict]:
        """The object at `pointer`, following local `$ref`s; and the pointer it was found at."""
        node = self.at(pointer)
        for _ in range(32):
            ref = node.get("$ref") if isinstance(node, dict) else None
            if not isinstance(ref, str) or not ref.startswith("#"):
                return pointer, node
            pointer = ref[1:]
            node = self.at(pointer)
        raise ValueError(f"$ref loop at {pointer}")

    def validator(self, pointer: str) -> Draft202012Validator:
        """A validator for the schema at `pointer`, its `$ref`s resolved in the whole document."""
        if pointer not in self.validators:
            ref = f"{DOCUMENT_URI}#{quote(pointer, safe='/~')}"
            self.validators[pointer] = Draft202012Validator(
                {"$ref": ref}, registry=self.registry, format_checker=self.checker
            )
        return self.validators[pointer]


# ---------------------------------------------------------------------------------------------
# Validation errors, concisely


def shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def location(error: ValidationError) -> str:
    return "/" + "/".join(str(p) for p in error.absolute_path)


def branches(error: ValidationError) -> dict[int, list[ValidationError]]:
    """The errors of a failed `oneOf` or `anyOf`, by the index of the branch they are from."""
    found: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        found.setdefault(sub.relative_schema_path[0], []).append(sub)
    return found


def discriminator(error: ValidationError) -> tuple[str, dict] | None:
    """The OpenAPI discriminator of a failed `oneOf` over an object: property name, mapping."""
    found = error.schema.get("discriminator") if isinstance(error.schema, dict) else None
    if not isinstance(found, dict) or not isinstance(error.instance, dict):
        return None
    return found.get("propertyName"), found.get("mapping") or {}


def unknown_discriminator(error: ValidationError) -> str | None:
    """What to say when the discriminating property has none of the mapped values."""
    name, mapping = discriminator(error) or (None, {})
    if not name or not mapping or error.instance.get(name) in mapping:
        return None
    where = "/".join([location(error).rstrip("/"), name])
    return f"at {where}: {error.instance.get(name)!r} is not one of {', '.join(mapping)}"


def discriminated_branch(error: ValidationError) -> list[ValidationError] | None:
    """With an OpenAPI discriminator, the errors of the branch the instance names."""
    name, mapping = discriminator(error) or (None, {})
    target = mapping.get(error.instance.get(name)) if name else None
    for index, branch in enumerate(error.validator_value):
        if target and isinstance(branch, dict) and branch.get("$ref") == target:
            return branches(error).get(index)
    return None


def fitting_branch(error: ValidationError) -> list[ValidationError] | None:
    """The errors of the only branch whose type the instance has (`oneOf: [X, null]`)."""
    fitting = [
        errors
        for errors in branches(error).values()
        if not any(sub.validator == "type" and not sub.path for sub in errors)
    ]
    return fitting[0] if len(fitting) == 1 else None


def describe(error: ValidationError) -> str:
    """Where and what, from the branch of a `oneOf` the instance was meant for."""
    while error.validator in ("oneOf", "anyOf") and error.context:
        if unknown := unknown_discriminator(error):
            return unknown
        branch = discriminated_branch(error) or fitting_branch(error)
        if not branch:
            break
        error = best_match(branch)
    if error.context:
        error = best_match([error])
    return f"at {location(error)}: {shorten(error.message)}"


def schema_problems(validator: Draft202012Validator, instance) -> list[str]:
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    return [describe(error) for error in errors]


def capped(problems: list[str], what: str) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    rest = len(problems) - MAX_PROBLEMS
    return problems[:MAX_PROBLEMS] + [f"… and {rest} more {what}"]


# ---------------------------------------------------------------------------------------------
# One exchange


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json_media(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


def response_key(responses: dict, status: int) -> str | None:
    """The key of `responses` that documents `status`: exact, then `4XX`-style, then default."""
    keys = {str(key).upper(): str(key) for key in responses}
    for candidate in (str(status), f"{str(status)[0]}XX", "DEFAULT"):
        if candidate in keys:
            return keys[candidate]
    return None


def content_key(content: dict, media: str) -> str | None:
    keys = {media_type(key): key for key in content}
    for candidate in (media, media.split("/")[0] + "/*", "*/*"):
        if candidate in keys:
            return keys[candidate]
    return None


def error_code(exchange: dict) -> str | None:
    body = exchange.get("json")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("code")
    return None


def check_refusal(doc: Document, exchange: dict, status: int, code: str, why: str) -> list[str]:
    """An undocumented route or method is fine when the server refuses it with `status` `code`."""
    if exchange.get("status") != status or error_code(exchange) != code:
        return [f"{why}, and the answer is not a {status} {code}"]
    problems = schema_problems(doc.validator(ERROR_SCHEMA), exchange["json"])
    return [f"refusal body {p}" for p in problems]


def check_event(validator: Draft202012Validator, event: dict) -> list[str]:
    """An SSE event: its id is TURN-SEQ of its data's turn, its name is its data's type, and its
    data is a StreamEvent."""
    data, name, event_id = event.get("data"), event.get("event"), str(event.get("id", ""))
    problems = []
    match = EVENT_ID.match(event_id)
    if not match:
        problems.append(f"id {event_id!r} is not TURN-SEQ")
    elif isinstance(data, dict) and isinstance(data.get("turn"), int):
        if int(match.group(1)) != data["turn"]:
            problems.append(f"id {event_id} is not of turn {data['turn']}")
    data_type = data.get("type") if isinstance(data, dict) else None
    if name != data_type:
        problems.append(f"SSE event name {name!r} is not data.type {data_type!r}")
    problems += [f"data {p}" for p in schema_problems(validator, data)]
    return problems


def check_events(doc: Document, schema_pointer: str, events: list) -> list[str]:
    validator = doc.validator(schema_pointer)
    problems = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            problems.append(f"event {index} is not an object")
            continue
        head = f"event {index} (id {event.get('id')}, {event.get('event')})"
        problems += [f"{head}: {p}" for p in check_event(validator, event)]
    return capped(problems, "event problems")


def first_difference(served, documented, path: str = "") -> str | None:
    """The JSON pointer of the first place where two JSON values differ; None if they don't."""
    if isinstance(served, dict) and isinstance(documented, dict):
        for key in sorted(set(served) | set(documented)):
            at = f"{path}/{escape_pointer(key)}"
            if key not in served or key not in documented:
                return at
            found = first_difference(served[key], documented[key], at)
            if found:
                return found
        return None
    if isinstance(served, list) and isinstance(documented, list) and len(served) == len(documented):
        for index, (a, b) in enumerate(zip(served, documented)):
            found = first_difference(a, b, f"{path}/{index}")
            if found:
                return found
        return None
    same = served == documented and isinstance(served, bool) == isinstance(documented, bool)
    return None if same else path or "/"


def check_served_document(doc: Document, exchange: dict) -> list[str]:
    """The document the server serves must be the one checked against."""
    if exchange.get("status") != 200 or "json" not in exchange:
        return []
    as_json = json.loads(json.dumps(doc.contents))  # as JSON has it: every key a string
    where = first_difference(exchange["json"], as_json)
    return [] if where is None else [f"the served document differs from the YAML at {where}"]


def check_body(doc: Document, exchange: dict, schema_pointer: str, media: str) -> list[str]:
    if media == "text/event-stream":
        return check_events(doc, schema_pointer, exchange.get("events") or [])
    if not is_json_media(media):
        return []  # files: the recorder keeps no body to check
    if "json" not in exchange:
        return ["the body is not JSON"]
    problems = schema_problems(doc.validator(schema_pointer), exchange["json"])
    return capped([f"body {p}" for p in problems], "body problems")


def check_response(doc: Document, op: Operation, exchange: dict, head: bool = False) -> list[str]:
    """head: a HEAD request answered as its GET, whose headers are checked but not its body."""
    status = exchange["status"]
    responses = op.spec.get("responses") or {}
    key = response_key(responses, status)
    if key is None:
        return [f"status {status} is not documented (documented: {', '.join(map(str, responses))})"]
    if error_code(exchange) in ("no_route", "method_not_allowed"):
        return [f"the server has no route for this documented operation ({error_code(exchange)})"]
    pointer, response = doc.resolve(f"{op.pointer}/responses/{escape_pointer(key)}")
    content = response.get("content") or {}
    if not content:
        has_body = "json" in exchange or exchange.get("events")
        return ["documented without content, but the answer has a JSON body"] if has_body else []
    media = media_type(exchange.get("content_type"))
    match = content_key(content, media)
    if match is None:
        documented = ", ".join(content)
        return [f"content type {media or '(none)'} is not documented for {key} ({documented})"]
    problems = []
    if "schema" in (content[match] or {}) and not head:
        schema_pointer = f"{pointer}/content/{escape_pointer(match)}/schema"
        problems += check_body(doc, exchange, schema_pointer, media)
    if op.method == "GET" and op.template == SERVED_DOCUMENT_PATH:
        problems += check_served_document(doc, exchange)
    return problems


def check_exchange(doc: Document, exchange: dict) -> tuple[Operation | None, list[str]]:
    """The operation the exchange belongs to (None if none), and what is wrong with it."""
    method = str(exchange["method"]).upper()
    path = str(exchange["target"]).split("?", 1)[0].split("#", 1)[0]
    template = doc.template_for(path)
    if template is None:
        why = f"{path} matches no documented path"
        return None, check_refusal(doc, exchange, 404, "no_route", why)
    op = doc.operation(method, template)
    # HTTP answers HEAD as GET without the body (RFC 9110, 9.3.2); the document says so once.
    head = op is None and method == "HEAD" and doc.operation("GET", template) is not None
    if head:
        op = doc.operation("GET", template)
        if "json" in exchange or exchange.get("events"):
            return op, ["the answer to HEAD has a body"]
        return op, check_response(doc, op, exchange, head=True)
    if op is None:
        why = f"{template} documents no {method}"
        return None, check_refusal(doc, exchange, 405, "method_not_allowed", why)
    if 200 <= exchange["status"] < 300:
        op.exercised = True
    return op, check_response(doc, op, exchange)


# ---------------------------------------------------------------------------------------------
# The run


def read_exchanges(path: str):
    """(exchange, None) for each good line, (None, what is wrong) for each other one."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as error:
        yield None, f"no exchanges to check: {error}"
        return
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            exchange = json.loads(line)
        except ValueError as error:
            yield None, f"{path}:{number}: not JSON: {error}"
            continue
        if not isinstance(exchange, dict) or not all(k in exchange for k in REQUIRED_KEYS):
            yield None, f"{path}:{number}: not an exchange with {', '.join(REQUIRED_KEYS)}"
        elif not isinstance(exchange["status"], int):
            yield None, f"{path}:{number}: the status is not an integer"
        else:
            yield exchange, None


def exchange_heading(exchange: dict) -> str:
    return f"{exchange['test']} {exchange['method']} {exchange['target']} {exchange['status']}"


def run(doc: Document, exchanges_path: str) -> tuple[int, list[tuple[Operation | None, str]]]:
    """Checks every exchange, then coverage: the number of exchanges checked, and each failure
    in order with its operation (None for an exchange that matches no operation)."""
    failures, checked = [], 0
    for exchange, problem in read_exchanges(exchanges_path):
        if problem:
            failures.append((None, problem))
            continue
        if exchange["target"].startswith(DAYTONA_PREFIX):
            continue
        checked += 1
        op, problems = check_exchange(doc, exchange)
        failures += [(op, f"{exchange_heading(exchange)}: {p}") for p in problems]
    for op in doc.operations:
        if not op.exercised:
            failures.append((op, f"no test exercises {op.name} with a 2xx answer"))
    return checked, failures


def gtest_report(doc: Document, failures: list[tuple[Operation | None, str]]) -> dict:
    """One test per documented operation, and `exchanges` for those that match none."""
    tests = [(op.name, [f for o, f in failures if o is op]) for op in doc.operations]
    tests.append((EXCHANGES_TEST, [f for o, f in failures if o is None]))
    suite = []
    for name, lines in tests:
        test = {"name": name, "classname": "openapi", "status": "RUN", "result": "COMPLETED"}
        if lines:
            test["failures"] = [{"failure": line, "type": ""} for line in lines]
        suite.append(test)
    summary = {"tests": len(suite), "failures": sum(1 for _, lines in tests if lines)}
    return {**summary, "name": "AllTests",
            "testsuites": [{"name": "openapi", **summary, "testsuite": suite}]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("openapi", help="the OpenAPI document (YAML)")
    parser.add_argument("exchanges", help="the recorded exchanges (JSON Lines)")
    parser.add_argument("--report", help="also write a GoogleTest-shaped JSON report here")
    args = parser.parse_args(argv)

    with open(args.openapi, encoding="utf-8") as f:
        doc = Document(yaml.safe_load(f))
    checked, failures = run(doc, args.exchanges)

    for _, line in failures:
        print(line)
    exercised = sum(1 for op in doc.operations if op.exercised)
    print(f"openapi: {checked} exchanges checked, {len(failures)} failures, "
          f"{exercised} of {len(doc.operations)} operations exercised")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(gtest_report(doc, failures), f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
