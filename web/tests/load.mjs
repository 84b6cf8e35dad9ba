// The Load page of all conversations (#/load): every step of a user with 207 of them, more than
// a page of the API (200); the table sorted by a click on a header; the page following new
// steps and the live sandboxes by state while it is open, without a reload.
import {
  ask,
  assert,
  newConversation,
  noProblems,
  open,
  openTab,
  run,
  runCell,
  screenshot,
  signIn,
  tokens,
  turnEnded,
  url,
} from "./browser.mjs";

// "12 ms", "1.20 s" as milliseconds.
const milliseconds = (text) => (text.endsWith(" ms") ? Number.parseFloat(text) : Number.parseFloat(text) * 1000);

await run(async (browser) => {
  const page = await open(browser, { timeout: 120_000 });
  await signIn(page, tokens.alice);
  // One conversation of 205 quick steps, another of one slower step.
  await newConversation(page);
  await ask(page, "Run many steps");
  const many = await turnEnded(page, 1);
  assert.ok(await many.evaluate((node) => node.classList.contains("turn-completed")));
  assert.equal(await many.locator("details.step").count(), 205);
  const slowId = await newConversation(page);
  await runCell(page, "python", "import time\ntime.sleep(0.5)\nprint('the slow one')");
  await turnEnded(page, 1);

  await page.getByRole("navigation").getByRole("link", { name: "Load" }).click();
  await page.waitForURL(/#\/load$/);
  await page.getByRole("heading", { name: "Load: All conversations" }).waitFor();
  const table = page.locator("table.steps");
  const rows = table.locator("tbody tr");
  const figure = (name) => page.locator(".totals div", { has: page.locator("dt", { hasText: name }) }).locator("dd");
  await page.locator(".steps-shown", { hasText: "All 206 steps." }).waitFor();
  assert.equal(await figure("Code steps").innerText(), "206");
  assert.equal(await rows.count(), 206);
  // Newest first: the slow cell's conversation, then the other.
  const header = await table.locator("thead th").allInnerTexts();
  assert.deepEqual(header, ["Time ▼", "Conversation", "Step", "Run", "CPU", "Overhead", "Peak memory", "Exit"]);
  const conversationOf = (row) => row.locator("td").nth(1).innerText();
  assert.match(await conversationOf(rows.first()), /import time/);
  assert.equal(await conversationOf(rows.last()), "Run many steps");
  // No step took a second: the time chart's run and CPU time are in milliseconds.
  const timeLegend = () => page.locator(".chart").first().locator(".u-legend .u-label").allInnerTexts();
  assert.deepEqual(await timeLegend(), ["Time", "run (ms)", "CPU (ms)", "overhead (ms)"]);
  // Run time as rings, CPU time and overhead as dots: a step that computed all along shows both,
  // and the legend says which is which.
  const markers = await page
    .locator(".chart")
    .first()
    .locator(".u-legend .u-marker")
    .evaluateAll((nodes) => nodes.map((node) => [getComputedStyle(node).backgroundColor, getComputedStyle(node).borderTopColor]));
  assert.deepEqual(markers.slice(1), [
    ["rgba(0, 0, 0, 0)", "rgb(47, 93, 80)"],
    ["rgb(194, 124, 14)", "rgb(194, 124, 14)"],
    ["rgb(107, 111, 181)", "rgb(107, 111, 181)"],
  ]);
  await screenshot(page, "load-all");

  // Sorted by run time: a click sorts longest first, another shortest first.
  const runTimes = async () => (await table.locator("tbody tr td:nth-child(4)").allInnerTexts()).map(milliseconds);
  await table.getByRole("button", { name: "Run" }).click();
  await table.locator("th[aria-sort='descending']", { hasText: "Run" }).waitFor();
  let times = await runTimes();
  assert.deepEqual(times, [...times].sort((a, b) => b - a), "longest first");
  assert.ok(times[0] >= 500, `the slow step leads (${times[0]} ms)`);
  assert.match(await conversationOf(rows.first()), /import time/);
  await table.getByRole("button", { name: "Run" }).click();
  await table.locator("th[aria-sort='ascending']", { hasText: "Run" }).waitFor();
  times = await runTimes();
  assert.deepEqual(times, [...times].sort((a, b) => a - b), "shortest first");
  assert.match(await conversationOf(rows.last()), /import time/);
  await screenshot(page, "load-sorted");

  // With the page open, a step runs in another tab: the sandbox shows busy, then idle, and the
  // step joins the table and the figures.
  const tab = await openTab(page);
  await tab.goto(`${url}/#/c/${slowId}`);
  // (Six seconds: more than one of the page's refreshes, three seconds apart, on a busy host.)
  await runCell(tab, "python", "import time\nprint('watched', flush=True)\ntime.sleep(6)");
  const sandboxes = page.locator("section.sandboxes");
  const live = sandboxes.locator("li", { hasText: "import time" });
  await live.locator(".state-busy", { hasText: "busy" }).waitFor({ timeout: 15_000 });
  assert.match(await sandboxes.innerText(), /Yours: 1 busy, 1 idle/);
  await screenshot(page, "load-live-busy", sandboxes);
  await turnEnded(tab, 2);
  await page.locator(".steps-shown", { hasText: "All 207 steps." }).waitFor({ timeout: 15_000 });
  assert.equal(await figure("Code steps").innerText(), "207");
  assert.equal(await rows.count(), 207);
  await live.locator(".state-idle", { hasText: "idle" }).waitFor({ timeout: 15_000 });
  assert.match(await sandboxes.innerText(), /Yours: 2 idle/);
  // Still sorted shortest first: the new 6 s step is last.
  const sorted = await runTimes();
  assert.ok(sorted.at(-1) >= 6000, `the 6 s step is not last: the last run times are ${sorted.slice(-3).join(", ")} ms`);
  // Now one did: seconds.
  assert.deepEqual(await timeLegend(), ["Time", "run (s)", "CPU (s)", "overhead (ms)"]);
  // Allowed: the 401 before signing in.
  noProblems(page, [/status of 401/]);
  noProblems(tab);
});
