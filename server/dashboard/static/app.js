// The dashboard: sign in once (the key buys a session cookie), then poll the JSON API and draw.

import { lineChart, scatterChart } from "./charts.js";
import { ago, clock, count, credits, creditsShort, decimal, millis, percent, when } from "./format.js";

const POLL_MS = 1500;
const LIVE_HISTORY = 120; // samples of the live queue, about three minutes
const BLUE = "#2563eb", ORANGE = "#ea580c", GREEN = "#16a34a", GREY = "#64748b", PURPLE = "#7c3aed";

const $ = (id) => document.getElementById(id);
// `round` changes at every sign-in, sign-out and tab switch: an answer from an older round is
// dropped, so that exactly one polling loop runs.
const state = { me: null, view: null, round: 0, timer: null, live: { t: [], queue: [], inflight: [] } };

class SignedOut extends Error {}

async function api(path, options = {}) {
  const reply = await fetch(path, {
    credentials: "same-origin",
    cache: "no-store",
    ...options,
    headers: { Accept: "application/json", ...(options.headers || {}) },
  });
  if (reply.status === 401) throw new SignedOut();
  const body = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(body?.error?.message || `HTTP ${reply.status}`);
  return body;
}

function show(section) {
  for (const id of ["sign-in", "market", "account"]) $(id).hidden = id !== section;
  $("tabs").hidden = !(state.me && state.me.admin) || section === "sign-in";
  $("sign-out").hidden = section === "sign-in";
  $("tab-market").classList.toggle("active", section === "market");
  $("tab-account").classList.toggle("active", section === "account");
}

