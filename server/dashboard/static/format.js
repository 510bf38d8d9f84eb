// Formatting for the dashboard. Money arrives as integer micro-credits and is shown exactly.

const MICROS = 1_000_000;

/** Micro-credits as credits with all six decimals: 1500000 -> "1.500000". */
export function credits(micros) {
  const sign = micros < 0 ? "-" : "";
  const abs = Math.abs(micros);
  const whole = Math.floor(abs / MICROS);
  const frac = String(abs % MICROS).padStart(6, "0");
  return `${sign}${whole.toLocaleString("en-US")}.${frac}`;
}

/** Micro-credits rounded for axes and tiles: "12.3", "0.0042". */
export function creditsShort(micros) {
  const value = micros / MICROS;
  const abs = Math.abs(value);
  if (abs === 0) return "0";
  if (abs >= 1000) return value.toLocaleString("en-US", { maximumFractionDigits: 0 });
  if (abs >= 1) return value.toLocaleString("en-US", { maximumFractionDigits: 2 });
  return String(Number(value.toPrecision(3)));
}

/** A plain number for an axis, with the decimals its tick needs: 0.25 stays "0.25". */
export function decimal(value) {
  return value.toLocaleString("en-US", { maximumFractionDigits: 3 });
}

export function percent(rate) {
  return rate === null || rate === undefined ? "–" : `${(rate * 100).toFixed(1)} %`;
}

export function millis(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(1)} ms`;
}

export function clock(epochSeconds) {
  const d = new Date(epochSeconds * 1000);
  return d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

/** An axis label: a date for long spans, seconds when ticks are less than a minute apart. */
export function shortTime(epochSeconds, spanSeconds, stepSeconds = 60) {
  const d = new Date(epochSeconds * 1000);
  if (spanSeconds > 2 * 86400) {
    return d.toLocaleDateString("en-GB", { day: "numeric", month: "short" });
  }
  if (stepSeconds < 60) return clock(epochSeconds);
  return d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
}

/** A moment as "11 Dec, 06:00": unambiguous in every locale. */
export function when(iso) {
  const d = new Date(iso);
  const day = d.toLocaleDateString("en-GB", { day: "numeric", month: "short" });
  const time = d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
  return `${day}, ${time}`;
}

export function ago(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

export function count(n) {
  return n.toLocaleString("en-US");
}
