// The seed's first case typed into the UI: the answer streams in, the step row shows its
// metering, the table and the interactive chart appear, and an artifact downloads with the
// bytes the server keeps.
import { readFile } from "node:fs/promises";

import { ask, assert, newConversation, noProblems, open, run, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  // Watch the answer grow, to see that it streams rather than arrives at once.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const text = document.querySelector("li.turn:last-child .markdown:last-of-type")?.textContent ?? "";
      if (window.__lengths.at(-1) !== text.length) window.__lengths.push(text.length);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  await ask(
    page,
    "Compute the median and 90th percentile of peak views per video for each category, and make an interactive bar chart of the medians",
  );
  const turn = await turnEnded(page, 1);
  assert.ok(await turn.evaluate((node) => node.classList.contains("turn-completed")), "the turn completed");
  const lengths = await page.evaluate(() => window.__lengths);
  assert.ok(lengths.length >= 5, `the answer arrived in pieces (${lengths.length} lengths seen)`);

  const answer = turn.locator(".answer");
  assert.match(await answer.innerText(), /interactive bar chart of the medians is outputs\/category_medians\.html/);

  // Two steps; the code step's row is closed and sums up what it cost.
  const steps = turn.locator("details.step");
  assert.equal(await steps.count(), 2);
  const summary = await steps.nth(1).locator("summary").innerText();
  assert.match(summary, /run_python · [\d.]+ (ms|s) · CPU [\d.]+ (ms|s) · peak [\d.]+ MiB of 1 GiB/);
  assert.equal(await steps.nth(1).getAttribute("open"), null, "a finished step is collapsed");

  // The table: the categories, sortable.
  const table = turn.locator(".artifact-csv table");
  await table.locator("tbody tr").first().waitFor();
  assert.equal(await table.locator("tbody tr").count(), 16);
  await table.getByRole("button", { name: "videos" }).click();
  await turn.locator(".artifact-csv .table-view[aria-busy='false'] th[aria-sort='ascending']").waitFor();
  const firstVideos = Number(await table.locator("tbody tr:first-child td:last-child").innerText());
  const lastVideos = Number(await table.locator("tbody tr:last-child td:last-child").innerText());
  assert.ok(firstVideos <= lastVideos, "sorted by videos");

  // The chart: plotly in a frame that may run scripts but has no same-origin access.
  const frame = turn.locator(".artifact-html iframe");
  assert.equal(await frame.getAttribute("sandbox"), "allow-scripts");
  const chart = page.frameLocator(".artifact-html iframe");
  await chart.locator(".plotly").first().waitFor();

  // The CSV downloads with the server's bytes.
  const link = turn.locator(".artifact-csv figcaption a").first();
  const [download] = await Promise.all([page.waitForEvent("download"), link.click()]);
  const downloaded = await readFile(await download.path());
  const kept = await page.evaluate(async (href) => {
    const response = await fetch(href);
    return Array.from(new Uint8Array(await response.arrayBuffer()));
  }, await link.getAttribute("href"));
  assert.deepEqual(Array.from(downloaded), kept);
  assert.match(downloaded.toString(), /^category_name,median,p90,videos\n/);
  assert.match(await turn.locator(".artifact-csv figcaption").innerText(), /category_stats\.csv \d+ B/);

  await screenshot(page, "peak-views");
  await screenshot(page, "peak-views-top", turn);
  // The same conversation after a reload: steps closed, their metering kept.
  await page.reload();
  const reloaded = await turnEnded(page, 1);
  assert.match(await reloaded.locator("details.step").nth(1).locator("summary").innerText(), /peak [\d.]+ MiB of 1 GiB/);
  assert.equal(await reloaded.locator("details.step[open]").count(), 0);

  // On a phone: nothing wider than the screen but the table, which scrolls in its own box;
  // the conversation list behind the menu button.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page fits a phone's width (${overflow} px too wide)`);
  await screenshot(page, "phone", reloaded.locator(".artifact-csv"));
  await page.getByRole("button", { name: "Conversations" }).click();
  // (This conversation: the server's history may hold another browser's run of this script.)
  await page.locator('.sidebar a[aria-current="page"]', { hasText: /Compute the median/ }).waitFor();
  await screenshot(page, "phone-menu");
  noProblems(page);
});
