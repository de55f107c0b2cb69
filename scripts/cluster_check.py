"""The checks of scripts/cluster.sh, against agui-serve nodes sharing one PostgreSQL.

Usage: cluster_check.py TOKEN_FILE CHECK ARGS...
  exact   A B             a run through A, reattached through B mid-stream: byte-identical
  listing A B C           threads created through each node are listed by every node
  tls-exact D E           as exact, between two nodes on their generated self-signed
                          certificates (pinned through the database); $CLUSTER_CA says
                          which certificate each HOST:PORT serves
  kill    A PID B C TTL   kill -9 of the owner mid-run: B resyncs, C continues the thread
  stop    A PID B C TTL   SIGSTOP of the owner past its lease: it ends with LEASE_LOST and
                          nothing it produced afterwards is stored
  orphan  A PID B TTL     kill -9 of the owner, nobody asks for the thread: B records the
                          run interrupted on its own
Each node is given by its base URL (http://127.0.0.1:PORT/agui). Prints one "ok" line per
check; exits non-zero with a "FAIL" line on the first check that does not hold.
"""
import http.client
import json
import os
import signal
import ssl
import sys
import time
import urllib.parse

TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
TOKEN = ""


class Fail(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Fail(message)


def ok(message):
    print(f"ok   {message}", flush=True)


class Frame:
    """One SSE frame: its raw bytes (without the blank line ending it), its id and its event."""

    def __init__(self, raw):
        self.raw = raw
        self.id = None
        self.event = None
        data = []
        for line in raw.split(b"\n"):
            if line.startswith(b"id:"):
                self.id = line[3:].lstrip(b" ").decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
        if data:
            self.event = json.loads(b"\n".join(data))

    @property
    def type(self):
        return self.event.get("type") if self.event else None

    def __repr__(self):
        return repr(self.raw.decode(errors="replace")[:200])


def connection(url, timeout):
    """An HTTP(S) connection to url's host. HTTPS trusts the certificate $CLUSTER_CA names for
    that host and port ("HOST:PORT=FILE ...": the nodes' generated certificates, one per
    node, since they all carry the same subject name)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    context = ssl.create_default_context()
    # The generated certificates are plain self-signed leaves, which strict X.509 checks
    # (Python 3.13's default) refuse as their own issuer.
    context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    for entry in os.environ.get("CLUSTER_CA", "").split():
        netloc, _, cafile = entry.partition("=")
        if netloc == parts.netloc:
            context.load_verify_locations(cafile=cafile)
    return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=context)


class Stream:
    """An event stream over HTTP: frames as they arrive, keep-alive comments left out."""

    def __init__(self, method, url, body=None, headers=None, timeout=20):
        parts = urllib.parse.urlsplit(url)
        self.conn = connection(url, timeout)
        all_headers = {"authorization": f"Bearer {TOKEN}", "accept": "text/event-stream"}
        if body is not None:
            all_headers["content-type"] = "application/json"
            body = json.dumps(body)
        all_headers.update(headers or {})
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn.request(method, path, body=body, headers=all_headers)
        self.sock = self.conn.sock  # the connection lets go of it when the response will close
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.buffer = b""
        self.eof = False
        if self.status != 200:
            self.error_body = self.response.read(2000).decode(errors="replace")
            self.eof = True

    def header(self, name):
        return self.response.getheader(name)

    def next(self, timeout=20):
        """The next frame, or None at the end of the stream; Fail when none comes in time."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n\n", 1)
                if raw and not all(line.startswith(b":") for line in raw.split(b"\n")):
                    return Frame(raw)
            if self.eof:
                check(not self.buffer.strip(), f"the stream ended inside a frame: {self.buffer[:200]!r}")
                return None
            left = deadline - time.monotonic()
            check(left > 0, f"no frame within {timeout}s")
            self.sock.settimeout(left)
            try:
                chunk = self.response.read1(65536)
            except TimeoutError:
                raise Fail(f"no frame within {timeout}s") from None
            except (http.client.IncompleteRead, ConnectionError) as error:
                raise Fail(f"the stream was cut ({type(error).__name__}) after {self.buffer[-200:]!r}") from None
            if not chunk:
                self.eof = True
            self.buffer += chunk

    def until(self, predicate, timeout=20):
        """Frames up to and including the first one the predicate holds for."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next(max(0.1, deadline - time.monotonic()))
            check(frame is not None, f"the stream ended before the expected frame; got {frames[-3:]}")
            frames.append(frame)
            if predicate(frame):
                return frames

    def to_end(self, timeout=20):
        """Frames up to the first terminal event, or to the end of the stream."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.next(max(0.1, deadline - time.monotonic()))
            if frame is None:
                return frames
            frames.append(frame)
            if frame.type in TERMINAL:
                return frames

    def close(self):
        self.conn.close()


