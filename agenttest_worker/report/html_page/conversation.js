// A case's conversations: each record's turns as a chat, with assertions, votes, calls.

// Turn fields rendered in their own places; any other (added later) is listed generically.
const TURN_FIELDS = new Set([
  "turn", "input", "input_source", "output", "tool_calls", "tool_results", "awaiting_input",
  "awaiting_reason", "input_hint", "assertions", "status", "duration_ms", "error",
  "skip_reason", "simulator_reasoning", "usage", "calls", "assertion_errors", "problems",
  "attachments", "finish_reason",
]);
const CASE_FIELDS = new Set([
  "version", "id", "name", "status", "agent", "turns", "final_assertions", "total_turns",
  "duration_ms", "error", "skip_reason", "goal_achieved", "simulator", "tags", "usage",
  "file", "line", "repeat", "repeats", "usage_by_role", "trace_id", "cause",
]);

// -- a case: its records' conversations ----------------------------------------------

const caseSection = (source, row, pairs) => {
  const first = pairs.length ? pairs[0][0] : { id: row.id, name: row.name };
  const title = el("h2", null, badge(row.status), " ", el("span", "case-id", first.id), first.name && first.name !== first.id ? el("span", "case-name", ` ${first.name}`) : null);
  const section = el("section", "case", link(source.runHref(), "back", "← all cases"), title);
  section.id = "conversation";
  if (row.repeated) {
    const flaky = row.flaky ? el("span", "flaky", "flaky") : null;
    section.appendChild(el("p", "verdict", `${row.passed}/${row.played} repetitions passed `, flaky));
  }
  for (const [rec, notes] of pairs) {
    if (pairs.length > 1 || rec.repeat) section.appendChild(el("h3", null, `Repetition ${rec.repeat || "?"}/${rec.repeats || pairs.length} `, badge(rec.status)));
    section.appendChild(recordView(rec, notes || {}, source.label ? labeller(source, rec) : null));
  }
  return section;
};

// The viewer's label buttons: a person's pass or fail for one judged assertion, sent to
// the viewer (which keeps it as `agenttest-submit label` does); the report has none.
const labeller = (source, rec) => (turn, position, item) => {
  const key = rec.repeat ? `${rec.id}#${rec.repeat}` : rec.id;
  const said = el("span", "dim", "");
  const button = (verdict) => {
    const b = el("button", "label-button", `label ${verdict}`);
    b.type = "button";
    b.dataset.label = verdict;
    b.addEventListener("click", async () => {
      said.textContent = " …";
      try {
        const kept = await source.label({ case: key, turn, assertion: position, label: verdict });
        said.textContent = ` labelled ${kept.label} (the judge said ${kept.judge_verdict})`;
      } catch (error) {
        said.textContent = ` not labelled: ${shown(error.message || error)}`;
      }
    });
    return b;
  };
  item.appendChild(el("div", "labels", button("pass"), " ", button("fail"), said));
};

const recordView = (rec, notes, label) => {
  const facts = [];
  if (rec.agent) facts.push(field("Agent", rec.agent));
  if (rec.simulator) facts.push(field("Simulator", rec.simulator));
  if (rec.file) facts.push(field("File", rec.line ? `${rec.file}:${rec.line}` : rec.file));
  if ((rec.tags || []).length) facts.push(field("Tags", rec.tags.join(", ")));
  if (rec.cause && rec.status !== "passed") facts.push(field("Cause", word("cause", rec.cause)));
  facts.push(field("Turns", String(rec.total_turns)), field("Time", ms(rec.duration_ms)));
  if (rec.usage) facts.push(field("Tokens", number(rec.usage.total_tokens)));
  if (rec.goal_achieved !== undefined && rec.goal_achieved !== null) facts.push(field("Goal achieved", rec.goal_achieved ? "yes" : "no"));
  if (rec.trace_id) facts.push(field("Trace", notes.trace_url ? outLink(notes.trace_url, "trace-link", rec.trace_id) : rec.trace_id));
  for (const [key, value] of Object.entries(rec)) if (!CASE_FIELDS.has(key)) facts.push(field(key, json(value)));
  const chat = el("div", "chat");
  (rec.turns || []).forEach((turn, index) => {
    const skip = (notes.skips || {})[String(index)];
    chat.appendChild(skip ? skipNotice(skip) : turnView(turn, index, notes, label));
  });
  if (notes.end_skip) chat.appendChild(skipNotice(notes.end_skip));
  const parts = [el("div", "facts", facts), usageTable(rec.usage_by_role), chat];
  if ((rec.final_assertions || []).length) {
    parts.push(el("h4", null, "Final assertions"), assertionList(rec.final_assertions, notes.final_labels || [], label && ((position, item) => label("final", position, item))));
  }
  for (const diff of notes.golden || []) parts.push(goldenDiff(diff));
  const result = [el("span", "label", "Result "), badge(rec.status)];
  if (rec.error) result.push(pre("error", rec.error));
  if (rec.skip_reason && !notes.end_skip && !Object.keys(notes.skips || {}).length) result.push(el("div", "reason", `Reason: ${rec.skip_reason}`));
  parts.push(el("div", `result ${statusClass(rec.status)}`, result));
  return el("div", "record", parts);
};

