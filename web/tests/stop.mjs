// Stop during a running step: the command is killed, the turn ends as stopped, and the
// conversation goes on. The step is stopped from a second tab, which follows the running turn
// live beside the first.
import { ask, assert, newConversation, noProblems, open, openTab, run, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  await ask(page, "Run the long one.");
  // The step is open while it runs, its output arriving live.
  const step = page.locator("li.turn[data-turn='1'] details.step");
  await step.locator("pre.stdout", { hasText: "started" }).waitFor();
  assert.notEqual(await step.getAttribute("open"), null, "a running step is open");
  // Reloaded, the page follows the running turn (its events stream); the same conversation in a
  // second tab shows the step's output while it runs too (the step runs for a minute: far longer
  // than this wait), though the first tab holds a stream of the same events.
  await page.reload();
  await step.locator("pre.stdout", { hasText: "started" }).waitFor();
  const tab = await openTab(page);
  await tab.goto(page.url());
  const other = tab.locator("li.turn-running[data-turn='1'] details.step");
  await other.locator("pre.stdout", { hasText: "started" }).waitFor({ timeout: 15_000 });
  await tab.getByRole("button", { name: "Stop" }).click();
  assert.match(await (await turnEnded(tab, 1)).locator(".turn-end").innerText(), /Stopped: cancelled by the user/);
  noProblems(tab);
  await tab.close();
  const turn = await turnEnded(page, 1);
  assert.match(await turn.locator(".turn-end").innerText(), /Stopped: cancelled by the user/);
  assert.match(await step.locator("summary").innerText(), /stopped/);
  await screenshot(page, "stopped", turn);
  // Usable after, with the keyboard alone: the next question is answered, knowing the step was
  // stopped.
  await page.getByLabel("Question").focus();
  await page.keyboard.type("Please try again");
  await page.keyboard.press("Enter");
  const next = await turnEnded(page, 2);
  assert.match(await next.locator(".answer").innerText(), /cancelled before it finished/);
  noProblems(page);
});
