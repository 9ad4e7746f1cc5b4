// The pages: the HTML report (its data in the page) and the viewer's (data from /api/).

// -- where the data comes from -----------------------------------------------------

const readData = (id) => {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
};

// The report: everything is in the page; the records are parsed when first needed.
const reportSource = () => {
  const data = readData("agenttest-run");
  let records = null;
  let haystacks = null;
  const all = () => {
    if (records === null) records = readData("agenttest-records");
    return records;
  };
  return {
    live: false,
    header: async () => data.run,
    rows: async () => data.rows,
    pairs: async (row) => all().slice(row.first, row.first + row.count),
    // The same text the viewer searches (html_page/data.py search_text).
    search: async (query, rows) => {
      if (haystacks === null) {
        const pairs = all();
        haystacks = new Map(
          rows.map((r) => [r.id, pairs.slice(r.first, r.first + r.count).map(([rec]) => searchText(rec)).join("\n")]),
        );
      }
      const q = query.toLowerCase();
      return new Set(rows.filter((r) => haystacks.get(r.id).includes(q)).map((r) => r.id));
    },
    caseHref: (id) => `#case=${encodeURIComponent(id)}`,
    runHref: () => "#",
  };
};

const searchText = (rec) => {
  const parts = [rec.id, rec.name, ...(rec.tags || []), rec.error, rec.skip_reason];
  for (const turn of rec.turns || []) {
    parts.push(turn.input, turn.output, turn.error, turn.skip_reason);
    for (const call of turn.tool_calls || []) parts.push(call.name, JSON.stringify(call.args));
    for (const a of turn.assertions || []) parts.push(a.reason);
  }
  for (const a of rec.final_assertions || []) parts.push(a.reason);
  return parts.map((p) => (p === null || p === undefined ? "" : String(p))).join("\n").toLowerCase();
};

// A 404 of the case API still says something worth showing (no such case, or not yet).
const getJSON = async (url, allowMissing = false) => {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok && !(allowMissing && response.status === 404)) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
};

// The viewer: the same pages over /api/.
const viewerSource = (runId) => {
  const api = `/api/runs/${encodeURIComponent(runId)}`;
  return {
    live: true,
    header: async () => getJSON(api),
    rows: async () => (await getJSON(`${api}/cases`)).rows,
    caseData: async (id) => getJSON(`${api}/case?id=${encodeURIComponent(id)}`, true),
    pairs: async (row) => (await getJSON(`${api}/case?id=${encodeURIComponent(row.id)}`)).records,
    search: async (query) => new Set((await getJSON(`${api}/cases?q=${encodeURIComponent(query)}`)).ids),
    // JSON from this page only: the viewer refuses a label sent any other way.
    label: async (body) => {
      const response = await fetch(`${api}/labels`, { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body) });
      const answer = await response.json();
      if (!response.ok) throw new Error(answer.message || `HTTP ${response.status}`);
      return answer;
    },
    caseHref: (id) => `/runs/${encodeURIComponent(runId)}/case?id=${encodeURIComponent(id)}`,
    runHref: () => `/runs/${encodeURIComponent(runId)}`,
    diffHref: () => `/runs/${encodeURIComponent(runId)}/diff`,
  };
};

// -- the run: header, summary, the case table --------------------------------------

const headerSection = (run) => {
  const facts = [];
  if ((run.targets || []).length > 1) facts.push(field("Targets", run.targets.join(" | ")));
  else if (run.agent) facts.push(field("Agent", run.agent));
  facts.push(field("Input", run.input_label || "–"));
  if (run.run_id) facts.push(field("Run", run.run_id));
  if (run.status) facts.push(field("Status", run.status + (run.cancelled ? " (cancelled)" : "")));
  if (run.generated) facts.push(field("Generated", run.generated));
  return el("header", "run-header", el("h1", null, run.title || "agenttest"), el("div", "facts", facts));
};

