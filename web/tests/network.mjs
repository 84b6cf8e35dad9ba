// A step whose connections the sandbox's network allowlist refused says so: in its summary line,
// and under it each refusal with its reason, as the model was told.
import { assert, newConversation, noProblems, open, run, runCell, screenshot, turnEnded, url } from "./browser.mjs";

await run(async (browser) => {
  const page = await open(browser);
  await page.goto(url);
  await newConversation(page);
  await runCell(
    page,
    "python",
    [
      "import urllib.request",
      "for url in ['http://denied.quarry.test/', 'https://10.0.0.1/']:",
      "    try:",
      "        urllib.request.urlopen(url, timeout=10)",
      "    except Exception as error:",
      "        print(url, error)",
    ].join("\n"),
  );
  const turn = await turnEnded(page, 1);
  const step = turn.locator("details.step");
  assert.match(await step.locator("summary").innerText(), /run_python · .* · 2 connections refused/);
  const denials = await step.locator(".network-denials").innerText();
  assert.match(denials, /The sandbox's network allowlist refused 2 connections/);
  assert.match(denials, /denied\.quarry\.test:80 denied\.quarry\.test is not in the sandbox's network allowlist/);
  assert.match(denials, /10\.0\.0\.1:443 '10\.0\.0\.1' is an IP address, not a name/);
  assert.match(await step.locator("pre.stdout").innerText(), /http:\/\/denied\.quarry\.test\/ HTTP Error 403: Forbidden/);
  await screenshot(page, "network-denials", turn);
  noProblems(page);
});
