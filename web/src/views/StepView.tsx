// A tool step as a row: open while it runs, closed when done, with a one-line summary of what
// it did and what it cost; failures, timeouts and out-of-memory kills in red with the message
// the model saw. Inside: the code or SQL (highlighted, to copy or to run again as a cell), the
// output as it came, the result, and the files it saved.
import { useEffect, useState } from "preact/hooks";

import type { CellKind } from "../api";
import { copyText } from "../clipboard";
import { seconds, size } from "../format";
import { highlight } from "../highlight";
import { describeMetering, stepSource, type Item, type Step } from "../turns";
import { ArtifactView } from "./ArtifactView";

// An Expand all or Collapse all: `at` tells one press from the next.
export interface Expansion {
  open: boolean;
  at: number;
}

interface Props {
  step: Step;
  items: Item[];
  expanded: Expansion | null;
  keepOpen: boolean;  // a cell's step stays open when done: its output is what the user wanted
  onEditCell: (cell: { kind: CellKind; code: string; filename: string }) => void;
}

function title(step: Step): string {
  const args = (typeof step.arguments === "object" && step.arguments ? step.arguments : {}) as Record<string, unknown>;
  if (step.tool === "export_query" && typeof args.filename === "string") return `export_query → ${args.filename}`;
  if (step.tool === "write_file" && typeof args.path === "string") return `write_file ${args.path}`;
  if (step.tool === "run_python" && typeof args.path === "string") return `run_python ${args.path}`;
  return step.tool;
}

function summary(step: Step): string {
  const parts = [title(step)];
  if (step.metering) parts.push(describeMetering(step.metering, { seconds, size }));
  else if (step.elapsedMs !== undefined) parts.push(seconds(step.elapsedMs));
  if (step.metering?.oom) parts.push("out of memory");
  else if (step.metering?.timed_out) parts.push("timed out");
  else if (step.status === "failed") parts.push("failed");
  else if (step.status === "cancelled") parts.push("stopped");
  else if (step.status === "interrupted") parts.push("interrupted");
  else if (step.status === "running") parts.push("running…");
  return parts.join(" · ");
}

// What the model read after a step, less the output already shown above it in full: the
// "--- stderr ---" section (a traceback, most often) would otherwise be read twice. An output
// the model read cut differs from the step's and stays. Each part after an output starts with
// a line break of its own, so the output's last one goes with it.
function toldBesidesOutput(content: string, step: Step): string {
  let told = content;
  for (const [name, text] of [["stdout", step.stdout], ["stderr", step.stderr]] as const) {
    if (text) told = told.replace(`--- ${name} ---\n${text}`, `--- ${name}: shown above ---`);
  }
  return told;
}

// Lines of a traceback or error output, so they can be shown as errors.
function isErrorOutput(text: string): boolean {
  return /Traceback \(most recent call last\)|^\w+Error: /m.test(text);
}

export function StepView({ step, items, expanded, keepOpen, onEditCell }: Props) {
  const running = step.status === "running";
  const [open, setOpen] = useState(running || keepOpen);
  useEffect(() => setOpen(running || keepOpen), [running, keepOpen]);
  useEffect(() => {
    if (expanded) setOpen(expanded.open);
  }, [expanded]);
  const source = stepSource(step, items);
  const bad = step.status === "failed" || step.metering?.oom || step.metering?.timed_out;
  const showContent = step.content && (!step.metering || bad);
  return (
    <>
    <details
      class={`step step-${step.status}${bad ? " bad" : ""}`}
      open={open}
      onToggle={(event) => setOpen((event.currentTarget as HTMLDetailsElement).open)}
    >
      <summary>
        <span class="step-icon" aria-hidden="true">
          {running ? "◌" : bad ? "✕" : step.status === "ok" ? "✓" : "■"}
        </span>
        <span class="step-summary">{summary(step)}</span>
      </summary>
      <div class="step-body">
        {source && (
          <div class="code-block">
            <div class="code-actions">
              <CopyButton text={source.code} />
              {source.cell && !running && (
                <button class="link" onClick={() => onEditCell(source.cell!)}>
                  Edit and run as a cell
                </button>
              )}
            </div>
            <pre>
              <code class={`hljs language-${source.language}`} dangerouslySetInnerHTML={{ __html: highlight(source.code, source.language) }} />
            </pre>
          </div>
        )}
        {(step.stdout || step.stderr) && (
          <div class="output" aria-live={running ? "polite" : undefined}>
            {step.stdout && <pre class={isErrorOutput(step.stdout) ? "stdout error-output" : "stdout"}>{step.stdout}</pre>}
            {step.stderr && <pre class={isErrorOutput(step.stderr) ? "stderr error-output" : "stderr"}>{step.stderr}</pre>}
            {(step.outputCut || step.metering?.truncated) && (
              <p class="hint output-cut">
                The output was longer than the server keeps (sandbox.output_limit); the rest was cut off.
              </p>
            )}
            {running && step.shownCut && !step.outputCut && (
              <p class="hint output-cut">
                The output so far is longer than the page shows while the step runs; all of it is shown when the step ends.
              </p>
            )}
          </div>
        )}
        {showContent ? (
          <pre class={bad ? "result error-output" : "result"}>{bad ? toldBesidesOutput(step.content!, step) : step.content}</pre>
        ) : (
          step.metering?.message && <pre class="error-output">{step.metering.message}</pre>
        )}
        {step.metering && step.metering.denied_connections > 0 && (
          <div class="network-denials">
            <p>
              The sandbox's network allowlist refused {step.metering.denied_connections} connection
              {step.metering.denied_connections === 1 ? "" : "s"}:
            </p>
            <ul>
              {step.metering.denials.map((denial, index) => (
                <li key={index}>
                  <code>{denial.host}:{denial.port}</code> {denial.reason}
                </li>
              ))}
            </ul>
          </div>
        )}
        {/* The advice, unless the result the model read (shown above) has it already. */}
        {step.failure?.advice && !(showContent && step.content?.includes(step.failure.advice)) && (
          <p class="advice">{step.failure.advice}</p>
        )}
      </div>
    </details>
    {/* What a step made stays in view when its row is closed. */}
    {step.artifacts.map((artifact) => (
      <ArtifactView key={artifact.id} artifact={artifact} />
    ))}
    </>
  );
}

// Copies the code, and says whether it could.
function CopyButton({ text }: { text: string }) {
  const [said, setSaid] = useState<"copied" | "failed" | null>(null);
  useEffect(() => {
    if (!said) return;
    const timer = setTimeout(() => setSaid(null), said === "copied" ? 2000 : 6000);
    return () => clearTimeout(timer);
  }, [said]);
  return (
    <>
      <span class={said === "failed" ? "copy-said error" : "copy-said"} role="status">
        {said === "copied" ? "Copied" : said === "failed" ? "Could not copy: select the code and press Ctrl+C" : ""}
      </span>
      <button class="link" onClick={() => void copyText(text).then((copied) => setSaid(copied ? "copied" : "failed"))}>
        Copy
      </button>
    </>
  );
}
