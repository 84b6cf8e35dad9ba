// What the user sends next: a question for the agent, or a cell (Python, an SQL query, an SQL
// export to Parquet) run without the model. While a turn runs it offers Stop.
import { useEffect, useRef, useState } from "preact/hooks";

import type { CellKind } from "../api";

export type Draft =
  | { mode: "ask"; text: string; key: number }
  | { mode: "cell"; kind: CellKind; code: string; filename: string; key: number };

interface Props {
  running: boolean;
  modelAvailable: boolean;
  draft: Draft | null;
  // Resolves to false when the question was not taken: it goes back in the box.
  onAsk: (text: string) => Promise<boolean>;
  onCell: (kind: CellKind, code: string, filename: string) => void;
  onStop: () => void;
}

const kKinds: { kind: CellKind; label: string }[] = [
  { kind: "python", label: "Python" },
  { kind: "sql_query", label: "SQL query" },
  { kind: "sql_export", label: "SQL export to Parquet" },
];

export function Composer({ running, modelAvailable, draft, onAsk, onCell, onStop }: Props) {
  const [mode, setMode] = useState<"ask" | "cell">(modelAvailable ? "ask" : "cell");
  const [question, setQuestion] = useState("");
  const [kind, setKind] = useState<CellKind>("python");
  const [code, setCode] = useState("");
  const [filename, setFilename] = useState("");
  const input = useRef<HTMLTextAreaElement>(null);
  // A draft's text area gets the focus once it is drawn (a draft may switch the tab).
  const [focusFor, setFocusFor] = useState(0);

  useEffect(() => setMode(modelAvailable ? "ask" : "cell"), [modelAvailable]);
  useEffect(() => {
    if (!draft) return;
    if (draft.mode === "ask") {
      setMode("ask");
      setQuestion(draft.text);
    } else {
      setMode("cell");
      setKind(draft.kind);
      setCode(draft.code);
      setFilename(draft.filename);
    }
    setFocusFor(draft.key);
  }, [draft]);
  useEffect(() => {
    if (focusFor) input.current?.focus();
  }, [focusFor]);

  const ask = () => {
    const text = question.trim();
    if (running || text === "") return;
    setQuestion("");
    void onAsk(text).then((taken) => {
      if (!taken) setQuestion((now) => (now === "" ? text : now));
    });
  };
  const modes: ("ask" | "cell")[] = modelAvailable ? ["ask", "cell"] : ["cell"];
  const onTabKey = (event: KeyboardEvent) => {
    if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
    event.preventDefault();
    const step = event.key === "ArrowRight" ? 1 : modes.length - 1;
    const next = modes[(modes.indexOf(mode) + step) % modes.length];
    setMode(next);
    document.getElementById(`composer-tab-${next}`)?.focus();
  };
  const run = () => {
    if (running || code.trim() === "") return;
    onCell(kind, code, filename.trim());
  };

  return (
    <form
      class="composer"
      onSubmit={(event) => {
        event.preventDefault();
        if (mode === "ask") ask();
        else run();
      }}
    >
      {/* Tabs as WAI-ARIA's pattern has them: one Tab stop, the arrow keys move between them. */}
      <div class="tabs" role="tablist" aria-label="What to send" onKeyDown={onTabKey}>
        {modes.map((each) => (
          <button
            key={each}
            id={`composer-tab-${each}`}
            type="button"
            role="tab"
            aria-selected={mode === each}
            aria-controls="composer-panel"
            tabIndex={mode === each ? 0 : -1}
            onClick={() => setMode(each)}
          >
            {each === "ask" ? "Ask" : "Cell"}
          </button>
        ))}
      </div>
      <div class="composer-panel" id="composer-panel" role="tabpanel" aria-labelledby={`composer-tab-${mode}`}>
        {mode === "ask" ? (
          <>
            <label class="visually-hidden" for="question">
              Question
            </label>
            <textarea
              id="question"
              ref={input}
              rows={2}
              value={question}
              placeholder="Ask about your data (Enter sends, Shift+Enter for a new line)"
              onInput={(event) => setQuestion(event.currentTarget.value)}
              onKeyDown={(event) => {
                // Enter that confirms an input method's candidate is not a send.
                if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
                  event.preventDefault();
                  ask();
                }
              }}
            />
          </>
        ) : (
          <>
            <div class="cell-options">
              <label for="cell-kind">Kind</label>
              <select id="cell-kind" value={kind} onChange={(event) => setKind(event.currentTarget.value as CellKind)}>
                {kKinds.map((option) => (
                  <option key={option.kind} value={option.kind}>
                    {option.label}
                  </option>
                ))}
              </select>
              {kind === "sql_export" && (
                <>
                  <label for="cell-filename">File</label>
                  <input
                    id="cell-filename"
                    value={filename}
                    placeholder="views.parquet"
                    onInput={(event) => setFilename(event.currentTarget.value)}
                  />
                </>
              )}
            </div>
            <label class="visually-hidden" for="cell-code">
              Code
            </label>
            <textarea
              id="cell-code"
              class="code"
              ref={input}
              rows={5}
              spellcheck={false}
              value={code}
              placeholder={kind === "python" ? "import polars as pl\n…  (Ctrl+Enter runs)" : "SELECT …  (Ctrl+Enter runs)"}
              onInput={(event) => setCode(event.currentTarget.value)}
              onKeyDown={(event) => {
                if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
                  event.preventDefault();
                  run();
                }
              }}
            />
          </>
        )}
      </div>
      <div class="composer-actions">
        {running ? (
          // Send turns into Stop under the pointer: the second click of a double click on Send
          // is not a Stop.
          <button type="button" class="stop" onClick={(event) => event.detail < 2 && onStop()}>
            Stop
          </button>
        ) : (
          <button type="submit" class="primary">
            {mode === "ask" ? "Send" : "Run"}
          </button>
        )}
      </div>
    </form>
  );
}
