// Browser end-to-end test: Debian's Chromium, headless, driven by playwright-core, against the
// example page (E2E_URL) whose CopilotKit runtime talks to agui-serve on the demo agent.
// Each case types into the real CopilotChat and checks what a person would see.
//
//   E2E_URL=http://127.0.0.1:3000 AGUI_BASE=https://127.0.0.1:8443/agui AGUI_TOKEN_FILE=t \
//     NODE_EXTRA_CA_CERTS=<data-dir>/tls/cert.pem node e2e/run.mjs
// CHROMIUM overrides the browser (default /usr/bin/chromium). Screenshots (of a failure, of
// the final page, and the README's: the first screen, a conversation, generative UI, an
// error, a stopped reply) go to E2E_ARTIFACTS (default: a new temp dir); with E2E_SCREENSHOTS=DIR the
// README's are also written to DIR (examples/copilotkit/screenshots).
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { copyFileSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const base = process.env.E2E_URL ?? "http://127.0.0.1:3000";
// The daemon itself, to check what the page did there (optional: cases that need it say so).
const daemon = process.env.AGUI_BASE;
const daemonToken = process.env.AGUI_TOKEN_FILE
  ? readFileSync(process.env.AGUI_TOKEN_FILE, "utf8").trim()
  : process.env.AGUI_TOKEN;
const artifacts = process.env.E2E_ARTIFACTS ?? mkdtempSync(join(tmpdir(), "agui-e2e-"));
const TIMEOUT = 20_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
// A fresh, empty profile per run (playwright's default for a new context), in an 800 px
// high window.
const VIEWPORT = { width: 1280, height: 800 };
const context = await browser.newContext({ viewport: VIEWPORT });
const page = await context.newPage();
// The content-encoding each script arrived with, by path.
const scriptEncodings = new Map();
page.on("response", (response) => {
  if (response.request().resourceType() !== "script") return;
  scriptEncodings.set(new URL(response.url()).pathname, response.headers()["content-encoding"] ?? "none");
});
// Anything the page reports as an error fails the case, unless the case expects it.
const pageErrors = [];
const expectedErrors = [];
page.on("pageerror", (error) => pageErrors.push(error.message));
page.on("console", (message) => {
  if (message.type() !== "error") return;
  if (expectedErrors.some((text) => message.text().includes(text))) return;
  pageErrors.push(`console: ${message.text()}`);
});
page.setDefaultTimeout(TIMEOUT);

const assistant = page.getByTestId("copilot-assistant-message");
const user = page.getByTestId("copilot-user-message");

// Until the runtime's /info has answered, Enter keeps the text and sends nothing: Enter is
// pressed again while the text is still in the box (once sent the box is empty, and Enter on
// an empty box of a running chat would stop the run).
async function send(text) {
  const input = page.getByTestId("copilot-chat-textarea");
  await input.fill(text);
  for (let i = 0; i < 200 && (await input.inputValue()) === text; i += 1) {
    await input.press("Enter");
    await page.waitForTimeout(100);
  }
  await user.filter({ hasText: text }).last().waitFor();
}

async function reply(text) {
  await assistant.filter({ hasText: text }).last().waitFor();
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

// A screenshot of the window for the README, when the run is asked for them.
async function shot(name) {
  const path = join(artifacts, `${name}.png`);
  await page.screenshot({ path });
  if (process.env.E2E_SCREENSHOTS) copyFileSync(path, join(process.env.E2E_SCREENSHOTS, `${name}.png`));
}

// The chat's input is wholly inside the window.
async function inputOnScreen(when) {
  const box = await page.getByTestId("copilot-chat-input").boundingBox();
  check(box, `${when}: no chat input`);
  check(box.y >= 0 && box.y + box.height <= VIEWPORT.height, `${when}: the input is cut off: ${JSON.stringify(box)} in a ${VIEWPORT.height} px window`);
}

// Answers the permission request that waits on `thread` with Allow, as the operator's
// console does: the thread's messages and a tool message, posted to the daemon.
async function approveElsewhere(thread) {
  const headers = { Authorization: `Bearer ${daemonToken}` };
  const read = await fetch(`${daemon}/threads/${encodeURIComponent(thread)}/messages`, { headers });
  const messages = (await read.json()).messages.filter((m) => m.role !== "activity");
  const call = messages
    .flatMap((m) => m.toolCalls ?? [])
    .filter((c) => c.function.name === "agui_permission_request")
    .pop();
  check(call, "no permission request in the thread");
  const options = JSON.parse(call.function.arguments).options ?? [];
  const allow = options.find((o) => (o.kind ?? "").startsWith("allow"))?.optionId ?? "allow";
  messages.push({ id: randomUUID(), role: "tool", toolCallId: call.id, content: JSON.stringify({ optionId: allow }) });
  const response = await fetch(`${daemon}/demo`, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ threadId: thread, runId: randomUUID(), messages, tools: [], context: [], state: {}, forwardedProps: {} }),
  });
  const events = await response.text();
  check(response.ok && events.includes("RUN_FINISHED"), `the approval elsewhere: ${response.status} ${events.slice(-300)}`);
}

