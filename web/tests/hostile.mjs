// Hostile content changes nothing and runs nothing in the page's origin: the model's answer
// with a script, an image whose error handler runs code and a javascript: link; and an HTML
// artifact that tries to read the cookie, the parent page, storage and the API, and to create
// a conversation, delete one and sign the user out, with the user's cookie and without; shown
// in the chat and opened on its own. On a server with tokens, signed in with a session cookie,
// so there is something to steal; on one without, where a request without credentials is the
// user's own, so only the origin stands in the way.
import { ask, assert, newConversation, noProblems, open, openTab, run, screenshot, signIn, tokens, turnEnded, url } from "./browser.mjs";

const withTokens = Boolean(tokens.alice);

// What the user has, as the page's own API client sees it.
const conversationIds = (page) =>
  page.evaluate(async () => (await (await fetch("/api/v1/conversations?limit=200")).json()).conversations.map((c) => c.id).sort());

// The artifact's attempts, each blocked before it reached the server.
function assertAllBlocked(result, target) {
  assert.equal(result.target, target);
  for (const name of ["api", "create", "create_anonymous", "create_simple", "delete", "delete_anonymous", "sign_out"]) {
    assert.match(result[name], /^blocked: TypeError$/, `the artifact's "${name}" request`);
  }
}

await run(async (browser) => {
  const page = await open(browser);
  if (withTokens) await signIn(page, tokens.alice);
  else await page.goto(url);
  const id = await newConversation(page);
  const before = await conversationIds(page);
  assert.ok(before.includes(id));
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
  assertAllBlocked(result, "unknown");
  await screenshot(page, withTokens ? "hostile" : "hostile-no-tokens", turn);

  // Opened on its own (its "open" link), aimed at this conversation: the same.
  const link = turn.locator(".artifact-html figcaption a", { hasText: "open" });
  assert.equal(await link.getAttribute("target"), "_blank");
  const alone = await openTab(page);
  await alone.goto(new URL(await link.getAttribute("href"), url).href + "#" + id);
  await alone.locator("body[data-result]").waitFor();
  assertAllBlocked(JSON.parse(await alone.locator("body").getAttribute("data-result")), id);
  await alone.close();

  // Nothing was changed: the same conversations (this one with its turn), and the session
  // still works.
  assert.deepEqual(await conversationIds(page), before);
  const kept = await page.evaluate(async (id) => (await fetch(`/api/v1/conversations/${id}`)).status, id);
  assert.equal(kept, 200);
  await page.reload();
  await turnEnded(page, 1);
  assert.equal(await page.getByLabel("Token").count(), 0, "still signed in");
  // Allowed: the 401 before signing in, the image "x" that does not exist (404), and the
  // chart's blocked fetch reported by the CSP.
  noProblems(page, [
    /status of 401/,
    /status of 404/,
    /Content Security Policy|connect-src|Refused to connect|Failed to fetch|ERR_FAILED|net::/i,
  ]);
});
