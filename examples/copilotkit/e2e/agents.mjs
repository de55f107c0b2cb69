// The example page with real coding agents behind agui-serve (scripts/browser-real-agents.sh
// starts them on a scripted model): what a person sees before approving a Claude Code write,
// and a Codex command's output arriving while the command runs.
//
//   E2E_CLAUDE=http://127.0.0.1:PORT E2E_CODEX=http://127.0.0.1:PORT node e2e/agents.mjs
// CHROMIUM overrides the browser (default /usr/bin/chromium); screenshots go to
// E2E_ARTIFACTS (default: a new temp dir).
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const artifacts = process.env.E2E_ARTIFACTS ?? mkdtempSync(join(tmpdir(), "agui-e2e-agents-"));
// Real agents start in seconds, not milliseconds.
const TIMEOUT = 60_000;

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

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function open(url) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const errors = [];
  page.on("pageerror", (error) => errors.push(error.message));
  await page.goto(url);
  await page.getByTestId("copilot-chat-textarea").waitFor();
  return { page, errors };
}

// The chat takes input before it can send it: until the runtime's /info has answered, Enter
// keeps the text and sends nothing. So Enter is pressed again while the text is still in the
// box (once sent, the box is empty, and Enter on an empty box of a running chat would stop
// the run), then the message is waited for in the chat.
async function send(page, text) {
  const input = page.getByTestId("copilot-chat-textarea");
  await input.fill(text);
  for (let i = 0; i < 200 && (await input.inputValue()) === text; i += 1) {
    await input.press("Enter");
    await page.waitForTimeout(100);
  }
  await page.getByTestId("copilot-user-message").filter({ hasText: text }).last().waitFor();
}

const cases = [
  [
    "Claude Code: the approval card shows what the write writes and its diff; allowed, it is written",
    async () => {
      const { page, errors } = await open(process.env.E2E_CLAUDE);
      await send(page, "task-write: write the notes");
      const card = page.getByTestId("approval").last();
      await card.waitFor();
      const call = await card.getByTestId("approval-call").innerText();
      check(call.includes("Write") && call.includes("notes.txt"), `the card names the write: ${JSON.stringify(call)}`);
      const diff = await card.getByTestId("approval-diff").innerText();
      check(diff.includes("+ hello from claude"), `the card shows the diff: ${JSON.stringify(diff)}`);
      await page.screenshot({ path: join(artifacts, "claude-approval.png") });
      await card.locator('button[data-kind="allow_once"]').click();
      await page.getByTestId("copilot-assistant-message").filter({ hasText: "All done." }).last().waitFor();
      const shown = await page.getByTestId("ui-diff").last().innerText();
      check(shown.includes("notes.txt") && shown.includes("+ hello from claude"), `the diff in the chat: ${JSON.stringify(shown)}`);
      check(errors.length === 0, `page errors: ${errors.join("; ")}`);
    },
  ],
  [
    "Codex: the approval card shows the command; allowed, its output streams into the page",
    async () => {
      const { page, errors } = await open(process.env.E2E_CODEX);
      await send(page, "task-shell: run the command");
      const card = page.getByTestId("approval").last();
      await card.waitFor();
      const call = await card.getByTestId("approval-call").innerText();
      check(call.includes("echo one; sleep 1"), `the card shows the command: ${JSON.stringify(call)}`);
      await card.locator('button[data-kind="allow_once"]').click();
      // While the command runs the page shows what it printed so far, then how it ended.
      const terminal = page.getByTestId("ui-terminal").last();
      await terminal.waitFor();
      let whileRunning = null;
      const until = Date.now() + TIMEOUT;
      while (Date.now() < until) {
        const ended = await terminal.getAttribute("data-ended");
        const output = await terminal.getByTestId("terminal-output").innerText();
        // What the page showed when "two" first appeared: "three" comes a second later.
        // (A later look may fall between "three" and the exit that follows it at once.)
        if (whileRunning === null && ended === "false" && output.includes("two")) whileRunning = output;
        if (ended === "true") break;
        await page.waitForTimeout(50);
      }
      check(whileRunning !== null, "no output was shown while the command ran");
      check(!whileRunning.includes("three"), `the output came all at once: ${JSON.stringify(whileRunning)}`);
      const final = await terminal.innerText();
      check(final.includes("three") && final.includes("exit 0"), `the ended command: ${JSON.stringify(final)}`);
      await page.screenshot({ path: join(artifacts, "codex-terminal.png") });
      await page.getByTestId("copilot-assistant-message").filter({ hasText: "printed three lines" }).last().waitFor();
      check(errors.length === 0, `page errors: ${errors.join("; ")}`);
    },
  ],
];

let failed = 0;
for (const [name, run] of cases) {
  try {
    await run();
    console.log(`ok   ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`FAIL ${name}: ${error.message}`);
  }
}
await browser.close();
console.log(`${cases.length - failed} passed, ${failed} failed (screenshots in ${artifacts})`);
process.exit(failed ? 1 : 0);
