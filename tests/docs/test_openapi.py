#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_openapi.py IDEM REFUND_SERVICE SOURCE_DIR — docs/openapi.yaml against
the running daemon.

1. The description is well-formed OpenAPI 3.1: its required fields, every
   $ref resolves, every operation has responses, its schemas use only the
   JSON Schema keywords the checker below implements (any other fails here,
   so the description cannot say something that goes unchecked).
2. Its operations are the endpoints docs/http-api.md has headings for and
   the rows of the daemon's endpoint table (server/admin/api.c), and every
   problem type the daemon's source names is among its problem types.
3. idem serve (embedded store, admin_listen on a loopback TCP port, a read
   and a write API key) in front of the example refund service: every
   operation is called with valid and invalid input, at least one success
   and one documented error each, and each real answer (status, content
   type, headers, body) is checked against the description: its status is
   one the operation lists, its content type one of that response's, its
   required headers there and well-formed, its body valid under the schema,
   and a problem's type one the response names, answered with a status the
   type lists. The gateway's own answers are checked against the problem
   types too.

Only the standard library and PyYAML (python3-yaml).
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import yaml

IDEM, REFUND_SERVICE, SRC = (os.path.abspath(a) for a in sys.argv[1:4])
REDIS_URL = sys.argv[4]  # the tests' Redis, for a consumer's stream
SPEC_PATH = os.path.join(SRC, "docs", "openapi.yaml")
HTTP_API_PATH = os.path.join(SRC, "docs", "http-api.md")

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


class SpecError(Exception):
    """The description itself is wrong, or uses what the checker cannot check."""


# ---- the JSON Schema subset ----

CHECKED = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
           "oneOf", "anyOf", "$ref", "minimum", "maximum", "minLength", "maxLength", "pattern"}
NOTES = {"description", "title", "default", "examples", "format"}
TYPES = {"null", "boolean", "integer", "number", "string", "array", "object"}


def resolve(spec, ref):
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise SpecError("$ref %r: only local references (#/...) are used here" % (ref,))
    node = spec
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SpecError("$ref %s does not resolve" % ref)
        node = node[part]
    return node


def is_type(value, t):
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    raise SpecError("type %r is no JSON Schema type" % (t,))


def check_keywords(schema, where):
    if not isinstance(schema, (dict, bool)):
        raise SpecError("%s: a schema must be an object or a boolean" % where)
    if isinstance(schema, bool):
        return
    for k in schema:
        if k not in CHECKED and k not in NOTES and not k.startswith("x-"):
            raise SpecError("%s: keyword %s is not one the checker implements" % (where, k))
    if "type" in schema:
        for t in schema["type"] if isinstance(schema["type"], list) else [schema["type"]]:
            if t not in TYPES:
                raise SpecError("%s: type %r" % (where, t))
    if "pattern" in schema:
        re.compile(schema["pattern"])


def validate(spec, schema, value, where="$"):
    """The errors of value under schema, a list of strings."""
    check_keywords(schema, where)
    if schema is True:
        return []
    if schema is False:
        return ["%s: no value is allowed here" % where]
    errs = []
    if "$ref" in schema:
        errs += validate(spec, resolve(spec, schema["$ref"]), value, where)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(is_type(value, t) for t in types):
            return errs + ["%s: %r is not of type %s" % (where, value, "/".join(types))]
    if "const" in schema and not same(value, schema["const"]):
        errs.append("%s: %r is not %r" % (where, value, schema["const"]))
    if "enum" in schema and not any(same(value, e) for e in schema["enum"]):
        errs.append("%s: %r is none of %r" % (where, value, schema["enum"]))
    if is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errs.append("%s: %r is under %r" % (where, value, schema["minimum"]))
        if "maximum" in schema and value > schema["maximum"]:
            errs.append("%s: %r is over %r" % (where, value, schema["maximum"]))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errs.append("%s: shorter than %d" % (where, schema["minLength"]))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errs.append("%s: longer than %d" % (where, schema["maxLength"]))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append("%s: %r does not match %s" % (where, value[-200:], schema["pattern"]))
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += validate(spec, schema["items"], v, "%s[%d]" % (where, i))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errs.append("%s: required member %s missing" % (where, name))
        for name, v in value.items():
            if name in props:
                errs += validate(spec, props[name], v, "%s.%s" % (where, name))
            elif "additionalProperties" in schema:
                errs += validate(spec, schema["additionalProperties"], v, "%s.%s" % (where, name))
    for key in ("oneOf", "anyOf"):
        if key in schema:
            results = [validate(spec, s, value, "%s<%s %d>" % (where, key, i))
                       for i, s in enumerate(schema[key])]
            ok = sum(1 for r in results if not r)
            if key == "oneOf" and ok != 1:
                errs.append("%s: matches %d of oneOf's %d schemas, not one: %s" %
                            (where, ok, len(results), "; ".join(e for r in results for e in r)))
            if key == "anyOf" and ok == 0:
                errs.append("%s: matches none of anyOf: %s" %
                            (where, "; ".join(e for r in results for e in r)))
    return errs


def same(a, b):
    return type(a) is type(b) and a == b or (is_type(a, "number") and is_type(b, "number")
                                             and not isinstance(a, bool) and a == b)


# ---- 1. the description is well-formed ----

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
OPERATION_KEYS = {"operationId", "tags", "summary", "description", "parameters", "requestBody",
                  "responses", "security"}
RESPONSE_KEYS = {"description", "headers", "content"}


