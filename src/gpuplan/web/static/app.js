// gpuplan web: form -> job-spec YAML, fetch() with a spinner, errors next to their fields.
"use strict";

const lang = () => document.documentElement.dataset.lang || "en";

function yamlScalar(v) {
  if (/^-?\d+(\.\d+)?$/.test(v)) return v;
  return /^[A-Za-z][A-Za-z0-9_.\/+-]*$/.test(v) && !/^(true|false|null|yes|no|on|off)$/i.test(v)
    ? v : JSON.stringify(v);
}

function listOf(text) {
  return text.split(",").map((s) => s.trim()).filter((s) => s);
}

// The spec the form describes, as YAML (flow mappings for the nested parts).
function formToYaml(form) {
  const top = [], nested = {};
  const put = (path, value) => {
    const [head, ...rest] = path.split(".");
    if (rest.length) (nested[head] = nested[head] || []).push(`${rest.join(".")}: ${value}`);
    else top.push(`${head}: ${value}`);
  };
  const method = form.querySelector('[data-spec="method"]');
  const lora = method && method.value !== "full";
  form.querySelectorAll("[data-spec]").forEach((el) => {
    const path = el.dataset.spec, v = el.value.trim();
    if (!v || (path.startsWith("lora.") && !lora)) return;
    if (path === "lora.targets" || path === "constraints.regions") {
      put(path, `[${listOf(v).map(yamlScalar).join(", ")}]`);
    } else put(path, yamlScalar(v));
  });
  const lists = {};
  form.querySelectorAll("[data-spec-list]").forEach((el) => {
    if (el.checked) (lists[el.dataset.specList] = lists[el.dataset.specList] || []).push(yamlScalar(el.value));
  });
  Object.entries(lists).forEach(([path, vals]) => put(path, `[${vals.join(", ")}]`));
  const lines = [];
  top.forEach((line) => {
    const key = line.split(":")[0];
    lines.push(line);
    if (key === "method" && nested.lora) lines.push(`lora: {${nested.lora.join(", ")}}`);
  });
  Object.entries(nested).forEach(([head, parts]) => {
    if (head !== "lora") lines.push(`${head}: {${parts.join(", ")}}`);
  });
  return lines.join("\n") + "\n";
}

function clearErrors(form) {
  form.querySelectorAll(".err").forEach((e) => { e.textContent = ""; });
  form.querySelectorAll("[aria-invalid]").forEach((e) => e.removeAttribute("aria-invalid"));
}

// Put the message next to the field it names (or its parent field, or the YAML box).
function showError(form, field, message) {
  let slot = null, name = field || "";
  while (name && !slot) {
    slot = form.querySelector(`[data-field="${CSS.escape(name)}"]`);
    name = name.includes(".") ? name.slice(0, name.lastIndexOf(".")) : "";
  }
  slot = slot || form.querySelector('[data-field="spec"]');
  const err = slot.querySelector(".err");
  err.textContent = "error: " + message;
  const input = slot.querySelector("input, select, textarea");
  if (input) input.setAttribute("aria-invalid", "true");
  slot.scrollIntoView({ block: "center" });
}

function optionQuery(form) {
  const q = new URLSearchParams();
  form.querySelectorAll("[data-opt]").forEach((el) => {
    if (el.value.trim()) q.append(el.dataset.opt, el.value.trim());
  });
  return q;
}

async function submit(form, event) {
  event.preventDefault();
  const spinner = form.querySelector(".spinner"), result = document.getElementById("result");
  const yaml = form.querySelector("#spec-yaml").value;
  clearErrors(form);
  spinner.hidden = false;
  form.setAttribute("aria-busy", "true");
  try {
    const q = optionQuery(form);
    let url, type = "application/yaml";
    if (form.dataset.api) url = `${form.dataset.api}?${q}`;
    else {
      q.append("lang", lang());
      url = `${form.dataset.fragment}?${q}`;
      if (form.dataset.format === "csv" || (/^[^\n:]*,[^\n]*\n/.test(yaml) && !/^\s*\w+\s*:/.test(yaml))) {
        type = "text/csv";
      }
    }
    const resp = await fetch(url, { method: "POST", headers: { "Content-Type": type }, body: yaml });
    if (resp.status === 422) {
      const data = await resp.json();
      showError(form, data.field, data.detail);
      return;
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    if (form.dataset.api) {
      const id = resp.headers.get("X-Plan-Id");
      const frag = await fetch(`/plans/${id}/fragment?lang=${lang()}`);
      result.innerHTML = await frag.text();
    } else {
      result.innerHTML = await resp.text();
    }
    result.scrollIntoView({ behavior: "smooth", block: "start" });
  } catch (err) {
    showError(form, "spec", String(err));
  } finally {
    spinner.hidden = true;
    form.removeAttribute("aria-busy");
  }
}

function init() {
  document.querySelectorAll("form.job, form.doc").forEach((form) => {
    const box = form.querySelector("#spec-yaml");
    box.addEventListener("input", () => { delete form.dataset.format; });
    if (form.classList.contains("job")) {
      const refresh = () => { box.value = formToYaml(form); };
      form.querySelectorAll("[data-spec], [data-spec-list]").forEach((el) => {
        el.addEventListener("input", refresh);
        el.addEventListener("change", refresh);
      });
      refresh();
    }
    const file = form.querySelector("#spec-file");
    if (file) {
      file.addEventListener("change", () => {
        const f = file.files[0];
        if (!f) return;
        form.dataset.format = /\.csv$/i.test(f.name) ? "csv" : "yaml";
        f.text().then((text) => { box.value = text; });
      });
    }
    form.addEventListener("submit", (e) => submit(form, e));
  });
}

document.addEventListener("DOMContentLoaded", init);
