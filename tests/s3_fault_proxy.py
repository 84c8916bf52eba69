#!/usr/bin/env python3
"""An HTTP proxy in front of the test's S3 server that injects faults.

    s3_fault_proxy.py PORT UPSTREAM_PORT CONTROL LOG

Requests go to 127.0.0.1:UPSTREAM_PORT unchanged (the Host header too, so
SigV4 signatures made for the proxy's address still hold). Each request's
line ("METHOD PATH?QUERY") is appended to LOG as it arrives. CONTROL, a
JSON file read at every request (absent or empty: no faults), holds rules
tried in order; the first whose "match" (a regular expression searched in
the request line) fits and whose "count" is not used up applies:

    {"match": "PUT .*step-00000020", "count": 3, "status": 503, "code": "SlowDown"}
        answer with that status and an S3 error body instead of forwarding
    {"match": "...", "count": 1000, "drop": true}
        close the connection without an answer (a server that is gone)
    {"match": "...", "count": 1, "delay": 3}
        hold the request that long, then forward it (to a server the test
        may have stopped meanwhile: an upload caught in the middle)

A rule's "count" goes down by one at each use (the file is rewritten).
"""
import http.client
import http.server
import json
import os
import re
import sys
import threading
import time

PORT, UPSTREAM, CONTROL, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Lock()


def rule_for(line):
    with lock:
        try:
            with open(CONTROL) as f:
                rules = json.load(f)
        except (OSError, ValueError):
            return None
        for r in rules:
            if r.get("count", 0) > 0 and re.search(r["match"], line):
                r["count"] -= 1
                tmp = CONTROL + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(rules, f)
                os.replace(tmp, CONTROL)
                return r
    return None


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_one(self):
        line = f"{self.command} {self.path}"
        with lock, open(LOG, "a") as f:
            f.write(line + "\n")
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        rule = rule_for(line)
        if rule and rule.get("delay"):
            time.sleep(rule["delay"])
            rule = None
        if rule and rule.get("drop"):
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if rule:
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{rule.get("code", "InternalError")}'
                   f'</Code><Message>injected by the test</Message></Error>').encode()
            self.send_response(rule.get("status", 503))
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)
            return
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
            up.request(self.command, self.path, body=body if n or self.command in ("PUT", "POST") else None,
                       headers=headers)
            resp = up.getresponse()
            data = resp.read()
        except OSError:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        finally:
            up.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length or "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_one


http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
