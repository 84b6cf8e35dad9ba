// What a turn's steps show a person (tests/api/scenarios/chat.yml, on a server with a 5 s time
// limit and a 4 KiB output limit): the answer's Markdown table and highlighted code block, still
// without its script; SQL and Python highlighted, and a Copy that copies; a PNG chart inline; a
// CSV of 45 rows paged and sorted in the browser; output cut at the limit, saying so; a
// traceback and a timed-out step in red with what the model was told (less the output shown
// above it); Expand all and Collapse all. Then the failing step is fixed and run as a cell, and
// the question edited and asked again: the model's answer quotes the cell, so cells and
// questions are one conversation.
import {
  ask,
  assert,
  browserName,
  countIs,
  newConversation,
  noProblems,
  open,
  run,
  screenshot,
  turnEnded,
  url,
} from "./browser.mjs";

const kRed = "rgb(179, 38, 30)";
const kQuestion = "Which categories have the most videos? Chart them and give me a table.";
const kSql = [
  "SELECT category_name, count(DISTINCT video_id) AS videos",
  "FROM trending_videos",
  "GROUP BY category_name",
  "ORDER BY videos DESC",
].join("\n");

const color = (locator) => locator.evaluate((node) => getComputedStyle(node).color);

await run(async (browser) => {
  const page = await open(browser);
  if (browserName === "chromium") {
    await page.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: url });
  }
  await page.goto(url);
  await newConversation(page);
  await ask(page, kQuestion);
  const turn = await turnEnded(page, 1);
  assert.ok(await turn.evaluate((node) => node.classList.contains("turn-completed")), "the turn completed");
  const steps = turn.locator("details.step");
  assert.equal(await steps.count(), 4);
  const [query, chart, failing, slow] = [0, 1, 2, 3].map((index) => steps.nth(index));
  await countIs(turn.locator("details.step[open]"), 0); // finished steps are collapsed

  // The answer's Markdown: a table (its right-aligned column right-aligned) and a highlighted
  // code block; its script neither kept nor run.
  const answer = turn.locator(".answer");
  const table = answer.locator("table");
  assert.deepEqual(await table.locator("thead th").allInnerTexts(), ["category", "videos"]);
  assert.deepEqual(await table.locator("tbody tr").first().locator("td").allInnerTexts(), ["Entertainment", "1590"]);
  assert.equal(await table.locator("tbody td").nth(1).evaluate((node) => getComputedStyle(node).textAlign), "right");
  const block = answer.locator("pre code");
  assert.match(await block.getAttribute("class"), /\bhljs\b.*\blanguage-python\b|\blanguage-python\b.*\bhljs\b/);
  assert.match(await block.innerText(), /^import polars as pl\ncounts = pl\.read_csv/);
  assert.ok((await block.locator("span.hljs-keyword").count()) >= 1, "the code block is highlighted");
  assert.equal(await answer.locator("code", { hasText: "outputs/videos.png" }).count(), 1);
  assert.equal(await page.locator(".markdown script").count(), 0);
  assert.doesNotMatch(await answer.innerText(), /__pwned/);
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "nothing ran in the page");
  await screenshot(page, "chat-answer", answer);

  // The PNG chart, inline and drawn.
  const image = turn.locator(".artifact-png img");
  await image.scrollIntoViewIfNeeded();
  await page.waitForFunction((node) => node.complete && node.naturalWidth > 0, await image.elementHandle());
  assert.deepEqual(await image.evaluate((node) => [node.naturalWidth, node.naturalHeight]), [600, 300]);
  assert.match(await turn.locator(".artifact-png figcaption").innerText(), /^videos\.png [\d.]+ KiB$/);

  // The CSV of 45 rows: 20 at a time, Next and Previous in the browser, sorted over all rows.
  const csv = turn.locator(".artifact-csv");
  const pager = csv.locator(".pager");
  const rows = csv.locator("tbody tr");
  const firstDay = () => rows.first().locator("td").first().innerText();
  await rows.first().waitFor();
  assert.match(await pager.innerText(), /rows 1–20 of 45/);
  assert.equal(await rows.count(), 20);
  assert.equal(await pager.getByRole("button", { name: "Previous" }).isDisabled(), true);
  await pager.getByRole("button", { name: "Next" }).click();
  await pager.getByText("rows 21–40 of 45").waitFor();
  assert.equal(await firstDay(), "21");
  await pager.getByRole("button", { name: "Next" }).click();
  await pager.getByText("rows 41–45 of 45").waitFor();
  assert.equal(await rows.count(), 5);
  assert.equal(await firstDay(), "41");
  assert.equal(await pager.getByRole("button", { name: "Next" }).isDisabled(), true);
  await screenshot(page, "chat-table-last-page", csv);
  await pager.getByRole("button", { name: "Previous" }).click();
  await pager.getByText("rows 21–40 of 45").waitFor();
  assert.equal(await firstDay(), "21");
  // Sorting goes back to the first page, over the whole file.
  await csv.getByRole("button", { name: "views" }).click();
  await csv.locator(".table-view[aria-busy='false'] th[aria-sort='ascending']").waitFor();
  await csv.getByRole("button", { name: "views" }).click();
  await csv.locator(".table-view[aria-busy='false'] th[aria-sort='descending']").waitFor();
  assert.match(await pager.innerText(), /rows 1–20 of 45/);
  assert.deepEqual(await rows.first().locator("td").allInnerTexts(), ["45", "2025000"]);

  // Expand all and Collapse all, also after a step was opened or closed by hand.
  await page.getByRole("button", { name: "Expand all" }).click();
  await countIs(turn.locator("details.step[open]"), 4);
  await query.locator("summary").click();
  await countIs(turn.locator("details.step[open]"), 3);
  await page.getByRole("button", { name: "Expand all" }).click();
  await countIs(turn.locator("details.step[open]"), 4); // also the one closed by hand
  await page.getByRole("button", { name: "Collapse all" }).click();
  await countIs(turn.locator("details.step[open]"), 0);
  await chart.locator("summary").click();
  await countIs(turn.locator("details.step[open]"), 1);
  await page.getByRole("button", { name: "Collapse all" }).click();
  await countIs(turn.locator("details.step[open]"), 0); // also the one opened by hand
  await page.getByRole("button", { name: "Expand all" }).click();
  await countIs(turn.locator("details.step[open]"), 4); // opened by an effect after the click

  // SQL and Python highlighted.
  const sql = query.locator(".code-block code");
  assert.match(await sql.getAttribute("class"), /\bhljs\b/);
  assert.match(await sql.getAttribute("class"), /\blanguage-sql\b/);
  assert.equal(await sql.innerText(), kSql);
  assert.ok((await sql.locator("span.hljs-keyword", { hasText: /^SELECT$/ }).count()) === 1, "SELECT is a keyword");
  const python = chart.locator(".code-block code");
  assert.match(await python.getAttribute("class"), /\blanguage-python\b/);
  assert.ok((await python.locator("span.hljs-keyword", { hasText: /^import$/ }).count()) >= 2, "import is a keyword");
  assert.ok((await python.locator("span.hljs-string").count()) >= 1, "strings are highlighted");

  // Copy copies: the clipboard holds the SQL (read back where the browser lets a page read it),
  // and pasted into the composer it is the SQL.
  await query.getByRole("button", { name: "Copy" }).click();
  await query.locator(".copy-said", { hasText: "Copied" }).waitFor();
  if (browserName === "chromium") {
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), kSql);
  }
  await page.getByLabel("Question").focus();
  await page.keyboard.press("ControlOrMeta+V");
  assert.equal(await page.getByLabel("Question").inputValue(), kSql);
  await page.getByLabel("Question").fill("");

  // Output past the limit is cut, and the step says so; the whole output was 400 lines.
  const stdout = chart.locator("pre.stdout");
  assert.equal((await stdout.textContent()).length, 4096);
  assert.match(await stdout.textContent(), /^day 000: a line of the long output\n/);
  assert.match(await chart.locator(".output-cut").innerText(), /longer than the server keeps \(sandbox\.output_limit\)/);
  assert.match(await chart.locator("summary").innerText(), /^✓\s*run_python · .* of 1 GiB$/);

  // The traceback, red as an error.
  assert.ok(await failing.evaluate((node) => node.classList.contains("bad")), "the failed step is marked");
  assert.match(await failing.locator("summary").innerText(), /run_python · .* · failed$/);
  const traceback = failing.locator("pre.stderr");
  assert.match(await traceback.innerText(), /^Traceback \(most recent call last\):[\s\S]*ZeroDivisionError: division by zero/);
  assert.ok(await traceback.evaluate((node) => node.classList.contains("error-output")));
  assert.equal(await color(traceback), kRed);
  assert.equal(await color(failing.locator("summary")), kRed);
  // Under it what the model read, with its times as the summary gives them and the traceback
  // not a second time.
  const failingTold = await failing.locator("pre.result.error-output").innerText();
  assert.match(failingTold, /^exit code 1 · [\d.]+ m?s · CPU [\d.]+ m?s · peak memory \d+ MiB of 1024 MiB\n--- stderr: shown above ---\nCode error: Read the error above/);
  assert.doesNotMatch(failingTold, /Traceback|ZeroDivisionError/);

  // The step that ran out of time: red, with what the model was told (and advised).
  assert.ok(await slow.evaluate((node) => node.classList.contains("bad")), "the timed-out step is marked");
  assert.match(await slow.locator("summary").innerText(), /run_python · .* · timed out$/);
  assert.equal(await color(slow.locator("summary")), kRed);
  assert.equal(await slow.locator("pre.stdout").innerText(), "computing slowly\n");
  const told = slow.locator("pre.result.error-output");
  assert.match(await told.innerText(), /Timed out: command ran longer than 5s and was interrupted \(KeyboardInterrupt\); the kernel goes on/);
  assert.equal(await color(told), kRed);
  assert.match(await told.innerText(), /Environment error \(timeout\): Do not run it again as it is/);
  assert.match(await told.innerText(), /\n--- stdout: shown above ---\n/);
  assert.doesNotMatch(await told.innerText(), /computing slowly/);
  await screenshot(page, "chat-steps", query);
  await screenshot(page, "chat-failed-steps", failing);

  // After a reload the history shows the same: the cut output said, the traceback red.
  await page.reload();
  const reloaded = await turnEnded(page, 1);
  await page.getByRole("button", { name: "Expand all" }).click();
  // The steps open in an effect after the click's render: wait for it, as a reader would.
  const reloadedCut = reloaded.locator("details.step").nth(1).locator(".output-cut");
  await reloadedCut.waitFor({ state: "visible" });
  assert.match(await reloadedCut.innerText(), /sandbox\.output_limit/);
  assert.equal(await color(reloaded.locator("details.step").nth(2).locator("pre.stderr")), kRed);
  assert.match(await reloaded.locator("details.step").nth(3).locator("pre.result").innerText(), /Timed out/);

  // The failing step fixed and run again as a cell.
  const failed = reloaded.locator("details.step").nth(2);
  await failed.getByRole("button", { name: "Edit and run as a cell" }).click();
  await page.getByRole("tab", { name: "Cell", selected: true }).waitFor();
  assert.equal(await page.getByLabel("Kind").inputValue(), "python");
  const code = page.getByLabel("Code");
  const original = await code.inputValue();
  assert.match(original, /print\(views_per_day\(1000, 0\)\)/);
  await page.waitForFunction((node) => node === document.activeElement, await code.elementHandle()); // ready to edit
  await code.fill(original.replace("(1000, 0)", "(1000, 4)"));
  await page.getByRole("button", { name: "Run", exact: true }).click();
  const cell = await turnEnded(page, 2);
  assert.match(await cell.locator(".cell-label").innerText(), /Python cell/i);
  assert.equal(await cell.locator("pre.stdout").innerText(), "250.0\n");
  await screenshot(page, "chat-cell", cell);

  // The question edited and asked again: the model answers from the cell's result.
  assert.equal(await page.locator("li.turn").getByRole("button", { name: "Edit and ask again" }).count(), 1);
  await page.locator("li.turn[data-turn='1']").getByRole("button", { name: "Edit and ask again" }).click();
  await page.getByRole("tab", { name: "Ask", selected: true }).waitFor();
  const question = page.getByLabel("Question");
  assert.equal(await question.inputValue(), kQuestion);
  await page.waitForFunction((node) => node === document.activeElement, await question.elementHandle()); // ready to edit
  await question.fill("Which are the top three categories?");
  await page.getByRole("button", { name: "Send", exact: true }).click();
  const again = await turnEnded(page, 3);
  assert.ok(await again.evaluate((node) => node.classList.contains("turn-completed")), "the edited question was answered");
  assert.match(await again.locator(".answer").innerText(), /Your cell found 250\.0 views per day/);
  // One conversation of a question, a cell and a question; only the last may be edited now.
  assert.deepEqual(
    await page.locator("li.turn").evaluateAll((turns) => turns.map((turn) => (turn.querySelector(".cell-label") ? "cell" : "ask"))),
    ["ask", "cell", "ask"],
  );
  assert.equal(await page.locator("li.turn[data-turn='3']").getByRole("button", { name: "Edit and ask again" }).count(), 1);
  assert.equal(await page.locator("li.turn[data-turn='1']").getByRole("button", { name: "Edit and ask again" }).count(), 0);
  await screenshot(page, "chat-asked-again", cell);
  noProblems(page);
});
