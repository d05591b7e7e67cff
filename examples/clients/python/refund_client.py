#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""refund_client.py -- the token flow against idem serve, standard library only.

Issues a one-time token (POST /_idem/v1/tokens), submits a refund with it,
submits it again (Idem answers with the first answer: Idempotent-Replayed),
then tries another refund with the spent token (409 token_spent, whose detail
is the configuration's text for people). Exits 0 when every answer is the one
Idem promises, 1 otherwise.

    refund_client.py [BASE_URL [SUBJECT [REFUND_NO]]]
    refund_client.py http://127.0.0.1:8080 alice R-py-1
"""
import json
import sys
import time
import urllib.error
import urllib.request


def call(base, path, subject, body, token=None):
    """POST body as JSON; returns (status, headers, parsed body or text)."""
    headers = {"Content-Type": "application/json", "X-Subject": subject}
    if token:
        headers["Idem-Token"] = token
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, hdrs, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:  # 4xx and 5xx are answers too
        status, hdrs, raw = e.code, e.headers, e.read()
    text = raw.decode("utf-8")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def main(argv):
    base = (argv[1] if len(argv) > 1 else "http://127.0.0.1:8080").rstrip("/")
    subject = argv[2] if len(argv) > 2 else "alice"
    refund_no = argv[3] if len(argv) > 3 else "R-py-%d" % time.time()
    refund = {"refund_no": refund_no, "amount": "1.00"}

    status, _, body = call(base, "/_idem/v1/tokens", subject, {"scene": "refund"})
    if status != 201:
        print("issue: %d %s" % (status, body))
        return 1
    token = body["token"]
    print("token: issued")

    status, hdrs, first = call(base, "/refunds", subject, refund, token)
    print("submit: %d %s (kept until %s)" % (status, json.dumps(first),
                                            hdrs.get("Idempotency-Key-Expires")))
    if status != 201 or hdrs.get("Idempotent-Replayed"):
        return 1

    status, hdrs, again = call(base, "/refunds", subject, refund, token)
    replayed = hdrs.get("Idempotent-Replayed") == "true"
    print("again: %d replayed=%s %s" % (status, str(replayed).lower(), json.dumps(again)))
    if status != 201 or not replayed or again != first:
        return 1

    other = {"refund_no": refund_no + "-other", "amount": "1.00"}
    status, _, spent = call(base, "/refunds", subject, other, token)
    if status != 409 or not isinstance(spent, dict):
        print("spent token: %d %s" % (status, spent))
        return 1
    print("spent token: %d %s: %s" % (status, spent.get("type"), spent.get("detail")))
    return 0 if spent.get("type") == "urn:idem:token_spent" else 1


if __name__ == "__main__":
    sys.stdout.reconfigure(encoding="utf-8")
    sys.exit(main(sys.argv))
