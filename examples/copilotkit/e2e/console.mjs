// The daemon's built-in operator console ({path}/console) in headless Chromium, driven as an
// operator would: it asks for the token; a run waiting for approval appears in the "waiting
// for you" strip with its diff and is approved from there; a question is answered there; a
// long run is stopped; a thread is found by search and its transcript shows a tool call's
// input, diff and terminal output; a thread is deleted; a schedule is listed and deleted; the
// thread list and the live table never disagree; at 390 px the page does not scroll
// sideways. Screenshots at desktop and phone widths go to CONSOLE_SCREENSHOTS when set.
//
// The daemon serves `demo`, the scripted ACP agent as `scripted`, a demo agent with a budget
// of 12 tokens a run as `metered` and one with `hitl = "interrupt"` as `asking`:
//   AGUI_BASE=https://127.0.0.1:8443/agui AGUI_TOKEN_FILE=t \
//     NODE_EXTRA_CA_CERTS=<data-dir>/tls/cert.pem node e2e/console.mjs
import { chromium } from "playwright-core";
import { mkdirSync, readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";

const base = process.env.AGUI_BASE;
const token = readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").trim();
const shots = process.env.CONSOLE_SCREENSHOTS || "";
const TIMEOUT = 20_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});
// The daemon's generated certificate is not one Chromium trusts.
const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
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
    console.log(`FAIL console :: ${name} (${error.message.split("\n").slice(0, process.env.E2E_VERBOSE ? 30 : 1).join("\n")})`);
  }
}

const unique = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A run started elsewhere: a plain POST to the run route with the token.
async function startRun(agent, threadId, text, { wait = false } = {}) {
  const response = await fetch(`${base}/${agent}`, {
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
  if (wait) return await done;
  return done;
}

async function messages(threadId) {
  const response = await fetch(`${base}/threads/${encodeURIComponent(threadId)}/messages`, { headers: { Authorization: `Bearer ${token}` } });
  return (await response.json()).messages ?? [];
}

/** Waits until the text messages of `threadId`'s transcript satisfy `check`. */
async function agentSaid(what, threadId, check) {
  await until(what, async () => {
    const said = (await messages(threadId)).map((m) => m.content).filter((c) => typeof c === "string");
    return check(said) || said;
  });
}

async function until(what, check) {
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    const last = await check();
    if (last === true) return;
    if (Date.now() > deadline) throw new Error(`${what}: ${JSON.stringify(last)}`);
    await sleep(150);
  }
}

/**
 * The thread list and the live table, read in one go: every thread the list shows as running
 * or suspended has that run in the table, and every run in the table whose thread is listed
 * shows there with the run's phase. The disagreements, if any.
 */
async function disagreements() {
  return page.evaluate(() => {
    const said = [];
    const runs = new Map();
    for (const row of document.querySelectorAll("#runs li")) {
      const phase = row.querySelector("[data-phase]").dataset.phase;
      runs.set(`${row.dataset.owner}\u001f${row.dataset.thread}`, phase);
    }
    for (const row of document.querySelectorAll("#threads li")) {
      const id = `${row.dataset.owner}\u001f${row.dataset.thread}`;
      const listed = row.dataset.status;
      const live = runs.get(id) ?? "idle";
      if (listed !== live) said.push(`${row.dataset.thread}: list ${listed}, table ${live}`);
    }
    return said;
  });
}

async function agreeing(moment) {
  const said = await disagreements();
  if (said.length) throw new Error(`${moment}: ${said.join("; ")}`);
}

async function noSidewaysScroll() {
  return page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    width: window.innerWidth,
  }));
}

await step("the page loads under its content security policy and asks for the token", async () => {
  const response = await page.goto(`${base}/console`);
  const policy = response.headers()["content-security-policy"] ?? "";
  if (!policy.includes("default-src 'none'") || !policy.includes("script-src 'self'")) throw new Error(`policy ${policy}`);
  await page.getByLabel("Operator token").fill(token);
  await page.getByRole("button", { name: "Connect" }).click();
  await page.getByText("Live", { exact: true }).waitFor();
  if (await page.locator("#login").isVisible()) throw new Error("the login form is still shown");
  if (!(await page.locator("#console").isVisible())) throw new Error("the console is not shown");
});