async function idle() {
  await page.locator('[data-copilot-running="false"]').first().waitFor();
}

// The main conversation's URL, while the generative UI cases use a thread of their own.
let mainThread;

// What /ui choice_prompt asks in the cases below.
const REGION = {
  question: "Which region?",
  options: [
    { id: "eu", label: "Europe" },
    { id: "us", label: "United States" },
  ],
};

// The progress bar of '/ui progress {"label":"Indexing","percent":42,...}', once.
async function progressShown() {
  const bar = page.getByRole("progressbar", { name: "Indexing" });
  await bar.waitFor();
  check((await bar.count()) === 1, `${await bar.count()} progress bars`);
  check((await bar.getAttribute("aria-valuenow")) === "42", `aria-valuenow ${await bar.getAttribute("aria-valuenow")}`);
  const card = page.getByTestId("ui-progress");
  const text = await card.innerText();
  for (const part of ["Indexing", "42%", "3 of 7 folders"]) check(text.includes(part), `the progress card shows ${JSON.stringify(text)}`);
}

// The choice prompt, answered "Europe": that option marked, none answerable any more.
async function choiceAnswered(when) {
  const prompt = page.getByRole("group", { name: REGION.question });
  await prompt.waitFor();
  check((await prompt.count()) === 1, `${when}: ${await prompt.count()} prompts`);
  const europe = prompt.getByRole("button", { name: "Europe", exact: true });
  const us = prompt.getByRole("button", { name: "United States" });
  check((await europe.getAttribute("aria-pressed")) === "true", `${when}: Europe is not marked chosen`);
  check((await us.getAttribute("aria-pressed")) === "false", `${when}: United States is marked chosen`);
  check((await europe.isDisabled()) && (await us.isDisabled()), `${when}: the prompt can still be answered`);
  check((await prompt.innerText()).includes("Answered: Europe"), `${when}: no answer shown`);
}

