// The seed's second case: Polars runs out of memory on 20 million events, shown in red with the
// message the model saw; the DuckDB rewrite succeeds; the Load page shows both steps with their
// peak memory against the limit and the OOM kill marked.
import { ask, assert, newConversation, noProblems, open, run, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser, { timeout: 180_000 });
  await page.goto(url);
  const id = await newConversation(page);
  await ask(page, "What is the typical session length per device? Use the events table.");
  const turn = await turnEnded(page, 1);
  assert.ok(await turn.evaluate((node) => node.classList.contains("turn-completed")));

  const steps = turn.locator("details.step");
  assert.equal(await steps.count(), 3);
  const polars = steps.nth(1);
  assert.ok(await polars.evaluate((node) => node.classList.contains("bad")), "the OOM step is marked");
  assert.match(await polars.locator("summary").innerText(), /out of memory/);
  assert.equal(await polars.locator("summary").evaluate((node) => getComputedStyle(node).color), "rgb(179, 38, 30)");
  await polars.locator("summary").click();
  assert.match(await polars.innerText(), /Killed: command ran out of memory\.\nPeak memory: \d+ MiB\nSandbox limit: 1024 MiB/);
  const duckdb = steps.nth(2);
  assert.ok(!(await duckdb.evaluate((node) => node.classList.contains("bad"))), "the DuckDB step succeeded");
  assert.match(await duckdb.locator("summary").innerText(), /^✓\s*run_python · .* of 1 GiB$/);
  await screenshot(page, "sessions-oom", polars);

  // The Load page of this conversation.
  await page.getByRole("link", { name: "Load", exact: true }).last().click();
  await page.waitForURL(new RegExp(`#/load/${id}`));
  const table = page.locator("table.steps");
  await table.locator("tbody tr").nth(1).waitFor();
  assert.equal(await table.locator("tbody tr").count(), 2);
  const oomRow = table.locator("tbody tr.bad");
  assert.equal(await oomRow.count(), 1);
  assert.match(await oomRow.innerText(), /OOM/);
  assert.match(await oomRow.innerText(), /of 1 GiB/);
  assert.match(await page.locator(".totals").innerText(), /Out of memory\n1/);
  // Both charts are drawn, the memory one with its OOM series.
  assert.equal(await page.locator(".chart canvas").count(), 2);
  assert.match(await page.locator(".chart").nth(1).innerText(), /OOM kill/);
  // Steps of seconds: run and CPU time in seconds, overhead in milliseconds on its own axis.
  const legend = (chart) => page.locator(".chart").nth(chart).locator(".u-legend .u-label").allInnerTexts();
  assert.deepEqual(await legend(0), ["Time", "run (s)", "CPU (s)", "overhead (ms)"]);
  await screenshot(page, "load-page");
  noProblems(page);
});