def walk_refs(spec, node, where):
    if isinstance(node, dict):
        if "$ref" in node:
            resolve(spec, node["$ref"])
        for k, v in node.items():
            walk_refs(spec, v, where + "/" + str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk_refs(spec, v, "%s/%d" % (where, i))


def walk_schemas(spec, node, where):
    """Every schema in the description, its keywords checked."""
    if isinstance(node, dict):
        check_keywords(node, where)
        for k in ("properties",):
            for name, s in node.get(k, {}).items():
                walk_schemas(spec, s, "%s/%s/%s" % (where, k, name))
        for k in ("items", "additionalProperties"):
            if isinstance(node.get(k), dict):
                walk_schemas(spec, node[k], where + "/" + k)
        for k in ("oneOf", "anyOf"):
            for i, s in enumerate(node.get(k, [])):
                walk_schemas(spec, s, "%s/%s/%d" % (where, k, i))


def deref(spec, node):
    while isinstance(node, dict) and "$ref" in node:
        node = resolve(spec, node["$ref"])
    return node


def check_spec(spec):
    if spec.get("openapi") != "3.1.0":
        raise SpecError("openapi: must be 3.1.0")
    info = spec.get("info")
    if not isinstance(info, dict) or not isinstance(info.get("title"), str) or \
            not isinstance(info.get("version"), str):
        raise SpecError("info: title and version are required")
    if not isinstance(spec.get("paths"), dict) or not spec["paths"]:
        raise SpecError("paths: required")
    walk_refs(spec, spec, "#")
    schemes = spec.get("components", {}).get("securitySchemes", {})
    for name, s in spec.get("components", {}).get("schemas", {}).items():
        walk_schemas(spec, s, "#/components/schemas/" + name)
    ids = set()
    ops = {}
    for path, item in spec["paths"].items():
        if not path.startswith("/"):
            raise SpecError("path %s: must start with /" % path)
        for method, op in item.items():
            where = "%s %s" % (method.upper(), path)
            if method not in METHODS:
                raise SpecError("%s: %s is no operation" % (path, method))
            unknown = set(k for k in op if not k.startswith("x-")) - OPERATION_KEYS
            if unknown:
                raise SpecError("%s: unknown fields %s" % (where, sorted(unknown)))
            if op.get("operationId") in ids or not op.get("operationId"):
                raise SpecError("%s: operationId missing or not unique" % where)
            ids.add(op["operationId"])
            if not set(op.get("x-idem-listeners", [])) or \
                    not set(op["x-idem-listeners"]) <= {"listen", "admin_listen"}:
                raise SpecError("%s: x-idem-listeners: listen and/or admin_listen" % where)
            if op.get("x-idem-scope") not in ("read", "write"):
                raise SpecError("%s: x-idem-scope: read or write" % where)
            for req in op.get("security", spec.get("security", [])):
                for name in req:
                    if name not in schemes:
                        raise SpecError("%s: security scheme %s is not defined" % (where, name))
            params = [deref(spec, p) for p in op.get("parameters", [])]
            for p in params:
                if p.get("in") not in ("query", "header", "path", "cookie") or "name" not in p:
                    raise SpecError("%s: parameter %r" % (where, p))
                walk_schemas(spec, p.get("schema", {}), where + " parameter " + p["name"])
            declared = set(p["name"] for p in params if p["in"] == "path")
            templated = set(re.findall(r"\{([^}]+)\}", path))
            if declared != templated or \
                    not all(p.get("required") for p in params if p["in"] == "path"):
                raise SpecError("%s: path parameters %s, declared %s" %
                                (where, sorted(templated), sorted(declared)))
            if "requestBody" in op:
                for mt, media in deref(spec, op["requestBody"])["content"].items():
                    walk_schemas(spec, media["schema"], where + " request " + mt)
            if not op.get("responses"):
                raise SpecError("%s: no responses" % where)
            for code, resp in op["responses"].items():
                if not re.fullmatch(r"[1-5][0-9][0-9]|default", str(code)):
                    raise SpecError("%s: response %s: not a status" % (where, code))
                resp = deref(spec, resp)
                unknown = set(k for k in resp if not k.startswith("x-")) - RESPONSE_KEYS
                if unknown or not isinstance(resp.get("description"), str):
                    raise SpecError("%s %s: a description is required; unknown fields %s" %
                                    (where, code, sorted(unknown)))
                for mt, media in resp.get("content", {}).items():
                    walk_schemas(spec, media.get("schema", {}), "%s %s %s" % (where, code, mt))
                for name, h in resp.get("headers", {}).items():
                    walk_schemas(spec, deref(spec, h).get("schema", {}), "%s header %s" %
                                 (where, name))
                for t in resp.get("x-idem-problem-types", []):
                    if "urn:idem:" + t not in problem_types(spec):
                        raise SpecError("%s %s: problem type %s is not in ProblemType" %
                                        (where, code, t))
            ops[(method.upper(), path)] = op
    for entry in spec["components"]["schemas"]["ProblemType"]["oneOf"]:
        statuses = entry.get("x-idem-status") or entry.get("x-idem-status-range")
        if not statuses or not all(isinstance(s, int) and 400 <= s <= 599 for s in statuses):
            raise SpecError("ProblemType %s: x-idem-status (or -range) of 4xx and 5xx" %
                            entry.get("const"))
    return ops


def problem_types(spec):
    """{"urn:idem:x": the statuses it is answered with}"""
    out = {}
    for e in spec["components"]["schemas"]["ProblemType"]["oneOf"]:
        if "x-idem-status-range" in e:
            lo, hi = e["x-idem-status-range"]
            out[e["const"]] = set(range(lo, hi + 1))
        else:
            out[e["const"]] = set(e["x-idem-status"])
    return out


# ---- 2. the description, http-api.md and the source agree ----

def doc_endpoints():
    """The (METHOD, path) of every endpoint heading of http-api.md: "### POST
    /_idem/v1/locks/acquire, /locks/renew" names two, the second under the
    first's /_idem/v1 unless it says so itself."""
    out = set()
    for line in open(HTTP_API_PATH, encoding="utf-8"):
        m = re.match(r"### (GET|POST) (/_idem/v1/[^\s,]+)((?:, /[^\s,]+)*)\s*$", line)
        if not m:
            continue
        out.add((m.group(1), m.group(2)))
        for rel in re.findall(r", (/[^\s,]+)", m.group(3)):
            out.add((m.group(1), rel if rel.startswith("/_idem/v1/") else "/_idem/v1" + rel))
    return out


def table_endpoints():
    """The (METHOD, path) of every row of the JSON API's endpoint table
    (server/admin/api.c): what the daemon routes. A path ending in "{}" is
    records/{space}/{key}; "/{}/" inside one is a consumer's "/{name}/"."""
    text = open(os.path.join(SRC, "server", "admin", "api.c"), encoding="utf-8").read()
    table = text[text.index("endpoints[] = {"):]
    table = table[:table.index("};")]
    out = set()
    for m, p in re.findall(r'\{"(GET|POST)", "([a-z_/{}]+)",', table):
        p = p[:-2] + "{space}/{key}" if p.endswith("{}") else p.replace("/{}/", "/{name}/")
        out.add((m, "/_idem/v1/" + p))
    if not out:
        raise SpecError("server/admin/api.c: no endpoint table found")
    return out


def source_problem_types():
    found = set()
    sources = [os.path.join(top, name) for top, _, names in os.walk(os.path.join(SRC, "server"))
               for name in names if name.endswith(".c")]
    for path in sources:
        text = open(path, encoding="utf-8").read()
        found |= set(re.findall(r'problem\([^,()]+,\s*"([a-z_]+)"', text))
        found |= set(re.findall(r'bad\(type,\s*"([a-z_]+)"', text))
        found |= set(re.findall(r'send_problem_and_close\(c,\s*\d+,\s*"([a-z_]+)"', text))
        found |= set(re.findall(r'error_status == \d+\s*\?\s*"([a-z_]+)"', text))
        found |= set(re.findall(r'urn:idem:([a-z_]+)', text))
    return found


# ---- 3. the daemon ----

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, what):
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit("%s exited with %d" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("%s does not listen on %d" % (what, port))


WRITE_KEY = "w" * 8 + "0123456789abcdef-write"
READ_KEY = "r" * 8 + "0123456789abcdef-read"


def shown(body):
    return (body.decode("utf-8", "replace") if isinstance(body, bytes) else json.dumps(body))[:120]


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # [(name, value)]
        self.body = body

    def header(self, name):
        vals = [v for n, v in self.headers if n.lower() == name.lower()]
        return vals[0] if vals else None

    def json(self):
        return json.loads(self.body)


def send(port, method, target, body=None, headers=()):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None \
        else b""
    for n, v in headers:
        c.putheader(n, v)
    if body is not None or method == "POST":
        c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(len(data)))
    c.endheaders(data if data else None)
    r = c.getresponse()
    a = Answer(r.status, r.getheaders(), r.read())
    c.close()
    return a


