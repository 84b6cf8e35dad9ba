// A conversation as the chat shows it: turns of items (the model's text, tool steps, sandbox
// events, notes), derived from the history the server keeps, or built up event by event while
// a turn streams. Pure functions; the views only render what these return.
import type {
  Artifact,
  CellKind,
  ConversationDetail,
  Exec,
  Message,
  Metering,
  SandboxEvent,
  StreamEvent,
} from "./api";

export type StepStatus = "running" | "ok" | "failed" | "cancelled" | "interrupted";

export interface Failure {
  kind: string;
  cause: string;
  advice?: string;
}

export interface Step {
  callId: string;
  tool: string;
  arguments: unknown;  // as JSON when the model sent JSON
  status: StepStatus;
  content?: string;    // the result as the model read it
  failure?: Failure;
  metering?: Metering;
  elapsedMs?: number;
  stdout: string;
  stderr: string;
  outputCut: boolean;  // the live output stopped at the server's limit
  shownCut: boolean;   // the live output is longer than the page keeps while the step runs
  artifacts: Artifact[];
}

export type Item =
  | { kind: "text"; text: string; modelStep: number }
  | { kind: "step"; step: Step }
  | { kind: "sandbox"; event: { kind: string; reason: string; sandboxId: string; details: Record<string, unknown> } }
  | { kind: "note"; text: string };

export type TurnStatus = "running" | "completed" | "failed" | "cancelled" | "interrupted";

export interface TurnView {
  number: number;
  kind: "ask" | "cell";
  status: TurnStatus;
  error?: string;
  question?: string;
  cell?: { kind: CellKind; code: string; filename: string };
  items: Item[];
  answer?: string;
}

// Output kept per stream of a step in the page; the full text is in the history.
const kOutputShown = 200_000;

function parseArguments(text: string): unknown {
  try {
    return JSON.parse(text || "{}");
  } catch {
    return text;
  }
}

function cellOf(kind: string, call: { name: string; arguments: string }) {
  const args = parseArguments(call.arguments) as Record<string, string>;
  return {
    kind: kind as CellKind,
    code: args.code ?? args.sql ?? "",
    filename: args.filename ?? "",
  };
}

function newStep(callId: string, tool: string, args: unknown): Step {
  return { callId, tool, arguments: args, status: "running", stdout: "", stderr: "", outputCut: false, shownCut: false, artifacts: [] };
}

function meteringOf(exec: Exec): Metering {
  const { exit_code, signal, truncated, run_ms, cpu_ms, peak_memory_bytes, memory_limit_bytes,
          overhead_ms, oom, timed_out, message, denied_connections, denials } = exec;
  return { exit_code, signal, truncated, run_ms, cpu_ms, peak_memory_bytes, memory_limit_bytes,
           overhead_ms, oom, timed_out, message, denied_connections, denials };
}

const kSandboxKinds = new Set(["queued", "sandbox_ready", "sandbox_replaced", "sandbox_deleted", "commands_stopped"]);

