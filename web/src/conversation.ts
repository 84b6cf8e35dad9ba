// One open conversation: its turns from the history, and the running turn built from its stream
// as events arrive. Asking, running a cell, cancelling, and picking up a turn that was running
// when the page was loaded (its stream is replayed from its start, then followed).
import { ApiError, api, followEvents, startTurn, type CellKind, type ConversationDetail, type Received } from "./api";
import { Backoff, worthRetrying } from "./retry";
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
  // Whether the error shown is the last load's (a load that works clears it; an error of asking
  // or running stays until the next action), and the next try.
  private loadFailed = false;
  private readonly retry = new Backoff();

  // `changed` is told when the conversation's title or activity changed (for the list).
  constructor(
    readonly id: string,
    private readonly changed: () => void,
  ) {
    this.state = new Store<ConversationState>({ id, turns: [], running: false, missing: false });
  }

  // Reads the conversation as it is now and follows its running turn, if any. When it cannot be
  // read (the server is restarting, the network is down), the page keeps what it shows, says
  // why, and tries again while it is open; a turn that ran meanwhile is picked up then.
  async load() {
    this.retry.cancel();
    try {
      const detail = await api.conversation(this.id);
      if (!this.open) return;
      this.history = turnsFromHistory(detail);
      this.retry.reset();
      const running = this.history.find((turn) => turn.status === "running");
      if (running && !this.stream) {
        // A turn runs (asked in another tab, or before a reload): replay it and follow it.
        this.history = this.history.filter((turn) => turn !== running);
        this.follow(running.number);
      }
      if (!this.stream) {
        // Nothing streams: the finished turns are all from the history.
        this.live = undefined;
        this.publish({ detail, running: false, ...this.clearLoadError() });
      } else {
        // The streamed turn gives way to its record once the history has it.
        const live = this.live;
        if (live && this.history.some((turn) => turn.number === live.number)) this.live = undefined;
        this.publish({ detail, ...this.clearLoadError() });
      }
    } catch (error) {
      if (!this.open) return;
      if (error instanceof ApiError && error.status === 404) {
        this.publish({ missing: true });
        return;
      }
      if (!worthRetrying(error)) {
        this.failLoading(messageOf(error));
        return;
      }
      const seconds = this.retry.schedule(() => void this.load());
      this.failLoading(`${unreachable(error)}; trying again in ${seconds} s`);
    }
  }

  // Resolves to false when the server refused the question (the error says why), so the composer
  // can give it back.
  ask(content: string) {
    return this.begin((onEvent, signal) => startTurn(this.id, { content }, onEvent, signal), true);
  }

  runCell(kind: CellKind, code: string, filename: string) {
    const cell = kind === "sql_export" ? { kind, code, filename } : { kind, code };
    return this.begin((onEvent, signal) => startTurn(this.id, cell, onEvent, signal), true);
  }

  async cancel() {
    try {
      await api.cancel(this.id);
    } catch (error) {
      this.fail(error);
    }
  }

  // The conversation is no longer shown (another was opened, or the page is being left): its
  // stream is aborted and nothing more is requested. The turn goes on without us.
  close() {
    this.open = false;
    this.retry.cancel();
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

  // Starts a stream (`asked`: by the user, whose earlier error it replaces); resolves to false
  // when it failed before its first event (refused, or the server was not reached).
  private async begin(
    start: (onEvent: (received: Received) => void, signal: AbortSignal) => Promise<void>,
    asked: boolean,
  ): Promise<boolean> {
    this.stream?.abort();
    const stream = new AbortController();
    this.stream = stream;
    this.live = undefined;
    this.publish({ running: true, ...(asked ? this.clearError() : this.clearLoadError()) });
    let started = false;
    let failed = false;
    try {
      await start((received) => {
        started = true;
        this.take(received);
      }, stream.signal);
    } catch (error) {
      if (!stream.signal.aborted) {
        failed = true;
        this.fail(error);
      }
    } finally {
      if (this.stream === stream) await this.finish();
    }
    return started || !failed;
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
    }, false);
  }

  private take(received: Received) {
    this.live = applyEvent(this.live, received.event);
    this.publish({});
    if (received.event.type === "turn_started") this.changed();
  }

  // The stream ended (the turn is done, or the connection broke): the history says how the turn
  // ended, or that it still runs, and then it is followed again.
  private async finish() {
    this.stream = undefined;
    await this.load();
    this.changed();
  }

  // An action's error. The server's refusal is shown until the next action, whatever loads
  // meanwhile; a broken connection until the conversation can be read again (and its turn
  // followed, if it still runs).
  private fail(error: unknown) {
    if (error instanceof ApiError) {
      this.loadFailed = false;
      this.publish({ error: messageOf(error) });
    } else {
      this.failLoading(unreachable(error));
    }
  }

  // An error of reading from the server: shown until a load works.
  private failLoading(message: string) {
    this.loadFailed = true;
    this.publish({ error: message });
  }

  private clearError(): Partial<ConversationState> {
    this.loadFailed = false;
    return { error: undefined };
  }

  private clearLoadError(): Partial<ConversationState> {
    return this.loadFailed ? this.clearError() : {};
  }

  private publish(change: Partial<ConversationState>) {
    const turns = this.live ? [...this.history, this.live] : this.history;
    this.state.update((state) => ({ ...state, ...change, turns }));
  }
}

// What the page says of a request that failed: the server's message, or that it was not reached
// (fetch's own words differ by browser: "Failed to fetch", "NetworkError when ...").
export function unreachable(error: unknown): string {
  if (error instanceof ApiError) return messageOf(error);
  return `The server cannot be reached (${messageOf(error)})`;
}

export function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}
