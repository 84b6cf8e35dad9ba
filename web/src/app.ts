// The application's state: who is signed in, the server's info, the conversation list and the
// route (from the location's hash: #/c/ID, #/load, #/load/ID).
import { ApiError, api, useCsrfToken, type Conversation, type Info, type Session } from "./api";
import { messageOf, unreachable } from "./conversation";
import { Backoff, worthRetrying } from "./retry";
import { Store } from "./store";

export type Route =
  | { page: "home" }
  | { page: "conversation"; id: string }
  | { page: "load"; conversation?: string };

export type SessionState =
  | { status: "loading" }
  | { status: "signed-out"; error?: string }
  | { status: "unreachable"; error: string }
  | { status: "signed-in"; session: Session };

export const session = new Store<SessionState>({ status: "loading" });
export const info = new Store<Info | null>(null);
export const conversations = new Store<{
  list: Conversation[];
  next: string | null;
  pages?: number;  // pages loaded: the first, and those of "More"
  error?: string;
}>({
  list: [],
  next: null,
});
export const route = new Store<Route>(parseRoute(location.hash));
export const notice = new Store<string | null>(null);

export function parseRoute(hash: string): Route {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "c" && parts[1]) return { page: "conversation", id: parts[1] };
  if (parts[0] === "load") return { page: "load", conversation: parts[1] };
  return { page: "home" };
}

export function go(to: Route) {
  const hash =
    to.page === "conversation"
      ? `#/c/${encodeURIComponent(to.id)}`
      : to.page === "load"
        ? `#/load${to.conversation ? "/" + encodeURIComponent(to.conversation) : ""}`
        : "#/";
  if (location.hash !== hash) location.hash = hash;
}

window.addEventListener("hashchange", () => route.set(parseRoute(location.hash)));

const sessionRetry = new Backoff();
const infoRetry = new Backoff();

// Who is signed in, then the server's info and the conversations. A server that cannot be
// reached (restarting, or the network is down) is not a reason to ask for a token: the page
// says so and tries again.
export async function start() {
  sessionRetry.cancel();
  let current: Session;
  try {
    current = await api.session();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      session.set({ status: "signed-out" });
    } else if (worthRetrying(error)) {
      const seconds = sessionRetry.schedule(() => void start());
      session.set({ status: "unreachable", error: `${unreachable(error)}; trying again in ${seconds} s` });
    } else {
      session.set({ status: "signed-out", error: messageOf(error) });
    }
    return;
  }
  sessionRetry.reset();
  useCsrfToken(current.csrf_token);
  session.set({ status: "signed-in", session: current });
  await Promise.all([loadInfo(), refreshConversations()]);
}

// The model the server asks (the bar, and whether a question can be asked). Tried again until
// it is known; until then the page offers cells only.
async function loadInfo() {
  infoRetry.cancel();
  try {
    info.set(await api.info());
    infoRetry.reset();
  } catch (error) {
    if (worthRetrying(error)) infoRetry.schedule(() => void loadInfo());
    else notice.set(messageOf(error));
  }
}

export async function signIn(token: string) {
  try {
    await api.signIn(token);
  } catch (error) {
    session.set({ status: "signed-out", error: messageOf(error) });
    return;
  }
  await start();
}

export async function signOut() {
  try {
    await api.signOut();
  } finally {
    useCsrfToken(null);
    conversations.set({ list: [], next: null });
    session.set({ status: "signed-out" });
  }
}

// The first page again (a turn started or ended, so the order changed). Pages loaded with "More"
// stay below it, without the conversations the first page now has.
export async function refreshConversations() {
  try {
    const page = await api.conversations();
    conversations.update((state) => {
      const pages = state.pages ?? 1;
      if (pages === 1) return { list: page.conversations, next: page.next_cursor, pages };
      const first = new Set(page.conversations.map((c) => c.id));
      const rest = state.list.filter((c) => !first.has(c.id));
      return { list: [...page.conversations, ...rest], next: state.next, pages };
    });
  } catch (error) {
    conversations.update((state) => ({ ...state, error: unreachable(error) }));
  }
}

let loadingMore = false;

export async function moreConversations() {
  const { next } = conversations.value;
  if (!next || loadingMore) return;
  loadingMore = true;
  try {
    const page = await api.conversations(next);
    conversations.update((state) => {
      const shown = new Set(state.list.map((c) => c.id));
      return {
        list: [...state.list, ...page.conversations.filter((c) => !shown.has(c.id))],
        next: page.next_cursor,
        pages: (state.pages ?? 1) + 1,
      };
    });
  } catch (error) {
    conversations.update((state) => ({ ...state, error: unreachable(error) }));
  } finally {
    loadingMore = false;
  }
}

export async function newConversation() {
  try {
    const created = await api.createConversation();
    conversations.update((state) => ({ ...state, list: [created, ...state.list] }));
    go({ page: "conversation", id: created.id });
  } catch (error) {
    notice.set(messageOf(error));
  }
}

export async function deleteConversation(id: string) {
  try {
    await api.deleteConversation(id);
    conversations.update((state) => ({ ...state, list: state.list.filter((c) => c.id !== id) }));
    go({ page: "home" });
    focusMain();  // the button that had the focus is gone with the page
  } catch (error) {
    notice.set(messageOf(error));
  }
}

// Puts the focus on the page's main part, where what a control did shows, when that control is
// gone (so it does not fall back to the top of the document).
export function focusMain() {
  requestAnimationFrame(() => document.getElementById("main")?.focus());
}
