// Without a model the UI says so and still works as a notebook: an SQL export cell, then a
// Python cell that reads what it exported, each metered like a step of the agent.
import { assert, countIs, newConversation, noProblems, open, run, runCell, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await page.locator(".bar .model", { hasText: "notebook mode" }).waitFor();
  await newConversation(page);
  assert.match(await page.locator(".notebook-note").innerText(), /Notebook mode: no language model is configured/);
  assert.equal(await page.getByRole("tab", { name: "Ask" }).count(), 0, "there is no one to ask");

  await runCell(
    page,
    "sql_export",
    "SELECT category_name, video_id, max(views) AS peak FROM trending_videos GROUP BY 1, 2",
    "peaks.parquet",
  );
  const exported = await turnEnded(page, 1);
  assert.match(await exported.locator(".cell-label").innerText(), /SQL export cell/i);
  assert.match(await exported.locator("details.step").innerText(), /Wrote 6351 rows to \/home\/sandbox\/data\/peaks\.parquet/);

  await runCell(
    page,
    "python",
    [
      "import polars as pl",
      "peaks = pl.read_parquet('/home/sandbox/data/peaks.parquet')",
      "print(len(peaks), 'videos')",
      "peaks.group_by('category_name').agg(pl.col('peak').median()).write_parquet('/home/sandbox/outputs/medians.parquet')",
    ].join("\n"),
  );
  const python = await turnEnded(page, 2);
  const step = python.locator("details.step");
  assert.notEqual(await step.getAttribute("open"), null, "a cell's output stays in view");
  assert.equal(await step.locator("pre.stdout").innerText(), "6351 videos\n");
  assert.match(await step.locator("summary").innerText(), /run_python · .* peak [\d.]+ MiB of 1 GiB/);
  // Its Parquet output as a table.
  const table = python.locator(".artifact-parquet table");
  await table.locator("tbody tr").first().waitFor();
  assert.match(await python.locator(".artifact-parquet .pager").innerText(), /rows 1–16 of 16/);
  await screenshot(page, "notebook", python);

  // A page of the table that does not come (the network failed) leaves the table as it was,
  // says so, and can be asked for again.
  await page.route((address) => address.pathname.endsWith("/table") && address.searchParams.has("sort"),
    (route) => route.abort(), { times: 1 });
  await table.locator("th button").first().click();
  const failed = python.locator(".artifact-parquet [role='alert']");
  await failed.getByRole("button", { name: "Try again" }).waitFor();
  assert.equal(await table.locator("tbody tr").count(), 16, "the rows shown stay");
  await failed.getByRole("button", { name: "Try again" }).click();
  await python.locator(".artifact-parquet .table-view[aria-busy='false'] th[aria-sort='ascending']").waitFor();
  assert.equal(await failed.count(), 0);

  // Output longer than the page keeps while a step runs: the page says so, and shows all of it
  // once the step has ended.
  await runCell(page, "python", ["import sys, time", "sys.stdout.write('x' * 300_000 + '\\n')", "sys.stdout.flush()", "time.sleep(3)"].join("\n"));
  const long = page.locator("li.turn[data-turn='3']");
  await long.locator(".output-cut", { hasText: "longer than the page shows while the step runs" }).waitFor();
  await turnEnded(page, 3);
  assert.equal(await long.locator(".output-cut").count(), 0);
  assert.equal((await long.locator("pre.stdout").textContent()).length, 300_001);

  // More conversations than a page: those "More" showed stay listed when a turn starts and
  // ends (the list's first page is read again then), each once.
  await page.evaluate(async () => {
    const { csrf_token } = await (await fetch("/api/v1/session")).json();
    for (let i = 0; i < 55; i++) {
      await fetch("/api/v1/conversations", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...(csrf_token ? { "X-CSRF-Token": csrf_token } : {}) },
        body: JSON.stringify({ title: `filler ${i}` }),
      });
    }
  });
  await page.reload();
  const listed = page.locator(".sidebar li");
  await countIs(listed, 50);
  await page.getByRole("button", { name: "More" }).click();
  await page.waitForFunction(() => document.querySelectorAll(".sidebar li").length > 50);
  const shown = await listed.count();
  await runCell(page, "python", "print('still listed')");
  await turnEnded(page, 4);
  // The list was read again: the conversation that ran a cell is the most recent now.
  await listed.first().locator("a[aria-current='page']").waitFor();
  assert.equal(await listed.count(), shown, "the pages shown stay shown");
  const ids = await page.locator(".sidebar li a").evaluateAll((links) => links.map((link) => link.getAttribute("href")));
  assert.equal(new Set(ids).size, ids.length, "each conversation is listed once");
  // The table's page that the test made fail.
  noProblems(page, [/Failed to load resource: net::ERR_FAILED/]);
});
