// Agent replies as a reader expects them: pretty JSON when the reply is JSON, else a
// safe subset of Markdown (code blocks, inline code, bold, italic, lists, headings,
// links to http(s) only). Nothing is parsed as HTML: each construct becomes an element
// made here and every piece of text a text node (dom.js `el`), so a reply holding
// "<script>" still shows those characters, and a link can only be an http(s) URL.

const MD_FENCE = /^\s*```/;
const MD_ITEM = /^\s*(?:[-*+]|\d+[.)])\s+(.*)$/;
const MD_ORDERED = /^\s*\d+[.)]\s+/;
const MD_HEADING = /^\s*(#{1,6})\s+(.*)$/;
// `code`, **bold**, __bold__, *italic*, _italic_, [text](http(s)://...). Emphasis only
// between word edges, as CommonMark has it: `window.__name` or `a*b*c` stay as written.
const MD_INLINE =
  /`([^`\n]+)`|(?<![\w.*])\*\*(?=\S)([^*\n]+?)\*\*(?![\w*])|(?<![\w._])__(?=\S)([^_\n]+?)__(?![\w_])|(?<![\w.*])\*(?=\S)([^*\n]+?)\*(?![\w*])|(?<![\w._])_(?=\S)([^_\n]+?)_(?![\w_])|\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g;

const asJSON = (text) => {
  const trimmed = text.trim();
  if (!/^[[{]/.test(trimmed)) return undefined;
  try {
    return JSON.parse(trimmed);
  } catch (error) {
    return undefined;
  }
};

const inline = (text) => {
  const parts = [];
  let at = 0;
  for (const m of text.matchAll(MD_INLINE)) {
    if (m.index > at) parts.push(text.slice(at, m.index));
    if (m[1] !== undefined) parts.push(el("code", null, m[1]));
    else if (m[2] !== undefined || m[3] !== undefined) parts.push(el("strong", null, m[2] ?? m[3]));
    else if (m[4] !== undefined || m[5] !== undefined) parts.push(el("em", null, m[4] ?? m[5]));
    else {
      const a = el("a", "md-link", m[6]);
      a.href = m[7]; // only http(s): the pattern allows nothing else
      a.rel = "noopener noreferrer";
      a.target = "_blank";
      parts.push(a);
    }
    at = m.index + m[0].length;
  }
  if (at < text.length) parts.push(text.slice(at));
  return parts;
};

const markdown = (text) => {
  const root = el("div", "md");
  const lines = text.split("\n");
  let paragraph = [];
  let list = null;
  const flush = () => {
    if (paragraph.length) root.appendChild(el("p", null, inline(paragraph.join("\n"))));
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (MD_FENCE.test(line)) {
      flush();
      list = null;
      const code = [];
      for (i++; i < lines.length && !MD_FENCE.test(lines[i]); i++) code.push(lines[i]);
      root.appendChild(el("pre", "md-code", el("code", null, code.join("\n"))));
      continue;
    }
    const item = MD_ITEM.exec(line);
    if (item) {
      flush();
      const tag = MD_ORDERED.test(line) ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = el(tag);
        root.appendChild(list);
      }
      list.appendChild(el("li", null, inline(item[1])));
      continue;
    }
    const heading = MD_HEADING.exec(line);
    if (heading) {
      flush();
      list = null;
      root.appendChild(el("p", "md-heading", el("strong", null, inline(heading[2]))));
      continue;
    }
    if (!line.trim()) {
      flush();
      list = null;
      continue;
    }
    list = null;
    paragraph.push(line);
  }
  flush();
  return root;
};

// A reply: pretty JSON, Markdown, or (`plain`) as written.
const replyText = (text, plain) => {
  if (plain) return pre("text", text);
  const value = asJSON(text);
  if (value !== undefined && value !== null && typeof value === "object") return pre("text json", JSON.stringify(value, null, 2));
  return markdown(text);
};
