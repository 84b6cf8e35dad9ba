// The Load page (seed 002): per conversation or overall, each code step over time with its run
// time, CPU time and overhead, its peak memory against the limit with OOM kills marked, a
// sortable table of the steps, and the live sandboxes by state. Updated every few seconds.
import { useEffect, useMemo, useState } from "preact/hooks";

import { conversations } from "../app";
import { api, type Exec, type ExecTotals, type Sandboxes } from "../api";
import { messageOf } from "../conversation";
import { kMostShown, loadExecs } from "../execs";
import { seconds, size } from "../format";
import { useStore } from "../store";
import { TimeChart, type Series } from "./TimeChart";

const kRefreshMs = 3000;

// Run and CPU time in seconds, or in milliseconds while no step took a second ("0.3", not
// "0.000300"); overhead, always milliseconds, on an axis of its own. Drawn nested, so that none
// hides another where they meet: run time as rings, CPU time as dots inside them (a step that
// computed all along), overhead as smaller dots (its axis's top meets the run axis's).
function timeSeries(unit: "s" | "ms"): Series[] {
  const per = unit === "s" ? 1000 : 1;
  return [
    { label: `run (${unit})`, value: (e) => e.run_ms / per, color: "#2f5d50", ring: true },
    { label: `CPU (${unit})`, value: (e) => e.cpu_ms / per, color: "#c27c0e" },
    { label: "overhead (ms)", value: (e) => e.overhead_ms, color: "#6b6fb5", scale: "overhead", size: 4 },
  ];
}
const kTimeInSeconds = timeSeries("s");
const kTimeInMilliseconds = timeSeries("ms");

const kMemorySeries: Series[] = [
  { label: "peak (MiB)", value: (e) => e.peak_memory_bytes / 2 ** 20, color: "#2f5d50" },
  { label: "limit (MiB)", value: (e) => e.memory_limit_bytes / 2 ** 20, color: "#999999", line: true },
  { label: "OOM kill", value: (e) => (e.oom ? e.peak_memory_bytes / 2 ** 20 : null), color: "#c0392b", size: 12 },
];

type Column = { key: string; label: string; value: (exec: Exec) => number | string; show: (exec: Exec) => string };

// The steps' conversation, in the overview of all of them.
function conversationColumn(titles: Map<string, string>): Column {
  const title = (e: Exec) => titles.get(e.conversation_id ?? "") || e.conversation_id || "";
  return { key: "conversation", label: "Conversation", value: title, show: title };
}

const kColumns: Column[] = [
  { key: "time", label: "Time", value: (e) => e.started_at, show: (e) => new Date(e.started_at).toLocaleTimeString() },
  { key: "tool", label: "Step", value: (e) => e.tool ?? "", show: (e) => e.tool ?? e.command },
  { key: "run", label: "Run", value: (e) => e.run_ms, show: (e) => seconds(e.run_ms) },
  { key: "cpu", label: "CPU", value: (e) => e.cpu_ms, show: (e) => seconds(e.cpu_ms) },
  { key: "overhead", label: "Overhead", value: (e) => e.overhead_ms, show: (e) => seconds(e.overhead_ms) },
  { key: "peak", label: "Peak memory", value: (e) => e.peak_memory_bytes, show: (e) => `${size(e.peak_memory_bytes)} of ${size(e.memory_limit_bytes)}` },
  { key: "exit", label: "Exit", value: (e) => e.exit_code, show: (e) => (e.oom ? "OOM" : e.timed_out ? "timeout" : String(e.exit_code)) },
];

