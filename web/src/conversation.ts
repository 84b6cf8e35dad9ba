// One open conversation: its turns from the history, and the running turn built from its stream
// as events arrive. Asking, running a cell, cancelling, and picking up a turn that was running
// when the page was loaded (its stream is replayed from its start, then followed).
import { ApiError, api, followEvents, startTurn, type CellKind, type ConversationDetail, type Received } from "./api";
import { Store } from "./store";
import { applyEvent, turnsFromHistory, type TurnView } from "./turns";

export interface ConversationState {
  id: string;
  detail?: ConversationDetail;
  turns: TurnView[];  // finished turns, then the running one (live) if any
  running: boolean;
  error?: string;
  missing: boolean;   // the conversation does not exist (or is not the user's)
}

export class ConversationController {
  readonly state: Store<ConversationState>;
  private stream?: AbortController;
  private open = true;
  private live?: TurnView;
  private history: TurnView[] = [];

  // `changed` is told when the conversation's title or activity changed (for the list).
  constructor(
    readonly id: string,
    private readonly changed: () => void,
  ) {
    this.state = new Store<ConversationState>({ id, turns: [], running: false, missing: false });
  }

  async load() {
    try {
      const detail = await api.conversation(this.id);
      if (!this.open) return;
      this.history = turnsFromHistory(detail);
      const running = this.history.find((turn) => turn.status === "running");
      if (running && !this.stream) {
        // A turn runs (asked in another tab, or before a reload): replay it and follow it.
        this.history = this.history.filter((turn) => turn !== running);
        this.follow(running.number);
      }
      // The streamed turn gives way to its record once the history has it.
      const live = this.live;
      if (live && this.history.some((turn) => turn.number === live.number)) this.live = undefined;
      this.publish({ detail, error: undefined });
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        this.publish({ missing: true });
      } else {
        this.publish({ error: messageOf(error) });
      }
    }
  }

  ask(content: string) {
    return this.begin((onEvent, signal) => startTurn(this.id, { content }, onEvent, signal));
  }

  runCell(kind: CellKind, code: string, filename: string) {
    const cell = kind === "sql_export" ? { kind, code, filename } : { kind, code };
    return this.begin((onEvent, signal) => startTurn(this.id, cell, onEvent, signal));
  }

  async cancel() {
    try {
      await api.cancel(this.id);
    } catch (error) {
      this.publish({ error: messageOf(error) });
    }
  }

  // The conversation is no longer shown (another was opened, or the page is being left): its
  // stream is aborted and nothing more is requested. The turn goes on without us.
  close() {
    this.open = false;
    const stream = this.stream;
    this.stream = undefined;
    stream?.abort();
  }

  // Shown again (the browser restored the page from its back-forward cache): picks the
  // conversation up as it is now.
  reopen() {
    this.open = true;
    this.live = undefined;
    this.publish({ running: false });
    void this.load();
  }

  private async begin(
    start: (onEvent: (received: Received) => void, signal: AbortSignal) => Promise<void>,
  ) {
    this.stream?.abort();
    const stream = new AbortController();
    this.stream = stream;
    this.live = undefined;
    this.publish({ running: true, error: undefined });
    try {
      await start((received) => this.take(received), stream.signal);
    } catch (error) {
      if (!stream.signal.aborted) this.publish({ error: messageOf(error) });
    } finally {
      if (this.stream === stream) await this.finish();
    }
  }

  private follow(turn: number) {
    void this.begin(async (onEvent, signal) => {
      const done = new AbortController();
      signal.addEventListener("abort", () => done.abort());
      try {
        await followEvents(
          this.id,
          `${turn}-0`,
          (received) => {
            onEvent(received);
            if (received.event.type === "done" && received.event.turn === turn) done.abort();
          },
          done.signal,
        );
      } catch (error) {
        if (!done.signal.aborted) throw error;
      }
    });
  }

  private take(received: Received) {
    this.live = applyEvent(this.live, received.event);
    this.publish({});
    if (received.event.type === "turn_started") this.changed();
  }

  private async finish() {
    this.stream = undefined;
    await this.load();
    this.live = undefined;
    this.publish({ running: false });
    this.changed();
  }

  private publish(change: Partial<ConversationState>) {
    const turns = this.live ? [...this.history, this.live] : this.history;
    this.state.update((state) => ({ ...state, ...change, turns }));
  }
}

export function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}
