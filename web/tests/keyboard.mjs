// A whole flow with the keyboard alone, on a server reached at a LAN address over plain http
// (no secure context, so no navigator.clipboard): sign in, start a conversation, ask, stop the
// running step, ask again, open a step row with Enter and close it with Space, copy its code
// and paste it into the composer, move between the composer's tabs with the arrow keys, and
// delete the conversation.
import { assert, noProblems, open, run, screenshot, tokens, turnEnded, url } from "./browser.mjs";

// Presses Tab (Shift+Tab with `back`) until `target` has the focus; fails after `most` presses.
async function tabTo(page, target, { back = false, most = 80 } = {}) {
  for (let presses = 0; presses < most; presses++) {
    await page.keyboard.press(back ? "Shift+Tab" : "Tab");
    if (await target.evaluate((node) => node === document.activeElement)) return;
  }
  const focused = await page.evaluate(() => document.activeElement?.outerHTML.slice(0, 120));
  throw new Error(`${most} presses of ${back ? "Shift+Tab" : "Tab"} never reached ${target}; the focus is on ${focused}`);
}

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  assert.deepEqual(
    await page.evaluate(() => [window.isSecureContext, "clipboard" in navigator]),
    [false, false],
    "the page is served as from the LAN: no secure context, no navigator.clipboard",
  );
  await tabTo(page, page.getByLabel("Token"));
  await page.keyboard.type(tokens.alice);
  await page.keyboard.press("Enter");
  const start = page.getByRole("button", { name: "New conversation" }).first();
  await start.waitFor();
  await tabTo(page, start);
  await page.keyboard.press("Enter");
  await page.waitForURL(/#\/c\//);

  const question = page.getByLabel("Question");
  await tabTo(page, question);
  await page.keyboard.type("Run the long one.");
  await page.keyboard.press("Enter");
  const step = page.locator("li.turn[data-turn='1'] details.step");
  await step.locator("pre.stdout", { hasText: "started" }).waitFor();
  const stop = page.getByRole("button", { name: "Stop" });
  // Only the running turn is busy: Stop and the page around it stay announced.
  assert.equal(await page.locator("li.turn[data-turn='1']").getAttribute("aria-busy"), "true");
  assert.ok(await stop.evaluate((node) => node.closest("[aria-busy='true']") === null), "Stop is in no busy region");
  await tabTo(page, stop);
  await screenshot(page, "keyboard-stop");
  await page.keyboard.press("Enter");
  assert.match(await (await turnEnded(page, 1)).locator(".turn-end").innerText(), /Stopped: cancelled by the user/);

  await tabTo(page, question, { back: true });
  await page.keyboard.type("Please try again");
  await page.keyboard.press("Enter");
  const second = await turnEnded(page, 2);
  assert.match(await second.locator(".answer").innerText(), /cancelled before it finished/);

  // The stopped step's row: Enter opens it, Space closes it, Enter opens it again.
  const row = step.locator("summary");
  assert.equal(await step.getAttribute("open"), null, "the finished step is collapsed");
  await tabTo(page, row, { back: true });
  await page.keyboard.press("Enter");
  await page.waitForFunction((node) => node.open, await step.elementHandle());
  await page.keyboard.press("Space");
  await page.waitForFunction((node) => !node.open, await step.elementHandle());
  await page.keyboard.press("Enter");
  await page.waitForFunction((node) => node.open, await step.elementHandle());

  // Its code copied with the keyboard, without navigator.clipboard, and pasted as a cell.
  const code = await step.locator(".code-block code").innerText();
  await tabTo(page, step.getByRole("button", { name: "Copy" }));
  await page.keyboard.press("Enter");
  await step.locator(".copy-said", { hasText: "Copied" }).waitFor();
  await screenshot(page, "keyboard-copied", step);
  await tabTo(page, question);
  await page.keyboard.press("ControlOrMeta+V");
  assert.equal(await question.inputValue(), code);

  // The composer's tabs: one Tab stop, the arrow keys move between them and switch the panel.
  const askTab = page.getByRole("tab", { name: "Ask" });
  await tabTo(page, askTab, { back: true });
  await page.keyboard.press("ArrowRight");
  const cellTab = page.getByRole("tab", { name: "Cell" });
  await page.waitForFunction((node) => node === document.activeElement, await cellTab.elementHandle());
  assert.equal(await cellTab.getAttribute("aria-selected"), "true");
  const panel = page.locator(`#${await cellTab.getAttribute("aria-controls")}`);
  assert.equal(await panel.getAttribute("role"), "tabpanel");
  assert.equal(await panel.getByLabel("Code").count(), 1, "the panel is the cell's");
  assert.equal(await askTab.getAttribute("tabindex"), "-1", "one Tab stop for the tabs");
  await page.keyboard.press("ArrowLeft");
  await page.waitForFunction((node) => node === document.activeElement, await askTab.elementHandle());
  assert.equal(await question.inputValue(), code, "the question is kept across the switch");

  // Deleted with the keyboard: the focus goes to the page's main part, not back to the top of
  // the document, and Tab goes on from there.
  const id = decodeURIComponent(page.url().split("#/c/")[1]);
  page.once("dialog", (dialog) => dialog.accept());
  await tabTo(page, page.getByRole("button", { name: "Delete" }), { back: true });
  await page.keyboard.press("Enter");
  await page.waitForURL(/#\/$/);
  await page.waitForFunction(() => document.activeElement?.id === "main");
  assert.equal(await page.locator(`.sidebar a[href="#/c/${id}"]`).count(), 0, "gone from the list");
  await page.keyboard.press("Tab");
  assert.ok(
    await page.evaluate(() => document.getElementById("main").contains(document.activeElement)),
    "Tab goes on within the page",
  );
  noProblems(page, [/status of 401/]);
});
