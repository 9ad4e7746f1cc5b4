// The conversation pages' DOM helpers. Every value from a run is put in the page as a
// text node (textContent), never parsed as markup: an agent reply holding "<script>"
// shows as those characters. Control characters and bidirectional overrides are shown
// as escapes, so a reply cannot make text read other than it is. (shell.py joins dom.js,
// conversation.js and app.js into the page's one script, in that order, in one scope.)
"use strict";

const PAGE_ROWS = 200; // table rows added at a time: a 10,000-case run opens at once
const POLL_MS = 1500; // how often a running run's page asks for its progress
const STATUS_ORDER = ["failed", "skipped", "passed"];
const UNSAFE =
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
// -- building the page ---------------------------------------------------------------

const shown = (value) =>
  (value === null || value === undefined ? "" : String(value)).replace(UNSAFE, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x100
      ? "\\x" + code.toString(16).padStart(2, "0")
      : "\\u" + code.toString(16).padStart(4, "0");
  });

// el("div", "class", child, ...): children are nodes, strings (as text), arrays, or null.
const el = (tag, cls, ...children) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  append(node, children);
  return node;
};
const append = (node, children) => {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(shown(child)));
  }
  return node;
};
// Links go only where this script points them (its own pages), never to a URL from data.
const link = (href, cls, ...children) => {
  const a = el("a", cls, ...children);
  a.href = href;
  return a;
};
// A link out of the page, to the trace UI agenttest is configured with (never to an
// address from a run's data): http(s) only, opened apart, telling it nothing of the page.
const outLink = (href, cls, ...children) => {
  if (!/^https?:\/\//i.test(href)) return el("span", cls, ...children);
  const a = el("a", cls, ...children);
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  return a;
};
const badge = (status) => el("span", `badge ${statusClass(status)}`, String(status).toUpperCase());
const statusClass = (status) => (STATUS_ORDER.includes(status) ? status : "other");
const json = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));
const pre = (cls, text) => el("pre", cls, text);
const field = (label, value) => el("span", "field", el("span", "label", label), " ", value);

const seconds = (s) => {
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${s.toFixed(1)}s`;
  if (s < 3600) {
    const m = Math.floor(Math.round(s) / 60);
    return `${m}m${String(Math.round(s) % 60).padStart(2, "0")}s`;
  }
  const h = Math.floor(Math.round(s) / 3600);
  return `${h}h${String(Math.floor((Math.round(s) % 3600) / 60)).padStart(2, "0")}m`;
};
const ms = (value) => seconds((value || 0) / 1000);
const number = (value) => (value || 0).toLocaleString("en-US");
const money = (value) => `$${(value || 0).toFixed(4)}`;
const percent = (value) => (value === null || value === undefined ? "–" : `${(value * 100).toFixed(1)}%`);
