// Signing in with a token from `quarry token create NAME`; the server answers with a session
// cookie the page cannot read.
import { useState } from "preact/hooks";

import { signIn } from "../app";

export function SignIn({ error }: { error?: string }) {
  const [token, setToken] = useState("");
  const [busy, setBusy] = useState(false);
  return (
    <main class="signin">
      <h1>quarry</h1>
      <form
        onSubmit={async (event) => {
          event.preventDefault();
          setBusy(true);
          await signIn(token.trim());
          setBusy(false);
        }}
      >
        <label for="token">Token</label>
        <input
          id="token"
          type="password"
          autocomplete="off"
          value={token}
          onInput={(event) => setToken(event.currentTarget.value)}
          placeholder="qry_…"
          required
        />
        <button type="submit" disabled={busy || token.trim() === ""}>
          Sign in
        </button>
        {error && (
          <p class="error" role="alert">
            {error}
          </p>
        )}
        <p class="hint">
          An administrator makes tokens with <code>quarry token create NAME</code>.
        </p>
      </form>
    </main>
  );
}
