// The steps the Load page shows: GET /api/v1/execs page by page (newest first, through its
// cursor) up to kMostShown, and on each refresh only the pages newer than what is held.
import { api, type Exec, type ExecTotals } from "./api";

export const kMostShown = 5000;

export interface ExecList {
  execs: Exec[];      // newest first, at most kMostShown
  totals: ExecTotals; // of every step, shown or not
}

// The steps now, given those held from the last call (newest first; [] the first time). New
// steps are recorded with higher ids, so reading stops at the first page that reaches a held
// one; the held list is returned as it was when nothing is new, so views need not redraw.
export async function loadExecs(conversation: string | undefined, held: Exec[]): Promise<ExecList> {
  const heldIds = new Set(held.map((exec) => exec.id));
  const fresh: Exec[] = [];
  let totals: ExecTotals | undefined;
  let cursor: string | undefined;
  let reached = held.length === 0;
  for (;;) {
    const page = await api.execs(conversation, cursor);
    totals ??= page.totals;
    for (const exec of page.execs) {
      if (heldIds.has(exec.id)) reached = true;
      else fresh.push(exec);
    }
    if ((reached && held.length > 0) || !page.next_cursor || fresh.length >= kMostShown) break;
    cursor = page.next_cursor;
  }
  if (!reached) held = []; // more is new than a refresh reads: what was held is replaced
  const execs = fresh.length === 0 ? held : [...fresh, ...held].slice(0, kMostShown);
  // Fewer steps than are held: some went with a deleted conversation; read them all again.
  if (totals!.steps < execs.length) return loadExecs(conversation, []);
  return { execs, totals: totals! };
}
