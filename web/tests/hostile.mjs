// Hostile content changes nothing and runs nothing in the page's origin: the model's answer
// with a script, an image whose error handler runs code and a javascript: link; and an HTML
// artifact that tries to read the cookie, the parent page, storage and the API. Signed in with
// a session cookie, so there is something to steal.
import { ask, assert, newConversation, noProblems, open, run, screenshot, signIn, tokens, turnEnded } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await signIn(page, tokens.alice);
  await newConversation(page);
  const before = await page.evaluate(async () => (await (await fetch("/api/v1/conversations")).json()).conversations.length);
  await ask(page, "Draw me a chart");
  const turn = await turnEnded(page, 1);
  assert.ok(await turn.evaluate((node) => node.classList.contains("turn-completed")));

  // The answer is rendered, without its script, its handler or its javascript: link.
  const answer = turn.locator(".answer");
  assert.equal(await answer.locator("strong").innerText(), "this is bold");
  assert.equal(await page.locator(".markdown script").count(), 0);
  assert.equal(await answer.locator("img[onerror]").count(), 0);
  for (const href of await answer.locator("a").evaluateAll((links) => links.map((a) => a.getAttribute("href")))) {
    assert.ok(!href || !/^\s*javascript:/i.test(href), `a link to ${href}`);
  }
  await answer.getByText("Open the details").click();
  await page.waitForTimeout(300);
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "nothing ran in the page");

  // The chart runs, in an origin of its own: no cookie, no parent, no storage, no API.
  assert.equal(await turn.locator(".artifact-html iframe").getAttribute("sandbox"), "allow-scripts");
  const frame = page.frameLocator(".artifact-html iframe");
  await frame.locator("body[data-result]").waitFor();
  const result = JSON.parse(await frame.locator("body").getAttribute("data-result"));
  assert.match(result.cookie, /^blocked: SecurityError/);
  assert.match(result.parent, /^blocked: SecurityError/);
  assert.match(result.storage, /^blocked: SecurityError/);
  assert.match(result.api, /^blocked: TypeError/);
  await screenshot(page, "hostile", turn);

  // Nothing was changed: the same conversations, and the session still works.
  const after = await page.evaluate(async () => (await (await fetch("/api/v1/conversations")).json()).conversations.length);
  assert.equal(after, before);
  // Allowed: the 401 before signing in, the image "x" that does not exist (404), and the
  // chart's blocked fetch reported by the CSP.
  noProblems(page, [
    /status of 401/,
    /status of 404/,
    /Content Security Policy|connect-src|Refused to connect|Failed to fetch|ERR_FAILED|net::/i,
  ]);
});