def call(method, url, body=None, timeout=15):
    parts = urllib.parse.urlsplit(url)
    conn = connection(url, timeout)
    headers = {"authorization": f"Bearer {TOKEN}"}
    if body is not None:
        headers["content-type"] = "application/json"
        body = json.dumps(body)
    conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def get_json(url):
    status, data = call("GET", url)
    check(status == 200, f"GET {url}: HTTP {status}: {data[:300]!r}")
    return json.loads(data)


def unique(prefix):
    return f"{prefix}-{time.time_ns():x}"


def run(node, thread, text, messages=()):
    """POSTs a run with one new user message; returns (stream, user message, run id)."""
    user = {"id": unique("msg"), "role": "user", "content": text}
    run_id = unique("run")
    body = {"threadId": thread, "runId": run_id, "protocolVersion": "1.0", "state": {},
            "tools": [], "context": [], "forwardedProps": {}, "messages": [*messages, user]}
    stream = Stream("POST", f"{node}/demo", body)
    check(stream.status == 200, f"POST {node}/demo: HTTP {stream.status}: {getattr(stream, 'error_body', '')}")
    return stream, user, run_id


def reattach(node, thread, last_id, retry_for=0.0):
    """GET the thread's stream with Last-Event-ID; 502/503/504 are retried for retry_for s."""
    deadline = time.monotonic() + retry_for
    while True:
        stream = Stream("GET", f"{node}/threads/{urllib.parse.quote(thread)}/stream",
                        headers={"last-event-id": last_id})
        if stream.status in (502, 503, 504) and time.monotonic() < deadline:
            print(f"     (reattach through {node}: HTTP {stream.status}, retrying)", flush=True)
            time.sleep(0.5)
            continue
        check(stream.status == 200,
              f"reattach through {node}: HTTP {stream.status}: {getattr(stream, 'error_body', '')}")
        return stream


def chunks(n):
    """A predicate true on the n-th TEXT_MESSAGE_CONTENT."""
    seen = [0]

    def predicate(frame):
        if frame.type == "TEXT_MESSAGE_CONTENT":
            seen[0] += 1
        return seen[0] >= n
    return predicate


def messages_of(node, thread):
    return get_json(f"{node}/threads/{urllib.parse.quote(thread)}/messages")["messages"]


def last_run(node, thread):
    return get_json(f"{node}/threads/{urllib.parse.quote(thread)}").get("lastRun") or {}