// The turns of a conversation from its history.
export function turnsFromHistory(detail: ConversationDetail): TurnView[] {
  const turns = new Map<number, TurnView>();
  for (const turn of detail.turns) {
    turns.set(turn.number, {
      number: turn.number,
      kind: turn.kind,
      status: turn.status,
      error: turn.error ?? undefined,
      items: [],
    });
  }
  const turnOf = (number: number): TurnView => {
    let turn = turns.get(number);
    if (!turn) {
      turn = { number, kind: "ask", status: "completed", items: [] };
      turns.set(number, turn);
    }
    return turn;
  };
  // Messages, execs and events interleave by time within a turn.
  type Timed = { at: string; order: number; add: () => void };
  const timed: Timed[] = [];
  const steps = new Map<string, Step>();
  let order = 0;
  let pendingCell: string | undefined;

  for (const message of detail.messages) {
    const turn = turnOf(message.turn);
    timed.push({ at: message.created_at, order: order++, add: () => addMessage(turn, message) });
  }
  function addMessage(turn: TurnView, message: Message) {
    const details = (message.details ?? {}) as Record<string, unknown>;
    if (message.role === "user") {
      if (typeof details.cell === "string") {
        pendingCell = details.cell;
      } else if (message.content.startsWith("(quarry checked the answer)")) {
        turn.items.push({ kind: "note", text: message.content });
      } else if (turn.question === undefined) {
        turn.question = message.content;
      }
      return;
    }
    if (message.role === "assistant") {
      if (message.content) turn.items.push({ kind: "text", text: message.content, modelStep: 0 });
      for (const call of message.tool_calls ?? []) {
        if (pendingCell && turn.kind === "cell") turn.cell = cellOf(pendingCell, call);
        const step = newStep(call.id, call.name, parseArguments(call.arguments));
        steps.set(call.id, step);
        turn.items.push({ kind: "step", step });
      }
      pendingCell = undefined;
      return;
    }
    const step = steps.get(message.tool_call_id ?? "");
    if (!step) return;
    step.content = message.content;
    step.elapsedMs = typeof details.elapsed_ms === "number" ? details.elapsed_ms : undefined;
    const failure = details.failure as Failure | undefined;
    if (failure?.kind) step.failure = failure;
    step.status = details.interrupted ? "interrupted" : details.cancelled ? "cancelled" : details.ok === false ? "failed" : "ok";
  }
  for (const exec of detail.execs) {
    timed.push({
      at: exec.started_at,
      order: order++,
      add: () => {
        const step = steps.get(exec.tool_call_id ?? "");
        if (!step) return;
        step.metering = meteringOf(exec);
        step.stdout = exec.stdout ?? "";
        step.stderr = exec.stderr ?? "";
      },
    });
  }
  for (const artifact of detail.artifacts) {
    timed.push({
      at: artifact.created_at,
      order: order++,
      add: () => steps.get(artifact.tool_call_id ?? "")?.artifacts.push(artifact),
    });
  }
  for (const event of detail.events) {
    if (!kSandboxKinds.has(event.kind)) continue;
    timed.push({ at: event.created_at, order: order++, add: () => addSandboxItem(turnOf(event.turn), sandboxItem(event)) });
  }
  timed.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : a.order - b.order));
  for (const entry of timed) entry.add();

  const list = [...turns.values()].sort((a, b) => a.number - b.number);
  for (const turn of list) {
    if (turn.status !== "completed" || turn.kind !== "ask") continue;
    const last = turn.items[turn.items.length - 1];
    if (last?.kind === "text") {
      turn.answer = last.text;
      turn.items.pop();
    }
  }
  return list;
}

function sandboxItem(event: SandboxEvent | { kind: string; reason: string; sandbox_id: string; details: Record<string, unknown> }): Item {
  return {
    kind: "sandbox",
    event: { kind: event.kind, reason: event.reason, sandboxId: event.sandbox_id, details: event.details as Record<string, unknown> },
  };
}

// A sandbox event happens during a step (the first command starts the sandbox): it goes before
// the step still running, else at the end.
function addSandboxItem(turn: TurnView, item: Item) {
  // A waiting turn's place changes: one note, kept current.
  if (item.kind === "sandbox" && item.event.kind === "queued") {
    const waiting = turn.items.findIndex((entry) => entry.kind === "sandbox" && entry.event.kind === "queued");
    if (waiting >= 0 && !turn.items.slice(waiting).some((entry) => entry.kind === "sandbox" && entry.event.kind === "sandbox_ready")) {
      turn.items[waiting] = item;
      return;
    }
  }
  // A sandbox found dead is removed, another started and recorded as its replacement: to a
  // person that is one thing, told once.
  if (item.kind === "sandbox" && item.event.kind === "sandbox_replaced") {
    const { sandboxId, details } = item.event;
    turn.items = turn.items.filter(
      (entry) =>
        entry.kind !== "sandbox" ||
        !(
          (entry.event.kind === "sandbox_ready" && entry.event.sandboxId === sandboxId) ||
          (entry.event.kind === "sandbox_deleted" && entry.event.reason === "dead" && entry.event.sandboxId === details.previous)
        ),
    );
  }
  const running = turn.items.findLastIndex((entry) => entry.kind === "step" && entry.step.status === "running");
  if (running >= 0) turn.items.splice(running, 0, item);
  else turn.items.push(item);
}

function stepIn(turn: TurnView, callId: string): Step | undefined {
  for (const item of turn.items) if (item.kind === "step" && item.step.callId === callId) return item.step;
  return undefined;
}

