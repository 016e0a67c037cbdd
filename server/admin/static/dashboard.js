// kvstore dashboard: polls /v1/stats and /v1/stats/history?window_s=… (same origin, same
// credentials as the page) and draws with the canvas API. No build step, no dependencies.
// Each chart's and table's element carries data-points (how many values it shows), so tests can
// read the DOM; the charts' x range is also in the DOM (#xrange, data-x-range).
// The page's Content-Security-Policy allows only this script and dashboard.css: styles are
// set through the CSSOM (element.style), never as a style attribute, which the CSP blocks.
"use strict";
// Tableau 10: distinguishable from each other, and on white
const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac"];
const HIT = "#59a14f", MISS = "#e15759";
const REFRESH_MS = 2000;
// the time windows the selector offers (seconds -> label); the sampler keeps an hour
const WINDOWS = new Map([[60, "1 m"], [600, "10 m"], [3600, "1 h"]]);
const DEFAULT_WINDOW_S = 600;
let windowS = DEFAULT_WINDOW_S;
let generation = 0;  // a refresh whose answer arrives after a newer one started is dropped

function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + u[i];
}

function fmtCount(n) {
  return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e4 ? (n / 1e3).toFixed(0) + "k" : String(Math.round(n));
}

function fmtRate(r) { return r === null || r === undefined ? "—" : (100 * r).toFixed(1) + " %"; }

function fmtTime(unix) { return new Date(unix * 1000).toLocaleTimeString(); }

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// A namespace id in full: the cell shows its start (CSS ellipsis), the title the whole id, and
// one click selects all of it for copying. Labels arrive in the namespaces table's own column.
function nsId(hex) {
  return el("code", { class: "nsid", title: hex }, hex);
}

async function getJSON(path) {
  // location.origin: never the user:token@ of a URL the page was opened with (fetch refuses it)
  const r = await fetch(location.origin + path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function drawOccupancy(stats) {
  const box = document.getElementById("occupancy");
  box.replaceChildren();
  for (const t of stats.tiers) {
    const row = el("div", { class: "row", "data-tier": t.name });
    row.append(el("div", {}, `${t.name} (${t.kind}, ${t.policy})`));
    const track = el("div", { class: "track" });
    const pct = t.capacity_pages ? (100 * t.used_pages) / t.capacity_pages : 0;
    const fill = el("div", { class: "fill" });
    fill.style.width = `${pct.toFixed(1)}%`;
    track.append(fill);
    row.append(track);
    row.append(el("div", {}, `${t.used_pages} / ${t.capacity_pages} pages · ${fmtBytes(t.used_bytes)}`));
    box.append(row);
  }
  box.dataset.points = String(stats.tiers.length);
}

// The frame every chart shares: y grid and labels, x ticks relative to the window's end, and
// the part of the window before the first sample shaded (the daemon had not sampled it yet).
// Returns the mapping from (unix time, value) to canvas pixels.
function frame(c, x0, x1, max, fmt, firstAt) {
  const g = c.getContext("2d");
  const W = c.width, H = c.height, L = 60, R = 10, T = 8, B = 22;
  g.clearRect(0, 0, W, H);
  const x = (t) => L + ((W - L - R) * (t - x0)) / (x1 - x0);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const start = firstAt === undefined ? x1 : Math.max(firstAt, x0);
  if (start > x0) {
    g.fillStyle = "#eef0f4";
    g.fillRect(L, T, x(start) - L, H - T - B);
    g.fillStyle = "#8a93a6"; g.font = "11px system-ui";
    if (x(start) - L > 90) g.fillText("no samples", L + 6, T + 14);
  }
  g.strokeStyle = "#e6e9ef"; g.fillStyle = "#5f6878"; g.font = "11px system-ui"; g.lineWidth = 1;
  g.setLineDash([]);
  for (let i = 0; i <= 4; i++) {
    const yy = T + ((H - T - B) * i) / 4;
    g.beginPath(); g.moveTo(L, yy); g.lineTo(W - R, yy); g.stroke();
    g.fillText(fmt(max * (1 - i / 4)), 2, yy + 4);
  }
  const span = x1 - x0, unit = span > 120 ? 60 : 1, suffix = span > 120 ? " m" : " s";
  for (let i = 0; i <= 4; i++) {
    const t = x0 + (span * i) / 4, xx = x(t);
    g.beginPath(); g.moveTo(xx, H - B); g.lineTo(xx, H - B + 4); g.stroke();
    const label = i === 4 ? "now" : "−" + String(+((span * (4 - i)) / 4 / unit).toFixed(1)) + suffix;
    const w = g.measureText(label).width;
    g.fillText(label, Math.min(Math.max(xx - w / 2, L), W - R - w), H - 6);
  }
  c.dataset.xRange = `${Math.round(span)} s`;
  return { g, x, y, W, H, L, R, T, B };
}

// series: [{name, values: [number|null], dashed}], times: [unix seconds], drawn over [x0, x1].
// Solid series first, dashed ones on top, so a copy path that equals a tier's input (write_back
// -> disk and "into disk") shows both colours instead of one line hiding the other.
function drawLines(id, times, series, fmt, x0, x1) {
  const c = document.getElementById(id);
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  if (!max) max = 1;
  const { g, x, y } = frame(c, x0, x1, max, fmt, times[0]);
  let points = 0;
  const order = series.map((s, si) => [s, si]).sort((a, b) => Number(a[0].dashed) - Number(b[0].dashed));
  for (const [s, si] of order) {
    g.strokeStyle = COLORS[si % COLORS.length];
    g.lineWidth = s.dashed ? 2 : 3;
    g.setLineDash(s.dashed ? [7, 5] : []);
    g.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || times[i] < x0) { pen = false; return; }
      points++;
      if (pen) g.lineTo(x(times[i]), y(v)); else g.moveTo(x(times[i]), y(v));
      pen = true;
    });
    g.stroke();
  }
  g.setLineDash([]);
  c.dataset.points = String(points);
  const legend = document.getElementById(id + "-legend");
  legend.replaceChildren(...series.map((s, si) => {
    const span = el("span", { "data-style": s.dashed ? "dashed" : "solid" });
    const swatch = el("i");
    swatch.style.borderTop = `3px ${s.dashed ? "dashed" : "solid"} ${COLORS[si % COLORS.length]}`;
    span.append(swatch, s.name);
    return span;
  }));
}