const cases = [
  [
    "the page loads with an empty chat, a thread in the URL and the demo commands",
    async () => {
      await page.goto(base);
      await page.getByTestId("copilot-chat-textarea").waitFor();
      check(new URL(page.url()).searchParams.get("thread"), `no thread in ${page.url()}`);
      await idle();
      const hint = page.getByTestId("welcome");
      await hint.waitFor();
      const text = await hint.innerText();
      for (const command of ["/slow", "/todo", "/tool show_card", "/approve", "/fail", '/ui progress {"label":"Indexing","percent":42}'])
        check(text.includes(command), `the hint does not list ${command}: ${text}`);
      await inputOnScreen("first screen");
      await shot("first-screen");
    },
  ],
  [
    "the entry script and the page's largest script arrive compressed",
    async () => {
      const html = await (await fetch(base)).text();
      const entry = html.match(/<script type="module"[^>]* src="([^"]+)"/)?.[1];
      check(entry, "no entry script in the page");
      const encoding = scriptEncodings.get(new URL(entry, base).pathname);
      check(["br", "gzip"].includes(encoding), `entry script ${entry}: content-encoding ${encoding}`);
      const preloaded = [...html.matchAll(/<link rel="modulepreload"[^>]* href="([^"]+)"/g)].map((m) => m[1]);
      check(preloaded.length > 0, "no preloaded chunk");
      for (const path of preloaded) {
        const got = scriptEncodings.get(new URL(path, base).pathname);
        check(["br", "gzip"].includes(got), `${path}: content-encoding ${got}`);
        // And to a client that asks for gzip only, gzip (each server picks what is accepted).
        const response = await fetch(new URL(path, base), { headers: { "accept-encoding": "gzip" } });
        check(response.headers.get("content-encoding") === "gzip", `${path} for gzip: ${response.headers.get("content-encoding")}`);
        await response.arrayBuffer();
      }
    },
  ],
  [
    "a reply streams in, and the hint makes way for the conversation",
    async () => {
      await send("hello browser");
      await reply("You said: hello browser");
      check((await page.getByTestId("welcome").count()) === 0, "the hint is still shown");
    },
  ],
  [
    "a slow reply arrives chunk by chunk, not in one piece at the end",
    async () => {
      // Record, in the page, when each chunk first becomes visible.
      await page.evaluate(() => {
        window.__chunks = {};
        const seen = () => {
          for (const match of document.body.innerText.matchAll(/chunk (\d+)\/6/g))
            window.__chunks[match[1]] ??= performance.now();
        };
        window.__observer = new MutationObserver(seen);
        window.__observer.observe(document.body, { subtree: true, childList: true, characterData: true });
      });
      await send("/slow 6 250");
      await reply("chunk 6/6");
      const seenAt = await page.evaluate(() => {
        window.__observer.disconnect();
        return window.__chunks;
      });
      const times = [1, 2, 3, 4, 5, 6].map((i) => seenAt[i]);
      check(times.every((t) => typeof t === "number"), `chunks seen: ${JSON.stringify(seenAt)}`);
      // Produced 250 ms apart; delivered in a batch they would all appear within one frame.
      const distinct = new Set(times.map((t) => Math.round(t / 50))).size;
      check(distinct >= 4 && times[5] - times[0] >= 600, `chunks not incremental: ${JSON.stringify(times)}`);
    },
  ],
  [
    "/todo fills the todos panel from shared state",
    async () => {
      await send("/todo plan; build; ship");
      await reply("Todo list set: 3 items");
      const items = page.getByTestId("todos").locator("li");
      await items.nth(2).waitFor();
      const texts = await items.allInnerTexts();
      check(texts.length === 3, `todos: ${JSON.stringify(texts)}`);
      check(/plan$/.test(texts[0]) && /build$/.test(texts[1]) && /ship$/.test(texts[2]), `todos: ${JSON.stringify(texts)}`);
      check((await items.first().getAttribute("data-status")) === "in_progress", "first todo is not in progress");
    },
  ],
  [
    "/tool runs the frontend tool and renders it in the page",
    async () => {
      await send('/tool show_card {"title":"Hello from the agent","body":"rendered by the page"}');
      const card = page.getByTestId("tool-card").filter({ hasText: "Hello from the agent" });
      await card.waitFor();
      check((await card.innerText()).includes("rendered by the page"), "card body missing");
      await reply('Tool show_card returned: card "Hello from the agent" shown');
    },
  ],
  [
    "/approve shows the approval card and the reply follows the click",
    async () => {
      await send("/approve deploy");
      const card = page.getByTestId("approval").filter({ hasText: "deploy" }).last();
      await card.waitFor();
      const allow = card.getByRole("button", { name: "Allow" });
      await allow.waitFor();
      check(await card.getByRole("button", { name: "Deny" }).isVisible(), "no Deny button");
      check((await assistant.filter({ hasText: "Approved: deploy" }).count()) === 0, "replied before the click");
      await allow.click();
      await reply("Approved: deploy");
      await idle();
      await shot("conversation");
    },
  ],
  [
    "/approve answered with Deny is denied",
    async () => {
      await send("/approve delete the database");
      const card = page.getByTestId("approval").filter({ hasText: "delete the database" }).last();
      await card.getByRole("button", { name: "Deny" }).click();
      await reply("Denied: delete the database");
    },
  ],
  [
    "a reload while the approval card waits keeps it answerable",
    async () => {
      await send("/approve reboot");
      const waiting = page.getByTestId("approval").filter({ hasText: "reboot" }).last();
      await waiting.getByRole("button", { name: "Allow" }).waitFor();
      await page.reload();
      const card = page.getByTestId("approval").filter({ hasText: "reboot" }).last();
      const allow = card.getByRole("button", { name: "Allow" });
      await allow.waitFor();
      await allow.click();
      await reply("Approved: reboot");
    },
  ],
  [
    "a stale Deny after another client approved: the card shows the answer that counted",
    async () => {
      expectedErrors.push("already answered on this thread"); // CopilotKit logs the refusal
      await send("/approve rotate keys");
      const card = page.getByTestId("approval").filter({ hasText: "rotate keys" }).last();
      await card.getByRole("button", { name: "Allow" }).waitFor();
      // Another client (the operator's console) approves first, through the daemon.
      const thread = new URL(page.url()).searchParams.get("thread");
      check(thread, `no thread in ${page.url()}`);
      await approveElsewhere(thread);
      // The page still shows the question; its Deny comes too late.
      await card.getByRole("button", { name: "Deny" }).click();
      await page.getByTestId("run-error").filter({ hasText: "already answered" }).waitFor();
      const answered = card.getByText("Answered: Allow");
      for (let i = 0; i < 100 && !(await answered.count()); i += 1) await page.waitForTimeout(50);
      check(await answered.count(), `the card reads ${JSON.stringify(await card.innerText())}`);
      await page.getByTestId("run-error").getByRole("button", { name: "Dismiss" }).click();
    },
  ],
  [
    "/ui progress: the page draws the agent's progress bar",
    async () => {
      // In a thread of their own (the chat keeps only the rows near the view in the page
      // once a conversation is long, and the cases after these look far back in theirs).
      mainThread = page.url();
      await page.goto(base);
      await page.getByTestId("welcome").waitFor();
      await send('/ui progress {"label":"Indexing","percent":42,"detail":"3 of 7 folders"}');
      await reply("Showed progress");
      await progressShown();
    },
  ],
  [
    "/ui choice_prompt: the question and its options as buttons; a click answers with the label",
    async () => {
      await send(`/ui choice_prompt ${JSON.stringify(REGION)}`);
      await reply("Showed choice_prompt");
      const prompt = page.getByRole("group", { name: REGION.question });
      await prompt.waitFor();
      check((await prompt.count()) === 1, `${await prompt.count()} prompts`);
      const buttons = await prompt.getByRole("button").allInnerTexts();
      check(JSON.stringify(buttons) === JSON.stringify(["Europe", "United States"]), `buttons: ${JSON.stringify(buttons)}`);
      const europe = prompt.getByRole("button", { name: "Europe", exact: true });
      check((await europe.getAttribute("aria-pressed")) === "false", "Europe is chosen before the click");
      await europe.click();
      await user.filter({ hasText: /^\s*Europe\s*$/ }).waitFor();
      await reply("You said: Europe");
      await choiceAnswered("after the click");
      // For the README: from the /ui progress command on.
      await user.filter({ hasText: "/ui progress" }).evaluate((message) => message.scrollIntoView({ block: "start" }));
      await shot("generative-ui");
    },
  ],
  [
    "a reload keeps the agent's components and the prompt's answer",
    async () => {
      await page.reload();
      await reply("You said: Europe");
      await progressShown();
      await choiceAnswered("after the reload");
    },
  ],
  [
    "/ui: the other default components, and props shown as text, never as markup",
    async () => {
      const shows = [
        ["approval_card", { title: "Deploy to production?", description: "3 services", risk: "high", actions: [{ id: "go", label: "Deploy" }, { id: "no", label: "Cancel" }] }, ["Deploy to production?", "3 services", "high risk"]],
        ["diff_summary", { summary: "Tidy the parser", files: [{ path: "src/a.rs", added: 3, removed: 1 }, { path: "README.md", added: 10 }] }, ["2 files changed, +13 −1", "Tidy the parser", "src/a.rs", "+3", "−1", "README.md", "+10"]],
        ["metric", { label: "Latency p99", value: 12.5, unit: "ms", trend: "down" }, ["Latency p99", "12.5", "ms", "down"]],
        ["agent_card", { name: "reviewer", status: "working", description: "reading the diff" }, ["reviewer", "working", "reading the diff"]],
        ["metric", { label: "<img src=x onerror=alert(1)>", value: "<b>7</b>" }, ["<img src=x onerror=alert(1)>", "<b>7</b>"]],
      ];
      for (const [component, props, texts] of shows) {
        // A component shown twice (metric) waits for its new card and its new reply, not the
        // ones already on the page.
        const cards = page.getByTestId(`ui-${component}`);
        const replies = assistant.filter({ hasText: `Showed ${component}` });
        const [cardsBefore, repliesBefore] = [await cards.count(), await replies.count()];
        await send(`/ui ${component} ${JSON.stringify(props)}`);
        await replies.nth(repliesBefore).waitFor();
        const card = cards.nth(cardsBefore);
        await card.waitFor();
        const shown = await card.textContent(); // (innerText would be the badges' upper case)
        for (const text of texts) check(shown.includes(text), `${component}: no "${text}" in ${JSON.stringify(shown)}`);
        // Checked as each one arrives, while it is in view.
        if (component === "approval_card") {
          const actions = await card.getByRole("button").allInnerTexts();
          check(actions.join("|") === "Deploy|Cancel", `approval_card: actions ${JSON.stringify(actions)}`);
          const cancel = card.getByRole("button", { name: "Cancel" });
          await cancel.click();
          await reply("You said: Cancel");
          check((await cancel.getAttribute("aria-pressed")) === "true", "approval_card: Cancel is not marked");
          check(await card.getByRole("button", { name: "Deploy" }).isDisabled(), "approval_card: still answerable");
        }
        if (props.label?.startsWith("<img")) {
          const markup = await card.locator("img, b").count();
          check(markup === 0, `the props became ${markup} element(s)`);
        }
      }
      // A prompt that allows several options: tick two, Send.
      const toppings = { question: "Which toppings?", multiple: true, options: [{ id: "a", label: "Basil" }, { id: "b", label: "Olives" }, { id: "c", label: "Capers" }] };
      await send(`/ui choice_prompt ${JSON.stringify(toppings)}`);
      await reply("Showed choice_prompt");
      const prompt = page.getByRole("group", { name: "Which toppings?" });
      await prompt.waitFor(); // (the reply above may be the earlier prompt's)
      const sendChoice = prompt.getByRole("button", { name: "Send" });
      check(await sendChoice.isDisabled(), "Send is enabled with nothing ticked");
      await prompt.getByRole("button", { name: "Basil" }).click();
      await prompt.getByRole("button", { name: "Capers" }).click();
      await sendChoice.click();
      await reply("You said: Basil, Capers");
      const pressed = await prompt.locator('button[aria-pressed="true"]').allInnerTexts();
      check(pressed.join("|") === "Basil|Capers", `marked: ${JSON.stringify(pressed)}`);
      // A component off the daemon's list puts nothing on the page (which would draw it as an
      // unknown component); the agent says why.
      await send('/ui script_runner {"code":"rm -rf /"}');
      await reply("UI refused: unknown component");
      await idle();
      check((await page.getByTestId("ui-unknown").count()) === 0, "a refused component was drawn");
      // Back to the main conversation.
      await page.goto(mainThread);
      await reply("Approved: reboot");
    },
  ],
  [
    "an agent error is shown in the banner and in the conversation, the input stays on screen",
    async () => {
      // The conversation is longer than the window by now.
      const overflowing = await page.evaluate(() =>
        [...document.querySelectorAll(".chat *")].some(
          (e) => e.scrollHeight > 1.5 * window.innerHeight && e.clientHeight < e.scrollHeight,
        ),
      );
      check(overflowing, "the conversation is not yet longer than the window");
      expectedErrors.push("the disk is full"); // CopilotKit also logs it to the console
      await send("/fail the disk is full");
      const banner = page.getByTestId("run-error");
      await banner.filter({ hasText: "the disk is full" }).waitFor();
      const inline = page.getByTestId("inline-error").filter({ hasText: "the disk is full" });
      await inline.waitFor();
      await idle();
      await inputOnScreen("after /fail, with the banner");
      // Inline, right after the message that failed.
      const follows = await page.evaluate(() => {
        const error = [...document.querySelectorAll('[data-testid="inline-error"]')].pop();
        const users = [...document.querySelectorAll('[data-testid="copilot-user-message"]')];
        const failed = users.filter((u) => u.innerText.includes("/fail the disk is full")).pop();
        return Boolean(failed && error && failed.compareDocumentPosition(error) & Node.DOCUMENT_POSITION_FOLLOWING);
      });
      check(follows, "the inline error does not follow the failed message");
      await inline.scrollIntoViewIfNeeded();
      const seen = await inline.boundingBox();
      check(seen && seen.y >= 0 && seen.y + seen.height <= VIEWPORT.height, `the inline error is not in the window: ${JSON.stringify(seen)}`);
      await inputOnScreen("with the inline error in view");
      await shot("error");
      await banner.getByRole("button", { name: "Dismiss" }).click();
      check(await inline.isVisible(), "the inline error went with the banner");
      await send("after the error");
      await reply("You said: after the error");
      await inputOnScreen("after the next reply");
    },
  ],
  [
    "the stop button cancels the run in the daemon",
    async () => {
      check(daemon && daemonToken, "AGUI_BASE and AGUI_TOKEN_FILE (or AGUI_TOKEN) are needed");
      await send("/slow 40 250");
      await reply("chunk 2/40");
      await page.getByTestId("copilot-send-button").click();
      await page.locator('[data-copilot-running="false"]').first().waitFor();
      // Without the cancel the run would go on in the daemon, detached, for the grace period.
      const thread = new URL(page.url()).searchParams.get("thread");
      let status;
      for (let i = 0; i < 50 && status !== "idle"; i++) {
        const response = await fetch(`${daemon}/threads/${thread}`, {
          headers: { Authorization: `Bearer ${daemonToken}` },
        });
        status = (await response.json()).status;
        if (status !== "idle") await new Promise((r) => setTimeout(r, 100));
      }
      check(status === "idle", `the daemon's thread is ${status}`);
      check((await assistant.filter({ hasText: "chunk 40/40" }).count()) === 0, "the run was not stopped");
      // The reply so far stays, marked as stopped.
      const marker = page.getByTestId("stopped");
      await marker.waitFor();
      check((await marker.count()) === 1, `${await marker.count()} stopped markers`);
      const marked = await page.evaluate(() => {
        const marker = document.querySelector('[data-testid="stopped"]');
        const replies = [...document.querySelectorAll('[data-testid="copilot-assistant-message"]')];
        const stopped = replies.filter((r) => r.innerText.includes("chunk 2/40")).pop();
        const after = replies.filter((r) => stopped && stopped.compareDocumentPosition(r) & Node.DOCUMENT_POSITION_FOLLOWING);
        return Boolean(stopped && stopped.compareDocumentPosition(marker) & Node.DOCUMENT_POSITION_FOLLOWING) && after.every((r) => r.compareDocumentPosition(marker) & Node.DOCUMENT_POSITION_PRECEDING);
      });
      check(marked, "the stopped reply is not the one marked");
      await marker.scrollIntoViewIfNeeded();
      await shot("stopped");
      await send("after the stop");
      await reply("You said: after the stop");
    },
  ],
  [
    "a reload in the middle of a reply picks the live run up again",
    async () => {
      await send("/slow 8 300");
      await reply("chunk 2/8");
      await page.reload();
      await reply("chunk 8/8");
      check((await assistant.filter({ hasText: "You said: hello browser" }).count()) > 0, "earlier history lost");
      check((await user.filter({ hasText: "/slow 8 300" }).count()) === 1, "the prompt is not shown once");
    },
  ],
  [
    "a reload keeps the conversation, the todos and the thread",
    async () => {
      const before = page.url();
      const userCount = await user.count();
      await page.reload();
      check(page.url() === before, `thread changed: ${before} -> ${page.url()}`);
      await reply("Denied: delete the database");
      for (const text of ["You said: hello browser", "chunk 6/6", "Todo list set: 3 items", "Approved: deploy"])
        check((await assistant.filter({ hasText: text }).count()) > 0, `after reload, no "${text}"`);
      // The error is part of the history: once, inline, without the banner.
      const inline = page.getByTestId("inline-error").filter({ hasText: "the disk is full" });
      await inline.waitFor();
      check((await inline.count()) === 1, `${await inline.count()} inline errors after the reload`);
      check((await page.getByTestId("run-error").count()) === 0, "the banner came back");
      await inputOnScreen("after the reload");
      check((await user.count()) === userCount, `user messages ${userCount} -> ${await user.count()}`);
      await page.getByTestId("todos").locator("li").nth(2).waitFor();
      // The conversation goes on in the same thread.
      await send("still here");
      await reply("You said: still here");
    },
  ],
];