const summarySection = (run) => {
  const s = run.summary || {};
  const cost = Object.values(run.usage || {}).reduce((sum, u) => sum + (u.cost || 0), 0);
  const card = (label, value, cls) => el("div", `card ${cls || ""}`, el("div", "value", value), el("div", "label", label));
  const cards = el(
    "div",
    "cards",
    card("cases", number(s.total)),
    card("passed", number(s.passed), "passed"),
    card("failed", number(s.failed), "failed"),
    card("skipped", number(s.skipped), "skipped"),
    card("pass rate", percent(s.pass_rate)),
    card("duration", seconds(s.duration_s || 0)),
    // The average is over conversations: a repeated case's repetitions each count.
    card("turns", `${number(s.total_turns)} (${(s.avg_turns || 0).toFixed(1)}/${run.distinct_cases ? "conversation" : "case"})`),
    card("tokens", number(run.tokens)),
    cost ? card("cost", money(cost)) : null,
  );
  const notes = [];
  if (s.not_run) notes.push(el("p", "note", `Not run: ${s.not_run} (${s.not_run_reason || ""})`));
  if (run.budget) notes.push(el("p", "note", `Budget: ${run.budget}`));
  for (const line of run.repeat_lines || []) notes.push(el("p", "note", line));
  if ((run.flaky || []).length) notes.push(el("p", "note", `Flaky (${run.flaky.length}): ${run.flaky.join(", ")}`));
  // Failed or skipped conversations by cause (agent, judge, simulator, infrastructure, flake, input).
  const causes = Object.entries(s.causes || {});
  if (causes.length) notes.push(el("p", "note causes", `Causes: ${causes.map(([c, n]) => `${n} ${c}`).join(", ")}`));
  return el("section", "summary", cards, wrapped(usageTable(run.usage)), notes);
};

const usageTable = (usage) => {
  const roles = Object.keys(usage || {});
  if (!roles.length) return null;
  const head = el("tr", null, ["role", "calls", "prompt", "completion", "tokens", "cost"].map((h) => el("th", null, h)));
  const rows = roles.map((role) => {
    const u = usage[role];
    // Calls served from the reply cache used nothing: "120 (96 cached)".
    const calls = el("td", "num", number(u.calls) + (u.cached ? ` (${number(u.cached)} cached)` : ""));
    return el("tr", null, el("td", null, role), calls, [u.prompt_tokens, u.completion_tokens, u.total_tokens].map((v) => el("td", "num", number(v))), el("td", "num", money(u.cost)));
  });
  return el("table", "usage", el("thead", null, head), el("tbody", null, rows));
};

const progressSection = () => {
  const bar = el("progress", null);
  const text = el("span", "progress-text");
  const section = el("section", "progress", bar, text);
  section.id = "progress";
  return {
    section,
    update(run) {
      const p = run.progress || {};
      const total = p.total || 0;
      bar.max = Math.max(total, 1);
      bar.value = p.finished || 0;
      const counts = `${p.passed || 0} passed, ${p.failed || 0} failed, ${p.skipped || 0} skipped`;
      const turns = p.played_turns !== undefined ? `, ${number(p.played_turns)} turns played` : "";
      text.textContent = shown(`${run.status}: ${p.finished || 0}/${total || "?"} ${p.unit || "cases"} finished (${counts}${turns})`);
      section.hidden = run.status === "done" && !run.cancelled;
      document.body.dataset.runStatus = run.status;
    },
  };
};

// The case table's columns: what each sorts by.
const CASE_COLUMNS = [
  ["status", (r) => STATUS_ORDER.indexOf(r.status)],
  ["id", (r) => r.id],
  ["name", (r) => r.name || ""],
  ["tags", (r) => r.tags.join(" ")],
  ["turns", (r) => r.turns],
  ["time", (r) => r.ms],
  ["what went wrong", (r) => r.problem || ""],
];