def text_of(message):
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def check_resync(stream, via, thread, user):
    """A resync answer: header, RUN_STARTED, MESSAGES_SNAPSHOT with the run's user message."""
    resume = stream.header("agui-resume")
    check(resume == "resync", f"reattach through {via} after the owner's loss: agui-resume {resume!r}, expected 'resync'")
    frames = stream.to_end(timeout=20)
    types = [f.type for f in frames]
    check(types[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"],
          f"the resync does not start with RUN_STARTED, MESSAGES_SNAPSHOT: {types[:6]}")
    check(all(f.id for f in frames), "a resync frame without an id")
    snapshot = frames[1].event.get("messages", [])
    ids = [m.get("id") for m in snapshot]
    check(user["id"] in ids, f"MESSAGES_SNAPSHOT lacks the run's user message {user['id']}: {ids}")
    return frames, snapshot


def exact(a, b, owner_name="A", label="a"):
    thread = unique("cluster-exact")
    stream, _, _ = run(a, thread, "/slow 40 50")
    before = stream.until(chunks(10))
    mark = before[-1].id
    check(mark, f"a frame without an id: {before[-1]}")
    other = reattach(b, thread, mark)
    resume = other.header("agui-resume")
    check(resume == "exact", f"reattach through B with an id of A's stream: agui-resume {resume!r}, expected 'exact'")
    owner, served = stream.header("agui-node") or "", other.header("agui-node") or ""
    check(owner.startswith(f"{owner_name}~") and served == owner,
          f"the reattach through B was served by {served!r}, the run by {owner!r}: expected A's node")
    through_b = other.to_end(timeout=20)
    through_a = stream.to_end(timeout=20)
    check(through_a and through_a[-1].type == "RUN_FINISHED", f"A's stream did not end with RUN_FINISHED: {through_a[-2:]}")
    check(len(through_a) > 20, f"only {len(through_a)} frames after the 10th chunk of 40")
    for i, (x, y) in enumerate(zip(through_a, through_b)):
        check(x.raw == y.raw, f"frame {i} after {mark} differs:\n  A: {x.raw!r}\n  B: {y.raw!r}")
    check(len(through_a) == len(through_b),
          f"A showed {len(through_a)} frames after {mark}, B {len(through_b)}")
    stream.close()
    other.close()
    ok(f"{label}. a run through {owner_name} reattached through another node after a "
       f"mid-stream id ({a} -> {b}): sent on to {owner_name} "
       f"(agui-node {served}), agui-resume exact, {len(through_b)} frames byte-identical to "
       f"{owner_name}'s, ending with RUN_FINISHED")


def listing(*nodes):
    threads = {}
    for name, node in zip("ABC", nodes):
        thread = unique(f"cluster-list-{name}")
        stream, _, _ = run(node, thread, f"hello from {name}")
        frames = stream.to_end()
        check(frames and frames[-1].type == "RUN_FINISHED", f"the run through {name} ended with {frames[-1:]}")
        stream.close()
        threads[thread] = name
    for name, node in zip("ABC", nodes):
        listed, cursor = set(), None
        for _ in range(50):
            page = get_json(f"{node}/threads?limit=200" + (f"&cursor={urllib.parse.quote(cursor)}" if cursor else ""))
            listed |= {t["threadId"] for t in page["threads"]}
            cursor = page.get("nextCursor")
            if not cursor or set(threads) <= listed:
                break
        missing = {t: n for t, n in threads.items() if t not in listed}
        check(not missing, f"node {name} does not list the threads created through {sorted(missing.values())}")
    ok("b. threads created through A, B and C are listed by each of A, B and C")


def kill(a, pid, b, c, ttl):
    thread = unique("cluster-kill")
    stream, user, run_id = run(a, thread, "/slow 200 50")
    before = stream.until(chunks(20))
    mark = before[-1].id
    os.kill(pid, signal.SIGKILL)
    stream.close()
    time.sleep(ttl + 0.5)
    other = reattach(b, thread, mark, retry_for=2 * ttl)
    frames, snapshot = check_resync(other, "B", thread, user)
    other.close()
    ok(f"c. kill -9 of the owner A mid-run: a reattach through B with A's last id resyncs "
       f"(agui-resume resync, RUN_STARTED, MESSAGES_SNAPSHOT with the run's user message; "
       f"{len(frames)} frames, ending {frames[-1].type})")
    stored = messages_of(c, thread)
    lost = [m.get("id") for m in stored if m.get("id") not in {s.get("id") for s in snapshot}]
    check(not lost, f"stored messages missing from the resync's MESSAGES_SNAPSHOT: {lost}")
    ok(f"c. the snapshot holds every stored message ({len(stored)})")
    last = last_run(c, thread)
    check(last.get("runId") == run_id and last.get("outcome") == "interrupted",
          f"GET threads/{{id}} through C: lastRun {last}, expected runId {run_id} outcome interrupted")
    ok("c. GET threads/{id} through C: the killed run is interrupted")
    again, second, _ = run(c, thread, "after the failover", messages=snapshot)
    frames = again.to_end()
    again.close()
    check(frames and frames[-1].type == "RUN_FINISHED", f"the new run through C ended with {frames[-1:]}")
    reply = "".join(f.event.get("delta", "") for f in frames if f.type == "TEXT_MESSAGE_CONTENT")
    check("You said: after the failover" in reply, f"the new run's reply: {reply!r}")
    stored = messages_of(b, thread)
    ids = [m.get("id") for m in stored]
    check(user["id"] in ids and second["id"] in ids,
          f"messages through B lack the old ({user['id']}) or new ({second['id']}) user message: {ids}")
    check(any(m.get("role") == "assistant" and "You said: after the failover" in text_of(m) for m in stored),
          f"messages through B lack the new reply: {stored}")
    ok("c. a new message through C continues the thread: RUN_FINISHED, and B lists the old and new messages and the reply")


def stop(a, pid, b, c, ttl):
    thread = unique("cluster-stop")
    # Short enough that, unfenced, the resumed node would finish the message and store it.
    stream, user, run_id = run(a, thread, "/slow 40 100")
    before = stream.until(chunks(5))
    mark = before[-1].id
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(2 * ttl + 0.5)
        other = reattach(b, thread, mark, retry_for=2 * ttl)
        frames, _ = check_resync(other, "B", thread, user)
        other.close()
        last = last_run(b, thread)
        check(last.get("runId") == run_id and last.get("outcome") == "interrupted",
              f"GET threads/{{id}} through B while A is stopped: lastRun {last}, expected interrupted")
        ok(f"d. SIGSTOP of the owner A' past its lease: B takes the thread (reattach resyncs, "
           f"{len(frames)} frames; the run is interrupted)")
    finally:
        os.kill(pid, signal.SIGCONT)
    after = stream.to_end(timeout=20)
    stream.close()
    check(after and after[-1].type == "RUN_ERROR",
          f"A's stream after SIGCONT did not end with RUN_ERROR: {after[-3:] or 'nothing'}")
    code = after[-1].event.get("code")
    check(code == "LEASE_LOST", f"A's RUN_ERROR has code {code!r}, expected 'LEASE_LOST': {after[-1]}")
    ok(f"d. after SIGCONT, A's stream ends with RUN_ERROR code LEASE_LOST ({len(after)} frames after the stop)")
    time.sleep(1)
    for name, node in (("B", b), ("C", c)):
        stored = messages_of(node, thread)
        ids = [m.get("id") for m in stored]
        check(user["id"] in ids, f"messages through {name} lack the run's user message: {ids}")
        produced = [m for m in stored if m.get("role") != "user"]
        check(not produced, f"messages through {name} hold what the stopped node produced: {produced}")
        last = last_run(node, thread)
        check(last.get("runId") == run_id and last.get("outcome") == "interrupted",
              f"GET threads/{{id}} through {name}: lastRun {last}, expected interrupted")
    ok("d. through B and C the thread holds only the user message and its run is interrupted")
    status, _ = call("GET", f"{a}/healthz")
    print(f"     (A' after losing the lease: healthz HTTP {status})", flush=True)


def orphan(a, pid, b, ttl):
    """kill -9 of the owner, and nobody asks for the thread: another node records the run
    interrupted on its own (the thread is not shown live for ever)."""
    thread = unique("cluster-orphan")
    stream, _, run_id = run(a, thread, "/slow 200 50")
    stream.until(chunks(5))
    os.kill(pid, signal.SIGKILL)
    stream.close()
    began = time.monotonic()
    deadline = began + 4 * ttl
    while True:
        detail = get_json(f"{b}/threads/{urllib.parse.quote(thread)}")
        last = detail.get("lastRun") or {}
        if last.get("outcome") == "interrupted" and detail.get("status") == "idle":
            break
        check(time.monotonic() < deadline,
              f"{4 * ttl:.0f}s after kill -9 of its owner, the thread shows {detail.get('status')!r}, "
              f"lastRun {last} (expected idle, {run_id} interrupted)")
        time.sleep(0.25)
    check(last.get("runId") == run_id, f"lastRun {last}, expected {run_id}")
    ok(f"e. kill -9 of an owner, no request for its thread: another node records the run "
       f"interrupted and the thread idle after {time.monotonic() - began:.1f}s (lease {ttl:.0f}s)")


def main():
    global TOKEN
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        TOKEN = f.read().strip()
    name, args = sys.argv[2], sys.argv[3:]
    try:
        if name == "exact":
            exact(*args)
        elif name == "tls-exact":
            exact(*args, owner_name="D", label="f")
        elif name == "listing":
            listing(*args)
        elif name == "orphan":
            a, pid, b, ttl = args
            orphan(a, int(pid), b, float(ttl))
        elif name in ("kill", "stop"):
            a, pid, b, c, ttl = args
            (kill if name == "kill" else stop)(a, int(pid), b, c, float(ttl))
        else:
            sys.exit(__doc__)
    except Fail as failure:
        print(f"FAIL {name}: {failure}", flush=True)
        sys.exit(1)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
        print(f"FAIL {name}: {type(error).__name__}: {error}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
