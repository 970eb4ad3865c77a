// Usage (docs/usage.md): the signed-in user's cost today, over 7 and 30 days and in the
// chosen period, a chart of cost per UTC day, and tokens and cost by model and by agent.
import { get } from "./api.js";
import { formatUsd, showError } from "./util.js";

const SVG = "http://www.w3.org/2000/svg";
const errorNode = document.getElementById("usage-error");
const range = document.getElementById("usage-range");

function utcDay(daysAgo) {
  const day = new Date(Date.now() - daysAgo * 86400000);
  return day.toISOString().slice(0, 10);
}

async function load() {
  const since = utcDay(Number(range.value) - 1);
  const query = `since=${since}`;
  try {
    const [report, byModel, byAgent] = await Promise.all([
      get(`/v1/usage?${query}`),
      get(`/v1/usage?${query}&group_by=model`),
      get(`/v1/usage?${query}&group_by=agent`),
    ]);
    showError(errorNode, null);
    document.getElementById("cost-today").textContent = formatUsd(report.cost_today);
    document.getElementById("cost-7d").textContent = formatUsd(report.cost_last_7d);
    document.getElementById("cost-30d").textContent = formatUsd(report.cost_last_30d);
    document.getElementById("cost-period").textContent = formatUsd(report.total_cost_usd);
    drawChart(report.daily_costs);
    drawTable("by-model", byModel.data, "No model calls in this period.");
    drawTable("by-agent", byAgent.data, "No model calls in this period.");
    document.body.dataset.ready = "1";
  } catch (error) {
    showError(errorNode, error);
  }
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

// One bar per day, scaled to the most expensive day; each bar's title says its day and
// cost, and the axis names the first, middle and last day.
function drawChart(days) {
  const width = 720;
  const height = 200;
  const left = 48;
  const bottom = 24;
  const top = 10;
  const highest = Math.max(...days.map((day) => day.cost_usd), 0);
  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `Cost per day, highest ${formatUsd(highest)}`,
  });
  const plotWidth = width - left - 8;
  const plotHeight = height - bottom - top;
  const step = plotWidth / Math.max(days.length, 1);
  chart.append(svg("line", { class: "axis", x1: left, y1: top + plotHeight, x2: width - 8, y2: top + plotHeight }));
  chart.append(svg("text", { x: left - 4, y: top + 8, "text-anchor": "end" }, formatUsd(highest)));
  chart.append(svg("text", { x: left - 4, y: top + plotHeight, "text-anchor": "end" }, "$0"));
  days.forEach((day, index) => {
    const barHeight = highest > 0 ? (day.cost_usd / highest) * plotHeight : 0;
    const bar = svg("rect", {
      class: "bar",
      x: left + index * step + step * 0.1,
      y: top + plotHeight - barHeight,
      width: Math.max(step * 0.8, 1),
      height: barHeight,
      "data-day": day.day,
      "data-cost": day.cost_usd,
    });
    bar.append(svg("title", {}, `${day.day}: ${formatUsd(day.cost_usd)}`));
    chart.append(bar);
  });
  const labelled = new Set([0, Math.floor((days.length - 1) / 2), days.length - 1]);
  for (const index of labelled) {
    if (!days[index]) continue;
    chart.append(
      svg(
        "text",
        { x: left + index * step + step / 2, y: height - 6, "text-anchor": "middle" },
        days[index].day,
      ),
    );
  }
  document.getElementById("usage-chart").replaceChildren(chart);
}

function drawTable(id, rows, emptyText) {
  const body = document.querySelector(`#${id} tbody`);
  if (!rows.length) {
    const cell = document.createElement("td");
    cell.colSpan = 5;
    cell.className = "muted";
    cell.textContent = emptyText;
    const row = document.createElement("tr");
    row.append(cell);
    body.replaceChildren(row);
    return;
  }
  body.replaceChildren(
    ...rows.map((row) => {
      const tr = document.createElement("tr");
      const cells = [
        row.key || "(none)",
        row.input_tokens.toLocaleString("en-US"),
        row.output_tokens.toLocaleString("en-US"),
        row.total_tokens.toLocaleString("en-US"),
        formatUsd(row.cost_usd),
      ];
      cells.forEach((text, index) => {
        const cell = document.createElement(index ? "td" : "th");
        if (index) cell.className = "num";
        else cell.scope = "row";
        cell.textContent = text;
        tr.append(cell);
      });
      return tr;
    }),
  );
}

range.addEventListener("change", load);
load();