// In direct mode CopilotKit's own threads drawer lists the agent's threads from the daemon,
// archives and deletes them; the page renames through the drawer's store.
async function daemonThread(id) {
  const response = await fetch(`${daemon}/threads/${encodeURIComponent(id)}`, {
    headers: { Authorization: `Bearer ${daemonToken}` },
  });
  return { status: response.status, body: response.status === 200 ? await response.json() : null };
}

if (process.env.E2E_THREADS) {
  const row = (id) => page.locator(`li[data-thread-id="${id}"]`);
  cases.push([
    "CopilotKit's threads drawer lists the threads, shows a new one without a reload, switches",
    async () => {
      const first = new URL(page.url()).searchParams.get("thread");
      await row(first).waitFor();
      await page.locator('[part="new-thread-button"]').click();
      await page.waitForURL((url) => {
        const thread = url.searchParams.get("thread");
        return Boolean(thread) && thread !== first;
      });
      const second = new URL(page.url()).searchParams.get("thread");
      await row(first).waitFor();
      check((await row(second).count()) === 0, "the new thread is listed before it has a run");
      await send("in the second thread");
      await reply("You said: in the second thread");
      check((await assistant.filter({ hasText: "You said: hello browser" }).count()) === 0, "the new thread shows the old one");
      // No reload: the drawer lists the new thread once its run has ended.
      await row(second).waitFor();
      await row(first).click();
      await page.waitForURL((url) => url.searchParams.get("thread") === first);
      await reply("You said: hello browser");
      check((await assistant.filter({ hasText: "in the second thread" }).count()) === 0, "the first thread shows the second one");
    },
  ]);
  cases.push([
    "a thread renamed, archived and deleted in the drawer is so in the daemon",
    async () => {
      const current = new URL(page.url()).searchParams.get("thread");
      const form = page.getByTestId("rename-thread");
      await form.locator("input").fill("Browser thread");
      await form.locator("button").click();
      await row(current).filter({ hasText: "Browser thread" }).waitFor();
      const renamed = await daemonThread(current);
      check(renamed.body?.name === "Browser thread", `the daemon's name: ${JSON.stringify(renamed.body)}`);
      // Another thread, to archive and then delete from its row's menu.
      await page.locator('[part="new-thread-button"]').click();
      await page.waitForURL((url) => Boolean(url.searchParams.get("thread")) && url.searchParams.get("thread") !== current);
      const other = new URL(page.url()).searchParams.get("thread");
      await send("to be archived");
      await reply("You said: to be archived");
      await row(other).waitFor();
      // A row's menu shows on hover.
      await row(other).hover();
      await row(other).locator('[part="row-menu"]').click();
      await row(other).locator('[part="row-archive"]').click();
      await row(other).waitFor({ state: "detached" });
      const archived = await daemonThread(other);
      check(archived.body?.archived === true, `archived in the daemon: ${JSON.stringify(archived.body)}`);
      // Shown again with every thread, then deleted.
      await page.locator('[part="filter-toggle"]').click();
      await page.locator('[part="filter-all"]').click();
      await row(other).waitFor();
      await row(other).hover();
      await row(other).locator('[part="row-menu"]').click();
      await row(other).locator('[part="row-delete"]').click();
      await page.locator('[part="confirm-delete"]').click();
      await row(other).waitFor({ state: "detached" });
      const deleted = await daemonThread(other);
      check(deleted.status === 404, `the deleted thread answers ${deleted.status}`);
      // The renamed one is still there.
      await row(current).filter({ hasText: "Browser thread" }).waitFor();
      await page.goto(new URL(`?thread=${encodeURIComponent(current)}`, base).toString());
      await reply("You said: hello browser");
    },
  ]);
}