// The turn after one more streamed event (a new object; the old one is left as it was).
export function applyEvent(turn: TurnView | undefined, event: StreamEvent): TurnView {
  if (event.type === "turn_started") {
    return {
      number: event.turn,
      kind: event.kind,
      status: "running",
      question: event.content,
      cell: event.cell ? { kind: event.cell.kind, code: event.cell.code, filename: event.cell.filename } : undefined,
      items: [],
    };
  }
  const next: TurnView = turn
    ? { ...turn, items: turn.items.map((item) => (item.kind === "step" ? { ...item, step: { ...item.step } } : item)) }
    : { number: event.turn, kind: "ask", status: "running", items: [] };
  switch (event.type) {
    case "text": {
      const last = next.items[next.items.length - 1];
      if (last?.kind === "text" && last.modelStep === event.step) {
        next.items[next.items.length - 1] = { ...last, text: last.text + event.text };
      } else {
        next.items.push({ kind: "text", text: event.text, modelStep: event.step });
      }
      break;
    }
    case "tool_started":
      next.items.push({ kind: "step", step: newStep(event.call_id, event.tool, event.arguments) });
      break;
    case "output": {
      const step = stepIn(next, event.call_id);
      if (!step) break;
      const stream = event.stream === "stdout" ? "stdout" : "stderr";
      if (step[stream].length + event.text.length > kOutputShown) step.shownCut = true;
      if (step[stream].length < kOutputShown) step[stream] = (step[stream] + event.text).slice(0, kOutputShown);
      if (event.truncated) step.outputCut = true;
      break;
    }
    case "tool_finished": {
      const step = stepIn(next, event.call_id);
      if (!step) break;
      step.status = event.ok ? "ok" : "failed";
      step.content = event.content;
      step.elapsedMs = event.elapsed_ms;
      step.failure = event.failure ?? undefined;
      step.metering = event.exec ?? undefined;
      break;
    }
    case "artifact": {
      const step = stepIn(next, event.call_id);
      if (step) step.artifacts = [...step.artifacts, event.artifact];
      break;
    }
    case "sandbox":
      if (kSandboxKinds.has(event.kind)) addSandboxItem(next, sandboxItem(event));
      break;
    case "error":
      next.error = event.message;
      break;
    case "done": {
      next.status = event.status;
      if (event.error) next.error = event.error;
      for (const item of next.items) {
        if (item.kind === "step" && item.step.status === "running") {
          item.step.status = event.status === "interrupted" ? "interrupted" : "cancelled";
        }
      }
      if (event.status === "completed" && next.kind === "ask" && event.answer) {
        const last = next.items[next.items.length - 1];
        if (last?.kind === "text") next.items.pop();
        next.answer = event.answer;
      }
      break;
    }
  }
  return next;
}

// "run_python · 0.67 s · CPU 0.67 s · peak 114 MiB of 1 GiB"
export function describeMetering(metering: Metering, format: { seconds: (ms: number) => string; size: (bytes: number) => string }): string {
  return [
    format.seconds(metering.run_ms),
    `CPU ${format.seconds(metering.cpu_ms)}`,
    `peak ${format.size(metering.peak_memory_bytes)} of ${format.size(metering.memory_limit_bytes)}`,
    ...(metering.denied_connections > 0
      ? [`${metering.denied_connections} connection${metering.denied_connections === 1 ? "" : "s"} refused`]
      : []),
  ].join(" · ");
}

// The code or SQL a step ran, and the cell it would be if run again by hand.
export function stepSource(step: Step, turnItems: Item[]): { language: "python" | "sql"; code: string; cell?: { kind: CellKind; code: string; filename: string } } | undefined {
  const args = (typeof step.arguments === "object" && step.arguments) ? (step.arguments as Record<string, unknown>) : {};
  if (step.tool === "run_python") {
    let code = typeof args.code === "string" ? args.code : undefined;
    if (code === undefined && typeof args.path === "string") {
      // A script written by an earlier step of the turn.
      for (const item of turnItems) {
        if (item.kind !== "step" || item.step.tool !== "write_file") continue;
        const written = item.step.arguments as Record<string, unknown>;
        if (written?.path === args.path && typeof written.content === "string") code = written.content;
      }
    }
    return code === undefined ? undefined : { language: "python", code, cell: { kind: "python", code, filename: "" } };
  }
  if (step.tool === "query_database" && typeof args.sql === "string") {
    return { language: "sql", code: args.sql, cell: { kind: "sql_query", code: args.sql, filename: "" } };
  }
  if (step.tool === "export_query" && typeof args.sql === "string") {
    const filename = typeof args.filename === "string" ? args.filename : "";
    return { language: "sql", code: args.sql, cell: { kind: "sql_export", code: args.sql, filename } };
  }
  if (step.tool === "write_file" && typeof args.content === "string") {
    return { language: "python", code: args.content };
  }
  return undefined;
}
