// One turn: the question (or the cell that was run), then what happened in order (the model's
// text, tool steps, sandbox events), then the answer, and how the turn ended if not well.
import { useEffect, useRef } from "preact/hooks";

import type { CellKind } from "../api";
import { seconds } from "../format";
import { highlightBlocks } from "../highlight";
import { markdown } from "../markdown";
import type { Item, TurnView as Turn } from "../turns";
import { StepView, type Expansion } from "./StepView";

interface Props {
  turn: Turn;
  expanded: Expansion | null;  // the last Expand all or Collapse all; null: each step as it is
  onEditCell: (cell: { kind: CellKind; code: string; filename: string }) => void;
  onEditQuestion?: () => void;
}

const kCellNames: Record<string, string> = { python: "Python", sql_query: "SQL query", sql_export: "SQL export" };

export function TurnView({ turn, expanded, onEditCell, onEditQuestion }: Props) {
  return (
    // Busy while it runs: that turn only, so the composer (Stop) and the turns before it are
    // not hidden from assistive technology meanwhile.
    <li class={`turn turn-${turn.status}`} data-turn={turn.number} aria-busy={turn.status === "running"}>
      {turn.kind === "ask" ? (
        <div class="question">
          <p>{turn.question}</p>
          {onEditQuestion && (
            <button class="link" onClick={onEditQuestion}>
              Edit and ask again
            </button>
          )}
        </div>
      ) : (
        <div class="cell-label">{turn.cell ? kCellNames[turn.cell.kind] : "Cell"} cell</div>
      )}
      {turn.items.map((item, index) => (
        <ItemView
          key={index}
          item={item}
          items={turn.items}
          waiting={stillWaiting(turn, index)}
          expanded={expanded}
          keepOpen={turn.kind === "cell"}
          onEditCell={onEditCell}
        />
      ))}
      {turn.answer !== undefined && <Markdown text={turn.answer} class="answer" />}
      {turn.status === "running" && turn.items.length === 0 && <p class="thinking">Working…</p>}
      {turn.status !== "running" && turn.status !== "completed" && (
        <p class={`turn-end ${turn.status}`} role="status">
          {turn.status === "cancelled" ? "Stopped" : turn.status === "interrupted" ? "Interrupted" : "Failed"}
          {turn.error ? `: ${turn.error}` : ""}
        </p>
      )}
    </li>
  );
}

// Whether the running turn still waits for the sandbox its queue note (at `index`) is about.
function stillWaiting(turn: Turn, index: number): boolean {
  if (turn.status !== "running") return false;
  return !turn.items.slice(index + 1).some((later) => later.kind === "sandbox" && later.event.kind === "sandbox_ready");
}

function ItemView({
  item,
  items,
  waiting,
  expanded,
  keepOpen,
  onEditCell,
}: {
  item: Item;
  items: Item[];
  waiting: boolean; // still waiting for a sandbox, if this is the queue's note

  expanded: Expansion | null;
  keepOpen: boolean;
  onEditCell: Props["onEditCell"];
}) {
  switch (item.kind) {
    case "text":
      return <Markdown text={item.text} class="model-text" />;
    case "step":
      return <StepView step={item.step} items={items} expanded={expanded} keepOpen={keepOpen} onEditCell={onEditCell} />;
    case "note":
      return <p class="note">{item.text}</p>;
    case "sandbox":
      return <SandboxNote event={item.event} waiting={waiting} />;
  }
}

// Why a sandbox was deleted (sandbox_deleted's reason), in words.
const kDeletedBecause: Record<string, string> = {
  idle: "The sandbox was deleted after being idle; the next step starts a new one.",
  dead: "The sandbox had stopped (it died or was killed); the next step starts a new one.",
  evicted: "The idle sandbox was deleted to make room for another conversation; the next step starts a new one.",
};

function SandboxNote({ event, waiting }: { event: Extract<Item, { kind: "sandbox" }>["event"]; waiting: boolean }) {
  const details = event.details;
  let text: string;
  switch (event.kind) {
    case "queued":
      text = waiting
        ? `Every sandbox is in use: this turn waits for one (place ${String(details.position)} of ${String(details.waiting)} waiting).`
        : "Every sandbox was in use: this turn waited in the queue for one.";
      break;
    case "sandbox_ready": {
      const waited = typeof details.waited_ms === "number" && details.waited_ms >= 100 ? ` after waiting ${seconds(details.waited_ms)}` : "";
      text = details.start === "warm" ? `A ready sandbox from the warm pool was assigned${waited}.` : `A sandbox was started for this conversation${waited}.`;
      break;
    }
    case "sandbox_replaced":
      text = "The sandbox had stopped; a new one replaced it (files written before are gone).";
      break;
    case "commands_stopped":
      text = "Commands left running by an interrupted turn were stopped.";
      break;
    default:
      text = kDeletedBecause[event.reason] ?? `The sandbox was deleted (${event.reason || "no reason given"}).`;
  }
  return (
    <p class={`sandbox-event ${event.kind}`} title={event.sandboxId}>
      {text}
    </p>
  );
}

// Markdown from the model, sanitised, with its code blocks highlighted.
function Markdown({ text, class: className }: { text: string; class: string }) {
  const element = useRef<HTMLDivElement>(null);
  useEffect(() => {
    if (element.current) highlightBlocks(element.current);
  }, [text]);
  return <div ref={element} class={`markdown ${className}`} dangerouslySetInnerHTML={{ __html: markdown(text) }} />;
}