def check_problem(spec, a, where, types=None):
    """a is a problem: its body the Problem schema's, its type one of types
    (when given) and answered with a status the type lists."""
    try:
        body = a.json()
    except ValueError:
        fail("%s: the problem's body is not JSON: %r" % (where, a.body[:200]))
        return None
    for e in validate(spec, {"$ref": "#/components/schemas/Problem"}, body):
        fail("%s: %s" % (where, e))
    t = body.get("type") if isinstance(body, dict) else None
    known = problem_types(spec)
    if t in known and a.status not in known[t]:
        fail("%s: %s answered %d, and ProblemType lists %s" % (where, t, a.status,
                                                               sorted(known[t])))
    if types is not None and t not in ["urn:idem:" + x for x in types]:
        fail("%s: problem type %s, and the response names %s" % (where, t, types))
    if isinstance(body, dict) and body.get("status") != a.status:
        fail("%s: the problem's status %r is not the answer's %d" % (where, body.get("status"),
                                                                     a.status))
    return body


def check_answer(spec, op, a, where):
    """a against the operation's responses: status, content type, headers, body."""
    resp = op["responses"].get(str(a.status)) or op["responses"].get("default")
    if resp is None:
        fail("%s: status %d is not one the operation lists (%s)" %
             (where, a.status, ", ".join(op["responses"])))
        return
    resp = deref(spec, resp)
    ctype = a.header("Content-Type")
    content = resp.get("content", {})
    media = content.get(ctype)
    if media is None and ctype:
        media = content.get(ctype.split(";")[0].strip())
    if content and media is None:
        fail("%s: Content-Type %r, and the description has %s" % (where, ctype, list(content)))
        return
    for name, h in resp.get("headers", {}).items():
        h = deref(spec, h)
        v = a.header(name)
        if v is None:
            if h.get("required"):
                fail("%s: header %s missing" % (where, name))
            continue
        for e in validate(spec, h.get("schema", {}), v, "header " + name):
            fail("%s: %s" % (where, e))
    if media is None:
        return
    if ctype.startswith("application/"):
        try:
            body = a.json()
        except ValueError:
            fail("%s: the body is not JSON: %r" % (where, a.body[:200]))
            return
    else:
        body = a.body.decode("utf-8")
    for e in validate(spec, media.get("schema", {}), body):
        fail("%s: %s" % (where, e))
    if ctype == "application/problem+json":
        check_problem(spec, a, where, resp.get("x-idem-problem-types"))


