// One sandbox for everyone (capacity.max_sandboxes: 1): while one conversation's step runs,
// another's waits and says so, with its place in the queue; when the first ends, its idle sandbox
// makes room and the waiting step runs, saying how long it waited. The Load page shows the
// capacity: sandboxes in use against the limit, waits, starts and the eviction.
import { assert, newConversation, noProblems, open, openTab, run, runCell, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  await runCell(page, "python", "import time\nprint('holding the sandbox', flush=True)\ntime.sleep(6)");
  await page.locator("li.turn[data-turn='1'] pre.stdout", { hasText: "holding the sandbox" }).waitFor();

  const tab = await openTab(page);
  await tab.goto(url);
  await newConversation(tab);
  await runCell(tab, "python", "print('my turn')");
  const waiting = tab.locator("li.turn[data-turn='1'] .sandbox-event.queued");
  await waiting.waitFor();
  assert.match(await waiting.innerText(), /Every sandbox is in use: this turn waits for one \(place 1 of 1 waiting\)/);
  // The turn named the conversation when it started: the heading says so, as the list does.
  await tab.locator("header.conversation-head h1", { hasText: "print('my turn')" }).waitFor({ timeout: 5000 });
  await screenshot(tab, "capacity-waiting", tab.locator("li.turn[data-turn='1']"));

  const ran = await turnEnded(tab, 1);
  assert.equal(await ran.locator("pre.stdout").innerText(), "my turn\n");
  assert.equal(await waiting.innerText(), "Every sandbox was in use: this turn waited in the queue for one.");
  assert.match(await ran.locator(".sandbox-event.sandbox_ready").innerText(), /A sandbox was started for this conversation after waiting [\d.]+ (s|ms)\./);
  assert.match(await (await turnEnded(page, 1)).locator("pre.stdout").innerText(), /holding the sandbox/);

  // The first conversation's sandbox made room: its history says so.
  await page.reload();
  assert.match(
    await page.locator("li.turn[data-turn='1'] .sandbox-event.sandbox_deleted").innerText(),
    /The idle sandbox was deleted to make room for another conversation/,
  );

  await tab.getByRole("link", { name: "Load", exact: true }).last().click();
  const capacity = tab.locator("section.capacity");
  await capacity.waitFor();
  const figure = (name) => capacity.locator("div", { has: tab.locator("dt", { hasText: name }) }).locator("dd");
  assert.equal(await figure("Sandboxes").innerText(), "1 of 1");
  assert.equal(await figure("Evictions").innerText(), "1");
  assert.match(await figure("Cold starts").innerText(), /^2 \(/);
  assert.equal(await figure("Waiting turns").innerText(), "0");
  // capacity's limits, the queue's timeout (2m) in minutes.
  assert.match(await capacity.innerText(), /At most 4 per user; 100 turns may wait, each up to 2 min\./);
  await screenshot(tab, "capacity-load", capacity);
  noProblems(page);
  noProblems(tab);
});