function signedOut(message) {
  clearTimeout(state.timer);
  state.round += 1;
  state.me = null;
  state.view = null;
  $("whoami").textContent = "";
  $("status").textContent = "signed out";
  $("sign-in-error").textContent = message || "";
  document.body.dataset.ready = "";
  show("sign-in");
  $("api-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const field = $("api-key");
  const key = field.value.trim();
  field.value = ""; // the key leaves the page with this one request and is not kept
  $("sign-in-error").textContent = "";
  try {
    await api("/v1/dashboard/session", { method: "POST", headers: { Authorization: `Bearer ${key}` } });
  } catch (error) {
    $("sign-in-error").textContent = error instanceof SignedOut ? "That key is not valid." : error.message;
    return;
  }
  await start();
}

async function signOut() {
  await fetch("/v1/dashboard/session", { method: "DELETE", credentials: "same-origin" });
  signedOut("Signed out.");
}

async function start() {
  try {
    state.me = await api("/v1/dashboard/session");
  } catch (error) {
    signedOut(error instanceof SignedOut ? "" : error.message);
    return;
  }
  $("whoami").textContent = `${state.me.user}${state.me.admin ? " (admin)" : ""}`;
  state.live = { t: [], queue: [], inflight: [] };
  open(state.me.admin ? "market" : "account");
}

function open(view) {
  clearTimeout(state.timer);
  state.round += 1;
  state.view = view;
  show(view);
  document.body.dataset.ready = "";
  poll();
}

async function poll() {
  const { view, round } = state;
  if (!view) return;
  try {
    const data = await api(view === "market" ? "/v1/dashboard/market" : "/v1/dashboard/account");
    if (round !== state.round) return;
    if (view === "market") drawMarket(data); else drawAccount(data);
    $("status").textContent = `updated ${clock(Date.now() / 1000)}`;
    $("status").classList.remove("stale");
    if (document.body.dataset.ready !== view) {
      document.body.dataset.readyMs = String(Math.round(performance.now()));
      document.body.dataset.ready = view;
    }
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (error) {
    if (round !== state.round) return;
    if (error instanceof SignedOut) { signedOut("Your session ended; sign in again."); return; }
    $("status").textContent = `not updated: ${error.message}`;
    $("status").classList.add("stale");
  }
  state.timer = setTimeout(poll, POLL_MS);
}

function setText(id, text) { $(id).textContent = text; }

function row(cells, classes = []) {
  const tr = document.createElement("tr");
  cells.forEach((cell, i) => {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    if (classes[i]) td.className = classes[i];
    tr.appendChild(td);
  });
  return tr;
}

function lastMinute(values, buckets) {
  // The mean of the per-bucket rates over the newest minute (the newest bucket still filling).
  const recent = values.slice(-buckets).map((v) => v ?? 0);
  return recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : null;
}

function drawMarket(data) {
  const s = data.series;
  const minute = Math.max(1, Math.round(60 / data.bucket_seconds));
  const now = Date.parse(data.now) / 1000;
  const domain = [s.t[0], s.t[s.t.length - 1] + data.bucket_seconds];
  setText("m-bucket", String(data.bucket_seconds));
  setText("m-replica", data.replicas.map((r) => r.name).join(", "));
  const tiers = data.pricing.tiers.map((t) => `${t.name} ${credits(t.price_micros)}`);
  const floor = data.pricing.price_floor_micros;
  const posted = floor === null || floor === undefined ? "" : ` · price floor ${credits(floor)} (aiming at ${data.pricing.price_floor_target} waiting)`;
  setText("m-pricing", data.pricing.mode + (tiers.length ? ` (${tiers.join(", ")})` : "") + posted);
  setText("m-queue", count(data.live.queue));
  setText("m-inflight", count(data.live.inflight));
  const t = data.totals;
  setText("m-requests", count(t.requests));
  setText("m-requests-sub", `${count(t.served)} served · ${count(t.failed)} failed · ${count(t.abandoned)} abandoned`);
  const rate = lastMinute(s.batches_per_second, minute);
  setText("m-rate", rate === null ? "–" : rate.toFixed(2));
  const revenue = lastMinute(s.revenue_micros_per_minute, minute);
  const welfare = lastMinute(s.welfare_micros_per_minute, minute);
  setText("m-revenue", revenue === null ? "–" : creditsShort(revenue));
  setText("m-welfare", welfare === null ? "–" : creditsShort(welfare));
  const hits = s.cache_hit_rate.filter((v) => v !== null);
  setText("m-cache", hits.length ? percent(hits.reduce((a, b) => a + b, 0) / hits.length) : "–");
  const ttft = s.ttft_mean_ms.filter((v) => v !== null);
  setText("m-ttft", ttft.length ? millis(ttft.reduce((a, b) => a + b, 0) / ttft.length) : "–");
  drawLedger(data.ledger);

  const live = state.live;
  live.t.push(now); live.queue.push(data.live.queue); live.inflight.push(data.live.inflight);
  for (const key of ["t", "queue", "inflight"]) live[key].splice(0, Math.max(0, live[key].length - LIVE_HISTORY));
  lineChart($("c-live"), {
    series: [
      { name: "waiting in the queue", color: BLUE, t: live.t, values: live.queue },
      { name: "at the engine", color: ORANGE, t: live.t, values: live.inflight },
    ],
    xDomain: [Math.min(live.t[0], now - 60), now], yFormat: (v) => count(v), yMax: 4,
  });
  const c = data.clearing;
  scatterChart($("c-clearing"), {
    x: c.priority, y: c.charge_micros, age: c.age_seconds, color: BLUE, maxAge: data.window_seconds,
    yFormat: creditsShort, xLabel: "charge (credits) ↑   priority →", empty: "no batches cleared in the last 15 minutes",
  });
  lineChart($("c-batches"), {
    series: [{ name: "batches / s", color: BLUE, t: s.t, values: s.batches_per_second }],
    xDomain: domain, yFormat: decimal, empty: "no batches yet",
  });
  lineChart($("c-sizes"), {
    series: [
      { name: "mean", color: BLUE, t: s.t, values: s.mean_batch_size },
      { name: "largest", color: GREY, t: s.t, values: s.largest_batch, dash: "4 3" },
    ],
    xDomain: domain, yFormat: (v) => count(v), empty: "no batches yet",
  });
  lineChart($("c-money"), {
    series: [
      { name: "revenue (VCG charges)", color: GREEN, t: s.t, values: s.revenue_micros_per_minute },
      ...(data.totals.fees_micros ? [{ name: "request fees", color: ORANGE, t: s.t, values: s.fees_micros_per_minute }] : []),
      ...(data.totals.floors_micros ? [{ name: "price floor", color: GREY, t: s.t, values: s.floors_micros_per_minute }] : []),
      { name: "welfare (reported value served)", color: PURPLE, t: s.t, values: s.welfare_micros_per_minute },
    ],
    xDomain: domain, yFormat: creditsShort, empty: "no batches yet",
  });
  lineChart($("c-cache"), {
    series: [{ name: "cache hit rate", color: GREEN, t: s.t, values: s.cache_hit_rate }],
    xDomain: domain, yFormat: (v) => `${Math.round(v * 100)}%`, yMax: 1, empty: "no served requests yet",
  });
  lineChart($("c-ttft"), {
    series: [
      { name: "TTFT mean", color: ORANGE, t: s.t, values: s.ttft_mean_ms },
      { name: "max", color: GREY, t: s.t, values: s.ttft_max_ms, dash: "4 3" },
    ],
    xDomain: domain, yFormat: (v) => millis(v), empty: "no served requests yet",
  });

  const spenders = data.top_spenders.map((u) => {
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("span");
    const share = u.budget_micros ? Math.min(1, u.spent_micros / u.budget_micros) : 0;
    fill.style.width = `${(share * 100).toFixed(1)}%`; // CSSOM, which the CSP allows
    if (share > 0.9) fill.className = "hot";
    bar.appendChild(fill);
    const label = u.budget_micros ? `${Math.round(share * 100)} % of ${u.period === "none" ? "lifetime" : u.period}` : "no budget";
    const cell = document.createElement("div");
    cell.append(bar, document.createTextNode(label));
    cell.className = "share";
    return row([u.user, credits(u.spent_micros), credits(u.budget_micros), cell], ["mono", "num mono", "num mono", ""]);
  });
  $("t-spenders").replaceChildren(...(spenders.length ? spenders : [row(["nobody has spent yet this period", "", "", ""])]));
  const squatters = (data.prefix_squatters ? data.prefix_squatters.accounts : []).map((s) => row(
    [s.user, count(s.under_others), count(s.low_bid_requests), count(s.other_users), count(s.batches)],
    ["mono", "num mono", "num mono", "num mono", "num mono"],
  ));
  $("t-squatters").replaceChildren(...(squatters.length ? squatters : [row(["none in the window", "", "", "", ""])]));
  $("t-replicas").replaceChildren(...data.replicas.map((r) => row(
    [`${r.name}${r.this ? " (this one)" : ""}`, r.up ? "up" : "DOWN", r.engine, count(r.queue), count(r.inflight)],
    ["mono", r.up ? "ok" : "bad", "", "num", "num"],
  )));
}

function drawLedger(ledger) {
  const rec = ledger.reconcile;
  let verdict = "checking…", cls = "";
  if (rec.error) { verdict = rec.error; cls = "bad"; }
  else if (rec.ok === true) { verdict = `balanced (${count(rec.accounts_checked)} accounts)`; cls = "ok"; }
  else if (rec.ok === false) { verdict = `DRIFT: ${rec.drifted_users.join(", ")}`; cls = "bad"; }
  $("h-reconcile").textContent = rec.finished_at ? `${verdict}, ${ago(rec.finished_at)}` : verdict;
  $("h-reconcile").className = cls;
  const holds = ledger.open_holds;
  $("h-holds").textContent = `${count(holds.count)} holding ${credits(holds.amount_micros)} credits` +
    (holds.oldest ? `, oldest placed ${ago(holds.oldest)}` : "");
  const failed = Object.entries(ledger.failed_writes).filter(([, n]) => n > 0);
  $("h-failed").textContent = failed.length ? failed.map(([op, n]) => `${op}: ${n}`).join(", ") : "none since start";
  $("h-failed").className = failed.length ? "bad" : "ok";
  const healthy = rec.ok !== false && !rec.error && !failed.length;
  setText("m-ledger", healthy ? "healthy" : "attention");
  $("m-ledger").className = `value ${healthy ? "ok" : "bad"}`;
  setText("m-ledger-sub", `${count(holds.count)} open holds`);
}

const PERIOD_NAMES = { none: "lifetime budget", day: "daily budget", week: "weekly budget", month: "monthly budget" };

function drawAccount(data) {
  const b = data.balance;
  setText("a-user", data.user);
  const period = PERIOD_NAMES[data.period] || `${data.period} budget`;
  const end = data.period_end ? ` to ${when(data.period_end)}` : "";
  setText("a-period", `${period} of ${credits(data.budget_micros)} credits · this period from ${when(data.period_start)}${end}`);
  setText("a-balance", credits(b.balance_micros));
  $("a-balance").dataset.micros = String(b.balance_micros);
  setText("a-held", credits(b.held_micros));
  setText("a-available", credits(b.available_micros));
  setText("a-spent", credits(b.spent_this_period_micros));
  setText("a-spent-sub", data.budget_micros ? `of ${creditsShort(data.budget_micros)} credits (${percent(b.spent_this_period_micros / data.budget_micros)})` : "credits");
  setText("a-requests", count(data.requests.total));
  setText("a-requests-sub", `${count(data.requests.served)} served · ${count(data.requests.failed)} failed · ${count(data.requests.abandoned)} abandoned`);
  const p = data.projection;
  // The server forecasts only from a few charges on: one charge is no rate, and no reason
  // to draw the budget as running out.
  const forecast = p && p.at_period_end_micros !== null;
  if (forecast) {
    setText("a-projection", credits(p.at_period_end_micros));
    setText("a-projection-sub", p.budget_runs_out_at ? `budget runs out ${when(p.budget_runs_out_at)}` : "within budget");
    $("a-projection").className = `value mono ${p.budget_runs_out_at ? "bad" : "ok"}`;
  } else {
    setText("a-projection", "–");
    const charges = p ? `${count(p.charges)} charge${p.charges === 1 ? "" : "s"} this period` : "";
    setText("a-projection-sub", p ? `too early to forecast: ${charges}` : "a lifetime budget has no period end");
    $("a-projection").className = "value mono";
  }
  const spend = data.spend;
  const series = [{ name: "spent", color: BLUE, t: spend.t, values: spend.spent_micros, width: 2.5 }];
  let domain = [spend.t[0], spend.t[spend.t.length - 1]];
  if (data.pace) {
    series.push({ name: "even pacing", color: GREY, t: data.pace.t, values: data.pace.spent_micros, dash: "2 3" });
    domain = data.pace.t;
  }
  if (data.pace && forecast) {
    // The projection is drawn up to twice the budget at most: early in a period a short burst
    // projects far beyond it, and the spend and pacing lines must stay readable.
    const [nowT, endT] = [spend.t[spend.t.length - 1], data.pace.t[1]];
    const spentNow = spend.spent_micros[spend.spent_micros.length - 1];
    const cap = Math.max(2 * data.budget_micros, spentNow);
    let [toT, toV] = [endT, p.at_period_end_micros];
    if (toV > cap && toV > spentNow) {
      toT = nowT + ((endT - nowT) * (cap - spentNow)) / (toV - spentNow);
      toV = cap;
    }
    series.push({ name: "at this rate", color: ORANGE, t: [nowT, toT], values: [spentNow, toV], dash: "6 4" });
  }
  lineChart($("c-spend"), { series, xDomain: domain, yFormat: creditsShort, empty: "nothing spent yet" });
  const c = data.clearing;
  scatterChart($("c-my-clearing"), {
    x: c.priority, y: c.charge_micros, age: c.age_seconds, color: PURPLE,
    maxAge: Math.max(60, ...c.age_seconds), yFormat: creditsShort, xLabel: "charge (credits) ↑   priority →",
    empty: "no batches yet",
  });
  // A user's batch total and refund are per batch: shown on its first row there only.
  const seen = new Set();
  const rows = data.recent.map((r) => {
    const first = !seen.has(r.batch_id);
    seen.add(r.batch_id);
    return row([
      clock(Date.parse(r.closed_at) / 1000), r.rid, `${r.position + 1} of ${r.batch_size}`,
      r.priority.toFixed(3), credits(r.bid_micros), credits(r.request_charge_micros),
      r.request_fee_micros ? credits(r.request_fee_micros) : "",
      first ? credits(r.batch_charge_micros) : "",
      first && r.batch_refund_micros ? credits(r.batch_refund_micros) : "", r.status,
      millis(r.ttft_ms), r.cached_tokens === null ? "–" : `${r.cached_tokens}/${r.prompt_tokens}`,
    ], ["", "mono", "num", "num mono", "num mono", "num mono", "num mono", "num mono", "num mono", r.status === "failed" ? "bad" : "", "num", "num"]);
  });
  $("t-recent").replaceChildren(...(rows.length ? rows : [row(["no requests settled yet"])]));
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("tab-market").addEventListener("click", () => open("market"));
  $("tab-account").addEventListener("click", () => open("account"));
  start();
});
