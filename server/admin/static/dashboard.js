// kvstore dashboard: polls /v1/stats and /v1/stats/history (same origin, same credentials as
// the page) and draws with the canvas API. No build step, no dependencies. Each chart's
// element carries data-points (how many values it shows), so tests can read the DOM.
// The page's Content-Security-Policy allows only this script and dashboard.css: styles are
// set through the CSSOM (element.style), never as a style attribute, which the CSP blocks.
"use strict";
const COLORS = ["#3b7dd8", "#d8643b", "#2f9e5b", "#9b4dca", "#c9a227", "#17a2b8", "#e83e8c"];
const REFRESH_MS = 2000;

function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(Math.round(n))) + " " + u[i];
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
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

// series: [{name, values: [number|null]}], times: [unix seconds]
function drawLines(id, times, series, fmt, yMax) {
  const c = document.getElementById(id);
  const g = c.getContext("2d");
  const W = c.width, H = c.height, L = 56, R = 8, T = 8, B = 22;
  g.clearRect(0, 0, W, H);
  let max = yMax || 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  if (!max) max = 1;
  g.strokeStyle = "#e6e9ef"; g.fillStyle = "#8a93a6"; g.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = T + ((H - T - B) * i) / 4;
    g.beginPath(); g.moveTo(L, y); g.lineTo(W - R, y); g.stroke();
    g.fillText(fmt(max * (1 - i / 4)), 2, y + 4);
  }
  const n = times.length;
  const x = (i) => L + (n > 1 ? ((W - L - R) * i) / (n - 1) : 0);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  let points = 0;
  series.forEach((s, si) => {
    g.strokeStyle = COLORS[si % COLORS.length]; g.lineWidth = 2; g.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      points++;
      if (pen) g.lineTo(x(i), y(v)); else g.moveTo(x(i), y(v));
      pen = true;
    });
    g.stroke();
  });
  if (n) g.fillText(`last ${Math.round(times[n - 1] - times[0])} s`, L, H - 6);
  c.dataset.points = String(points);
  const legend = document.getElementById(id + "-legend");
  legend.replaceChildren(...series.map((s, si) => {
    const span = el("span");
    const swatch = el("i");
    swatch.style.background = COLORS[si % COLORS.length];
    span.append(swatch, s.name);
    return span;
  }));
}

function drawHistory(hist) {
  const pts = hist.points;
  const times = pts.map((p) => p.at);
  const tiers = pts.length ? Object.keys(pts[pts.length - 1].tiers) : [];
  const hit = tiers.map((t) => ({ name: t, values: pts.map((p) => p.tiers[t] ? p.tiers[t].hit_rate : null) }));
  hit.push({ name: "lookups", values: pts.map((p) => p.lookup_hit_rate) });
  drawLines("hitrate", times, hit, (v) => (100 * v).toFixed(0) + " %", 1);
  const paths = new Set();
  for (const p of pts) for (const k of Object.keys(p.copies_bytes_per_s)) paths.add(k);
  const bw = [...paths].sort().map((k) => ({ name: k.replace("->", " → "), values: pts.map((p) => p.copies_bytes_per_s[k] || 0) }));
  for (const t of tiers) {
    bw.push({ name: `into ${t}`, values: pts.map((p) => p.tiers[t] ? p.tiers[t].bytes_in_per_s : null) });
  }
  drawLines("bandwidth", times, bw, (v) => fmtBytes(v) + "/s");
}

function fillTable(id, rows) {
  const table = document.getElementById(id);
  table.tBodies[0].replaceChildren(...rows);
  table.dataset.points = String(rows.length);
}

function drawNamespaces(stats) {
  fillTable("namespaces", stats.namespaces.map((n) => {
    const tr = el("tr");
    const name = el("td");
    name.append(el("code", {}, n.namespace_id.slice(0, 16) + "…"));
    if (n.label) name.append(" " + n.label);
    tr.append(name, el("td", {}, Object.entries(n.pages).map(([t, c]) => `${t}: ${c}`).join(", ")),
      el("td", { class: "num" }, fmtBytes(n.bytes)), el("td", { class: "num" }, String(n.stored_pages)),
      el("td", { class: "num" }, String(n.removed_pages)),
      el("td", { class: "num" }, n.hit_rate_1m === null ? "—" : (100 * n.hit_rate_1m).toFixed(1) + " %"));
    return tr;
  }));
}

function drawRemovals(stats) {
  fillTable("removals", stats.recent_removals.slice(0, 15).map((r) => {
    const tr = el("tr");
    tr.append(el("td", {}, new Date(r.at * 1000).toLocaleTimeString()), el("td", {}, r.tier),
      el("td", { class: "num" }, String(r.pages)),
      el("td", {}, r.namespace_ids.map((n) => n.slice(0, 8)).join(", ") || "—"));
    return tr;
  }));
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [stats, hist] = await Promise.all([getJSON("/v1/stats"), getJSON("/v1/stats/history")]);
    drawOccupancy(stats);
    drawHistory(hist);
    drawNamespaces(stats);
    drawRemovals(stats);
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    status.textContent = "updated " + new Date(stats.at * 1000).toLocaleTimeString();
  } catch (err) {
    status.textContent = "error: " + err.message;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
