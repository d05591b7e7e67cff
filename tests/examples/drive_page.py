#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""drive_page.py CHROMIUM URL EXPECTED_DETAIL -- the refund form in a real browser.

Starts headless Chromium on URL (the example refund form, through idem serve)
and drives it as a user would, over the DevTools protocol (a WebSocket,
spoken here with the standard library): the page gets a token on load; a
bad amount is refused and, corrected, executes with the same token; a
second click is the replay; another refund
number with the spent token shows EXPECTED_DETAIL (the configuration's text
for token_spent) and the retry button, which gets a new token with which
that refund executes. Prints each step; exits 0 when all happened, else 1.
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request


class Page:
    """A DevTools WebSocket to one page: commands in, their results out."""

    def __init__(self, ws_url):
        u = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n"
                           % (u.path, u.hostname, u.port, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("DevTools closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError("DevTools refused the WebSocket: %r" % head[:200])
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.seq = 0

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("DevTools closed the WebSocket")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _message(self):
        data = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)  # the server does not mask
            if b0 & 0x0F == 8:
                raise RuntimeError("DevTools closed the WebSocket")
            data += payload
            if b0 & 0x80:
                return json.loads(data)

    def call(self, method, **params):
        self.seq += 1
        msg = json.dumps({"id": self.seq, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(msg)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
        while True:
            m = self._message()
            if m.get("id") == self.seq:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expr, what, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.05)
        raise RuntimeError("waited %ds for %s" % (timeout, what))


def main(chromium, url, detail):
    profile = tempfile.mkdtemp(prefix="idem-chromium.")
    proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                             "--no-first-run", "--user-data-dir=" + profile,
                             "--remote-debugging-port=0", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its helpers go with it
    try:
        port = None
        end = time.time() + 30
        while port is None and time.time() < end:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError("chromium exited before listening")
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = m and int(m.group(1))
        if not port:
            raise RuntimeError("chromium never said where DevTools listens")
        with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        page = Page(target["webSocketDebuggerUrl"])
        page.call("Page.enable")
        page.call("Page.navigate", url=url)

        text = "document.getElementById('%s').textContent"
        # Asked while the page may still be loading: nothing until the form is.
        tokened = ("(document.getElementById('send') && !document.getElementById('send').disabled"
                   " && document.getElementById('token').textContent)")
        token = page.wait(tokened, "a token on load")
        print("loaded: a token for the form")

        def submit(refund_no, amount="1.00"):
            page.js("document.getElementById('result').textContent = '';"
                    "document.getElementById('refund_no').value = %s;"
                    "document.getElementById('amount').value = %s;"
                    "document.getElementById('send').click()"
                    % (json.dumps(refund_no), json.dumps(amount)))
            return page.wait(text % "result", "the answer to refund " + refund_no)

        # A bad amount: the service's 400 is not kept, and the token is
        # given back, so the corrected form goes through with it.
        refused = submit("R-browser-1", "1,00")
        print("bad amount: " + refused)
        if not refused.startswith("400: amount must be"):
            return 1
        first = submit("R-browser-1")
        print("submit: " + first)
        if not first.startswith("Done: ") or '"refund_no":"R-browser-1"' not in first:
            return 1
        again = submit("R-browser-1")
        print("again: " + again)
        if again != "Already done (replayed): " + first[len("Done: "):]:
            return 1
        spent = submit("R-browser-2")
        shown = page.js("!document.getElementById('again').hidden")
        print("spent token: %s (retry button shown: %s)" % (spent, shown))
        if spent != detail or not shown:
            return 1
        page.js("document.getElementById('again').click()")
        fresh = page.wait("(%s) !== %s && (%s)" % (tokened, json.dumps(token), tokened),
                          "a new token")
        retried = submit("R-browser-2")
        print("retry with a new token: " + retried)
        if fresh == token or not retried.startswith("Done: "):
            return 1
        return 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.stdout.reconfigure(encoding="utf-8")
    try:
        sys.exit(main(*sys.argv[1:4]))
    except (RuntimeError, OSError, StopIteration, ValueError) as e:
        print("drive_page: %s" % e)
        sys.exit(1)
