// Signing in with a token, and another user's conversation out of reach: not in the list, and
// "no such conversation" when its address is typed in.
import { assert, newConversation, noProblems, open, run, runCell, screenshot, signIn, tokens, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const alice = await open(browser);
  await alice.goto(url);
  await alice.getByLabel("Token").fill("qry_not_a_token");
  await alice.getByRole("button", { name: "Sign in" }).click();
  await alice.getByRole("alert").filter({ hasText: "not valid" }).waitFor();
  await screenshot(alice, "sign-in-refused");
  await signIn(alice, tokens.alice);
  const id = await newConversation(alice);
  await runCell(alice, "sql_query", "SELECT 'only for alice' AS secret");
  await turnEnded(alice, 1);
  assert.match(await alice.locator(".sidebar").innerText(), /SELECT 'only for alice'/);

  const bob = await open(browser);
  await signIn(bob, tokens.bob);
  assert.doesNotMatch(await bob.locator(".sidebar").innerText(), /only for alice/);
  await bob.goto(`${url}/#/c/${id}`);
  await bob.getByRole("heading", { name: "No such conversation" }).waitFor();
  assert.doesNotMatch(await bob.locator("main").innerText(), /only for alice/);
  await screenshot(bob, "not-yours");
  // Signing out ends the session: the page asks for a token again.
  await bob.getByRole("button", { name: "Sign out" }).click();
  await bob.getByLabel("Token").waitFor();
  noProblems(alice, [/401|403|404/]);
  noProblems(bob, [/401|403|404/]);
});
