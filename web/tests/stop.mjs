// Stop during a running step: the command is killed, the turn ends as stopped, and the
// conversation goes on.
import { ask, assert, newConversation, noProblems, open, run, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  await ask(page, "Run the long one.");
  // The step is open while it runs, its output arriving live.
  const step = page.locator("li.turn[data-turn='1'] details.step");
  await step.locator("pre.stdout", { hasText: "started" }).waitFor();
  assert.notEqual(await step.getAttribute("open"), null, "a running step is open");
  await page.getByRole("button", { name: "Stop" }).click();
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
