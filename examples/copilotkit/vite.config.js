import { defineConfig } from "vite";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { extname, join, normalize, resolve } from "node:path";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

// `npm run dev` serves the page with hot reload and sends /api to `npm start` on port 3000.
export default defineConfig({
  esbuild: { jsx: "automatic" },
  server: { proxy: { "/api": "http://127.0.0.1:3000" } },
  plugins: [precompress()],
  build: {
    // CopilotKit's chat brings syntax highlighting and diagrams; one page, loaded once.
    chunkSizeWarningLimit: 4096,
    rollupOptions: {
      // The page, and the same chat under CopilotKit's v1 provider.
      input: { main: "index.html", v1: "v1.html" },
      onwarn(warning, warn) {
        // "use client" markers in dependencies mean nothing outside React Server Components.
        if (warning.code === "MODULE_LEVEL_DIRECTIVE") return;
        warn(warning);
      },
    },
  },
});

// Writes FILE.gz and FILE.br next to every compressible file of the build, once, so the
// servers (server.mjs, the Go proxy's -static, and `vite preview` through the middleware
// below) send them with `content-encoding` and never compress per request. Files under
// 1 KiB, and encodings that would not save a tenth, are skipped.
function precompress() {
  const compressible = new Set([".js", ".mjs", ".css", ".html", ".svg", ".json", ".ttf", ".txt"]);
  let outDir;
  let building = false;
  return {
    name: "precompress",
    configResolved(config) {
      outDir = resolve(config.root, config.build.outDir);
      building = config.command === "build";
    },
    // `vite preview`: a file with a copy the request accepts is sent as that copy.
    configurePreviewServer(server) {
      const types = { ".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml" };
      server.middlewares.use((req, res, next) => {
        if (req.method !== "GET" && req.method !== "HEAD") return next();
        let path;
        try {
          path = decodeURIComponent(new URL(req.url, "http://localhost").pathname);
        } catch {
          return next();
        }
        const file = join(outDir, normalize(path).replace(/^([/\\])+/, ""));
        if (!file.startsWith(outDir) || !types[extname(file)]) return next();
        const wanted = accepted(req.headers["accept-encoding"]);
        for (const [encoding, suffix] of [["br", ".br"], ["gzip", ".gz"]]) {
          if (!wanted.has(encoding) || !existsSync(file + suffix)) continue;
          res.setHeader("content-type", types[extname(file)]);
          res.setHeader("content-encoding", encoding);
          res.setHeader("vary", "accept-encoding");
          res.end(req.method === "HEAD" ? undefined : readFileSync(file + suffix));
          return;
        }
        next();
      });
    },
    closeBundle() {
      if (!building) return;
      for (const file of files(outDir)) {
        if (!compressible.has(extname(file))) continue;
        const body = readFileSync(file);
        if (body.length < 1024) continue;
        const encoded = {
          gz: gzipSync(body, { level: 9 }),
          br: brotliCompressSync(body, {
            params: {
              [constants.BROTLI_PARAM_QUALITY]: 9,
              [constants.BROTLI_PARAM_SIZE_HINT]: body.length,
            },
          }),
        };
        for (const [suffix, bytes] of Object.entries(encoded))
          if (bytes.length < body.length * 0.9) writeFileSync(`${file}.${suffix}`, bytes);
      }
    },
  };
}

// The encodings an Accept-Encoding header allows (listed, and not with q=0).
function accepted(header = "") {
  const names = new Set();
  for (const part of header.split(",")) {
    const [name, ...params] = part.trim().toLowerCase().split(";");
    if (!params.some((p) => /^\s*q=0(\.0*)?\s*$/.test(p))) names.add(name.trim());
  }
  return names;
}

function* files(dir) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* files(path);
    else yield path;
  }
}