class Daemon:
    def __init__(self, spec, ops):
        self.spec = spec
        self.ops = ops
        self.covered = {k: set() for k in ops}
        self.dir = tempfile.mkdtemp(prefix="idem-openapi.")
        self.up = free_port()
        self.listen = free_port()
        self.admin = free_port()
        self.dead = free_port()  # nothing listens there: upstream_unreachable
        self.log = open(os.path.join(self.dir, "idem.log"), "w")
        self.idem = None
        self.svc = subprocess.Popen([REFUND_SERVICE, "--listen", "127.0.0.1:%d" % self.up,
                                     "--db", ":memory:"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=self.log)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    def start(self):
        wait_port(self.up, self.svc, "refund_service")
        up = "http://127.0.0.1:%d" % self.up
        cfg = os.path.join(self.dir, "idem.yaml")
        with open(cfg, "w") as f:
            f.write(f"""
listen: 127.0.0.1:{self.listen}
admin_listen: 127.0.0.1:{self.admin}
api_keys:
  - {{ name: ops, scope: write, env: IDEM_OPENAPI_WRITE_KEY }}
  - {{ name: viewer, scope: read, env: IDEM_OPENAPI_READ_KEY }}
storage: {{ kind: embedded, path: {self.dir}/idem.db }}
subject_header: X-Subject
limits: {{ token_rate_subject: 3 }}
access_log: off
routes:
  - name: refund
    match: {{ method: POST, path: /refunds }}
    upstream: {up}
    key: {{ json: refund_no }}
    scope: subject
    layers: [token, record]
    replay_headers: [content-type, location]
  - name: slow
    match: {{ method: POST, path: /orders/*/refunds }}
    upstream: {up}
    key: {{ json: refund_no }}
    upstream_timeout: 300ms
    lease: 10s
    retention: 1h
    on_unknown_outcome: hold
  - name: dead
    match: {{ method: POST, path: /payments }}
    upstream: http://127.0.0.1:{self.dead}
    key: {{ json: refund_no }}
consumers:
  - name: payments-mq
    source: {{ redis_stream: "{REDIS_URL}", stream: idem-openapi-{os.getpid()}, group: idem }}
    key: {{ json: refund_no }}
    handler: {up}/refunds
""")
        env = dict(os.environ, IDEM_OPENAPI_WRITE_KEY=WRITE_KEY, IDEM_OPENAPI_READ_KEY=READ_KEY)
        self.idem = subprocess.Popen([IDEM, "serve", "-c", cfg], env=env, cwd=self.dir,
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_port(self.listen, self.idem, "idem serve")
        wait_port(self.admin, self.idem, "idem serve")

    def stop(self):
        for p in (self.idem, self.svc):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.log.close()
        # A clean stop on SIGTERM: exit status 0 (and, in a sanitizer's
        # build, no report of its at exit).
        if self.idem is not None and self.idem.returncode != 0:
            fail("idem serve exited with %d after SIGTERM" % self.idem.returncode)
        if failures or self.idem is None:
            print("--- the log of idem serve and the refund service ---")
            sys.stdout.write(open(os.path.join(self.dir, "idem.log")).read()[-4000:])
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, method, path, target=None, body=None, key="write", on="admin",
             headers=(), status=None, problem=None, body_invalid=False):
        """One request of the operation (method, path), its answer checked
        against the description; status and problem what this call expects."""
        op = self.ops[(method, path)]
        target = target or path
        hs = list(headers)
        if key and on == "admin":
            hs.append(("Authorization", "Bearer " + (WRITE_KEY if key == "write" else
                                                     READ_KEY if key == "read" else key)))
        a = send(self.admin if on == "admin" else self.listen, method, target, body, hs)
        where = "%s %s on %s (%s)" % (method, target, on, shown(body))
        if status is not None and a.status != status:
            fail("%s: answered %d, expected %d: %s" % (where, a.status, status, a.body[:300]))
        if problem is not None:
            got = a.json().get("type") if a.body.startswith(b"{") else None
            if got != "urn:idem:" + problem:
                fail("%s: problem %s, expected %s" % (where, got, problem))
        check_answer(self.spec, op, a, where)
        # What the description says a client may send: a body it lets
        # through is one the daemon takes, one it refuses the daemon refuses.
        if body is not None and "requestBody" in op and not isinstance(body, bytes):
            schema = deref(self.spec, op["requestBody"])["content"]["application/json"]["schema"]
            errs = validate(self.spec, schema, body)
            if body_invalid and not errs:
                fail("%s: the request schema takes this body the daemon refuses" % where)
            if a.status < 300 and errs:
                fail("%s: a body the daemon takes, and the request schema refuses: %s" %
                     (where, errs))
        if a.status < 300:
            self.covered[(method, path)].add("ok")
        elif a.status >= 400:
            self.covered[(method, path)].add("error")
        return a


def gateway(d, target, body, headers=(), status=None, problem=None):
    """A request to one of the routes: a problem answered is one of the
    description's problem types, with its status."""
    a = send(d.listen, "POST", target, body, headers)
    where = "gateway POST %s (%s)" % (target, shown(body))
    if status is not None and a.status != status:
        fail("%s: answered %d, expected %d: %s" % (where, a.status, status, a.body[:300]))
    if problem is not None:
        if a.header("Content-Type") != "application/problem+json":
            fail("%s: Content-Type %r, not application/problem+json" %
                 (where, a.header("Content-Type")))
        body = check_problem(d.spec, a, where)
        if body and body.get("type") != "urn:idem:" + problem:
            fail("%s: problem %s, expected %s" % (where, body.get("type"), problem))
    return a


def exercise(d):
    P = "/_idem/v1"
    spec = d.spec
    retry_after = spec["components"]["headers"]["Retry-After"]

    # ---- tokens, on both listeners ----
    a = d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "refund"},
               headers=[("X-Subject", "alice")], status=201)
    tok = a.json()["token"]
    d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "nope"},
           headers=[("X-Subject", "alice")], status=400, problem="invalid_field")
    d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "refund", "ttl": 1},
           status=400, problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/tokens", on="listen", key=None, body=b"[1,", status=400,
           problem="invalid_json")
    d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "refund"},
           headers=[("X-Subject", "a"), ("X_Subject", "b")], status=400,
           problem="subject_invalid")
    for i in range(5):
        a = d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "refund"},
                   headers=[("X-Subject", "flood")])
        if a.status == 429:
            break
    if a.status != 429:
        fail("POST tokens on listen past token_rate_subject: %d, not 429" % a.status)
    elif not re.fullmatch(retry_after["schema"]["pattern"], a.header("Retry-After") or ""):
        fail("429 too_many_tokens without Retry-After")
    a = d.call("POST", P + "/tokens", body={"scene": "any", "ttl_ms": 60000},
               headers=[("X-Subject", "bob")], status=201)
    admin_tok = a.json()["token"]
    d.call("POST", P + "/tokens", body={"scene": "any"}, key="read", status=403,
           problem="insufficient_scope")
    d.call("POST", P + "/tokens", body={"scene": "any"}, key=None, status=401,
           problem="unauthorized")
    d.call("POST", P + "/tokens", body={"scene": "any"}, key="not-a-key-of-this-daemon",
           status=401, problem="unauthorized")
    d.call("POST", P + "/tokens", body={"scene": "any", "ttl_ms": "60000"}, status=400,
           problem="invalid_field", body_invalid=True)

    # ---- tokens/consume, tokens/give_back ----
    hs = [("X-Subject", "bob")]
    d.call("POST", P + "/tokens/consume", body={"scene": "any", "token": admin_tok, "key": "K-1"},
           headers=hs, status=200)
    a = d.call("POST", P + "/tokens/consume", body={"scene": "any", "token": admin_tok},
               headers=hs, status=200)
    if a.json().get("outcome") != "ALREADY_CONSUMED" or a.json().get("spent_key") != "K-1":
        fail("consume twice: %r" % a.json())
    d.call("POST", P + "/tokens/consume", body={"scene": "any", "token": "x" * 32}, headers=hs,
           status=200)
    d.call("POST", P + "/tokens/consume", body={"scene": "any"}, status=400,
           problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/tokens/consume", on="listen", key=None,
           body={"scene": "refund", "token": tok}, status=404, problem="no_such_endpoint")
    a = d.call("POST", P + "/tokens/give_back",
               body={"scene": "any", "token": admin_tok, "key": "K-1"}, headers=hs, status=200)
    if a.json().get("outcome") != "RESTORED":
        fail("give_back: %r" % a.json())
    d.call("POST", P + "/tokens/give_back", body={"scene": "any", "token": 7}, status=400,
           problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/tokens/give_back", body={"scene": "any", "token": admin_tok},
           key="read", status=403, problem="insufficient_scope")

    # ---- locks ----
    lock = {"space": "inv", "key": "L-1", "owner": "w-1", "ttl_ms": 30000}
    a = d.call("POST", P + "/locks/acquire", body=lock, status=200)
    if a.json().get("outcome") != "ACQUIRED":
        fail("acquire: %r" % a.json())
    a = d.call("POST", P + "/locks/acquire", body=dict(lock, owner="w-2"), status=200)
    if a.json().get("outcome") != "BUSY" or a.json().get("holder") != "w-1":
        fail("acquire of a held lock: %r" % a.json())
    d.call("POST", P + "/locks/acquire", body=dict(lock, ttl_ms=1.5), status=400,
           problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/locks/acquire", body=dict(lock, space=""), status=400,
           problem="invalid_argument", body_invalid=True)
    a = d.call("POST", P + "/locks/renew", body=lock, status=200)
    if a.json().get("outcome") != "RENEWED":
        fail("renew: %r" % a.json())
    d.call("POST", P + "/locks/renew", body=dict(lock, lease=1), status=400,
           problem="invalid_field", body_invalid=True)
    rel = {"space": "inv", "key": "L-1", "owner": "w-1"}
    a = d.call("POST", P + "/locks/release", body=dict(rel, owner="w-2"), status=200)
    if a.json().get("outcome") != "NOT_HELD":
        fail("release by another owner: %r" % a.json())
    a = d.call("POST", P + "/locks/release", body=rel, status=200)
    if a.json().get("outcome") != "RELEASED":
        fail("release: %r" % a.json())
    d.call("POST", P + "/locks/release", body=lock, status=400, problem="invalid_field",
           body_invalid=True)
    d.call("POST", P + "/locks/release", on="listen", key=None, body=rel, status=404,
           problem="no_such_endpoint")

    # ---- records ----
    begin = {"space": "api", "key": "R-1", "owner": "w-1", "lease_ms": 30000,
             "fingerprint": "ab" * 32}
    a = d.call("POST", P + "/records/begin", body=begin, status=200)
    epoch = a.json()["record"]["epoch"]
    if a.json()["outcome"] != "NEW":
        fail("begin: %r" % a.json())
    a = d.call("POST", P + "/records/begin", body=dict(begin, owner="w-2"), status=200)
    if a.json()["outcome"] != "IN_PROGRESS":
        fail("begin of a claimed key: %r" % a.json())
    d.call("POST", P + "/records/begin", body=dict(begin, fingerprint="xyz"), status=400,
           problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/records/begin", body=b'{"space":"a","space":"b"}', status=400,
           problem="invalid_json")
    fin = {"space": "api", "key": "R-1", "epoch": epoch, "result": '{"id":1}',
           "retention_ms": 3600000}
    a = d.call("POST", P + "/records/complete", body=fin, status=200)
    if a.json()["outcome"] != "COMPLETED":
        fail("complete: %r" % a.json())
    a = d.call("POST", P + "/records/complete", body=fin, status=200)
    if a.json()["outcome"] != "CONFLICT":
        fail("complete twice: %r" % a.json())
    d.call("POST", P + "/records/complete", body=dict(fin, epoch=0), status=400,
           problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/records/complete",
           body={"space": "api", "key": "R-1", "epoch": epoch, "result_base64": "abcde"},
           status=400, problem="invalid_field", body_invalid=True)
    a = d.call("POST", P + "/records/begin", body=begin, status=200)
    if a.json()["outcome"] != "DONE" or a.json()["record"].get("result") != '{"id":1}':
        fail("begin of a finished key: %r" % a.json())
    a = d.call("POST", P + "/records/begin", body=dict(begin, fingerprint="cd" * 32), status=200)
    if a.json()["outcome"] != "MISMATCH":
        fail("begin with another fingerprint: %r" % a.json())
    # fail: a binary result, read back as result_base64
    a = d.call("POST", P + "/records/begin", body={"space": "api", "key": "R-2", "owner": "w"},
               status=200)
    e2 = a.json()["record"]["epoch"]
    a = d.call("POST", P + "/records/fail", body={"space": "api", "key": "R-2", "epoch": e2,
                                                   "result_base64": "AAEC", "retryable": False},
               status=200)
    if a.json()["outcome"] != "COMPLETED":
        fail("fail: %r" % a.json())
    d.call("POST", P + "/records/fail", body={"space": "api", "key": "R-2", "epoch": e2,
                                              "retryable": "true"},
           status=400, problem="invalid_field", body_invalid=True)
    # transition
    tr = {"space": "api", "key": "R-1", "from": "SUCCEEDED", "to": "REFUNDED"}
    a = d.call("POST", P + "/records/transition", body=tr, status=200)
    if a.json()["outcome"] != "APPLIED":
        fail("transition: %r" % a.json())
    a = d.call("POST", P + "/records/transition", body=dict(tr, to="CANCELLED"), status=200)
    if a.json() != {"outcome": "CONFLICT", "current": "REFUNDED"}:
        fail("transition from a state it is not in: %r" % a.json())
    a = d.call("POST", P + "/records/transition", body=dict(tr, key="nope"), status=200)
    if a.json()["outcome"] != "NOT_FOUND":
        fail("transition of no record: %r" % a.json())
    d.call("POST", P + "/records/transition", body=dict(tr, to="PROCESSING"), status=400,
           problem="invalid_argument")
    d.call("POST", P + "/records/transition", body={"space": "api", "key": "R-1"}, status=400,
           problem="invalid_field", body_invalid=True)
    # GET one
    rec_path = P + "/records/{space}/{key}"
    a = d.call("GET", rec_path, P + "/records/api/R-1", key="read", status=200)
    if a.json()["record"]["state"] != "REFUNDED":
        fail("get: %r" % a.json())
    a = d.call("GET", rec_path, P + "/records/api/R-2", key="read", status=200)
    if a.json()["record"].get("result_base64") != "AAEC":
        fail("get of a binary result: %r" % a.json())
    d.call("GET", rec_path, P + "/records/api/nope", key="read", status=404,
           problem="record_not_found")
    d.call("GET", rec_path, P + "/records/api/R%zz", key="read", status=400,
           problem="invalid_path")

    # ---- the gateway, its problems against the description's types ----
    gateway(d, "/refunds", {"refund_no": "G-1", "amount": "1.00"}, [("X-Subject", "carol")],
            428, "token_missing")
    gateway(d, "/refunds", {"refund_no": "G-1", "amount": "1.00"},
            [("X-Subject", "carol"), ("Idem-Token", "x" * 32)], 409, "token_spent")
    gateway(d, "/refunds", {"amount": "1.00"}, [("X-Subject", "carol")], 400, "key_missing")
    gateway(d, "/refunds", {"refund_no": "", "amount": "1.00"}, [("X-Subject", "carol")], 400,
            "key_invalid")
    gateway(d, "/refunds", {"refund_no": "G-1", "amount": "1.00"}, [], 400, "subject_missing")
    gateway(d, "/refunds/../refunds", {"refund_no": "G-1"}, [], 400, "path_not_canonical")
    gateway(d, "/nowhere", {"refund_no": "G-1"}, [], 404, "no_route")
    t = d.call("POST", P + "/tokens", on="listen", key=None, body={"scene": "refund"},
               headers=[("X-Subject", "carol")], status=201).json()["token"]
    hs = [("X-Subject", "carol"), ("Idem-Token", t)]
    first = gateway(d, "/refunds", {"refund_no": "G-1", "amount": "1.00"}, hs, 201)
    again = gateway(d, "/refunds", {"refund_no": "G-1", "amount": "1.00"}, hs, 201)
    replayed = spec["components"]["headers"]["Idempotent-Replayed"]["schema"]["const"]
    if again.header("Idempotent-Replayed") != replayed or first.header("Idempotent-Replayed"):
        fail("a replay's Idempotent-Replayed: %r, the first answer's %r" %
             (again.header("Idempotent-Replayed"), first.header("Idempotent-Replayed")))
    if again.body != first.body:
        fail("the replay is not the first answer")
    gateway(d, "/refunds", {"refund_no": "G-1", "amount": "9.00"}, hs, 422, "key_reused")
    gateway(d, "/payments", {"refund_no": "P-1"}, [], 502, "upstream_unreachable")
    gateway(d, "/orders/O-1/refunds", {"refund_no": "H-1", "amount": "1.00"},
            [("X-Delay-Ms", "3000")], 504, "outcome_unknown")
    a = gateway(d, "/orders/O-1/refunds", {"refund_no": "H-1", "amount": "1.00"}, [], 409,
                "request_in_flight")
    if not re.fullmatch(retry_after["schema"]["pattern"], a.header("Retry-After") or ""):
        fail("409 request_in_flight without Retry-After: %r" % a.headers)

    # ---- listings and events ----
    a = d.call("GET", P + "/records", P + "/records?space=slow&state=processing&limit=10",
               key="read", status=200)
    held = [r for r in a.json()["records"] if r["key"] == "H-1"]
    if not held or held[0].get("held") is not True:
        fail("the held claim is not listed held: %r" % a.json())
    hepoch = held[0]["epoch"] if held else 1
    a = d.call("GET", P + "/records", P + "/records?space=refund&limit=1", key="read", status=200)
    if a.json()["records"] and a.json()["records"][0].get("status") != 201:
        fail("a gateway record's status: %r" % a.json())
    d.call("GET", P + "/records", P + "/records?space=api&limit=501", key="read", status=400,
           problem="invalid_parameter")
    d.call("GET", P + "/records", P + "/records?space=api&colour=red", key="read", status=400,
           problem="invalid_parameter")
    d.call("GET", P + "/records", P + "/records?limit=1", key="read", status=400,
           problem="invalid_parameter")
    d.call("GET", P + "/records", P + "/records?space=api", on="listen", key=None, status=404,
           problem="no_such_endpoint")
    a = d.call("GET", P + "/records/held", P + "/records/held?space=slow", key="read", status=200)
    if [r["key"] for r in a.json()["records"]] != ["H-1"]:
        fail("records/held: %r" % a.json())
    d.call("GET", P + "/records/held", P + "/records/held?space=api", key="read", status=400,
           problem="invalid_parameter")
    a = d.call("GET", P + "/events", P + "/events?limit=10", key="read", status=200)
    kinds = [e["kind"] for e in a.json()["events"]]
    if "held" not in kinds or "mismatch_422" not in kinds or "in_flight_409" not in kinds:
        fail("events: %r" % kinds)
    d.call("GET", P + "/events", P + "/events?limit=0", key="read", status=400,
           problem="invalid_parameter")

    # ---- the console's questions ----
    a = d.call("GET", P + "/whoami", key="read", status=200)
    if a.json().get("scope") != "read" or a.json().get("write") is not False:
        fail("whoami with the read key: %r" % a.json())
    d.call("GET", P + "/whoami", key=None, status=401, problem="unauthorized")
    a = d.call("GET", P + "/spaces", key="read", status=200)
    if "slow" not in [e["space"] for e in a.json()["spaces"]]:
        fail("spaces: %r" % a.json())
    d.call("GET", P + "/spaces", on="listen", key=None, status=404, problem="no_such_endpoint")
    a = d.call("GET", P + "/routes", key="read", status=200)
    if not any(r["kind"] == "route" and r.get("match") for r in a.json()["routes"]):
        fail("routes: %r" % a.json())
    d.call("GET", P + "/routes", key=None, status=401, problem="unauthorized")
    a = d.call("GET", P + "/routes/stats", key="read", status=200)
    if not any(r["requests"] > 0 and r["p99_ms"] is not None for r in a.json()["routes"]):
        fail("routes/stats: %r" % a.json())
    d.call("GET", P + "/routes/stats", on="listen", key=None, status=404,
           problem="no_such_endpoint")

    # ---- an operator's actions ----
    act = {"space": "slow", "key": "H-1", "epoch": hepoch}
    # ---- a consumer's dead letters (none here: nothing to move) ----
    rd = P + "/consumers/{name}/redrive"
    mine = P + "/consumers/payments-mq/redrive"
    a = d.call("POST", rd, target=mine, body={"limit": 10}, status=200)
    if a.json()["moved"] != 0 or not a.json()["complete"]:
        fail("POST %s with no dead letter: %s" % (mine, a.body[:200]))
    d.call("POST", rd, target=mine, body={"limit": 0}, status=400, problem="invalid_field",
           body_invalid=True)
    d.call("POST", rd, target=mine, body={"why": "x"}, status=400, problem="invalid_field",
           body_invalid=True)
    d.call("POST", rd, target=P + "/consumers/nobody/redrive", body={}, status=404,
           problem="no_such_consumer")
    d.call("POST", rd, target=mine, body={}, key="read", status=403,
           problem="insufficient_scope")

    d.call("POST", P + "/records/release", body=act, key="read", status=403,
           problem="insufficient_scope")
    d.call("POST", P + "/records/mark_failed", body=dict(act, reason="paid by hand", status=409),
           status=200)
    a = gateway(d, "/orders/O-1/refunds", {"refund_no": "H-1", "amount": "1.00"}, [], 409,
                "failed_by_operator")
    if a.header("Idempotent-Replayed") != replayed:
        fail("the replay of a record marked failed: no Idempotent-Replayed")
    d.call("POST", P + "/records/mark_failed", body=dict(act, reason="again"), status=409,
           problem="record_moved_on")
    d.call("POST", P + "/records/mark_failed", body=act, status=400, problem="invalid_field",
           body_invalid=True)
    d.call("POST", P + "/records/mark_failed", body=dict(act, reason="x", status=302),
           status=400, problem="invalid_field", body_invalid=True)
    d.call("POST", P + "/records/release", body=act, status=409, problem="record_moved_on")
    d.call("POST", P + "/records/release", body=dict(act, key="none"), status=404,
           problem="record_not_found")
    d.call("POST", P + "/records/release", body=dict(act, epoch="1"), status=400,
           problem="invalid_field", body_invalid=True)
    a = d.call("POST", P + "/records/begin", body={"space": "ops", "key": "O-1", "owner": "w"},
               status=200)
    oe = a.json()["record"]["epoch"]
    ou = a.json()["record"]["updated_ms"]
    dl = {"space": "ops", "key": "O-1", "epoch": oe, "updated_ms": ou}
    d.call("POST", P + "/records/delete", body=dl, status=409, problem="record_moved_on")
    d.call("POST", P + "/records/release", body={"space": "ops", "key": "O-1", "epoch": oe},
           status=200)
    rec_path = P + "/records/{space}/{key}"
    a = d.call("GET", rec_path, P + "/records/ops/O-1", key="read", status=200)
    dl["updated_ms"] = a.json()["record"]["updated_ms"]
    d.call("POST", P + "/records/delete", body=dl, status=200)
    d.call("POST", P + "/records/delete", body=dl, status=404, problem="record_not_found")
    d.call("POST", P + "/records/delete", body={"space": "ops", "key": "O-1", "epoch": oe},
           status=400, problem="invalid_field", body_invalid=True)

    # ---- health and metrics ----
    for path in ("/health", "/health/ready", "/health/live"):
        a = d.call("GET", P + path, on="listen", key=None, status=200)
        a = d.call("GET", P + path, key="read", status=200)
        d.call("GET", P + path, key=None, status=401, problem="unauthorized")
    a = d.call("GET", P + "/health", key="read", status=200)
    if a.json().get("version") != spec["info"]["version"]:
        fail("health's version %r, info.version %r" % (a.json().get("version"),
                                                       spec["info"]["version"]))
    if "consumers" in d.call("GET", P + "/health", on="listen", key=None).json():
        fail("the main listener's health has the counters")
    a = d.call("GET", P + "/metrics", key="read", status=200)
    if b'idem_requests_total{route="refund",outcome="executed"}' not in a.body:
        fail("metrics without the refund route's requests")
    d.call("GET", P + "/metrics", key=None, status=401, problem="unauthorized")
    d.call("GET", P + "/metrics", on="listen", key=None, status=404, problem="no_such_endpoint")

    # Every documented method-not-allowed: each operation's 405.
    for (method, path), op in d.ops.items():
        if "405" not in op["responses"]:
            continue
        target = path.replace("{space}", "api").replace("{key}", "R-1").replace(
            "{name}", "payments-mq")
        other = "PUT"
        a = send(d.admin, other, target, None, [("Authorization", "Bearer " + WRITE_KEY)])
        where = "%s %s on admin" % (other, target)
        if a.status != 405:
            fail("%s: %d, not 405" % (where, a.status))
        allow = "POST" if method == "POST" else "GET, HEAD"
        if a.header("Allow") != allow:
            fail("%s: Allow %r, not %r" % (where, a.header("Allow"), allow))
        check_answer(spec, op, a, where)
        # Every GET operation answers HEAD too ("info.description"): the
        # same status and headers, no body.
        if method == "GET":
            key = [("Authorization", "Bearer " + READ_KEY)]
            g = send(d.admin, "GET", target, None, key)
            h = send(d.admin, "HEAD", target, None, key)
            if h.status != g.status or h.body or \
                    h.header("Content-Type") != g.header("Content-Type"):
                fail("HEAD %s: %d %r %r, GET: %d %r" % (target, h.status, h.header("Content-Type"),
                                                       h.body[:80], g.status,
                                                       g.header("Content-Type")))