export function LoadPage({ conversation }: { conversation?: string }) {
  const { list } = useStore(conversations);
  const [execs, setExecs] = useState<Exec[]>([]);
  const [totals, setTotals] = useState<ExecTotals | null>(null);
  const [sandboxes, setSandboxes] = useState<Sandboxes | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [sort, setSort] = useState<{ key: string; descending: boolean }>({ key: "time", descending: true });

  useEffect(() => {
    let current = true;
    let held: Exec[] = [];
    let timer: ReturnType<typeof setTimeout> | undefined;
    setExecs([]);
    setTotals(null);
    // The next refresh is timed from the end of this one, so a slow first read (many pages)
    // is never overlapped by a second.
    const refresh = async () => {
      try {
        const [list, live] = await Promise.all([loadExecs(conversation, held), api.sandboxes()]);
        if (!current) return;
        held = list.execs;
        setExecs(list.execs);
        setTotals(list.totals);
        setSandboxes(live);
        setError(null);
      } catch (failure) {
        if (current) setError(messageOf(failure));
      }
      if (current) timer = setTimeout(refresh, kRefreshMs);
    };
    void refresh();
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [conversation]);

  const ordered = useMemo(() => [...execs].sort((a, b) => a.started_at.localeCompare(b.started_at)), [execs]);
  const timeUnit = execs.some((e) => Math.max(e.run_ms, e.cpu_ms) >= 1000) ? "s" : "ms";
  const columns = useMemo(
    () =>
      conversation
        ? kColumns
        : [kColumns[0]!, conversationColumn(new Map(list.map((c) => [c.id, c.title]))), ...kColumns.slice(1)],
    [conversation, list],
  );
  const sorted = useMemo(() => {
    const column = columns.find((c) => c.key === sort.key) ?? columns[0]!;
    const rows = [...execs].sort((a, b) => {
      const x = column.value(a);
      const y = column.value(b);
      return x < y ? -1 : x > y ? 1 : 0;
    });
    return sort.descending ? rows.reverse() : rows;
  }, [execs, sort, columns]);
  const title = conversation ? list.find((c) => c.id === conversation)?.title || conversation : "All conversations";

  return (
    <section class="load">
      <header class="load-head">
        <h1>Load: {title}</h1>
        <label for="load-scope">Show</label>{" "}
        <select
          id="load-scope"
          value={conversation ?? ""}
          onChange={(event) => {
            const id = event.currentTarget.value;
            location.hash = id ? `#/load/${encodeURIComponent(id)}` : "#/load";
          }}
        >
          <option value="">All conversations</option>
          {list.map((c) => (
            <option key={c.id} value={c.id}>
              {c.title || c.id}
            </option>
          ))}
        </select>
      </header>
      {error && <p class="error" role="alert">{error}</p>}
      {totals && (
        <dl class="figures totals">
          <div><dt>Code steps</dt><dd>{totals.steps}</dd></div>
          <div><dt>Run time</dt><dd>{seconds(totals.run_ms)}</dd></div>
          <div><dt>CPU time</dt><dd>{seconds(totals.cpu_ms)}</dd></div>
          <div><dt>Overhead</dt><dd>{seconds(totals.overhead_ms)}</dd></div>
          <div><dt>Highest peak</dt><dd>{size(totals.max_peak_memory_bytes)}</dd></div>
          <div class={totals.ooms > 0 ? "bad" : undefined}><dt>Out of memory</dt><dd>{totals.ooms}</dd></div>
          <div><dt>Timed out</dt><dd>{totals.timeouts}</dd></div>
        </dl>
      )}
      {ordered.length > 0 ? (
        <div class="charts">
          <TimeChart
            title="Time per step"
            execs={ordered}
            series={timeUnit === "s" ? kTimeInSeconds : kTimeInMilliseconds}
          />
          <TimeChart title="Peak memory against the limit" execs={ordered} series={kMemorySeries} />
        </div>
      ) : (
        <p class="empty">No code steps yet.</p>
      )}
      {totals && sorted.length > 0 && (
        <p class="hint steps-shown">
          {sorted.length < totals.steps
            ? `The newest ${sorted.length} of ${totals.steps} steps (at most ${kMostShown} are listed; the figures above count all).`
            : `All ${sorted.length} steps.`}
        </p>
      )}
      {sorted.length > 0 && (
        <div class="table-scroll">
          <table class="steps">
            <thead>
              <tr>
                {columns.map((column) => (
                  <th key={column.key} scope="col" aria-sort={sort.key === column.key ? (sort.descending ? "descending" : "ascending") : undefined}>
                    <button
                      class="sort"
                      onClick={() => setSort({ key: column.key, descending: sort.key === column.key ? !sort.descending : true })}
                    >
                      {column.label}
                      {sort.key === column.key ? (sort.descending ? " ▼" : " ▲") : ""}
                    </button>
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {sorted.map((exec) => (
                <tr key={exec.id} class={exec.oom || exec.timed_out ? "bad" : undefined}>
                  {columns.map((column) => (
                    <td key={column.key} class={typeof column.value(exec) === "number" ? "number" : undefined}>
                      {column.key === "tool" && exec.conversation_id ? (
                        <a href={`#/c/${exec.conversation_id}`}>{column.show(exec)}</a>
                      ) : (
                        column.show(exec)
                      )}
                    </td>
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {sandboxes && (
        <section class="sandboxes">
          <h2>Live sandboxes</h2>
          <p>
            Yours:{" "}
            {Object.entries(sandboxes.by_state).map(([state, count]) => `${count} ${state}`).join(", ") || "none"}
            {" · "}Everyone's:{" "}
            {Object.entries(sandboxes.all_by_state).map(([state, count]) => `${count} ${state}`).join(", ") || "none"}
          </p>
          <ul>
            {sandboxes.sandboxes.map((sandbox) => (
              <li key={sandbox.conversation_id}>
                <a href={`#/c/${sandbox.conversation_id}`}>
                  {list.find((c) => c.id === sandbox.conversation_id)?.title || sandbox.conversation_id}
                </a>{" "}
                <span class={`state state-${sandbox.state}`}>{sandbox.state}</span>
              </li>
            ))}
          </ul>
        </section>
      )}
      {sandboxes && <CapacityPanel capacity={sandboxes.capacity} />}
    </section>
  );
}

// How the server shares its sandboxes: in use against the limit, the queue, waits, cold and
// warm starts, evictions and turns turned away.
function CapacityPanel({ capacity }: { capacity: Sandboxes["capacity"] }) {
  const { limits, sandboxes: use, queue, waits, starts } = capacity;
  // The limits hold across the servers sharing the history: theirs count too.
  const inUse = use.warm + use.starting + use.busy + use.idle + use.deleting + use.elsewhere;
  return (
    <section class="capacity">
      <h2>Capacity</h2>
      <dl class="figures">
        <div class={inUse >= limits.max_sandboxes ? "bad" : undefined}>
          <dt>Sandboxes</dt>
          <dd>
            {inUse} of {limits.max_sandboxes}
          </dd>
        </div>
        <div><dt>In a turn</dt><dd>{use.busy}</dd></div>
        <div><dt>Idle</dt><dd>{use.idle}</dd></div>
        <div><dt>Warm</dt><dd>{use.warm} (min {limits.warm_min_idle})</dd></div>
        <div><dt>Starting</dt><dd>{use.starting}</dd></div>
        {use.elsewhere > 0 && <div><dt>On other servers</dt><dd>{use.elsewhere}</dd></div>}
        <div class={queue.waiting > 0 ? "bad" : undefined}><dt>Waiting turns</dt><dd>{queue.waiting}</dd></div>
        <div><dt>Longest wait now</dt><dd>{seconds(queue.longest_wait_ms)}</dd></div>
        <div><dt>Wait p50 / p99</dt><dd>{seconds(waits.p50_ms)} / {seconds(waits.p99_ms)}</dd></div>
        <div><dt>Cold starts</dt><dd>{starts.cold} ({seconds(starts.cold_p50_ms)} p50)</dd></div>
        <div><dt>Warm starts</dt><dd>{starts.warm} ({seconds(starts.warm_p50_ms)} p50)</dd></div>
        <div><dt>Evictions</dt><dd>{capacity.evictions}</dd></div>
        <div class={capacity.timeouts > 0 ? "bad" : undefined}><dt>Timed out waiting</dt><dd>{capacity.timeouts}</dd></div>
        <div class={capacity.refused > 0 ? "bad" : undefined}><dt>Refused (429)</dt><dd>{capacity.refused}</dd></div>
      </dl>
      <p class="limits">
        At most {limits.max_per_user} per user; {limits.max_queue} turns may wait, each up to {seconds(limits.queue_timeout_ms)}.
        {capacity.accounts.length > 1 &&
          ` Accounts: ${capacity.accounts.map((a) => `${a.name} ${a.in_use} of ${a.max_sandboxes}`).join(", ")}.`}
      </p>
    </section>
  );
}
