// probe view: the little JavaScript the pages use (served by the project; every page works without it).
// Sortable tables (click a header), a text filter above report tables, and the trial filter form submitted
// when a choice changes.
"use strict";

function cellValue(row, i) {
  const cell = row.children[i];
  const text = cell ? cell.textContent.trim() : "";
  const num = Number(text.replace(/,/g, ""));
  return text !== "" && !Number.isNaN(num) ? num : text.toLowerCase();
}

function makeSortable(table) {
  const heads = table.querySelectorAll("thead th");
  heads.forEach((th, i) => {
    th.addEventListener("click", () => {
      const body = table.tBodies[0];
      const asc = !th.classList.contains("asc");
      heads.forEach((h) => h.classList.remove("asc", "desc"));
      th.classList.add(asc ? "asc" : "desc");
      const rows = Array.from(body.rows);
      rows.sort((a, b) => {
        const x = cellValue(a, i), y = cellValue(b, i);
        if (typeof x === typeof y) return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        return (typeof x === "number" ? -1 : 1) * (asc ? 1 : -1);
      });
      rows.forEach((r) => body.appendChild(r));
    });
  });
}

function makeFilterable(table) {
  const input = document.createElement("input");
  input.type = "search";
  input.placeholder = "filter rows";
  input.className = "table-filter";
  input.addEventListener("input", () => {
    const q = input.value.trim().toLowerCase();
    Array.from(table.tBodies[0].rows).forEach((r) => {
      r.hidden = q !== "" && !r.textContent.toLowerCase().includes(q);
    });
  });
  table.parentNode.insertBefore(input, table);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("table.sortable").forEach(makeSortable);
  document.querySelectorAll("table.filterable").forEach(makeFilterable);
  document.querySelectorAll("select[data-autosubmit]").forEach((sel) => {
    sel.addEventListener("change", () => sel.form.submit());
  });
});
