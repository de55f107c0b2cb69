"""Posts a slow run and reports when each text chunk arrived (seconds since the request).

Usage: stream_timing.py URL [TOKEN] [ORIGIN]
Asks for compression as a browser does, to catch a proxy that compresses the stream.
Prints one line of JSON: {"status": ..., "encoding": null, "arrivals": [...], "terminal": ...}.
"""
import http.client
import json
import sys
import time
import urllib.parse

url = urllib.parse.urlsplit(sys.argv[1])
token = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
origin = sys.argv[3] if len(sys.argv) > 3 else None
body = json.dumps({
    "threadId": f"timing-{time.time_ns()}", "runId": "r", "protocolVersion": "1.0",
    "messages": [{"id": "u", "role": "user", "content": "/slow 6 300"}],
})
headers = {
    "content-type": "application/json",
    "accept": "text/event-stream",
    "accept-encoding": "gzip, deflate, br",
}
if token:
    headers["authorization"] = f"Bearer {token}"
if origin:
    headers["origin"] = origin
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
start = time.monotonic()
conn.request("POST", url.path + (f"?{url.query}" if url.query else ""), body=body, headers=headers)
response = conn.getresponse()
encoding = response.getheader("content-encoding")
result = {"status": response.status, "encoding": encoding, "arrivals": [], "terminal": None}
if response.status == 200 and encoding is None:
    buffer = b""
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        now = time.monotonic() - start
        buffer += chunk
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "TEXT_MESSAGE_CONTENT":
                        result["arrivals"].append(round(now, 3))
                    if event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                        result["terminal"] = event["type"]
else:
    result["body"] = response.read(300).decode(errors="replace")
print(json.dumps(result))
