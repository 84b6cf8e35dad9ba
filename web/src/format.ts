// Numbers as people read them: sizes in binary units, durations in seconds or milliseconds.

export function size(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${bytes} B`;
  const digits = value >= 100 || Number.isInteger(value) ? 0 : 1;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

// "0.4 ms", "12 ms", "1.20 s"; from a minute on, whole minutes and seconds ("2 min", "2 min 5 s",
// "1 h 30 min"), not "120.00 s".
export function seconds(ms: number): string {
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  if (ms < 59_995) return `${(ms / 1000).toFixed(2)} s`;
  const total = Math.round(ms / 1000);
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor(total / 60) % 60;
  const rest = total % 60;
  if (hours > 0) return minutes > 0 ? `${hours} h ${minutes} min` : `${hours} h`;
  return rest > 0 ? `${minutes} min ${rest} s` : `${minutes} min`;
}

export function when(iso: string): string {
  const time = new Date(iso);
  const today = new Date();
  const sameDay = time.toDateString() === today.toDateString();
  return sameDay
    ? time.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : time.toLocaleDateString([], { month: "short", day: "numeric" });
}

// A table cell: floating-point noise (0.1 + 0.2) trimmed to 12 significant digits, integers as they are.
export function cell(value: unknown): string {
  if (typeof value === "number" && !Number.isInteger(value)) return String(Number(value.toPrecision(12)));
  return String(value);
}