// With E2E_UPLOAD_AGENT (an ACP agent of the daemon that takes images and answers its
// `blocks` command with the prompt's blocks), an image attached in the page reaches it.
if (process.env.E2E_UPLOAD_AGENT) {
  cases.push([
    "an image attached in the page reaches an ACP agent as an image block",
    async () => {
      const back = page.url();
      const png = Buffer.from(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082",
        "hex",
      );
      await page.goto(new URL(`?agent=${process.env.E2E_UPLOAD_AGENT}`, base).toString());
      await page.getByTestId("copilot-chat-textarea").waitFor();
      await page.locator('input[type="file"]').setInputFiles({ name: "dot.png", mimeType: "image/png", buffer: png });
      // The attachment is uploaded before the message can go.
      const input = page.getByTestId("copilot-chat-textarea");
      await input.fill("blocks");
      for (let i = 0; i < 100; i += 1) {
        await input.press("Enter");
        if (await user.filter({ hasText: "blocks" }).count()) break;
        await page.waitForTimeout(100);
      }
      const image = `{"type":"image","data":"${png.toString("base64")}","mimeType":"image/png"}`;
      await assistant.filter({ hasText: image }).last().waitFor();
      // The daemon's transcript keeps the upload's URL, not the bytes.
      const thread = new URL(page.url()).searchParams.get("thread");
      const response = await fetch(`${daemon}/threads/${encodeURIComponent(thread)}/messages`, {
        headers: { Authorization: `Bearer ${daemonToken}` },
      });
      const { messages } = await response.json();
      const sent = JSON.stringify(messages.find((m) => m.role === "user"));
      check(/"type":"url","value":"[^"]*\/uploads\/[0-9a-f]{32}\?owner=/.test(sent), `no upload link in ${sent.slice(0, 300)}`);
      check(!sent.includes(png.toString("base64")), "the transcript's message holds the image's bytes");
      check(!sent.includes("token="), "the transcript's message holds a token");
      // The page shows the image, by a link that needs no token, live and after a reload.
      const shown = async (when) => {
        const img = page.locator('img[alt="Image attachment"]').last();
        for (let i = 0; i < 100 && !(await img.count()); i += 1) {
          check(!(await page.getByText("Failed to load image").count()), `the page failed to load the image ${when}`);
          await page.waitForTimeout(100);
        }
        for (let i = 0; i < 100 && !(await img.evaluate((e) => e.complete && e.naturalWidth > 0)); i += 1) {
          await page.waitForTimeout(50);
        }
        check(await img.evaluate((e) => e.complete && e.naturalWidth === 1), `the image is not shown ${when}`);
        const src = new URL(await img.getAttribute("src"), page.url());
        check(src.searchParams.has("signature"), `the image's link is not signed ${when}: ${src}`);
        const id = src.pathname.split("/").pop();
        const bare = await fetch(`${daemon}/uploads/${id}${src.search}`);
        check(bare.status === 200, `the link without a token: ${bare.status} ${when}`);
        check(Buffer.from(await bare.arrayBuffer()).equals(png), `the link shows other bytes ${when}`);
      };
      await shown("live");
      await page.reload();
      await page.getByTestId("copilot-chat-textarea").waitFor();
      await shown("after a reload");
      await page.goto(back);
      await page.getByTestId("copilot-chat-textarea").waitFor();
    },
  ]);
}