await step("a run on a thread named __proto__ appears like any other and leaves when it ends", async () => {
  const run = startRun("demo", "__proto__", "/slow 30 100");
  const row = page.locator('#runs li[data-thread="__proto__"]');
  await row.waitFor();
  await agreeing("while it runs");
  await run;
  await row.waitFor({ state: "detached" });
  await page.locator('#threads li[data-thread="__proto__"][data-status="idle"]').waitFor();
  await agreeing("after it ended");
});

const editThread = unique("console-edit");
await step("a run waiting for approval is in the strip with its diff, and approved from there", async () => {
  await startRun("scripted", editThread, "permission-edit", { wait: true });
  const card = page.locator(`#waits article[data-thread="${editThread}"]`);
  await card.waitFor();
  if ((await card.getAttribute("data-kind")) !== "approval") throw new Error("not an approval");
  await card.locator("figure.diff").getByText("+ def greet(name):").waitFor();
  await card.locator("figure.diff").getByText("- def greet():").waitFor();
  await card.getByText('"old_string"').waitFor();
  await agreeing("while it waits");
  await card.getByRole("button", { name: "Allow once" }).click();
  await card.waitFor({ state: "detached" });
  await agentSaid("the agent heard the answer", editThread, (said) => said.includes("Permission allowed."));
});

const demoApproval = unique("console-approve");
await step("the demo agent's approval is denied from the strip", async () => {
  await startRun("demo", demoApproval, "/approve ship the release", { wait: true });
  const card = page.locator(`#waits article[data-thread="${demoApproval}"]`);
  await card.waitFor();
  await card.getByRole("button", { name: "Deny" }).click();
  await card.waitFor({ state: "detached" });
  await agentSaid("the run went on", demoApproval, (said) => said.includes("Denied: ship the release"));
});

const formThread = unique("console-form");
await step("a question is answered with its form from the strip", async () => {
  await startRun("scripted", formThread, "elicit", { wait: true });
  const card = page.locator(`#waits article[data-thread="${formThread}"]`);
  await card.waitFor();
  if ((await card.getAttribute("data-kind")) !== "input") throw new Error("not a question");
  await card.getByLabel("Name").fill("Ada");
  await card.getByLabel("age").fill("36");
  await card.getByRole("button", { name: "Send answer" }).click();
  await card.waitFor({ state: "detached" });
  await agentSaid("the form's answer reached the agent", formThread, (said) => said.some((text) => text.startsWith("Form accepted") && text.includes("Ada")));
});

const meteredThread = unique("console-budget");
await step("a run paused on its budget is extended from the strip, and the day's spending shows", async () => {
  // 3 tokens a chunk: paused at the fourth, the rest within the budget extended to 24.
  await startRun("metered", meteredThread, "/slow 6 20", { wait: true });
  const card = page.locator(`#waits article[data-thread="${meteredThread}"]`);
  await card.waitFor();
  if ((await card.getAttribute("data-kind")) !== "budget") throw new Error("not a budget pause");
  await card.getByText("budget of 12 is reached").waitFor();
  await card.getByRole("button", { name: "Extend the budget once" }).click();
  await card.waitFor({ state: "detached" });
  await agentSaid("the run went on to its end", meteredThread, (said) => said.some((text) => text.includes("chunk 6/6")));
  await page.locator('#principals li[data-principal="operator"]').getByText(/^tokens: \d+$/).waitFor();
});

const interruptThread = unique("console-interrupt");
await step("an approval asked by interrupt is answered from the strip with resume", async () => {
  await startRun("asking", interruptThread, "/approve open the gate", { wait: true });
  const card = page.locator(`#waits article[data-thread="${interruptThread}"]`);
  await card.waitFor();
  await card.getByText("Allow the demo agent to open the gate?").waitFor();
  await card.getByRole("button", { name: "Allow" }).click();
  await card.waitFor({ state: "detached" });
  await agentSaid("the run went on", interruptThread, (said) => said.includes("Approved: open the gate"));
});

const longThread = unique("console-long");
await step("a long run is stopped from the console", async () => {
  const run = startRun("demo", longThread, "/slow 600 100");
  const row = page.locator(`#runs li[data-thread="${longThread}"]`);
  await row.waitFor();
  await page.locator(`#threads li[data-thread="${longThread}"][data-status="running"]`).waitFor();
  await agreeing("while the long run runs");
  await row.getByRole("button", { name: /^Stop/ }).click();
  await row.waitFor({ state: "detached" });
  const stream = await run;
  if (!stream.includes("RUN_ERROR") && !stream.includes("cancel")) throw new Error("the run's stream did not end cancelled");
  await page.locator(`#threads li[data-thread="${longThread}"][data-status="idle"]`).waitFor();
  await agreeing("after the stop");
});

