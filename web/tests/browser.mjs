// What the browser tests share: Debian's Chromium driven by playwright-core, a page that
// records its own errors, screenshots under build/test-results/browser, and the test's
// settings from the environment (the server's URL and tokens, set by tests/browser).
import assert from "node:assert/strict";
import { mkdir } from "node:fs/promises";
import { resolve } from "node:path";
import { chromium, firefox } from "playwright-core";

export { assert };

export const url = process.env.QUARRY_URL;
export const results = process.env.QUARRY_RESULTS ?? resolve(import.meta.dirname, "../../build/test-results/browser");
export const tokens = { alice: process.env.QUARRY_TOKEN_ALICE, bob: process.env.QUARRY_TOKEN_BOB };
if (!url) throw new Error("QUARRY_URL is not set: tests/browser starts the server and sets it");

// The browser the tests run in: QUARRY_BROWSER=chromium (Debian's, the default) or firefox
// (Debian's firefox-esr, driven through WebDriver BiDi), headless; it reaches nothing but the
// test's server.
export const browserName = process.env.QUARRY_BROWSER ?? "chromium";

export async function launch() {
  if (browserName === "firefox") {
    return firefox.launch({
      channel: "moz-firefox",
      executablePath: process.env.FIREFOX ?? "/usr/bin/firefox-esr",
      firefoxUserPrefs: { "network.proxy.type": 0, "app.update.enabled": false },
    });
  }
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}

// Before a screenshot in Firefox, Playwright adds and removes a <style> "body {}" to sync
// animations; the page's CSP refuses it, as it should, and Firefox reports it (as a page error)
// with that style's hash.
function isPlaywrightsOwn(text) {
  return browserName === "firefox" && text.includes("'sha256-YjaKGiklmzC6wjXA513HAMmzus8VE61XCOT+SmwNZWA='");
}

// A page whose console errors and uncaught exceptions are kept (a CSP violation is an error).
export async function open(browser, options = {}) {
  const context = await browser.newContext({
    viewport: options.viewport ?? { width: 1280, height: 900 },
    acceptDownloads: true,
  });
  const page = await context.newPage();
  watch(page, options);
  return page;
}

// Another tab in `page`'s browser window: the same session, cookies and cache.
export async function openTab(page, options = {}) {
  const tab = await page.context().newPage();
  watch(tab, options);
  return tab;
}

function watch(page, options) {
  page.problems = [];
  const problem = (text) => isPlaywrightsOwn(text) || page.problems.push(text);
  page.on("console", (message) => message.type() === "error" && problem(message.text()));
  page.on("pageerror", (error) => problem(String(error)));
  page.setDefaultTimeout(options.timeout ?? 60_000);
}

// What a person sees: the window, scrolled to `element` (a locator) when one is given.
export async function screenshot(page, name, element) {
  await mkdir(results, { recursive: true });
  if (element) await element.evaluate((node) => node.scrollIntoView({ block: "start" }));
  await page.waitForTimeout(300);  // let charts and frames finish drawing
  const file = browserName === "chromium" ? name : `${browserName}-${name}`;
  await page.screenshot({ path: resolve(results, `${file}.png`) });
}

// Signs in through the page, as a person would.
export async function signIn(page, token) {
  await page.goto(url);
  await page.getByLabel("Token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "New conversation" }).first().waitFor();
}

// Starts a conversation and returns its id (once the page shows it, also when it showed another).
export async function newConversation(page) {
  const before = page.url();
  await page.getByRole("button", { name: "New conversation" }).first().click();
  await page.waitForURL((address) => /#\/c\//.test(address.hash) && address.href !== before);
  return decodeURIComponent(new URL(page.url()).hash.split("/")[2]);
}

export async function ask(page, question) {
  await page.getByLabel("Question").fill(question);
  await page.getByRole("button", { name: "Send", exact: true }).click();
}

export async function runCell(page, kind, code, filename) {
  await page.getByRole("tab", { name: "Cell" }).click();
  await page.getByLabel("Kind").selectOption(kind);
  if (filename) await page.getByLabel("File").fill(filename);
  await page.getByLabel("Code").fill(code);
  await page.getByRole("button", { name: "Run", exact: true }).click();
}

// The turn's list item, once it ended (completed, failed, cancelled or interrupted).
export async function turnEnded(page, number) {
  const turn = page.locator(`li.turn[data-turn="${number}"]`);
  await turn.and(page.locator(":not(.turn-running)")).waitFor({ timeout: 120_000 });
  return turn;
}

// Fails the test if the page logged errors (other than those `allowed` matches).
export function noProblems(page, allowed = []) {
  const problems = page.problems.filter((text) => !allowed.some((pattern) => pattern.test(text)));
  assert.deepEqual(problems, [], "the page logged errors");
}

// Runs the test body with a browser, closing it whatever happens.
export async function run(body) {
  const browser = await launch();
  try {
    await body(browser);
    console.log("ok");
  } finally {
    await browser.close();
  }
}

// Waits until `locator` matches `count` elements (the page renders after events, not at once).
export async function countIs(locator, count, timeout = 10_000) {
  const deadline = Date.now() + timeout;
  let seen;
  while ((seen = await locator.count()) !== count) {
    if (Date.now() > deadline) assert.equal(seen, count, `${locator} matches ${count} elements`);
    await new Promise((done) => setTimeout(done, 50));
  }
}
