#!/usr/bin/env python3
"""The daemon's resident size with every fleet stream it allows open (1 024: 16 principals x
64) and 250 live runs streaming (the demo's /slow), under a memory budget.

Usage: scripts/fleet_memory.py BINARY [BUDGET]   (BUDGET defaults to 64MiB)
Prints the peak VmRSS over 20 s and the memory meter's gauges."""
import json, os, selectors, shutil, socket, subprocess, sys, tempfile, time, urllib.request

BIN = sys.argv[1]
BUDGET = sys.argv[2] if len(sys.argv) > 2 else "64MiB"
work = tempfile.mkdtemp(prefix="agui-fleet-memory-")
open(work + "/t", "w").write("tok-0123456789abcdef")
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
d = subprocess.Popen([BIN, "--no-tls", "--port", str(port), "--data-dir", work + "/d", "--token-file", work + "/t",
                      "--memory-budget", BUDGET, "--max-connections", "4096", "--max-concurrent-runs", "256", "--max-runs-per-principal", "32"], stdout=subprocess.DEVNULL, stderr=open(work + "/err", "w"))
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
        break
    except OSError:
        time.sleep(0.1)
def req(method, path, body=None, token="tok-0123456789abcdef"):
    r = urllib.request.Request("http://127.0.0.1:%d/agui%s" % (port, path), method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": "Bearer " + token, "content-type": "application/json"})
    return json.load(urllib.request.urlopen(r))
tokens = [req("POST", "/tokens", {"sub": "p%d" % i, "ttlSeconds": 3600})["token"] for i in range(16)]
sel = selectors.DefaultSelector()
socks = []
def open_stream(head):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(head.encode()); s.setblocking(False)
    sel.register(s, selectors.EVENT_READ); socks.append(s)
for i in range(1024):
    open_stream("GET /agui/fleet/stream HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\naccept: text/event-stream\r\n\r\n" % tokens[i % 16])
read = [0]
def drain(seconds):
    end = time.time() + seconds
    while time.time() < end:
        for key, _ in sel.select(0.1):
            try:
                b = key.fileobj.recv(65536)
                read[0] += len(b)
                if not b: sel.unregister(key.fileobj)
            except BlockingIOError: pass
drain(2)
for i in range(250):
    body = {"threadId": "live-%d" % i, "runId": "r%d" % i, "messages": [{"id": "m%d" % i, "role": "user", "content": "/slow 600 100"}]}
    payload = json.dumps(body)
    open_stream("POST /agui/demo HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\naccept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (tokens[i % 16], len(payload), payload))
peak = 0
drain(2)
print("healthz", req("GET", "/healthz"))
for _ in range(20):
    drain(1)
    rss = int(open("/proc/%d/status" % d.pid).read().split("VmRSS:")[1].split()[0]) // 1024
    peak = max(peak, rss)
m = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%d/agui/metrics" % port, headers={"authorization": "Bearer tok-0123456789abcdef"})).read().decode()
counted = [l for l in m.splitlines() if l.startswith("agui_memory") ]
print("budget", BUDGET, "peak RSS MiB", peak, "read MB", read[0] // 1000000)
print("\n".join(counted))
d.kill()
d.wait()
shutil.rmtree(work, ignore_errors=True)