const skipNotice = (skip) =>
  el(
    "div",
    "skip",
    el("div", "turn-head", `Turn ${skip.turn} `, badge("skipped")),
    el("div", null, `Reason: ${skip.reason}`),
    skip.asked ? el("div", null, "Agent asked: ", el("q", null, skip.asked)) : null,
    skip.hint ? el("div", null, `Input hint: ${skip.hint}`) : null,
    skip.advice ? el("div", "advice", skip.advice) : null,
  );

const turnView = (turn, index, notes, label) => {
  const marker = ((notes.markers || [])[index]) || "";
  const status = turn.error ? "failed" : turn.status;
  const head = [el("span", "turn-no", `Turn ${turn.turn}`), " "];
  if (marker) head.push(el("span", "marker", marker), " ");
  head.push(badge(status), " ", el("span", "dim", ms(turn.duration_ms)));
  if (turn.usage) head.push(" ", el("span", "dim", `${number(turn.usage.total_tokens)} tokens`));
  for (const [key, value] of Object.entries(turn)) {
    if (!TURN_FIELDS.has(key) && value !== null && value !== undefined) head.push(" ", el("span", "extra", `${key}: ${json(value)}`));
  }
  const box = el("div", `turn ${statusClass(status)}`, el("div", "turn-head", head));
  box.dataset.turn = String(turn.turn);
  if (turn.input !== null && turn.input !== undefined) {
    const names = (turn.attachments || []).map((a) => (typeof a === "string" ? a : a.name || a.source || "attachment"));
    const attached = [...names, ...(((notes.attachments || [])[index]) || [])];
    box.appendChild(message("user", marker ? `User ${marker}` : "User", pre("text", turn.input), attached.length ? el("div", "attachments", "Attachments: ", attached.join(", ")) : null));
  }
  const calls = (notes.calls || [])[index] || [];
  if (turn.output !== null || (turn.tool_calls || []).length) {
    const body = [];
    if (turn.output) body.push(replyView(turn.output));
    else if (!(turn.tool_calls || []).length) body.push(el("div", "dim", "(empty reply)"));
    (turn.tool_calls || []).forEach((call, n) => {
      body.push(el("div", "tool-call", el("span", "label", "calls "), el("code", null, calls[n] || call.name), el("details", null, el("summary", null, "arguments"), pre("args", json(call.args)))));
    });
    box.appendChild(message("assistant", "Assistant", body));
  }
  for (const [name, result] of Object.entries(turn.tool_results || {})) {
    box.appendChild(message("tool", `Tool ${name} (mocked result)`, pre("text", json(result))));
  }
  if (turn.awaiting_input) box.appendChild(el("div", "note", `Awaiting input${turn.awaiting_reason ? ` (${word("awaiting", turn.awaiting_reason)})` : ""}`));
  if (turn.awaiting_reason === "response_truncated") box.appendChild(el("div", "note", `Cut off by its length (${word("stop", turn.finish_reason)})`));
  if (turn.input_hint) box.appendChild(el("div", "note", `Input hint: ${turn.input_hint}`));
  if (turn.simulator_reasoning) box.appendChild(el("div", "note", `Simulator: ${turn.simulator_reasoning}`));
  for (const problem of turn.problems || []) box.appendChild(pre("error", `Problem: ${problem}`));
  if (turn.error) box.appendChild(pre("error", `Error: ${turn.error}`));
  const judged = label && !turn.error ? (position, item) => label(turn.turn, position, item) : null;
  if ((turn.assertions || []).length) box.appendChild(assertionList(turn.assertions, (notes.labels || [])[index] || [], judged));
  if ((turn.calls || []).length) box.appendChild(callsView(turn.calls));
  const bars = (notes.spans || [])[index] || [];
  if (bars.length) box.appendChild(waterfall(bars));
  return box;
};

// A turn's spans (sent by the agent) as bars on one time axis, nested by ancestry.
const waterfall = (bars) => {
  const drawn = bars.filter((b) => b.more === undefined);
  const end = Math.max(1, ...drawn.map((b) => b.start_ms + b.duration_ms));
  const rows = drawn.map((b) => {
    const label = el("span", "span-name", b.name);
    label.style.paddingLeft = `${Math.min(b.depth, 16) * 12}px`;
    const bar = el("span", b.error ? "span-bar error" : "span-bar");
    bar.style.left = `${(100 * b.start_ms) / end}%`;
    bar.style.width = `${Math.max((100 * b.duration_ms) / end, 0.5)}%`;
    const row = el("div", "span-row", label, el("span", "span-track", bar), el("span", "span-time", `${b.duration_ms.toFixed(1)}ms`));
    row.title = b.service ? `${b.service}: ${b.name}` : b.name;
    return row;
  });
  const more = bars.find((b) => b.more !== undefined);
  if (more) rows.push(el("div", "dim", `${more.more} more spans not drawn`));
  const errors = drawn.filter((b) => b.error).length;
  const summary = `Agent spans (${drawn.length}${errors ? `, ${errors} in error` : ""})`;
  return el("details", "waterfall", el("summary", null, summary), rows);
};

