// What happened to the conversation's sandbox, shown where it happened (a server without a
// model, sandbox.idle_timeout 3s, 256 MiB sandboxes): started for the first cell; killed from
// outside and replaced at the next; a cell killed for memory, in red with the kernel's figures;
// deleted after being idle; started again for the next cell. The same after a reload.
import { readFile } from "node:fs/promises";
import { resolve } from "node:path";

import { assert, newConversation, noProblems, open, run, runCell, screenshot, turnEnded, url } from "./browser.mjs";

const stateDir = process.env.QUARRY_STATE_DIR;
if (!stateDir) throw new Error("QUARRY_STATE_DIR is not set: tests/browser sets it");

// The conversation's live sandbox, as the API lists it.
async function sandboxOf(page, conversation) {
  const live = await page.evaluate(async () => (await (await fetch("/api/v1/sandboxes")).json()).sandboxes);
  return live.find((sandbox) => sandbox.conversation_id === conversation);
}

// Whether the process has ended (gone, or a zombie waiting to be reaped).
async function ended(pid) {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return true;
  }
}

// Kills the sandbox's init from outside, as a crash or the kernel would, and waits until it has ended.
async function killSandbox(sandboxId) {
  const record = JSON.parse(await readFile(resolve(stateDir, "sandboxes", sandboxId, "sandbox.json"), "utf8"));
  process.kill(record.init_pid, "SIGKILL");
  for (let tries = 0; tries < 100; tries++) {
    if (await ended(record.init_pid)) return;
    await new Promise((done) => setTimeout(done, 50));
  }
  throw new Error(`the init of sandbox ${sandboxId} (pid ${record.init_pid}) did not die`);
}

const notes = (turn) => turn.locator(".sandbox-event").allInnerTexts();

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  const id = await newConversation(page);

  await runCell(page, "python", "print('first')");
  let first = await turnEnded(page, 1);
  assert.deepEqual(await notes(first), ["A sandbox was started for this conversation."]);
  // The note comes before the step whose first command needed the sandbox.
  assert.ok(await first.evaluate((turn) => turn.querySelector(".sandbox-event").compareDocumentPosition(turn.querySelector("details.step")) & Node.DOCUMENT_POSITION_FOLLOWING));
  const killed = await sandboxOf(page, id);
  assert.equal(killed?.state, "idle");
  await killSandbox(killed.sandbox_id);

  await runCell(page, "python", "print('second')");
  let second = await turnEnded(page, 2);
  assert.equal(await second.locator("pre.stdout").innerText(), "second\n");
  assert.deepEqual(await notes(second), [
    "The sandbox had stopped; a new one replaced it (files written before are gone).",
  ]);
  assert.notEqual((await sandboxOf(page, id)).sandbox_id, killed.sandbox_id);

  await runCell(page, "python", "data = 'x' * (400 * 2**20)\nprint(len(data))");
  let oom = await turnEnded(page, 3);
  const step = oom.locator("details.step");
  assert.ok(await step.evaluate((node) => node.classList.contains("bad")), "the OOM step is marked");
  assert.match(await step.locator("summary").innerText(), /peak [\d.]+ MiB of 256 MiB · out of memory$/);
  assert.equal(await step.locator("summary").evaluate((node) => getComputedStyle(node).color), "rgb(179, 38, 30)");
  assert.match(await step.locator("pre.error-output").innerText(), /\nKilled: command ran out of memory\.\nPeak memory: \d+ MiB\nSandbox limit: 256 MiB\n/);
  await screenshot(page, "sandbox-events-oom", page.locator("li.turn[data-turn='2']"));

  // Idle past sandbox.idle_timeout: the server deletes it (it checks every second).
  const deadline = Date.now() + 30_000;
  while (await sandboxOf(page, id)) {
    assert.ok(Date.now() < deadline, "the idle sandbox was never deleted");
    await page.waitForTimeout(250);
  }
  await runCell(page, "python", "print('fourth')");
  const fourth = await turnEnded(page, 4);
  assert.deepEqual(await notes(fourth), ["A sandbox was started for this conversation."]);
  // The deletion is shown after the step that last used the sandbox.
  oom = page.locator("li.turn[data-turn='3']");
  assert.deepEqual(await notes(oom), ["The sandbox was deleted after being idle; the next step starts a new one."]);
  assert.ok(await oom.evaluate((turn) => turn.querySelector("details.step").compareDocumentPosition(turn.querySelector(".sandbox-event")) & Node.DOCUMENT_POSITION_FOLLOWING));
  await screenshot(page, "sandbox-events", page.locator("li.turn[data-turn='2']"));

  // Reloaded, the history tells the same story in the same places.
  await page.reload();
  await turnEnded(page, 4);
  first = page.locator("li.turn[data-turn='1']");
  second = page.locator("li.turn[data-turn='2']");
  assert.deepEqual(await notes(first), ["A sandbox was started for this conversation."]);
  assert.deepEqual(await notes(second), ["The sandbox had stopped; a new one replaced it (files written before are gone)."]);
  assert.deepEqual(await notes(page.locator("li.turn[data-turn='3']")), [
    "The sandbox was deleted after being idle; the next step starts a new one.",
  ]);
  assert.match(await page.locator("li.turn[data-turn='3'] details.step summary").innerText(), /out of memory$/);
  assert.deepEqual(await notes(page.locator("li.turn[data-turn='4']")), ["A sandbox was started for this conversation."]);
  noProblems(page);
});
