// Without a model the UI says so and still works as a notebook: an SQL export cell, then a
// Python cell that reads what it exported, each metered like a step of the agent.
import { assert, newConversation, noProblems, open, run, runCell, screenshot, turnEnded, url } from "./browser.mjs";

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
  noProblems(page);
});
