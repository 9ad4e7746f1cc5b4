// What every table shares: words for codes, sorting by any column, and filters.

// The words for codes (report/wording.py), embedded in every page.
let WORDS = null;
const word = (kind, code) => {
  if (code === null || code === undefined || code === "") return "";
  if (WORDS === null) WORDS = readData("agenttest-words") || {};
  const found = (WORDS[kind] || {})[code];
  return found === undefined ? String(code).replace(/_/g, " ") : found;
};

// Every table sorts by any column: each header holds a button; its th carries
// aria-sort. `sorter(index, direction)` sorts a table whose rows are drawn from data
// (the case table pages its rows); without one the body's rows are moved, compared by
// their cells' `data-sort` or text, numbers as numbers.
const COLLATOR = new Intl.Collator("en", { numeric: true, sensitivity: "base" });
const cellKey = (row, index) => {
  const cell = row.children[index];
  if (!cell) return "";
  return cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim();
};
const compareKeys = (a, b) => {
  const x = Number(a);
  const y = Number(b);
  if (a !== "" && b !== "" && !Number.isNaN(x) && !Number.isNaN(y)) return x - y;
  return COLLATOR.compare(a, b);
};

const sortable = (table, sorter) => {
  if (!table || table.dataset.sortable) return table;
  table.dataset.sortable = "true";
  const heads = table.tHead ? [...table.tHead.rows[0].cells] : [];
  heads.forEach((th, index) => {
    const button = el("button", "sort", ...th.childNodes);
    button.type = "button";
    th.replaceChildren(button);
    th.setAttribute("aria-sort", "none");
    button.addEventListener("click", () => {
      const direction = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
      for (const other of heads) other.setAttribute("aria-sort", "none");
      th.setAttribute("aria-sort", direction);
      if (sorter) sorter(index, direction);
      else {
        const body = table.tBodies[0];
        const sign = direction === "ascending" ? 1 : -1;
        const rows = [...body.rows].sort((a, b) => sign * compareKeys(cellKey(a, index), cellKey(b, index)));
        body.append(...rows);
      }
    });
  });
  return table;
};

// Every table of `root` made sortable (those made already are left as they are).
// Each is put in a box that scrolls sideways (the page itself never does).
const sortTables = (root) => {
  for (const table of root.querySelectorAll("table")) {
    if (!table.parentNode.classList.contains("table-wrap")) {
      const box = el("div", "table-wrap");
      table.replaceWith(box);
      box.appendChild(table);
    }
    sortable(table);
  }
};

// Sorting rows of data by a key function.
const sortedBy = (rows, key, direction) => {
  const sign = direction === "descending" ? -1 : 1;
  return [...rows].sort((a, b) => sign * compareKeys(String(key(a) ?? ""), String(key(b) ?? "")));
};

// The filters beside a table: a select per field that has choices, and "flaky only".
// `fields`: [{key, label, choices: [[value, text]], test(row, value)}]; a select with
// no choices is left out. `change()` is called with the filter values.
class FilterBar {
  constructor(fields, change) {
    this.values = {};
    this.fields = fields;
    this.node = el("div", "filters");
    for (const f of fields) {
      if (f.key === "flaky") {
        const box = el("input");
        box.type = "checkbox";
        box.id = "flaky-filter";
        box.addEventListener("change", () => {
          this.values.flaky = box.checked ? "yes" : "";
          change();
        });
        const label = el("label", "check", box, " flaky only");
        label.hidden = !f.choices.length;
        this.node.appendChild(label);
        continue;
      }
      const select = el("select", `${f.key}-filter`, el("option", null, f.label));
      select.id = `${f.key}-filter`;
      select.setAttribute("aria-label", f.label);
      select.firstChild.value = "";
      for (const [value, text] of f.choices) {
        const option = el("option", null, text);
        option.value = value;
        select.appendChild(option);
      }
      select.hidden = !f.choices.length;
      select.addEventListener("change", () => {
        this.values[f.key] = select.value;
        change();
      });
      this.node.appendChild(select);
    }
  }

  matches(row) {
    return this.fields.every((f) => !this.values[f.key] || f.test(row, this.values[f.key]));
  }
}

// The filters every case listing has: cause, agent, assertion type, flaky.
const caseFilters = (choices) => [
  { key: "cause", label: "any cause", choices: (choices.causes || []).map((c) => [c, `cause: ${word("cause", c)}`]), test: (r, v) => r.cause === v },
  { key: "agent", label: "any agent", choices: (choices.agents || []).map((a) => [a, `agent: ${a}`]), test: (r, v) => r.agent === v },
  { key: "check", label: "any check", choices: (choices.checks || []).map((c) => [c, `check: ${word("assertion", c)}`]), test: (r, v) => (r.checks || []).includes(v) },
  { key: "flaky", label: "flaky", choices: choices.flaky ? [["yes", "flaky"]] : [], test: (r) => Boolean(r.flaky) },
];