// A reply formatted (Markdown, or pretty JSON), with a button to see it as written.
const replyView = (text) => {
  const box = el("div", "reply", replyText(text, false));
  const toggle = el("button", "reply-mode", "as written");
  toggle.type = "button";
  toggle.addEventListener("click", () => {
    const plain = toggle.textContent === "as written";
    box.firstChild.replaceWith(replyText(text, plain));
    toggle.textContent = plain ? "formatted" : "as written";
  });
  box.appendChild(toggle);
  return box;
};

const message = (role, label, ...body) => el("div", `msg ${role}`, el("div", "who", label), body);

// `label(position, item)`: the viewer's label buttons, added to each judged assertion.
const assertionList = (assertions, labels, label) =>
  el(
    "ul",
    "assertions",
    assertions.map((a, i) => {
      const item = el("li", a.passed ? "pass" : "fail", el("span", "mark", a.passed ? "✓" : "✗"), " ", el("span", "check", labels[i] || word("assertion", a.type)));
      if (a.reason) item.appendChild(el("div", "reason", a.reason));
      if (a.score !== null && a.score !== undefined) item.appendChild(el("span", "dim", `score ${a.score}`));
      if (a.agreement !== null && a.agreement !== undefined) item.appendChild(el("span", "dim", ` · agreement ${percent(a.agreement)}`));
      if (a.error) item.appendChild(pre("error", a.error));
      if ((a.suggestions || []).length) item.appendChild(el("ul", "suggestions", a.suggestions.map((s) => el("li", null, s))));
      // A judge's plan and thinking (tdx's evaluator), folded: they are long.
      if (a.plan) item.appendChild(el("details", "judge-plan", el("summary", null, "Judge's plan"), pre("text", a.plan)));
      if (a.thinking) item.appendChild(el("details", "judge-thinking", el("summary", null, "Judge's thinking"), pre("text", a.thinking)));
      // What the judge was sent and what it answered, word for word.
      if (a.judge_prompt) item.appendChild(el("details", "judge-prompt", el("summary", null, "Judge's prompt"), pre("text", a.judge_prompt)));
      if (a.judge_reply) item.appendChild(el("details", "judge-reply", el("summary", null, "Judge's reply, as it said it"), pre("text", a.judge_reply)));
      if ((a.votes || []).length) item.appendChild(votesTable(a.votes));
      if (label && a.type === "agent") label(i + 1, item);
      return item;
    }),
  );

// A failed golden assertion's comparison: golden | new, turn by turn.
const goldenDiff = (diff) => {
  const side = (turn) => (turn ? [turn.reply ? el("div", null, turn.reply) : null, el("div", "dim", turn.tools)] : el("span", "dim", "(no such turn)"));
  const head = el("tr", null, ["turn", "golden", "new"].map((h) => el("th", null, h)));
  const rows = diff.rows.map((r) =>
    el("tr", r.differs ? "differs" : "same", el("td", null, `${r.turn} ${r.differs ? "≠ " + r.differs : "="}`), el("td", null, side(r.golden)), el("td", null, side(r.new))),
  );
  return el("div", "golden-diff", el("h4", null, `Golden | new: ${diff.label}`), el("table", "golden", el("thead", null, head), el("tbody", null, rows)));
};

const votesTable = (votes) => {
  const head = el("tr", null, ["judge", "vote", "score", "reason"].map((h) => el("th", null, h)));
  const rows = votes.map((v) =>
    el("tr", null, el("td", null, v.judge), el("td", null, v.error ? "error" : v.passed ? "pass" : "fail"), el("td", "num", v.score === null || v.score === undefined ? "" : String(v.score)), el("td", null, v.error || v.reason || "")),
  );
  return el("table", "votes", el("thead", null, head), el("tbody", null, rows));
};

const callsView = (calls) => {
  const head = el("tr", null, ["role", "agent", "latency", "attempts", "status", "tokens", "error"].map((h) => el("th", null, h)));
  const rows = calls.map((c) =>
    el("tr", null, el("td", null, word("role", c.role)), el("td", null, c.agent), el("td", "num", c.cached ? "(cached)" : `${c.latency_ms}ms`), el("td", "num", c.cached ? "0" : String(c.attempts || 1)), el("td", "num", c.status_code ? String(c.status_code) : ""), el("td", "num", c.usage ? number(c.usage.total_tokens) : ""), el("td", null, c.error || "", c.reply ? pre("reply", c.reply) : null)),
  );
  return el("details", "calls", el("summary", null, `Agent calls (${calls.length})`), el("table", null, el("thead", null, head), el("tbody", null, rows)));
};

const failure = (app, error) => {
  app.replaceChildren(el("p", "error", `Could not load: ${error.message || error}`));
};