class CaseTable {
  constructor(source, rows, statuses, tags, run) {
    this.source = source;
    this.rows = rows;
    // A run of several targets: a row per case and target, the target beside the id.
    this.severalTargets = ((run && run.targets) || []).length > 1;
    this.filter = { status: "all", tag: "", query: "" };
    this.matches = null;
    this.shown = 0;
    this.filtered = rows;
    this.body = el("tbody");
    this.count = el("span", "count");
    this.count.id = "case-count";
    this.more = el("button", "more", "Show more");
    this.more.type = "button";
    this.more.addEventListener("click", () => this.page());
    this.statusButtons = el("div", "status-filter");
    this.tagSelect = el("select", "tag-filter");
    this.tagSelect.id = "tag-filter";
    this.tagSelect.addEventListener("change", () => this.set({ tag: this.tagSelect.value }));
    this.searchBox = el("input", "search");
    this.searchBox.id = "search";
    this.searchBox.type = "search";
    this.searchBox.placeholder = "Search ids, names, messages, reasons…";
    let timer = 0;
    this.searchBox.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.set({ query: this.searchBox.value.trim() }), 200);
    });
    this.sort = null;
    this.filterSlot = el("span", "filter-slot");
    this.setChoices(statuses, tags, run);
    const head = el("tr", null, CASE_COLUMNS.map(([h]) => el("th", null, h)));
    const table = el("table", "case-table", el("thead", null, head), this.body);
    sortable(table, (index, direction) => {
      this.sort = [CASE_COLUMNS[index][1], direction];
      this.apply();
    });
    this.section = el(
      "section",
      "cases",
      el("div", "controls", this.statusButtons, this.tagSelect, this.filterSlot, this.searchBox, this.count),
      el("div", "table-wrap", table),
      this.more,
    );
    // Rows are added as the reader scrolls near the end, never all at once.
    this.sentinel = el("div", "sentinel");
    this.section.appendChild(this.sentinel);
    if ("IntersectionObserver" in window) {
      new IntersectionObserver((entries) => {
        if (entries.some((e) => e.isIntersecting) && this.shown < this.filtered.length) this.page();
      }).observe(this.sentinel);
    }
  }

  setChoices(statuses, tags, run) {
    // Cause, agent, assertion type, flaky: kept as chosen when a running run's rows come.
    const kept = this.filters ? this.filters.values : {};
    const flaky = this.rows.some((r) => r.flaky);
    this.filters = new FilterBar(caseFilters({ ...(run || {}), flaky }), () => this.apply());
    for (const [key, value] of Object.entries(kept)) {
      const control = this.filters.node.querySelector(`#${key}-filter`);
      if (control && control.type === "checkbox") control.checked = value === "yes";
      else if (control) control.value = value;
      this.filters.values[key] = value;
    }
    this.filterSlot.replaceChildren(this.filters.node);
    this.statusButtons.replaceChildren();
    const total = Object.values(statuses || {}).reduce((a, b) => a + b, 0);
    for (const status of ["all", ...STATUS_ORDER]) {
      const count = status === "all" ? total : (statuses || {})[status] || 0;
      const button = el("button", `status ${status}`, `${status} (${count})`);
      button.type = "button";
      button.dataset.status = status;
      button.setAttribute("aria-pressed", String(this.filter.status === status));
      button.addEventListener("click", () => this.set({ status }));
      this.statusButtons.appendChild(button);
    }
    const chosen = this.filter.tag;
    this.tagSelect.replaceChildren(el("option", null, "all tags"));
    this.tagSelect.firstChild.value = "";
    for (const tag of tags || []) {
      const option = el("option", null, tag);
      option.value = tag;
      this.tagSelect.appendChild(option);
    }
    this.tagSelect.value = chosen;
    this.tagSelect.hidden = !(tags || []).length;
  }

  async set(change) {
    Object.assign(this.filter, change);
    for (const b of this.statusButtons.children) b.setAttribute("aria-pressed", String(b.dataset.status === this.filter.status));
    if ("query" in change) this.matches = this.filter.query ? await this.source.search(this.filter.query, this.rows) : null;
    this.apply();
  }

  replace(rows, statuses, tags, run) {
    this.rows = rows;
    this.setChoices(statuses, tags, run);
    this.set({ query: this.filter.query });
  }

  apply() {
    const { status, tag } = this.filter;
    this.filtered = this.rows.filter(
      (r) =>
        (status === "all" || r.status === status) &&
        (!tag || r.tags.includes(tag)) &&
        this.filters.matches(r) &&
        (this.matches === null || this.matches.has(r.id)),
    );
    if (this.sort) this.filtered = sortedBy(this.filtered, ...this.sort);
    this.body.replaceChildren();
    this.shown = 0;
    this.page();
  }

  page() {
    const end = Math.min(this.shown + PAGE_ROWS, this.filtered.length);
    const fragment = document.createDocumentFragment();
    for (let i = this.shown; i < end; i++) fragment.appendChild(this.row(this.filtered[i]));
    this.body.appendChild(fragment);
    this.shown = end;
    this.more.hidden = this.shown >= this.filtered.length;
    // Cases, and their conversations when some repeat: the counts every page gives.
    const played = this.rows.reduce((sum, r) => sum + (r.repeated ? r.played : 1), 0);
    const reps = played !== this.rows.length ? `, ${played} repetitions` : "";
    this.count.textContent = `${this.shown} shown of ${this.filtered.length} matching (${this.rows.length} cases${reps})`;
  }

  row(r) {
    const href = this.source.caseHref(r.id);
    const status = [badge(r.status)];
    if (r.repeated) status.push(" ", el("span", "fraction", `${r.passed}/${r.played}`));
    if (r.flaky) status.push(" ", el("span", "flaky", "flaky"));
  if (r.cause) status.push(" ", el("span", "cause", r.cause));
    const tr = el(
      "tr",
      `case-row ${statusClass(r.status)}`,
      el("td", null, status),
      el("td", "id", link(href, null, r.id), this.severalTargets ? el("span", "target", ` @ ${r.agent}`) : ""),
      el("td", null, r.name || ""),
      el("td", "tags", r.tags.map((t) => el("span", "tag", t))),
      el("td", "num", String(r.turns)),
      el("td", "num", ms(r.ms)),
      el("td", "problem", r.problem || ""),
    );
    tr.dataset.caseId = r.id;
    tr.addEventListener("click", (event) => {
      if (event.target.closest("a")) return;
      window.location.assign(href);
    });
    return tr;
  }
}

