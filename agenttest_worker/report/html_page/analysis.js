// The analysis pages: the runs with each suite's trend, two runs compared, one case of
// both side by side; and the HTML report's section on what changed since its baseline.

const SVG = "http://www.w3.org/2000/svg";
const svg = (tag, attrs, ...children) => {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  append(node, children);
  return node;
};
// A table in a box of its own that scrolls sideways on a narrow screen (the page does not).
const wrapped = (table) => (table ? el("div", "table-wrap", table) : null);
const runHref = (id) => `/runs/${encodeURIComponent(id)}`;
const pairHref = (a, b, id) => `/compare/case?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}&id=${encodeURIComponent(id)}`;

// -- trends ------------------------------------------------------------------------

const CHART = { w: 300, h: 110, left: 34, right: 8, top: 10, bottom: 18 };

// One small chart of `points` (oldest first): `value(p)` on a scale up to `top`, and
// for the pass rate the interval of a repeated run as a bar around its point.
const chart = (cls, title, points, value, top, format, interval) => {
  const { w, h, left, right, top: up, bottom } = CHART;
  const x = (i) => left + (points.length === 1 ? (w - left - right) / 2 : (i * (w - left - right)) / (points.length - 1));
  const y = (v) => up + (1 - (top ? v / top : 0)) * (h - up - bottom);
  const shapes = [
    svg("line", { x1: left, y1: y(0), x2: w - right, y2: y(0), class: "axis" }),
    svg("text", { x: left - 4, y: y(top) + 4, class: "tick", "text-anchor": "end" }, format(top)),
    svg("text", { x: left - 4, y: y(0) + 4, class: "tick", "text-anchor": "end" }, format(0)),
  ];
  const drawn = points.map((p, i) => [i, value(p)]).filter(([, v]) => v !== null && v !== undefined);
  if (drawn.length > 1) shapes.push(svg("polyline", { points: drawn.map(([i, v]) => `${x(i)},${y(v)}`).join(" "), class: "line" }));
  for (const [i, v] of drawn) {
    const p = points[i];
    if (interval && p.low !== undefined) shapes.push(svg("line", { x1: x(i), y1: y(p.low), x2: x(i), y2: y(p.high), class: "interval" }));
    const said = `${p.id} (${p.created_at}): ${format(v)}` + (interval && p.low !== undefined ? `, 95% interval ${format(p.low)}–${format(p.high)} over ${p.total} repetitions` : "");
    const dot = svg("circle", { cx: x(i), cy: y(v), r: 3.5, class: "point" }, svg("title", null, said));
    dot.dataset.run = p.id;
    shapes.push(dot);
  }
  const drawing = svg("svg", { viewBox: `0 0 ${w} ${h}`, class: `trend ${cls}`, role: "img", "aria-label": `${title}, ${points.length} runs` }, ...shapes);
  const last = drawn.length ? format(drawn[drawn.length - 1][1]) : "–";
  return el("figure", "chart", el("figcaption", null, `${title} `, el("span", "dim", `latest ${last}`)), drawing);
};

const trendSection = (points) => {
  if (!points || !points.length) return null;
  const maxCost = Math.max(...points.map((p) => p.cost || 0));
  const maxFlaky = Math.max(...points.map((p) => p.flaky || 0));
  const repeated = points.some((p) => p.repeated);
  return el(
    "div",
    "trends",
    chart("trend-rate", repeated ? "Pass rate (of repetitions)" : "Pass rate", points, (p) => p.rate, 1, (v) => `${Math.round(v * 100)}%`, true),
    chart("trend-cost", "Cost", points, (p) => p.cost || 0, maxCost || 1, (v) => `$${v.toFixed(v && v < 1 ? 3 : 2)}`, false),
    chart("trend-flaky", "Flaky cases", points, (p) => p.flaky || 0, Math.max(maxFlaky, 1), (v) => String(Math.round(v)), false),
  );
};

