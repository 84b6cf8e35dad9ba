// Trying a request again after the network failed or the server said it cannot serve now (it
// is restarting, or busy): after 1 s, then twice as long each time, at most 30 s apart.
import { ApiError } from "./api";

export function worthRetrying(error: unknown): boolean {
  return !(error instanceof ApiError) || error.status >= 500 || error.status === 429;
}

export class Backoff {
  private timer?: number;
  private delay = 0;

  // Calls `again` after the next delay, and returns that delay in seconds (for the message).
  schedule(again: () => void): number {
    window.clearTimeout(this.timer);
    this.delay = Math.min(Math.max(1000, this.delay * 2), 30_000);
    this.timer = window.setTimeout(again, this.delay);
    return this.delay / 1000;
  }

  // The request worked: the next failure waits 1 s again.
  reset() {
    this.delay = 0;
  }

  cancel() {
    window.clearTimeout(this.timer);
  }
}