// -- pages -------------------------------------------------------------------------

const runPage = async (app, source) => {
  const run = await source.header();
  const rows = await source.rows();
  const view = el("div", "run-view");
  const header = headerSection(run);
  let summary = summarySection(run);
  const progress = source.live ? progressSection() : null;
  const table = new CaseTable(source, rows, run.statuses, run.tags, run);
  // The viewer links to what changed since the suite's previous run (its diff page).
  const compare = source.diffHref ? el("p", "compare", link(source.diffHref(), null, "What changed since the previous run of its suite")) : null;
  // A run of several targets: its first two compared (A | B), as two runs are.
  const targets = run.targets || [];
  if (compare && run.run_id && targets.length >= 2) {
    const href = `/compare?run=${encodeURIComponent(run.run_id)}&a=${encodeURIComponent(targets[0])}&b=${encodeURIComponent(targets[1])}`;
    const targetsLink = link(href, null, `Compare its targets: ${targets[0]} | ${targets[1]}`);
    targetsLink.id = "compare-targets";
    compare.append(" · ", targetsLink);
  }
  // The report of a run made with --baseline: what changed since the baseline.
  const baseline = source.live ? null : baselineSection(readData("agenttest-diff"), table.rows);
  view.append(header, ...(progress ? [progress.section] : []), ...(compare ? [compare] : []), ...(baseline ? [baseline] : []), summary, table.section);
  const caseView = el("div", "case-view");
  app.replaceChildren(view, caseView);
  table.apply();
  if (progress) {
    progress.update(run);
    let finished = (run.progress || {}).finished;
    const poll = async () => {
      const now = await source.header();
      progress.update(now);
      if ((now.progress || {}).finished !== finished || now.status === "done") {
        finished = (now.progress || {}).finished;
        const fresh = summarySection(now);
        summary.replaceWith(fresh);
        summary = fresh;
        table.replace(await source.rows(), now.statuses, now.tags, now);
      }
      if (now.status !== "done" && !now.cancelled) setTimeout(poll, POLL_MS);
    };
    if (run.status !== "done" && !run.cancelled) setTimeout(poll, POLL_MS);
  }
  if (!source.live) {
    // The report opens a conversation in place (#case=ID), keeping the table's filters.
    const route = async () => {
      const hash = window.location.hash;
      const id = hash.startsWith("#case=") ? decodeURIComponent(hash.slice(6)) : null;
      const row = id === null ? null : table.rows.find((r) => r.id === id);
      view.hidden = row !== null && row !== undefined;
      caseView.replaceChildren();
      if (row) {
        caseView.appendChild(caseSection(source, row, await source.pairs(row)));
        sortTables(caseView);
        window.scrollTo(0, 0);
      }
    };
    window.addEventListener("hashchange", route);
    await route();
  }
  document.title = `agenttest · ${run.run_id ? `run ${run.run_id}` : "report"}`;
};

const casePage = async (app, source, caseId) => {
  const run = await source.header();
  const found = await source.caseData(caseId);
  const parts = [headerSection(run)];
  if (found.row) parts.push(caseSection(source, found.row, found.records));
  else parts.push(el("section", "case", link(source.runHref(), "back", "← all cases"), el("p", "note", found.message || "This case has not finished yet.")));
  app.replaceChildren(...parts);
  sortTables(app);
  document.title = "agenttest · case";
  if (!found.row && found.exists) setTimeout(() => casePage(app, source, caseId), POLL_MS);
};