def main():
    spec = yaml.safe_load(open(SPEC_PATH, encoding="utf-8"))
    try:
        ops = check_spec(spec)
    except SpecError as e:
        print("FAIL: docs/openapi.yaml: %s" % e)
        return 1
    described = set(ops)
    documented = doc_endpoints()
    for m, p in sorted(documented - described):
        fail("http-api.md has a heading for %s %s, openapi.yaml does not describe it" % (m, p))
    for m, p in sorted(described - documented):
        fail("openapi.yaml describes %s %s, http-api.md has no heading for it" % (m, p))
    routed = table_endpoints()
    for m, p in sorted(routed - described):
        fail("the endpoint table routes %s %s, openapi.yaml does not describe it" % (m, p))
    for m, p in sorted(described - routed):
        fail("openapi.yaml describes %s %s, the endpoint table has no row for it" % (m, p))
    types = set(t[len("urn:idem:"):] for t in problem_types(spec))
    for t in sorted(source_problem_types() - types):
        fail("server/ answers problem type %s, and ProblemType does not list it" % t)

    d = Daemon(spec, ops)
    try:
        exercise(d)
    except SpecError as e:
        fail("docs/openapi.yaml: %s" % e)
    finally:
        d.stop()
    for (m, p), seen in sorted(d.covered.items()):
        for what in ("ok", "error"):
            if what not in seen:
                fail("%s %s: no %s answer was checked" % (m, p, "successful" if what == "ok"
                                                          else "error"))
    if failures:
        print("%d failures" % len(failures))
        return 1
    print("openapi.yaml: %d operations, each answer checked against the daemon's" % len(ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
