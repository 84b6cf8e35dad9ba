// The server cannot be reached as the page starts: the page says so and tries again, rather than
// asking for a token. The page's connection to the server breaks: in the middle of a turn (the page picks the turn up
// again, Stop and all), and for longer (it keeps what it showed, says it is trying again, and
// sees the turn to its end once the server is back). And a question the server refuses stays
// in the box, with the server's reason, after the page has reloaded the conversation.
import net from "node:net";

import { ask, assert, newConversation, noProblems, open, run, screenshot, turnEnded, url } from "./browser.mjs";

// A TCP relay between the page and the server that can break every connection through it, and
// refuse new ones: a network that fails, with the real server behind it.
async function relay(target) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  let refusing = false;
  const server = net.createServer((client) => {
    if (refusing) return client.destroy();
    const upstream = net.connect(Number(port), hostname);
    for (const [from, to] of [[client, upstream], [upstream, client]]) {
      sockets.add(from);
      from.pipe(to);
      from.on("error", () => to.destroy());
      from.on("close", () => {
        sockets.delete(from);
        to.destroy();
      });
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/`,
    cut() {
      for (const socket of sockets) socket.destroy();
    },
    refuse(on) {
      refusing = on;
    },
    close() {
      this.cut();
      server.close();
    },
  };
}

const offline = [/Failed to fetch|network ?error|NetworkError|ERR_|aborted|Failed to load resource/i];

await run(async (browser) => {
  const line = await relay(url);
  try {
    {
      const page = await open(browser);
      const asked = { session: 0, info: 0 };
      await page.route("**/api/v1/session", (route) =>
        ++asked.session <= 2 ? route.abort("connectionrefused") : route.continue(),
      );
      await page.route("**/api/v1/info", (route) => (++asked.info <= 1 ? route.abort("connectionrefused") : route.continue()));
      await page.goto(line.url);
      const down = page.getByRole("alert").filter({ hasText: /^The server cannot be reached \(.+\); trying again in 1 s$/ });
      await down.waitFor();
      assert.equal(await page.getByLabel("Token").count(), 0, "an unreachable server is not a sign-in");
      await screenshot(page, "connection-start");
      await page.getByRole("alert").filter({ hasText: "trying again in 2 s" }).waitFor();
      // Signed in once the session could be read; the model is shown once the info could be.
      await page.getByRole("button", { name: "New conversation" }).first().waitFor();
      await page.locator(".bar .model", { hasText: /^model: / }).waitFor();
      assert.deepEqual(asked, { session: 3, info: 2 });
      noProblems(page, offline);
      await page.close();
    }

    const page = await open(browser);
    await page.goto(line.url);
    const id = await newConversation(page);

    // Refused: the question goes back in the box, and the reason stays after the reload.
    const question = page.getByLabel("Question");
    const tooLong = "How many rows? ".repeat(7000);
    const reloaded = page.waitForResponse(
      (response) => response.request().method() === "GET" && response.url().endsWith(`/api/v1/conversations/${id}`),
    );
    await ask(page, tooLong);
    await reloaded;
    const refusal = page.getByRole("alert");
    assert.match(await refusal.innerText(), /'content' is \d+ bytes; at most 100000 are allowed/);
    // Back in the box once the refusal is handled, which may come after the reload's answer.
    await page.waitForFunction((expected) => document.getElementById("question")?.value === expected, tooLong.trim());
    await screenshot(page, "connection-refused", page.locator(".composer"));

    // The connection breaks while the step runs: the page reads the conversation again, finds
    // the turn running and follows it, offering Stop until it ends.
    await question.fill("Count to five for me");
    await page.getByRole("button", { name: "Send", exact: true }).click();
    const first = page.locator("li.turn[data-turn='1']");
    await first.locator("pre.stdout", { hasText: "1" }).waitFor();
    line.cut();
    await page.locator("li.turn-running[data-turn='1'] pre.stdout", { hasText: "3" }).waitFor();
    assert.equal(await page.getByRole("button", { name: "Stop" }).count(), 1, "the resumed turn can be stopped");
    assert.equal(await page.getByRole("button", { name: "Send", exact: true }).count(), 0);
    await turnEnded(page, 1);
    assert.ok(await first.evaluate((node) => node.classList.contains("turn-completed")));
    assert.match(await first.locator(".answer").innerText(), /counted from one to five/);
    await page.getByRole("button", { name: "Send", exact: true }).waitFor();

    // The server cannot be reached for a while: the turn stays as far as it got, the page says
    // so and tries again, and once it can it shows the turn to its end.
    await ask(page, "Count again");
    const second = page.locator("li.turn[data-turn='2']");
    await second.locator("pre.stdout", { hasText: "1" }).waitFor();
    line.refuse(true);
    line.cut();
    await page.getByRole("alert").filter({ hasText: /trying again in \d+ s/ }).waitFor();
    assert.match(await second.locator("pre.stdout").innerText(), /^1\n/, "what the turn showed stays");
    await screenshot(page, "connection-lost", page.locator(".conversation"));
    line.refuse(false);
    await turnEnded(page, 2);
    assert.ok(await second.evaluate((node) => node.classList.contains("turn-completed")));
    await second.locator("details.step summary").click();
    assert.equal(await second.locator("pre.stdout").innerText(), "1\n2\n3\n4\n5\n");
    assert.match(await second.locator(".answer").innerText(), /counted from one to five again/);
    await page.getByRole("alert").waitFor({ state: "detached" });
    noProblems(page, offline);
  } finally {
    line.close();
  }
});