// -- the runs page -------------------------------------------------------------------

const runsPage = async (app) => {
  const { groups } = await getJSON("/api/runs");
  const picked = [];
  const go = el("button", "compare-go", "Compare");
  go.type = "button";
  go.id = "compare-go";
  go.disabled = true;
  const said = el("span", "dim", "Tick two runs (of any suites or agents) to compare them.");
  const bar = el("div", "pick-bar", go, " ", said);
  const boxes = [];
  const update = () => {
    go.disabled = picked.length !== 2;
    said.textContent = picked.length === 2 ? shown(`${picked[0].id} | ${picked[1].id}`) : "Tick two runs (of any suites or agents) to compare them.";
  };
  go.addEventListener("click", () => {
    // The older one first: then | now.
    const [a, b] = [...picked].sort((p, q) => COLLATOR.compare(`${p.created_at} ${p.id}`, `${q.created_at} ${q.id}`));
    window.location.assign(`/compare?a=${encodeURIComponent(a.id)}&b=${encodeURIComponent(b.id)}`);
  });
  const pickBox = (r) => {
    const box = el("input", "pick");
    box.type = "checkbox";
    box.dataset.runId = r.id;
    box.setAttribute("aria-label", `pick run ${shown(r.id)}`);
    box.addEventListener("change", () => {
      if (box.checked) {
        picked.push(r);
        // A third pick lets go of the first.
        if (picked.length > 2) {
          const dropped = picked.shift();
          for (const other of boxes) if (other.dataset.runId === dropped.id) other.checked = false;
        }
      } else picked.splice(picked.findIndex((p) => p.id === r.id), 1);
      update();
    });
    boxes.push(box);
    return box;
  };
  const sections = groups.map((group) => {
    const head = el("tr", null, ["pick", "run", "status", "created", "agent", "cases", "passed", "failed", "skipped", "cost"].map((h) => el("th", null, h)));
    const rows = group.runs.map((r) =>
      el("tr", `run-row ${r.status}`, el("td", null, pickBox(r)), el("td", "id", link(runHref(r.id), null, r.id)), el("td", null, r.status + (r.cancelled ? " (cancelled)" : "")), el("td", null, r.created_at || ""), el("td", null, r.agent || ""), el("td", "num", r.finished_cases < r.total_cases ? `${r.cases} (${r.finished_cases}/${r.total_cases} ${r.unit} finished)` : r.cases), el("td", "num passed", String(r.passed)), el("td", "num failed", String(r.failed)), el("td", "num skipped", String(r.skipped)), el("td", "num cost", money(r.cost))),
    );
    return el("section", "suite", el("h2", null, group.name || "(no suite)"), trendSection(group.trend), wrapped(el("table", "runs", el("thead", null, head), el("tbody", null, rows))));
  });
  app.replaceChildren(el("header", "run-header", el("h1", null, "agenttest runs")), ...(sections.length ? [bar, ...sections] : [el("p", "note", "No runs yet.")]));
  sortTables(app);
  document.title = "agenttest · runs";
  if (groups.some((g) => g.runs.some((r) => r.status !== "done" && !r.cancelled))) setTimeout(() => runsPage(app), POLL_MS * 2);
};

// -- two runs compared ---------------------------------------------------------------

const sideFacts = (label, run) => field(label, [link(runHref(run.id), null, run.id), ` ${run.agent ? `(${run.agent}) ` : ""}${run.created_at}`]);

