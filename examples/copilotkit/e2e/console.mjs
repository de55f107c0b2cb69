// The daemon's built-in operator console ({path}/console) in headless Chromium: it asks for
// the token, shows a run started elsewhere live, lets the operator answer a waiting
// approval (and the run goes on), opens a transcript, and lists and deletes a schedule.
//
//   AGUI_BASE=https://127.0.0.1:8443/agui AGUI_TOKEN_FILE=t \
//     NODE_EXTRA_CA_CERTS=<data-dir>/tls/cert.pem node e2e/console.mjs
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";

const base = process.env.AGUI_BASE;
const token = readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").trim();
const TIMEOUT = 20_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});
// The daemon's generated certificate is not one Chromium trusts.
const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 800 } });
const page = await context.newPage();
page.setDefaultTimeout(TIMEOUT);
const problems = [];
page.on("pageerror", (error) => problems.push(error.message));
page.on("console", (message) => {
  if (message.type() === "error") problems.push(`console: ${message.text()}`);
});

let failed = 0;
async function step(name, body) {
  try {
    await body();
    console.log(`ok   console :: ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL console :: ${name} (${error.message.split("\n")[0]})`);
  }
}

// A run started elsewhere: a plain POST to the run route with the token.
async function startRun(threadId, text, { wait = false } = {}) {
  const response = await fetch(`${base}/demo`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({
      threadId,
      runId: randomUUID(),
      protocolVersion: "1.0",
      messages: [{ id: randomUUID(), role: "user", content: text }],
    }),
  });
  if (!response.ok) throw new Error(`run: HTTP ${response.status}`);
  const done = response.text();
  if (wait) await done;
  return done;
}

async function messages(threadId) {
  const response = await fetch(`${base}/threads/${threadId}/messages`, { headers: { Authorization: `Bearer ${token}` } });
  return (await response.json()).messages ?? [];
}

await step("the page loads under its content security policy and asks for the token", async () => {
  const response = await page.goto(`${base}/console`);
  const policy = response.headers()["content-security-policy"] ?? "";
  if (!policy.includes("default-src 'none'") || !policy.includes("script-src 'self'")) throw new Error(`policy ${policy}`);
  await page.getByLabel("Operator token").fill(token);
  await page.getByRole("button", { name: "Connect" }).click();
  await page.getByText("Live", { exact: true }).waitFor();
  if (await page.locator("#login").isVisible()) throw new Error("the login form is still shown");
  if (!(await page.locator("#fleet").isVisible())) throw new Error("the fleet is not shown");
});

await step("a run on a thread named __proto__ appears like any other", async () => {
  const run = startRun("__proto__", "/slow 30 100");
  const row = page.locator('tr[data-thread="__proto__"]');
  await row.waitFor();
  await run;
  await row.waitFor({ state: "detached" });
});

const slowThread = `console-slow-${randomUUID().slice(0, 8)}`;
await step("a run started elsewhere appears live, and leaves when it ends", async () => {
  const run = startRun(slowThread, "/slow 30 100");
  const row = page.locator(`tr[data-thread="${slowThread}"]`);
  await row.waitFor();
  const phase = await row.locator("td").nth(3).textContent();
  if (phase !== "running") throw new Error(`phase ${phase}`);
  await run;
  await row.waitFor({ state: "detached" });
});

const approvalThread = `console-approve-${randomUUID().slice(0, 8)}`;
await step("a waiting approval is answered from the console and the run goes on", async () => {
  await startRun(approvalThread, "/approve ship the release", { wait: true });
  const row = page.locator(`tr[data-thread="${approvalThread}"]`);
  await row.waitFor();
  await row.getByText("approval").waitFor();
  await row.getByRole("button", { name: "Approve", exact: true }).click();
  await row.waitFor({ state: "detached" });
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    const said = (await messages(approvalThread)).map((m) => m.content).filter((c) => typeof c === "string");
    if (said.includes("Approved: ship the release")) break;
    if (Date.now() > deadline) throw new Error(`transcript ${JSON.stringify(said)}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
});

await step("a transcript opens, as text", async () => {
  const marker = `<b>not bold ${randomUUID().slice(0, 6)}</b>`;
  const thread = `console-text-${randomUUID().slice(0, 8)}`;
  await startRun(thread, marker, { wait: true });
  // The thread list refreshes every few seconds.
  const open = page.locator("#threads").getByRole("button", { name: marker });
  await open.waitFor();
  await open.click();
  const transcript = page.locator("#messages");
  await transcript.getByText(`You said: ${marker}`).waitFor();
  if ((await transcript.locator("b").count()) !== 0) throw new Error("agent text was rendered as HTML");
});

await step("a schedule shows when it fires next and how its last firing went, and is deleted", async () => {
  const name = `console-schedule-${randomUUID().slice(0, 8)}`;
  const response = await fetch(`${base}/schedules`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ agent: "demo", cron: "* * * * * *", name, messages: [{ role: "user", content: "<i>tick</i>" }] }),
  });
  if (response.status !== 201) throw new Error(`create: HTTP ${response.status}`);
  const { id } = await response.json();
  // The schedule list refreshes every few seconds; the firing shows once it has happened.
  const row = page.locator(`tr[data-schedule="${id}"]`);
  await row.getByText("started").waitFor();
  if ((await row.locator("td").first().textContent()) !== name) throw new Error("the name is not shown");
  await row.locator("td").nth(4).getByRole("button").click();
  await page.locator("#messages").getByText("You said: <i>tick</i>").first().waitFor();
  if ((await page.locator("#messages i").count()) !== 0) throw new Error("the message was rendered as HTML");
  await row.getByRole("button", { name: "Delete" }).click();
  await row.waitFor({ state: "detached" });
  const left = await (await fetch(`${base}/schedules`, { headers: { Authorization: `Bearer ${token}` } })).json();
  if (left.schedules.some((s) => s.id === id)) throw new Error("still listed");
});

if (problems.length) {
  failed += 1;
  console.log(`FAIL console :: the page reported errors: ${problems.join(" | ")}`);
}
await browser.close();
console.log(`console: ${failed ? `${failed} failed` : "all passed"}`);
process.exit(failed ? 1 : 0);