const searched = unique("find-me");
await step("a thread is found by search and its transcript shows a tool call's input, diff and terminal output", async () => {
  await startRun("scripted", searched, searched, { wait: true });
  await startRun("scripted", searched, "tool", { wait: true });
  await startRun("scripted", searched, "terminal", { wait: true });
  // Others to search among.
  for (let i = 0; i < 3; i++) await startRun("demo", unique("console-other"), `another thread ${i}`, { wait: true });
  await page.locator(`#threads li[data-thread="${searched}"]`).waitFor();
  await page.getByLabel("Search threads").fill(searched);
  await until("only the thread searched for is listed", async () => {
    const shown = await page.locator("#threads li").evaluateAll((rows) => rows.map((row) => row.dataset.thread));
    return (shown.length === 1 && shown[0] === searched) || shown;
  });
  // Opened from the keyboard.
  await page.locator("#threads li button").first().focus();
  await page.keyboard.press("Enter");
  const transcript = page.locator("#messages");
  await transcript.getByText(`Echo: ${searched}`).waitFor();
  const read = transcript.locator('section.tool-call[data-tool-call="call-1"]');
  await read.getByText('"path": "/src/main.rs"').waitFor();
  await read.locator("figure.diff .path").getByText("/src/lib.rs").waitFor();
  await read.locator("figure.diff").getByText("+ b").waitFor();
  const terminal = transcript.locator('section.tool-call[data-tool-call="call-t"]');
  await terminal.getByText('"command": "echo one; echo two"').waitFor();
  await terminal.locator("figure.terminal").getByText("exit code 0").waitFor();
  const output = await terminal.locator("figure.terminal pre").textContent();
  if (output !== "one\ntwo\n") throw new Error(`terminal output ${JSON.stringify(output)}`);
  const focused = await page.evaluate(() => document.activeElement && document.activeElement.id);
  if (focused !== "detail-title") throw new Error(`focus went to ${focused}, not the transcript`);
  await page.getByLabel("Search threads").fill("");
});

await step("agent text is rendered as text, never as HTML", async () => {
  const marker = `<b>not bold ${randomUUID().slice(0, 6)}</b>`;
  const thread = unique("console-text");
  await startRun("demo", thread, marker, { wait: true });
  const open = page.locator("#threads").getByRole("button", { name: marker });
  await open.waitFor();
  await open.click();
  await page.locator("#messages").getByText(`You said: ${marker}`).waitFor();
  if ((await page.locator("#messages b").count()) !== 0) throw new Error("agent text was rendered as HTML");
});

await step("several runs at once: the thread list and the live table never disagree", async () => {
  const threads = [0, 1, 2].map(() => unique("console-many"));
  const runs = threads.map((thread, i) => startRun("demo", thread, `/slow ${10 + i * 5} 100`));
  let samples = 0;
  const deadline = Date.now() + 6000;
  while (Date.now() < deadline) {
    await agreeing(`sample ${samples}`);
    samples += 1;
    await sleep(100);
  }
  await Promise.all(runs);
  await until("every run ended", async () => (await page.locator("#runs li").count()) === 0);
  await agreeing("after they ended");
  if (samples < 20) throw new Error(`only ${samples} samples`);
});

await step("a thread is deleted from the console", async () => {
  const thread = unique("console-delete");
  await startRun("demo", thread, "delete me", { wait: true });
  await page.locator("#threads").getByRole("button", { name: "delete me" }).click();
  await page.locator("#detail-title").getByText("delete me").waitFor();
  const remove = page.locator("#detail-actions").getByRole("button", { name: "Delete" });
  await remove.click();
  await page.locator("#detail-actions").getByRole("button", { name: "Delete for good?" }).click();
  await page.locator(`#threads li[data-thread="${thread}"]`).waitFor({ state: "detached" });
  const gone = await fetch(`${base}/threads/${thread}`, { headers: { Authorization: `Bearer ${token}` } });
  if (gone.status !== 404) throw new Error(`the thread is still there: HTTP ${gone.status}`);
});