// `run`: two targets of that run compared (a and b are their names), else two runs.
const comparePage = async (app, a, b, run) => {
  const ofRun = run ? `&run=${encodeURIComponent(run)}` : "";
  const found = await getJSON(`/api/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}${ofRun}`, true);
  const parts = [];
  if (!found.cases) {
    app.replaceChildren(el("header", "run-header", el("h1", null, "Compare two runs")), el("p", "note", found.message || "Nothing to compare."), link("/", null, "← all runs"));
    document.title = "agenttest · compare";
    return;
  }
  const [left, right] = found.labels;
  parts.push(el("header", "run-header", el("h1", null, `Compare: ${left} | ${right}`), el("div", "facts", sideFacts(left, found.runs[0]), sideFacts(right, found.runs[1]))));
  const counts = found.order.filter((c) => found.counts[c]).map((c) => `${found.titles[c]}: ${found.counts[c]}`);
  parts.push(el("p", "note counts", counts.join(" · ") || "No cases."));
  const rank = (c) => found.order.indexOf(c.category);
  const cases = [...found.cases].sort((x, y) => rank(x) - rank(y) || COLLATOR.compare(x.id, y.id));
  for (const c of cases) c.status = c.new || c.base;
  const UNCHANGED = ["still_passing", "still_failing"];
  const changes = found.order.filter((c) => found.counts[c]).map((c) => [c, `change: ${found.titles[c]}`]);
  const choices = {
    causes: [...new Set(cases.map((c) => c.cause).filter(Boolean))].sort(),
    agents: [...new Set(cases.map((c) => c.agent).filter(Boolean))].sort(),
    checks: [...new Set(cases.flatMap((c) => c.checks || []))].sort(),
    flaky: cases.some((c) => c.flaky),
  };
  const tags = [...new Set(cases.flatMap((c) => c.tags || []))].sort();
  const fields = [
    { key: "change", label: "any change", choices: [["changed", "changed (any)"], ...changes], test: (c, v) => (v === "changed" ? !UNCHANGED.includes(c.category) : c.category === v) },
    { key: "status", label: "any status", choices: STATUS_ORDER.map((s) => [s, `now: ${s}`]), test: (c, v) => c.status === v },
    { key: "tag", label: "any tag", choices: tags.map((t) => [t, `tag: ${t}`]), test: (c, v) => (c.tags || []).includes(v) },
    ...caseFilters(choices),
  ];
  const body = el("tbody");
  const count = el("span", "count");
  count.id = "case-count";
  const draw = () => {
    const shownRows = cases.filter((c) => filters.matches(c));
    body.replaceChildren(...shownRows.map((c) => compareRow(c, found, a, b, run)));
    count.textContent = `${shownRows.length} of ${cases.length} cases`;
  };
  const filters = new FilterBar(fields, draw);
  const head = el("tr", null, ["change", "id", "name", left, right, "why"].map((h) => el("th", null, h)));
  parts.push(el("div", "controls", filters.node, count), wrapped(el("table", "compare-table", el("thead", null, head), body)));
  app.replaceChildren(...parts);
  draw();
  document.title = "agenttest · compare";
};

const compareRow = (c, found, a, b, run) => {
  // Two targets of one run: the case's page of that run shows both conversations.
  const caseLink = run ? `/runs/${encodeURIComponent(run)}/case?id=${encodeURIComponent(c.id)}` : pairHref(a, b, c.id);
  const d = c.difference;
  const why = [c.flaky_because || c.changed_because || ""];
  if (d) why.push(el("div", null, d.turn ? `Turn ${d.turn}: ` : "", d.assertion || "", d.reason ? ` — ${d.reason}` : ""));
  const change = el("td", null, found.titles[c.category] || word("change", c.category));
  change.dataset.sort = String(found.order.indexOf(c.category));
  const verdict = (status) => {
    const td = el("td", null, status ? badge(status) : "–");
    td.dataset.sort = status ? String(STATUS_ORDER.indexOf(status)) : "9";
    return td;
  };
  const tr = el("tr", `compare-row ${c.category}`, change, el("td", "id", link(caseLink, null, c.id)), el("td", null, c.name || ""), verdict(c.base), verdict(c.new), el("td", null, why));
  tr.dataset.caseId = c.id;
  tr.dataset.category = c.category;
  return tr;
};

// -- one case of both runs, turn by turn ---------------------------------------------

