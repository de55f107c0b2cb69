#!/usr/bin/env node
// The benchmark's Node baseline: a plain `http` SSE server whose frames are encoded by the
// official AG-UI TypeScript encoder (`@ag-ui/encoder`, pinned in package.json). It answers
// `POST /agui/<agent>` with the same events, the same framing and the same sizes as
// examples/bare_sse.rs and agui-serve's demo agent:
//
//   RUN_STARTED, STATE_SNAPSHOT, TEXT_MESSAGE_START, then either one TEXT_MESSAGE_CONTENT
//   per word of "You said: <text>" (split after each space) or, for `/slow N [MS]`, N
//   chunks "chunk i/N\n" one every MS milliseconds (default 100; capped at 100 000 chunks
//   and 60 000 ms), then TEXT_MESSAGE_END, RUN_FINISHED.
//
// Each frame is "id: <id>\n" followed by the encoder's "data: <json>\n\n"; the writer
// waits for 'drain' when the socket is full. No runtime, no auth, no persistence.
//
// It takes agui-serve's command line, honours --host and --port, ignores the rest, and
// prints the same "agui-serve listening on http://HOST:PORT/agui" line:
//
//   (cd bench/node && npm ci) && node bench/node/server.mjs --no-tls --port 0

import http from "node:http";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { EventEncoder } from "@ag-ui/encoder";

const MAX_SLOW_CHUNKS = 100000;
const MAX_SLOW_INTERVAL_MS = 60000;

function flag(name, fallback) {
  const args = process.argv.slice(2);
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : fallback;
}

const host = flag("--host", "127.0.0.1");
const port = Number(flag("--port", "0"));
const encoder = new EventEncoder();

const yieldNow = () => new Promise((resolve) => setImmediate(resolve));

// The text of the last user message: a string, or its text parts joined by newlines.
function lastUserText(messages) {
  if (!Array.isArray(messages)) return "";
  for (let i = messages.length - 1; i >= 0; i--) {
    const message = messages[i];
    if (message && message.role === "user") {
      const content = message.content;
      if (typeof content === "string") return content;
      if (Array.isArray(content)) {
        return content
          .filter((part) => part && part.type === "text" && typeof part.text === "string")
          .map((part) => part.text)
          .join("\n");
      }
      return "";
    }
  }
  return "";
}

// `/slow N [MS]` as the demo agent reads it, or null for an echo.
function parseSlow(trimmed) {
  const space = trimmed.search(/\s/);
  const head = space < 0 ? trimmed : trimmed.slice(0, space);
  if (head !== "/slow") return null;
  const words = (space < 0 ? "" : trimmed.slice(space)).trim().split(/\s+/).filter(Boolean);
  const number = (word) => (/^\+?\d+$/.test(word) ? Number(word) : NaN);
  const chunks = words.length > 0 ? number(words[0]) : NaN;
  const ms = words.length > 1 ? number(words[1]) : 100;
  if (Number.isNaN(chunks) || Number.isNaN(ms)) return null;
  return {
    chunks: Math.min(chunks, MAX_SLOW_CHUNKS),
    interval: Math.min(ms, MAX_SLOW_INTERVAL_MS),
  };
}

async function stream(res, input) {
  let seq = 0;
  let closed = false;
  // The pending pause between two paced chunks: a reader that left ends it at once.
  let timer = null;
  let wake = null;
  res.on("close", () => {
    closed = true;
    if (timer) {
      clearTimeout(timer);
      timer = null;
      wake();
    }
  });
  const pause = (ms) =>
    new Promise((resolve) => {
      wake = resolve;
      timer = setTimeout(() => {
        timer = null;
        resolve();
      }, ms);
    });
  // Writes one frame; resolves once the socket takes more. False when the reader is gone.
  const send = async (event) => {
    if (closed) return false;
    seq += 1;
    const id = `1-00000000-${seq.toString(16).padStart(8, "0")}`;
    event.timestamp = Date.now();
    if (!res.write(`id: ${id}\n${encoder.encodeSSE(event)}`)) {
      await Promise.race([once(res, "drain"), once(res, "close")]);
    }
    return !closed;
  };
  const threadId = input.threadId;
  const runId = input.runId;
  const messageId = `msg-${randomUUID()}`;
  const content = (delta) => ({ type: "TEXT_MESSAGE_CONTENT", messageId, delta });
  const opening = [
    { type: "RUN_STARTED", threadId, runId, protocolVersion: "1.0" },
    {
      type: "STATE_SNAPSHOT",
      snapshot: { agent: "demo", todos: [], usage: {}, files: [] },
    },
    { type: "TEXT_MESSAGE_START", messageId, role: "assistant" },
  ];
  for (const event of opening) {
    if (!(await send(event))) return;
  }
  const trimmed = lastUserText(input.messages).trim();
  const slow = parseSlow(trimmed);
  if (slow) {
    for (let i = 1; i <= slow.chunks; i++) {
      if (i > 1) await (slow.interval === 0 ? yieldNow() : pause(slow.interval));
      if (!(await send(content(`chunk ${i}/${slow.chunks}\n`)))) return;
    }
  } else {
    // Like Rust's split_inclusive(' '): every piece keeps its trailing space.
    const reply = `You said: ${trimmed}`;
    let start = 0;
    while (start < reply.length) {
      const space = reply.indexOf(" ", start);
      const end = space < 0 ? reply.length : space + 1;
      if (!(await send(content(reply.slice(start, end))))) return;
      start = end;
    }
  }
  const closing = [
    { type: "TEXT_MESSAGE_END", messageId },
    { type: "RUN_FINISHED", threadId, runId },
  ];
  for (const event of closing) {
    if (!(await send(event))) return;
  }
  res.end();
}

function fail(res, status) {
  res.writeHead(status, { "content-length": "0" });
  res.end();
}

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || !/^\/agui\/[^/]+$/.test(req.url.split("?")[0])) {
    req.resume();
    fail(res, 404);
    return;
  }
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    let input;
    try {
      input = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      fail(res, 400);
      return;
    }
    if (!input || typeof input.threadId !== "string" || typeof input.runId !== "string") {
      fail(res, 400);
      return;
    }
    res.writeHead(200, { "content-type": encoder.getContentType() });
    stream(res, input).catch(() => res.destroy());
  });
});
// Streams may stay open for minutes: no request or idle timeouts.
server.requestTimeout = 0;
server.timeout = 0;
server.listen(port, host, () => {
  const address = server.address();
  const shown = address.family === "IPv6" ? `[${address.address}]` : address.address;
  console.log(`agui-serve listening on http://${shown}:${address.port}/agui`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => process.exit(0));
}