await step("a schedule shows when it fires next and how its last firing went, and is deleted", async () => {
  const name = unique("console-schedule");
  const response = await fetch(`${base}/schedules`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ agent: "demo", cron: "* * * * * *", name, messages: [{ role: "user", content: "<i>tick</i>" }] }),
  });
  if (response.status !== 201) throw new Error(`create: HTTP ${response.status}`);
  const { id } = await response.json();
  // The schedules are read again when a firing's run starts or ends.
  const row = page.locator(`tr[data-schedule="${id}"]`);
  await row.getByText("started").waitFor();
  if ((await row.locator("td").first().textContent()) !== name) throw new Error("the name is not shown");
  await row.getByRole("button", { name: "Delete" }).click();
  await row.waitFor({ state: "detached" });
  const left = await (await fetch(`${base}/schedules`, { headers: { Authorization: `Bearer ${token}` } })).json();
  if (left.schedules.some((s) => s.id === id)) throw new Error("still listed");
});

await step("a principal's token sees its own threads and runs only", async () => {
  const minted = await fetch(`${base}/tokens`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify({ sub: "alice", ttlSeconds: 600 }),
  });
  const alice = (await minted.json()).token;
  const hers = unique("console-alice");
  const run = await fetch(`${base}/demo`, {
    method: "POST",
    headers: { Authorization: `Bearer ${alice}`, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ threadId: hers, runId: randomUUID(), protocolVersion: "1.0", messages: [{ id: randomUUID(), role: "user", content: "hers" }] }),
  });
  await run.text();
  // The operator sees her thread, with her name.
  await page.locator(`#threads li[data-thread="${hers}"][data-owner="alice"]`).waitFor();
  const own = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
  const second = await own.newPage();
  second.setDefaultTimeout(TIMEOUT);
  await second.goto(`${base}/console`);
  await second.getByLabel("Operator token").fill(alice);
  await second.getByRole("button", { name: "Connect" }).click();
  await second.getByText("Live", { exact: true }).waitFor();
  await second.locator(`#threads li[data-thread="${hers}"]`).waitFor();
  const listed = await second.locator("#threads li").evaluateAll((rows) => rows.map((row) => row.dataset.thread));
  if (listed.length !== 1) throw new Error(`she sees ${JSON.stringify(listed)}`);
  if (await second.locator("#webhooks-panel").isVisible()) throw new Error("she sees the webhooks");
  await own.close();
});

const shownThread = unique("console-shown");
await step("screenshots at desktop and phone widths; at 390 px nothing scrolls sideways", async () => {
  // A page worth looking at: a run waiting for approval, a long run, a thread with tools.
  await startRun("scripted", shownThread, "permission-edit", { wait: true });
  const busy = unique("console-busy");
  const long = startRun("demo", busy, "/slow 600 100");
  await page.locator(`#waits article[data-thread="${shownThread}"] figure.diff`).waitFor();
  // Titles come with the thread list, read again as the runs start.
  await page.locator(`#runs li[data-thread="${busy}"] .title`).getByText("/slow 600 100").waitFor();
  await page.locator(`#waits article[data-thread="${shownThread}"] h3`).getByText("permission-edit").waitFor();
  await page.locator("#threads").getByRole("button", { name: searched }).click();
  await page.locator("#messages figure.terminal").waitFor();
  if (shots) {
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: `${shots}/console-desktop.png`, fullPage: true });
  }
  await page.setViewportSize({ width: 390, height: 844 });
  await sleep(300);
  const wide = await noSidewaysScroll();
  if (wide.scroll > wide.width) throw new Error(`the page is ${wide.scroll} px wide at ${wide.width} px`);
  await agreeing("at phone width");
  if (shots) await page.screenshot({ path: `${shots}/console-phone.png`, fullPage: true });
  await page.setViewportSize({ width: 1280, height: 900 });
  // Cleared away: the waiting run rejected, the long one stopped.
  const card = page.locator(`#waits article[data-thread="${shownThread}"]`);
  await card.getByRole("button", { name: "Reject" }).click();
  await card.waitFor({ state: "detached" });
  await page.locator(`#runs li[data-thread="${busy}"]`).getByRole("button", { name: /^Stop/ }).click();
  await long;
});

if (problems.length) {
  failed += 1;
  console.log(`FAIL console :: the page reported errors: ${problems.join(" | ")}`);
}
await browser.close();
console.log(`console: ${failed ? `${failed} failed` : "all passed"}`);
process.exit(failed ? 1 : 0);