// What changed from a base run to this one, by category (report/diff.py): each case's
// verdicts then and now, and for a regression where its conversations first differ.
const diffPage = async (app, runId, base) => {
  const found = await getJSON(`/api/runs/${encodeURIComponent(runId)}/diff?base=${encodeURIComponent(base)}`, true);
  const runLink = (id) => link(`/runs/${encodeURIComponent(id)}`, null, id);
  const facts = [field("Run", runLink(runId)), found.base ? field("Compared with", runLink(found.base.id)) : null];
  const parts = [el("header", "run-header", el("h1", null, "What changed"), el("div", "facts", facts))];
  if (!found.cases) parts.push(el("p", "note", found.message || "Nothing to compare with."));
  else {
    const counts = found.order.filter((c) => found.counts[c]).map((c) => `${found.titles[c]}: ${found.counts[c]}`);
    parts.push(el("p", "note", counts.join(" · ") || "No cases."));
    const causes = Object.entries(found.causes || {});
    if (causes.length) parts.push(el("p", "note causes", `Failing now, by cause: ${causes.map(([c, n]) => `${n} ${c}`).join(", ")}`));
    for (const category of found.order) {
      const cases = found.cases.filter((c) => c.category === category);
      const hrefOf = (c) => `/runs/${encodeURIComponent(c.category === "removed" ? found.base.id : runId)}/case?id=${encodeURIComponent(c.id)}`;
      if (cases.length) parts.push(diffSection(category, found.titles[category], cases, hrefOf));
    }
  }
  app.replaceChildren(...parts);
  document.title = "agenttest · diff";
};

// `hrefOf(case)`: where a case's row links (null: nowhere).
const diffSection = (category, title, cases, hrefOf) => {
  const rows = cases.map((c) => {
    const d = c.difference;
    const why = [c.flaky_because || ""];
    // The noise-aware gate's statistics: pass rates then and now, their intervals, the p-value.
    if (c.stats) why.push(el("div", "dim stats", c.stats.text));
    if (c.cause) why.push(el("div", "dim cause", `cause: ${c.cause}`));
    if (d) {
      why.push(el("div", null, d.turn ? `Turn ${d.turn}: ` : "", d.assertion || "", d.reason ? ` — ${d.reason}` : ""));
      if (d.said_then !== null && d.said_then !== undefined) why.push(el("div", "dim", "Then: ", el("q", null, d.said_then)));
      if (d.said_now !== null && d.said_now !== undefined) why.push(el("div", "dim", "Now: ", el("q", null, d.said_now)));
    }
    const href = hrefOf(c);
    const verdicts = el("td", null, c.base ? badge(c.base) : "–", " → ", c.new ? badge(c.new) : "–");
    const tr = el("tr", `diff-row ${category}`, el("td", "id", href ? link(href, null, c.id) : c.id), el("td", null, c.name || ""), verdicts, el("td", null, why));
    tr.dataset.caseId = c.id;
    return tr;
  });
  const head = el("tr", null, ["id", "name", "then → now", "why"].map((h) => el("th", null, h)));
  const section = el("section", `diff ${category}`, el("h2", null, `${title} (${cases.length})`), el("div", "table-wrap", el("table", "diff-table", el("thead", null, head), el("tbody", null, rows))));
  section.dataset.category = category;
  return section;
};

const start = async () => {
  const app = document.getElementById("app");
  const config = readData("agenttest-config") || { page: "report" };
  try {
    if (config.page === "report") await runPage(app, reportSource());
    else if (config.page === "runs") await runsPage(app);
    else if (config.page === "run") await runPage(app, viewerSource(config.run));
    else if (config.page === "case") await casePage(app, viewerSource(config.run), config.case);
    else if (config.page === "diff") await diffPage(app, config.run, config.base);
    else if (config.page === "compare") await comparePage(app, config.a, config.b, config.run);
    else if (config.page === "pair") await pairPage(app, config.a, config.b, config.case);
    sortTables(app);
    app.dataset.ready = "true";
  } catch (error) {
    failure(app, error);
    app.dataset.ready = "error";
  }
};

start();
