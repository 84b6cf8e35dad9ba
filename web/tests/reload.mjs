// A reload in the middle of a turn: the page picks the turn up where it is (its stream is
// replayed from the start, then followed) and sees it to its end.
import { ask, assert, newConversation, noProblems, open, run, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  await ask(page, "Count to five for me");
  await page.locator("li.turn[data-turn='1'] pre.stdout", { hasText: "1" }).waitFor();
  await page.reload();
  // After the reload the turn is still running, and its step still shows what it printed.
  await page.locator("li.turn-running[data-turn='1']").waitFor();
  const turn = await turnEnded(page, 1);
  assert.ok(await turn.evaluate((node) => node.classList.contains("turn-completed")));
  await turn.locator("details.step summary").click();
  assert.equal(await turn.locator("pre.stdout").innerText(), "1\n2\n3\n4\n5\n");
  assert.match(await turn.locator(".answer").innerText(), /counted from one to five/);
  await screenshot(page, "reloaded", turn);
  // The browser's own aborted stream is no error of the page.
  noProblems(page, [/Failed to fetch|network error|aborted/i]);
});
