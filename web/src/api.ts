// The one client of quarry's HTTP API. Its types come from the OpenAPI document
// (generated/api.ts, made by build.mjs), so tsc checks this client against what the server
// promises. Requests carry the session cookie; changes carry its CSRF token.
//
// Every request bypasses the browser's cache ("no-store"). The server's answers say no-store
// too, but that comes too late for Firefox: it lets only one request at a time use the cache
// entry of a URL, so a second tab following the same turn (or a reloaded page whose old page
// still held the stream) waited for the first stream to end before its own request was sent.
import type { components } from "./generated/api";

type Schemas = components["schemas"];
export type Conversation = Schemas["Conversation"];
export type ConversationPage = Schemas["ConversationPage"];
export type ConversationDetail = Schemas["ConversationDetail"];
export type Message = Schemas["Message"];
export type Exec = Schemas["Exec"];
export type ExecPage = Schemas["ExecPage"];
export type ExecTotals = Schemas["ExecTotals"];
export type Artifact = Schemas["Artifact"];
export type SandboxEvent = Schemas["SandboxEvent"];
export type Sandboxes = Schemas["Sandboxes"];
export type Session = Schemas["Session"];
export type Info = Schemas["Info"];
export type Turn = Schemas["Turn"];
export type TablePage = Schemas["TablePage"];
export type StreamEvent = Schemas["StreamEvent"];
export type Metering = Schemas["Metering"];
export type CellKind = Schemas["CreateCell"]["kind"];

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

let csrfToken: string | null = null;

// The CSRF token of the signed-in session (null when signed in by other means).
export function useCsrfToken(token: string | null) {
  csrfToken = token;
}

function headers(method: string, json: boolean): Record<string, string> {
  const result: Record<string, string> = {};
  if (json) result["Content-Type"] = "application/json";
  if (method !== "GET" && csrfToken) result["X-CSRF-Token"] = csrfToken;
  return result;
}

async function failure(response: Response): Promise<ApiError> {
  const body = await response.json().catch(() => null);
  const error = body?.error;
  return new ApiError(
    response.status,
    error?.code ?? "http_error",
    error?.message ?? `the server answered ${response.status} ${response.statusText}`,
  );
}

async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await fetch(path, {
    method,
    headers: headers(method, body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  if (!response.ok) throw await failure(response);
  if (response.status === 204) return undefined as T;
  return (await response.json()) as T;
}

function query(parameters: Record<string, string | number | undefined>): string {
  const pairs = Object.entries(parameters).filter(([, value]) => value !== undefined && value !== "");
  if (pairs.length === 0) return "";
  return "?" + pairs.map(([name, value]) => `${name}=${encodeURIComponent(String(value))}`).join("&");
}

export const api = {
  session: () => request<Session>("GET", "/api/v1/session"),
  signIn: (token: string) => request<Session>("POST", "/api/v1/session", { token }),
  signOut: () => request<void>("DELETE", "/api/v1/session"),
  info: () => request<Info>("GET", "/api/v1/info"),
  conversations: (cursor?: string) =>
    request<ConversationPage>("GET", "/api/v1/conversations" + query({ cursor, limit: 50 })),
  createConversation: () => request<Conversation>("POST", "/api/v1/conversations", {}),
  conversation: (id: string) =>
    request<ConversationDetail>("GET", `/api/v1/conversations/${encodeURIComponent(id)}`),
  deleteConversation: (id: string) =>
    request<void>("DELETE", `/api/v1/conversations/${encodeURIComponent(id)}`),
  cancel: (id: string) =>
    request<Schemas["CancelAccepted"]>(
      "POST",
      `/api/v1/conversations/${encodeURIComponent(id)}/cancel`,
    ),
  execs: (conversation?: string, cursor?: string) =>
    request<ExecPage>("GET", "/api/v1/execs" + query({ conversation, cursor, limit: 200 })),
  sandboxes: () => request<Sandboxes>("GET", "/api/v1/sandboxes"),
  table: (artifact: number, offset: number, limit: number, sort?: string, order?: "asc" | "desc") =>
    request<TablePage>(
      "GET",
      `/api/v1/artifacts/${artifact}/table` + query({ offset, limit, sort, order }),
    ),
};

// One event of a turn's stream, with the id to resume after it.
export interface Received {
  id: string;
  event: StreamEvent;
}

// Reads a Server-Sent Events body and hands over each event as it completes.
async function readEvents(response: Response, onEvent: (received: Received) => void) {
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let id = "";
  let data: string[] = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline: number;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
      if (line === "") {
        if (data.length > 0) onEvent({ id, event: JSON.parse(data.join("\n")) as StreamEvent });
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      } else if (line.startsWith("id:")) {
        id = line.slice(line.startsWith("id: ") ? 4 : 3);
      }
    }
  }
}

// Starts a turn (a question or a cell) and streams its events until its end, or until
// `signal` aborts (the turn goes on without us).
export async function startTurn(
  conversation: string,
  what: { content: string } | { kind: CellKind; code: string; filename?: string },
  onEvent: (received: Received) => void,
  signal: AbortSignal,
) {
  const path =
    `/api/v1/conversations/${encodeURIComponent(conversation)}/` +
    ("content" in what ? "messages" : "cells");
  const response = await fetch(path, {
    method: "POST",
    headers: headers("POST", true),
    body: JSON.stringify(what),
    credentials: "same-origin",
    cache: "no-store",
    signal,
  });
  if (!response.ok) throw await failure(response);
  await readEvents(response, onEvent);
}

// Follows a conversation's events after `after` ("3-17"; "3-0" replays turn 3) until `signal`
// aborts. The server keeps the stream open between turns.
export async function followEvents(
  conversation: string,
  after: string,
  onEvent: (received: Received) => void,
  signal: AbortSignal,
) {
  const response = await fetch(
    `/api/v1/conversations/${encodeURIComponent(conversation)}/events` + query({ after }),
    { credentials: "same-origin", cache: "no-store", signal },
  );
  if (!response.ok) throw await failure(response);
  await readEvents(response, onEvent);
}
