// A unified diff of two texts, computed in the browser from the API's before/after
// (GET …/diff/{path}), rendered with line numbers and colours. Text goes in as text.
import { el } from "./util.js";

const CONTEXT = 3;
const MAX_CELLS = 4_000_000; // above this the LCS table is too big: show a full rewrite

// The edit script: [op, oldLine, newLine] with op " " (same), "-" or "+".
export function lineDiff(before, after) {
  const a = before === null || before === "" ? [] : before.replace(/\n$/, "").split("\n");
  const b = after === null || after === "" ? [] : after.replace(/\n$/, "").split("\n");
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start += 1;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA -= 1;
    endB -= 1;
  }
  const ops = [];
  for (let i = 0; i < start; i += 1) ops.push([" ", i, i]);
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const n = midA.length;
  const m = midB.length;
  if (n * m > MAX_CELLS) {
    midA.forEach((_, i) => ops.push(["-", start + i, null]));
    midB.forEach((_, j) => ops.push(["+", null, start + j]));
  } else {
    // Longest common subsequence, table of suffix lengths.
    const width = m + 1;
    const table = new Uint32Array((n + 1) * width);
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        table[i * width + j] =
          midA[i] === midB[j]
            ? table[(i + 1) * width + j + 1] + 1
            : Math.max(table[(i + 1) * width + j], table[i * width + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && midA[i] === midB[j]) {
        ops.push([" ", start + i, start + j]);
        i += 1;
        j += 1;
      } else if (i < n && (j === m || table[(i + 1) * width + j] >= table[i * width + j + 1])) {
        // On a tie the removal goes first: a changed line reads "-old" then "+new".
        ops.push(["-", start + i, null]);
        i += 1;
      } else {
        ops.push(["+", null, start + j]);
        j += 1;
      }
    }
  }
  const shift = endB - endA;
  for (let i = endA; i < a.length; i += 1) ops.push([" ", i, i + shift]);
  return { ops, a, b };
}

// Hunks: runs of changes with CONTEXT lines of context on each side.
export function hunks(ops) {
  const result = [];
  let current = null;
  let lastChange = -Infinity;
  ops.forEach((op, index) => {
    if (op[0] !== " ") {
      if (!current || index - lastChange > 2 * CONTEXT) {
        current = { from: Math.max(0, index - CONTEXT), to: index };
        result.push(current);
      }
      lastChange = index;
      current.to = Math.min(ops.length - 1, index + CONTEXT);
    }
  });
  return result;
}

export function renderDiff(before, after) {
  const { ops, a, b } = lineDiff(before, after);
  const table = el("table", { class: "diff-table" });
  const body = el("tbody");
  table.append(body);
  const found = hunks(ops);
  if (!found.length) {
    body.append(el("tr", {}, el("td", { colspan: 3, class: "muted", text: "No line changes." })));
  }
  for (const hunk of found) {
    const slice = ops.slice(hunk.from, hunk.to + 1);
    const oldStart = slice.find((op) => op[1] !== null)?.[1] ?? 0;
    const newStart = slice.find((op) => op[2] !== null)?.[2] ?? 0;
    const oldCount = slice.filter((op) => op[1] !== null).length;
    const newCount = slice.filter((op) => op[2] !== null).length;
    body.append(
      el(
        "tr",
        { class: "hunk" },
        el("td", {
          colspan: 3,
          text: `@@ -${oldStart + 1},${oldCount} +${newStart + 1},${newCount} @@`,
        }),
      ),
    );
    for (const [kind, oldLine, newLine] of slice) {
      const text = kind === "+" ? b[newLine] : a[oldLine];
      body.append(
        el(
          "tr",
          { class: kind === "+" ? "add" : kind === "-" ? "del" : "same" },
          el("td", { class: "ln", text: oldLine === null ? "" : oldLine + 1 }),
          el("td", { class: "ln", text: newLine === null ? "" : newLine + 1 }),
          el("td", { class: "code", text: `${kind}${text}` }),
        ),
      );
    }
  }
  return table;
}
