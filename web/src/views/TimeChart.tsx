// Steps over time drawn by uPlot: one point per step at the time it started, a series per
// measure; a series with a value only now and then (OOM kills) shows only there.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

import type { Exec } from "../api";

export interface Series {
  label: string;
  value: (exec: Exec) => number | null;
  color: string;
  scale?: string;  // a second y axis (e.g. "ms")
  line?: boolean;  // a dashed line (a limit) instead of a point per step
  ring?: boolean;  // rings, so a dot of the same value drawn after them (CPU on run) still shows both
  size?: number;  // a dot's diameter in pixels (7): smaller for one drawn over another, larger
  // for marks where a series has a value only now and then (OOM kills)
}

// How a series' points are drawn, and its marker in the legend the same: a ring is hollow, a
// dot filled, a limit a dashed line.
function points(s: Series): uPlot.Series.Points {
  if (s.line) return { show: false };
  if (s.ring) return { show: true, size: 11, width: 2, stroke: s.color, fill: "transparent" };
  return { show: true, size: s.size ?? 7, width: 0, fill: s.color };
}
const markerFill = (s: Series) => (s.line || s.ring ? "transparent" : s.color);

// Tick labels with as many decimals as the step between ticks needs (0.0003 s, not 0).
function tickValues(_chart: uPlot, splits: number[]): string[] {
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 0;
  let decimals = 0;
  while (decimals < 6 && Math.abs(step * 10 ** decimals - Math.round(step * 10 ** decimals)) > 1e-9) decimals++;
  return splits.map((split) => split.toFixed(decimals));
}

// Room for the longest tick label (uPlot's default, 50 px, cuts "0.0004").
function tickSize(_chart: uPlot, values: string[] | null): number {
  const longest = Math.max(0, ...(values ?? []).map((value) => value.length));
  return Math.max(50, longest * 8 + 18);
}

export function TimeChart({ title, execs, series }: { title: string; execs: Exec[]; series: Series[] }) {
  const element = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const container = element.current;
    if (!container) return;
    const times = execs.map((exec) => Date.parse(exec.started_at) / 1000);
    // Time padded so no step sits on an edge; steps all at one moment get a minute around it
    // (uPlot would show a day from it).
    const first = Math.min(...times);
    const last = Math.max(...times);
    const pad = first === last ? 30 : Math.max((last - first) * 0.05, 30);
    const span: [number, number] = [first - pad, last + pad];
    // A limit is a line from edge to edge, not only between the first step and the last: it has
    // a value at both edges, where the steps' series have none.
    const edge = (s: Series, exec: Exec) => (s.line ? s.value(exec) : null);
    const data: uPlot.AlignedData =
      execs.length === 0
        ? [[], ...series.map(() => [])]
        : [
            [span[0], ...times, span[1]],
            ...series.map((s) => [edge(s, execs[0]), ...execs.map((exec) => s.value(exec)), edge(s, execs[execs.length - 1])]),
          ];
    const secondScale = series.find((s) => s.scale)?.scale;
    // From zero, with room above the highest point.
    const fromZero: uPlot.Scale.Range = (_chart, _min, max) => [0, max > 0 ? max * 1.15 : 1];
    const scales: uPlot.Scales = {
      x: { time: true, range: (_chart, min, max) => (execs.length > 0 ? span : [min, max]) },
      y: { range: fromZero },
    };
    if (secondScale) scales[secondScale] = { range: fromZero };
    const options: uPlot.Options = {
      title,
      width: Math.max(280, container.clientWidth),
      height: 220,
      // Room on the right for half of the last time label when no axis is there to give it.
      padding: [null, secondScale ? null : 40, null, null],
      scales,
      axes: [
        // Clock times, one line each (uPlot's default adds a date line whose labels collide).
        {
          space: 70,
          values: (_chart: uPlot, splits: number[]) =>
            splits.map((split) => new Date(split * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })),
        },
        { scale: "y", values: tickValues, size: tickSize },
        ...(secondScale
          ? [{ scale: secondScale, side: 1 as const, grid: { show: false }, values: tickValues, size: tickSize }]
          : []),
      ],
      series: [
        {},
        // A step is a point in time, not a sample of a curve: points only, but for limits.
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          scale: s.scale ?? "y",
          dash: s.line ? [6, 4] : undefined,
          width: s.line ? 1.5 : 0,
          points: points(s),
          paths: s.line ? undefined : () => null,
        })),
      ],
      legend: {
        markers: {
          stroke: (_chart: uPlot, index: number) => series[index - 1].color,
          fill: (_chart: uPlot, index: number) => markerFill(series[index - 1]),
          dash: (_chart: uPlot, index: number) => (series[index - 1].line ? "dashed" : "solid"),
        },
      },
    };
    const chart = new uPlot(options, data, container);
    const resize = new ResizeObserver(() => chart.setSize({ width: Math.max(280, container.clientWidth), height: 220 }));
    resize.observe(container);
    return () => {
      resize.disconnect();
      chart.destroy();
    };
  }, [execs, series, title]);
  return <div class="chart" ref={element} role="img" aria-label={title} />;
}