const pairPage = async (app, a, b, id) => {
  const api = (run) => `/api/runs/${encodeURIComponent(run)}/case?id=${encodeURIComponent(id)}`;
  const [left, right, labels] = await Promise.all([getJSON(api(a), true), getJSON(api(b), true), getJSON(`/api/compare/labels?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`, true)]);
  const names = labels.labels || ["A", "B"];
  const back = link(`/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`, "back", "← the comparison");
  const sides = [left, right].map((found) => (found.records && found.records.length ? found.records[0] : null));
  const heads = [0, 1].map((i) => {
    const found = [left, right][i];
    const rec = sides[i];
    const what = rec ? [badge(found.row.status), found.row.repeated ? ` ${found.row.passed}/${found.row.played} repetitions passed (the first shown)` : ""] : [el("span", "dim", found.message || "not in this run")];
    return el("div", "pair-head", el("strong", null, names[i]), " ", link(runHref([a, b][i]), null, [a, b][i]), el("div", null, what));
  });
  const turns = Math.max(...sides.map((s) => (s ? (s[0].turns || []).length : 0)), 0);
  const rows = [];
  for (let t = 0; t < turns; t++) {
    const cells = sides.map((s, i) => {
      const turn = s ? (s[0].turns || [])[t] : undefined;
      const cell = el("div", "pair-cell", el("div", "pair-label", names[i]));
      cell.appendChild(turn ? turnView(turn, t, s[1] || {}) : el("p", "dim", "(no such turn)"));
      return cell;
    });
    const outputs = sides.map((s) => (s && (s[0].turns || [])[t] ? s[0].turns[t].output : undefined));
    const row = el("div", `pair-row${outputs[0] !== outputs[1] ? " differs" : ""}`, cells);
    row.dataset.turn = String(t + 1);
    rows.push(row);
  }
  const ends = sides.map((s, i) => el("div", "pair-cell", el("div", "pair-label", names[i]), s ? recordEnd(s[0], s[1] || {}) : null));
  const title = sides.find(Boolean);
  app.replaceChildren(
    el("header", "run-header", el("h1", null, "Side by side: ", el("span", "case-id", id), title && title[0].name ? el("span", "case-name", ` ${title[0].name}`) : null)),
    back,
    el("div", "pair-row pair-heads", heads),
    el("section", "pair", rows),
    el("div", "pair-row", ends),
  );
  document.title = "agenttest · side by side";
};

// A record's final assertions and its result (what ends a conversation in a column).
const recordEnd = (rec, notes) => {
  const parts = [];
  if ((rec.final_assertions || []).length) parts.push(el("h4", null, "Final assertions"), assertionList(rec.final_assertions, notes.final_labels || []));
  const result = [el("span", "label", "Result "), badge(rec.status)];
  if (rec.error) result.push(pre("error", rec.error));
  if (rec.skip_reason) result.push(el("div", "reason", `Reason: ${rec.skip_reason}`));
  parts.push(el("div", `result ${statusClass(rec.status)}`, result));
  return parts;
};

// -- the report: what changed since its baseline -------------------------------------

const baselineSection = (found, rows) => {
  if (!found || !found.cases) return null;
  const here = new Set((rows || []).map((r) => r.id));
  const hrefOf = (c) => (here.has(c.id) ? `#case=${encodeURIComponent(c.id)}` : null);
  const counts = found.order.filter((c) => found.counts[c]).map((c) => `${found.titles[c]}: ${found.counts[c]}`);
  const parts = [el("h2", null, `What changed since the baseline (run ${found.base.id})`), el("p", "note", counts.join(" · ") || "No cases.")];
  for (const category of found.order) {
    if (category === "still_passing") continue; // counted above; listing them says nothing
    const cases = found.cases.filter((c) => c.category === category);
    if (cases.length) parts.push(diffSection(category, found.titles[category], cases, hrefOf));
  }
  const section = el("section", "baseline-diff", parts);
  section.id = "baseline-diff";
  return section;
};
