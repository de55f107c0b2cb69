// The example's server: the CopilotKit runtime at /api/copilotkit, with one agent ("default")
// that is an AG-UI HttpAgent pointed at agui-serve, and the built page (dist/) at /.
// The daemon's bearer token lives only here; the browser never sees it.
//
// Environment:
//   AGUI_URL          the agent's URL, e.g. https://127.0.0.1:8443/agui/demo (required)
//   AGUI_TOKEN_FILE   file holding the daemon's token (or AGUI_TOKEN with the token itself)
//   PORT, HOST        where this server listens (default 127.0.0.1:3000; PORT=0 picks one)
//   NODE_EXTRA_CA_CERTS  the daemon's self-signed certificate, when it uses the generated one
import { createServer } from "node:http";
import { readFile, stat } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";

// CopilotKit's runtime reports usage to a remote service unless told not to.
process.env.COPILOTKIT_TELEMETRY_DISABLED ??= "true";
const { HttpAgent } = await import("@ag-ui/client");
const { CopilotRuntime } = await import("@copilotkit/runtime/v2");
const { createCopilotNodeListener } = await import("@copilotkit/runtime/v2/node");
const { AguiServeRunner } = await import("./runner.mjs");

const agentUrl = required("AGUI_URL");
const token = process.env.AGUI_TOKEN_FILE
  ? readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").replace(/\r?\n$/, "")
  : required("AGUI_TOKEN");
if (!token) fail("the daemon's token is empty");
const base = new URL(".", agentUrl).href; // https://host/agui/demo -> https://host/agui/

const runtime = new CopilotRuntime({
  agents: { default: new HttpAgent({ url: agentUrl, headers: { Authorization: `Bearer ${token}` } }) },
  runner: new AguiServeRunner({ base, token }),
});
const copilot = createCopilotNodeListener({ runtime, basePath: "/api/copilotkit" });

const dist = fileURLToPath(new URL("./dist/", import.meta.url));
const types = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript",
  ".css": "text/css",
  ".svg": "image/svg+xml",
  ".woff2": "font/woff2",
};

const server = createServer(async (req, res) => {
  try {
    const path = new URL(req.url, "http://localhost").pathname;
    if (path === "/api/copilotkit" || path.startsWith("/api/copilotkit/")) return await copilot(req, res);
    if (req.method !== "GET" && req.method !== "HEAD") return send(res, 405, "text/plain", "method not allowed");
    await serveStatic(path, req.headers["accept-encoding"], res);
  } catch (error) {
    console.error("request failed:", error);
    if (!res.headersSent) send(res, 500, "text/plain", "internal error");
    else res.end();
  }
});

// The build writes FILE.br and FILE.gz beside each compressible file (vite.config.js); the
// first one the browser accepts is sent as it is, with `content-encoding`.
const ENCODINGS = [
  ["br", ".br"],
  ["gzip", ".gz"],
];

function accepted(header = "") {
  const names = new Set();
  for (const part of header.split(",")) {
    const [name, ...params] = part.trim().toLowerCase().split(";");
    if (!params.some((p) => /^\s*q=0(\.0*)?\s*$/.test(p))) names.add(name.trim());
  }
  return names;
}

async function serveStatic(path, acceptEncoding, res) {
  let decoded;
  try {
    decoded = decodeURIComponent(path);
  } catch {
    return send(res, 400, "text/plain", "bad path");
  }
  const relative = normalize(decoded).replace(/^([/\\])+/, "");
  let file = join(dist, relative);
  if (!file.startsWith(dist)) return send(res, 404, "text/plain", "not found");
  const info = await stat(file).catch(() => null);
  // Every page route is the single-page app; a missing file (an asset) is a 404.
  if (!info && extname(relative)) return send(res, 404, "text/plain", "not found");
  if (!info || info.isDirectory()) file = join(dist, "index.html");
  const type = types[extname(file)] ?? "application/octet-stream";
  const cache = file.includes(`${dist}assets`) ? "public, max-age=31536000, immutable" : "no-cache";
  const wanted = accepted(acceptEncoding);
  for (const [encoding, suffix] of ENCODINGS) {
    if (!wanted.has(encoding)) continue;
    const encoded = await readFile(file + suffix).catch(() => null);
    if (encoded)
      return send(res, 200, type, encoded, {
        "cache-control": cache,
        "content-encoding": encoding,
        vary: "accept-encoding",
      });
  }
  const body = await readFile(file).catch(() => null);
  if (!body) return send(res, 404, "text/plain", "not found (run `npm run build` first)");
  send(res, 200, type, body, { "cache-control": cache, vary: "accept-encoding" });
}

function send(res, status, type, body, headers = {}) {
  res.writeHead(status, { "content-type": type, ...headers });
  res.end(body);
}

function required(name) {
  const value = process.env[name];
  if (!value) fail(`${name} is not set`);
  return value;
}

function fail(message) {
  console.error(`copilotkit example: ${message}`);
  process.exit(2);
}

const host = process.env.HOST ?? "127.0.0.1";
server.listen(Number(process.env.PORT ?? 3000), host, () => {
  const { port } = server.address();
  console.log(`copilotkit example listening on http://${host}:${port} (agent ${agentUrl})`);
});
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections(); // open streams would otherwise hold the close
  });
}