// Lookups per sample as stacked bars (found blocks below, missed above), and the window's hit
// rate in the card's summary line: an idle store shows the window's earlier lookups, not nothing.
function drawLookups(hist, x0, x1) {
  const c = document.getElementById("hitrate");
  const pts = hist.points;
  let max = 0;
  for (const p of pts) max = Math.max(max, p.lookup_hit_blocks + p.lookup_miss_blocks);
  if (!max) max = 1;
  const { g, x, y } = frame(c, x0, x1, max, fmtCount, pts.length ? pts[0].at - hist.interval_s : undefined);
  const bw = Math.max(1, ((c.width - 70) * hist.interval_s) / (x1 - x0) - 1);
  let points = 0;
  for (const p of pts) {
    const hit = p.lookup_hit_blocks, miss = p.lookup_miss_blocks;
    if (!(hit + miss)) continue;
    points++;
    const left = x(p.at) - bw;
    g.fillStyle = HIT; g.fillRect(left, y(hit), bw, y(0) - y(hit));
    g.fillStyle = MISS; g.fillRect(left, y(hit + miss), bw, y(hit) - y(hit + miss));
  }
  c.dataset.points = String(points);
  const w = hist.window;
  const looked = w.lookup_hit_blocks + w.lookup_miss_blocks;
  const summary = document.getElementById("hitrate-summary");
  summary.replaceChildren();
  const rate = el("strong", {}, fmtRate(w.lookup_hit_rate));
  summary.append(`Lookup hit rate, last ${WINDOWS.get(windowS)}: `, rate,
    looked ? ` (${fmtCount(w.lookup_hit_blocks)} of ${fmtCount(looked)} blocks found)` : " (no lookups in this window)");
  const tiers = Object.entries(w.tier_hit_rate).map(([t, r]) => `${t} ${fmtRate(r)}`).join(" · ");
  if (tiers) summary.append(el("br"), el("span", { class: "muted", title: "pages a tier returned / pages read from it, over the window" }, "tier reads found: " + tiers));
  const legend = document.getElementById("hitrate-legend");
  legend.replaceChildren(...[["blocks found", HIT], ["blocks missed", MISS]].map(([name, color]) => {
    const span = el("span");
    const swatch = el("i");
    swatch.style.borderTop = `10px solid ${color}`;
    span.append(swatch, name);
    return span;
  }));
}

function drawHistory(hist) {
  const x1 = hist.window.end, x0 = x1 - hist.window_s;
  const xr = document.getElementById("xrange");
  xr.textContent = `last ${WINDOWS.get(windowS)}: ${fmtTime(x0)} – ${fmtTime(x1)}`;
  xr.dataset.windowS = String(hist.window_s);
  drawLookups(hist, x0, x1);
  const pts = hist.points;
  const times = pts.map((p) => p.at);
  const tiers = pts.length ? Object.keys(pts[pts.length - 1].tiers) : [];
  const paths = new Set();
  for (const p of pts) for (const k of Object.keys(p.copies_bytes_per_s)) paths.add(k);
  const bw = tiers.map((t) => ({ name: `written into ${t}`, dashed: false,
    values: pts.map((p) => p.tiers[t] ? p.tiers[t].bytes_in_per_s : null) }));
  for (const k of [...paths].sort()) {
    bw.push({ name: "copy " + k.replace("->", " → "), dashed: true,
      values: pts.map((p) => p.copies_bytes_per_s[k] || 0) });
  }
  drawLines("bandwidth", times, bw, (v) => fmtBytes(v) + "/s", x0, x1);
}