// With E2E_V1, the same chat under CopilotKit's v1 provider (v1.html) answers too.
if (process.env.E2E_V1) {
  cases.push([
    "the v1 provider (<CopilotKit runtimeUrl>) reaches the agent",
    async () => {
      const back = page.url();
      await page.goto(new URL("v1.html", base).toString());
      await page.getByTestId("copilot-chat-textarea").waitFor();
      await send("from the v1 provider");
      await reply("You said: from the v1 provider");
      await page.goto(back);
      await page.getByTestId("copilot-chat-textarea").waitFor();
    },
  ]);
}

// With E2E_RESTART (a command that restarts the daemon behind the page), one more case.
if (process.env.E2E_RESTART) {
  cases.push([
    "restarting agui-serve between two messages keeps the conversation after a reload",
    async () => {
      await send("before the restart");
      await reply("You said: before the restart");
      execFileSync(process.env.E2E_RESTART, { stdio: "inherit" });
      await page.reload();
      await reply("You said: before the restart");
      check((await assistant.filter({ hasText: "You said: hello browser" }).count()) > 0, "earlier history lost");
      await send("after the restart");
      await reply("You said: after the restart");
    },
  ]);
}

// Edit and regenerate from CopilotChat's own buttons (the page sends the history it owns,
// forwardedProps.agui.history = "client"), on a thread of their own; a reload shows what
// the daemon kept, which is what the page showed.
cases.push([
  "an earlier message edited and the last answer regenerated; a reload shows the same",
  async () => {
    const fresh = new URL(base);
    fresh.searchParams.set("thread", `edit-${randomUUID()}`);
    await page.goto(fresh.toString());
    await page.getByTestId("copilot-chat-textarea").waitFor();
    await send("first question");
    await reply("You said: first question");
    await idle();
    await send("second question");
    await reply("You said: second question");
    await idle();
    // The first question edited: the conversation goes back to before it and goes on.
    page.once("dialog", (dialog) => dialog.accept("first, edited"));
    const first = user.filter({ hasText: "first question" }).first();
    await first.hover();
    await first.getByTestId("copilot-edit-button").click();
    await reply("You said: first, edited");
    await idle();
    const texts = async () => ({
      users: await user.allInnerTexts(),
      answers: await assistant.allInnerTexts(),
    });
    let shown = await texts();
    check(shown.users.length === 1 && shown.users[0].includes("first, edited"), `questions after the edit: ${JSON.stringify(shown.users)}`);
    check(shown.answers.length === 1, `answers after the edit: ${JSON.stringify(shown.answers)}`);
    const thread = new URL(page.url()).searchParams.get("thread");
    const stored = async () => {
      if (!daemon) return null;
      const response = await fetch(`${daemon}/threads/${encodeURIComponent(thread)}/messages`, {
        headers: { Authorization: `Bearer ${daemonToken}` },
      });
      return (await response.json()).messages.filter((m) => m.role === "user" || m.role === "assistant");
    };
    const afterEdit = await stored();
    if (afterEdit) {
      check(
        JSON.stringify(afterEdit.map((m) => m.content)) === JSON.stringify(["first, edited", "You said: first, edited"]),
        `the daemon's transcript after the edit: ${JSON.stringify(afterEdit)}`,
      );
    }
    // The last answer regenerated: asked again, answered anew, in its place.
    const answer = assistant.last();
    await answer.hover();
    await answer.getByTestId("copilot-regenerate-button").click();
    if (afterEdit) {
      for (let i = 0; i < 100; i += 1) {
        const now = await stored();
        if (now.length === 2 && now[1].id !== afterEdit[1].id) break;
        await page.waitForTimeout(100);
      }
      const now = await stored();
      check(now.length === 2 && now[1].id !== afterEdit[1].id, `the daemon's transcript after regenerate: ${JSON.stringify(now)}`);
    }
    await idle();
    await reply("You said: first, edited");
    shown = await texts();
    check(shown.users.length === 1 && shown.answers.length === 1, `after regenerate: ${JSON.stringify(shown)}`);
    // A reload shows what the daemon kept: the same conversation.
    await page.reload();
    await reply("You said: first, edited");
    await idle();
    const reloaded = await texts();
    check(JSON.stringify(reloaded) === JSON.stringify(shown), `after a reload ${JSON.stringify(reloaded)}, before ${JSON.stringify(shown)}`);
  },
]);

let failed = 0;
let passed = 0;
for (const [name, run] of cases) {
  const started = Date.now();
  try {
    await run();
    if (pageErrors.length) throw new Error(`errors in the page: ${pageErrors.join(" | ")}`);
    passed += 1;
    console.log(`ok   ${name} (${Date.now() - started} ms)`);
  } catch (error) {
    failed += 1;
    const shot = join(artifacts, `failure-${failed}.png`);
    await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
    console.log(`FAIL ${name}: ${error.message.split("\n")[0]} (screenshot ${shot})`);
    pageErrors.length = 0;
    break; // later cases build on this one
  }
}
if (!failed) await page.screenshot({ path: join(artifacts, "final.png"), fullPage: true });
await browser.close();
const skipped = cases.length - passed - failed;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(failed ? 1 : 0);
