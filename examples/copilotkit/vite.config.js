import { defineConfig } from "vite";

// `npm run dev` serves the page with hot reload and sends /api to `npm start` on port 3000.
export default defineConfig({
  esbuild: { jsx: "automatic" },
  server: { proxy: { "/api": "http://127.0.0.1:3000" } },
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
