// A browser developer's first two mistakes, as headless Chromium meets them: a page on an
// origin the daemon does not allow can read why it was refused (and which flag allows it),
// and a daemon whose certificate the browser does not trust, which the page sees only as
// "Failed to fetch", says so in its log.
//
//   E2E_URL=http://127.0.0.1:5173 AGUI_BASE=https://127.0.0.1:8443/agui AGUI_TOKEN_FILE=t \
//     DAEMON_LOG=<the daemon's stderr> node e2e/diagnostics.mjs
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";

const base = process.env.AGUI_BASE;
const token = readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").trim();
const pageUrl = process.env.E2E_URL;
const log = process.env.DAEMON_LOG;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});

let failed = 0;
async function step(name, body) {
  try {
    await body();
    console.log(`ok   diagnostics :: ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL diagnostics :: ${name} (${error.message.split("\n")[0]})`);
  }
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

// What a page on `pageUrl` gets from `fetch` to the daemon's /info with the token.
async function fetchFromPage(context) {
  const page = await context.newPage();
  await page.goto(pageUrl);
  const got = await page.evaluate(
    async ([url, token]) => {
      try {
        const response = await fetch(url, { headers: { Authorization: `Bearer ${token}` } });
        return { status: response.status, body: await response.text() };
      } catch (error) {
        return { error: String(error) };
      }
    },
    [`${base}/info`, token],
  );
  await page.close();
  return got;
}

await step("a daemon the browser does not trust: the page sees Failed to fetch, the log says why", async () => {
  const context = await browser.newContext();
  const before = readFileSync(log, "utf8").length;
  const got = await fetchFromPage(context);
  await context.close();
  check(got.error && got.error.includes("Failed to fetch"), `the page got ${JSON.stringify(got)}`);
  let said = "";
  for (let i = 0; i < 50 && !said.includes("refused this daemon's TLS certificate"); i += 1) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    said = readFileSync(log, "utf8").slice(before);
  }
  check(said.includes("refused this daemon's TLS certificate"), `the log says nothing: ${said.slice(-500)}`);
  check(said.includes("--tls-cert"), "the log line gives no way out");
});

await step("a page on an origin the daemon does not allow reads the refusal and the flag", async () => {
  // This time the certificate is accepted (as once the developer opened the daemon's URL).
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const got = await fetchFromPage(context);
  await context.close();
  check(got.status === 403, `the page got ${JSON.stringify(got)}`);
  const body = JSON.parse(got.body);
  const origin = new URL(pageUrl).origin;
  check(body.code === "FORBIDDEN_ORIGIN", `code ${body.code}`);
  check(body.message.includes(`--allowed-origin ${origin}`), `message ${body.message}`);
  check(!got.body.includes(token), "the refusal echoes the token");
});

await browser.close();
process.exit(failed ? 1 : 0);
