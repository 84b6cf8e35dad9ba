// One conversation: its turns, and the composer for the next question or cell. The composer is
// also where "edit and run again" puts a step's code or the last question.
import { useEffect, useMemo, useState } from "preact/hooks";

import { conversations, deleteConversation, info, refreshConversations } from "../app";
import type { CellKind } from "../api";
import { ConversationController } from "../conversation";
import { useStore } from "../store";
import { Composer, type Draft } from "./Composer";
import type { Expansion } from "./StepView";
import { TurnView } from "./TurnView";

export function ConversationPage({ id }: { id: string }) {
  const controller = useMemo(() => new ConversationController(id, () => void refreshConversations()), [id]);
  const state = useStore(controller.state);
  const server = useStore(info);
  // The first turn names the conversation; the list hears of it when the turn starts, this page's
  // record only when it ends.
  const listed = useStore(conversations).list.find((conversation) => conversation.id === id);
  const [draft, setDraft] = useState<Draft | null>(null);
  // Expand all / Collapse all: each press is a new request, so pressing it again after opening or
  // closing steps by hand applies it again.
  const [expanded, setExpanded] = useState<Expansion | null>(null);

  useEffect(() => {
    void controller.load();
    // A page being left must not start new requests when the browser aborts its stream.
    const leave = () => controller.close();
    const shown = (event: PageTransitionEvent) => event.persisted && controller.reopen();
    addEventListener("pagehide", leave);
    addEventListener("pageshow", shown);
    return () => {
      removeEventListener("pagehide", leave);
      removeEventListener("pageshow", shown);
      controller.close();
    };
  }, [controller]);

  if (state.missing) {
    return (
      <section class="empty">
        <h1>No such conversation</h1>
        <p>
          It does not exist, or it is not yours. <a href="#/">Back</a>
        </p>
      </section>
    );
  }
  const modelAvailable = server?.model.available ?? false;
  const lastAsk = [...state.turns].reverse().find((turn) => turn.kind === "ask")?.number;
  const editCell = (cell: { kind: CellKind; code: string; filename: string }) =>
    setDraft({ mode: "cell", ...cell, key: Date.now() });

  return (
    <section class="conversation">
      <header class="conversation-head">
        <h1>{state.detail?.title || listed?.title || "New conversation"}</h1>
        <div class="actions">
          <button class="link" onClick={() => setExpanded({ open: true, at: Date.now() })}>
            Expand all
          </button>
          <button class="link" onClick={() => setExpanded({ open: false, at: Date.now() })}>
            Collapse all
          </button>
          <a href={`#/load/${id}`}>Load</a>
          <button
            class="link danger"
            disabled={state.running}
            onClick={() => {
              if (confirm("Delete this conversation, its sandbox and its files?")) void deleteConversation(id);
            }}
          >
            Delete
          </button>
        </div>
      </header>
      {!modelAvailable && server && (
        <p class="notebook-note">
          Notebook mode: no language model is configured ({server.model.reason}). Run SQL and Python
          cells below; they run in this conversation's sandbox with the same metering.
        </p>
      )}
      <ol class="turns">
        {state.turns.map((turn) => (
          <TurnView
            key={turn.number}
            turn={turn}
            expanded={expanded}
            onEditCell={editCell}
            onEditQuestion={
              turn.number === lastAsk && !state.running && modelAvailable
                ? () => setDraft({ mode: "ask", text: turn.question ?? "", key: Date.now() })
                : undefined
            }
          />
        ))}
      </ol>
      {state.error && (
        <p class="error" role="alert">
          {state.error}
        </p>
      )}
      <Composer
        running={state.running}
        modelAvailable={modelAvailable}
        draft={draft}
        onAsk={(text) => controller.ask(text)}
        onCell={(kind, code, filename) => void controller.runCell(kind, code, filename)}
        onStop={() => void controller.cancel()}
      />
    </section>
  );
}