function fillTable(id, rows) {
  const table = document.getElementById(id);
  table.tBodies[0].replaceChildren(...rows);
  table.dataset.points = String(rows.length);
}

function drawNamespaces(stats) {
  fillTable("namespaces", stats.namespaces.map((n) => {
    const tr = el("tr");
    const id = el("td");
    id.append(nsId(n.namespace_id));
    const label = n.label ? el("td", { class: "label" }, n.label) : el("td", { class: "label muted" }, "—");
    tr.append(id, label, el("td", {}, Object.entries(n.pages).map(([t, c]) => `${t}: ${c}`).join(", ")),
      el("td", { class: "num" }, fmtBytes(n.bytes)), el("td", { class: "num" }, String(n.stored_pages)),
      el("td", { class: "num" }, String(n.removed_pages)),
      el("td", { class: "num" }, fmtRate(n.hit_rate_1m)));
    return tr;
  }));
}

// Consecutive removals (newest first) from the same tier become one group: its time range,
// how many events and pages, and the namespaces involved.
function groupRemovals(removals) {
  const groups = [];
  for (const r of removals) {
    const g = groups[groups.length - 1];
    if (g && g.tier === r.tier) {
      g.first = r.at; g.events++; g.pages += r.pages;
      for (const n of r.namespace_ids) g.namespaces.add(n);
    } else {
      groups.push({ tier: r.tier, first: r.at, last: r.at, events: 1, pages: r.pages,
        namespaces: new Set(r.namespace_ids) });
    }
  }
  return groups;
}

const NS_SHOWN = 3;

function drawRemovals(stats) {
  const groups = groupRemovals(stats.recent_removals).slice(0, 12);
  fillTable("removals", groups.map((gr) => {
    const tr = el("tr", { "data-events": String(gr.events) });
    const when = gr.first === gr.last ? fmtTime(gr.last) : `${fmtTime(gr.first)} – ${fmtTime(gr.last)}`;
    const ns = el("td");
    const ids = [...gr.namespaces];
    if (!ids.length) ns.append("—");
    else {
      ns.append(`${ids.length}: `);
      ids.slice(0, NS_SHOWN).forEach((n, i) => { if (i) ns.append(" "); ns.append(nsId(n)); });
      if (ids.length > NS_SHOWN) ns.append(el("span", { class: "muted", title: ids.slice(NS_SHOWN).join("\n") }, ` +${ids.length - NS_SHOWN} more`));
    }
    tr.append(el("td", {}, when), el("td", {}, gr.tier), el("td", { class: "num" }, String(gr.events)),
      el("td", { class: "num" }, String(gr.pages)), ns);
    return tr;
  }));
  document.getElementById("removals").dataset.events = String(groups.reduce((a, g) => a + g.events, 0));
}

async function refresh() {
  const status = document.getElementById("status");
  const mine = ++generation;
  try {
    const [stats, hist] = await Promise.all([getJSON("/v1/stats"), getJSON(`/v1/stats/history?window_s=${windowS}`)]);
    if (mine !== generation) return;
    drawOccupancy(stats);
    drawHistory(hist);
    drawNamespaces(stats);
    drawRemovals(stats);
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    status.textContent = "updated " + fmtTime(stats.at);
  } catch (err) {
    if (mine === generation) status.textContent = "error: " + err.message;
  }
}

// The window selector; the page's address keeps the choice (#window=60), so a link or a reload
// shows the same window. Opening such an address sets the selector and fires its change event.
function setupWindow() {
  const select = document.getElementById("window");
  select.addEventListener("change", () => {
    windowS = Number(select.value);
    document.body.dataset.window = select.value;
    history.replaceState(null, "", "#window=" + select.value);
    refresh();
  });
  const fromHash = () => {
    const m = /window=(\d+)/.exec(location.hash);
    const want = m && WINDOWS.has(Number(m[1])) ? m[1] : String(DEFAULT_WINDOW_S);
    if (want !== select.value || want !== document.body.dataset.window) {
      select.value = want;
      select.dispatchEvent(new Event("change"));
    }
  };
  window.addEventListener("hashchange", fromHash);
  fromHash();
}

setupWindow();
setInterval(refresh, REFRESH_MS);
