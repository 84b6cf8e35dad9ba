// The frame: sign-in until there is a session, then the bar, the conversation list and the page
// the route names.
import { useEffect, useState } from "preact/hooks";

import { conversations, focusMain, info, notice, route, session, signOut } from "../app";
import { useStore } from "../store";
import { ConversationPage } from "./ConversationPage";
import { Home } from "./Home";
import { LoadPage } from "./LoadPage";
import { Sidebar } from "./Sidebar";
import { SignIn } from "./SignIn";

export function App() {
  const current = useStore(session);
  if (current.status === "loading") return <p class="loading">Loading…</p>;
  if (current.status === "signed-out") return <SignIn error={current.error} />;
  if (current.status === "unreachable") {
    return (
      <main class="signin">
        <h1>quarry</h1>
        <p class="error" role="alert">
          {current.error}
        </p>
      </main>
    );
  }
  return <Shell user={current.session.user} canSignOut={current.session.method === "cookie"} />;
}

function Shell({ user, canSignOut }: { user: string; canSignOut: boolean }) {
  const where = useStore(route);
  const message = useStore(notice);
  const server = useStore(info);
  const [menu, setMenu] = useState(false);
  useEffect(() => setMenu(false), [where]);
  useStore(conversations);
  return (
    <div class={"shell" + (menu ? " menu-open" : "")}>
      <header class="bar">
        <button class="menu-button" aria-label="Conversations" aria-expanded={menu} onClick={() => setMenu(!menu)}>
          ☰
        </button>
        <a class="brand" href="#/">
          quarry
        </a>
        <nav>
          <a href="#/" aria-current={where.page !== "load" ? "page" : undefined}>
            Chat
          </a>
          <a href="#/load" aria-current={where.page === "load" ? "page" : undefined}>
            Load
          </a>
        </nav>
        <span class="model" title={server?.model.reason ?? ""}>
          {server ? (server.model.available ? `model: ${server.model.name}` : "notebook mode (no model)") : ""}
        </span>
        <span class="user">{user}</span>
        {canSignOut && (
          <button class="link" onClick={() => void signOut()}>
            Sign out
          </button>
        )}
      </header>
      <Sidebar current={where.page === "conversation" ? where.id : undefined} />
      <main id="main" tabIndex={-1}>
        {message && (
          <div class="notice" role="alert">
            {message}
            <button
              class="link"
              aria-label="Dismiss"
              onClick={() => {
                notice.set(null);
                focusMain();
              }}
            >
              ✕
            </button>
          </div>
        )}
        {where.page === "conversation" ? (
          <ConversationPage key={where.id} id={where.id} />
        ) : where.page === "load" ? (
          <LoadPage conversation={where.conversation} />
        ) : (
          <Home />
        )}
      </main>
    </div>
  );
}
