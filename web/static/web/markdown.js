// Markdown to DOM nodes, safe by construction: the renderer builds elements with
// createElement and puts every piece of text in with textContent, so nothing the model
// writes is ever parsed as HTML. Links keep only http(s) and mailto targets.
// Covered: paragraphs, headings, fenced and indented code, lists, block quotes, rules,
// tables (GitHub style, cells are inline text), inline code, bold, italic, links.

const SAFE_LINK = /^(https?:|mailto:)/i;

export function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  let index = 0;
  while (index < lines.length) {
    const line = lines[index];
    if (/^\s*$/.test(line)) {
      index += 1;
      continue;
    }
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
    if (fence) {
      const body = [];
      index += 1;
      while (index < lines.length && !lines[index].trim().startsWith(fence[1])) {
        body.push(lines[index]);
        index += 1;
      }
      index += 1;
      fragment.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      const node = document.createElement(`h${Math.min(heading[1].length + 2, 6)}`);
      appendInline(node, heading[2]);
      fragment.append(node);
      index += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      fragment.append(document.createElement("hr"));
      index += 1;
      continue;
    }
    if (/^\s*>/.test(line)) {
      const body = [];
      while (index < lines.length && /^\s*>/.test(lines[index])) {
        body.push(lines[index].replace(/^\s*>\s?/, ""));
        index += 1;
      }
      const quote = document.createElement("blockquote");
      quote.append(renderMarkdown(body.join("\n")));
      fragment.append(quote);
      continue;
    }
    if (isTableStart(lines, index)) {
      index = appendTable(fragment, lines, index);
      continue;
    }
    const bullet = /^\s*([-*+]|\d+[.)])\s+/;
    if (bullet.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = document.createElement(ordered ? "ol" : "ul");
      while (index < lines.length && bullet.test(lines[index])) {
        const entry = document.createElement("li");
        let text = lines[index].replace(bullet, "");
        index += 1;
        while (
          index < lines.length &&
          /^\s{2,}\S/.test(lines[index]) &&
          !bullet.test(lines[index])
        ) {
          text += " " + lines[index].trim();
          index += 1;
        }
        appendInline(entry, text);
        list.append(entry);
      }
      fragment.append(list);
      continue;
    }
    if (/^( {4}|\t)/.test(line)) {
      const body = [];
      while (index < lines.length && (/^( {4}|\t)/.test(lines[index]) || !lines[index].trim())) {
        body.push(lines[index].replace(/^( {4}|\t)/, ""));
        index += 1;
      }
      fragment.append(codeBlock(body.join("\n").replace(/\n+$/, ""), ""));
      continue;
    }
    const paragraph = [];
    while (
      index < lines.length &&
      lines[index].trim() &&
      !/^\s*(```|~~~|#{1,6}\s|>|([-*+]|\d+[.)])\s)/.test(lines[index]) &&
      !(paragraph.length && isTableStart(lines, index))
    ) {
      paragraph.push(lines[index]);
      index += 1;
    }
    if (!paragraph.length) {
      paragraph.push(lines[index]);
      index += 1;
    }
    const node = document.createElement("p");
    appendInline(node, paragraph.join("\n"));
    fragment.append(node);
  }
  return fragment;
}

// A table: a header row with a pipe, then a delimiter row (`| --- | :-: |`) with as many
// cells; body rows run until a blank line or a line without a pipe.
const DELIMITER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function isTableStart(lines, index) {
  const header = lines[index];
  const delimiter = lines[index + 1];
  if (!header.includes("|") || delimiter === undefined || !DELIMITER.test(delimiter)) {
    return false;
  }
  if (!delimiter.includes("|") && splitRow(header).length < 2) return false;
  return splitRow(header).length === splitRow(delimiter).length;
}

// Cells of one row: split on pipes that are not escaped (`\|` is a literal pipe).
function splitRow(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  const cells = [];
  let cell = "";
  for (let i = 0; i < text.length; i += 1) {
    if (text[i] === "\\" && text[i + 1] === "|") {
      cell += "|";
      i += 1;
    } else if (text[i] === "|") {
      cells.push(cell.trim());
      cell = "";
    } else {
      cell += text[i];
    }
  }
  cells.push(cell.trim());
  return cells;
}

function appendTable(fragment, lines, start) {
  const header = splitRow(lines[start]);
  const aligns = splitRow(lines[start + 1]).map((cell) => {
    if (cell.startsWith(":") && cell.endsWith(":")) return "center";
    if (cell.endsWith(":")) return "right";
    return cell.startsWith(":") ? "left" : "";
  });
  const table = document.createElement("table");
  const row = (cells, tag) => {
    const tr = document.createElement("tr");
    header.forEach((_, column) => {
      const cell = document.createElement(tag);
      if (tag === "th") cell.scope = "col";
      if (aligns[column]) cell.style.textAlign = aligns[column];
      appendInline(cell, cells[column] ?? "");
      tr.append(cell);
    });
    return tr;
  };
  const head = document.createElement("thead");
  head.append(row(header, "th"));
  const body = document.createElement("tbody");
  let index = start + 2;
  while (index < lines.length && lines[index].trim() && lines[index].includes("|")) {
    body.append(row(splitRow(lines[index]), "td"));
    index += 1;
  }
  table.append(head, body);
  // Wide tables scroll inside their own box, never the page.
  const wrap = document.createElement("div");
  wrap.className = "table-wrap";
  wrap.tabIndex = 0;
  wrap.append(table);
  fragment.append(wrap);
  return index;
}

function codeBlock(text, language) {
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  if (language) code.dataset.language = language;
  code.textContent = text;
  pre.append(code);
  return pre;
}

// Inline spans: `code`, **bold**, *italic* / _italic_, [text](url); the rest is text.
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*([^\s*][\s\S]*?)\*|\b_([^\s_][\s\S]*?)_\b|\[([^\]]+)\]\(([^)\s]+)\)/g;

export function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) appendText(parent, text.slice(last, match.index));
    last = match.index + match[0].length;
    if (match[1]) {
      const code = document.createElement("code");
      code.textContent = match[2];
      parent.append(code);
    } else if (match[3] || match[4]) {
      const strong = document.createElement("strong");
      appendInline(strong, match[3] ?? match[4]);
      parent.append(strong);
    } else if (match[5] || match[6]) {
      const em = document.createElement("em");
      appendInline(em, match[5] ?? match[6]);
      parent.append(em);
    } else if (match[7]) {
      const href = match[8];
      if (SAFE_LINK.test(href)) {
        const link = document.createElement("a");
        link.href = href;
        link.rel = "noopener noreferrer nofollow";
        link.target = "_blank";
        appendInline(link, match[7]);
        parent.append(link);
      } else {
        appendText(parent, match[0]);
      }
    }
  }
  if (last < text.length) appendText(parent, text.slice(last));
}

function appendText(parent, text) {
  const parts = text.split("\n");
  parts.forEach((part, index) => {
    if (index > 0) parent.append(document.createElement("br"));
    if (part) parent.append(document.createTextNode(part));
  });
}
