// finality-gym results site (`python -m eval view`): every page is drawn here from data files
// that the build wrote as scripts (`FG.put(key, value)`), loaded on demand: a file:// page may
// run scripts but not fetch files. Text from the runs (policy names, a model's messages) is
// only ever set as text, never parsed as HTML.
"use strict";
const FG = (() => {
  const store = {}, waiting = {}, T0 = performance.now();

  function put(key, value) {
    store[key] = value;
    (waiting[key] || []).forEach((resolve) => resolve(value));
    delete waiting[key];
  }

  function load(src, key) {
    if (key in store) return Promise.resolve(store[key]);
    return new Promise((resolve, reject) => {
      (waiting[key] = waiting[key] || []).push(resolve);
      const s = document.createElement("script");
      s.src = src;
      s.onerror = () => reject(new Error(`${src} is missing from the site`));
      document.head.appendChild(s);
    });
  }

  // ------------------------------------------------------------------ DOM helpers
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  const usd = (cents) => (cents < 0 ? "-$" : "$") + (Math.abs(cents) / 100).toLocaleString(
    "en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  const dollars = (x) => (x === null || x === undefined ? "" : x.toFixed(2));
  const pct = (x) => (x === null || x === undefined ? "" : (100 * x).toFixed(1) + "%");
  const ci = (pair, f) => (pair ? ` [${f(pair[0])}, ${f(pair[1])}]` : "");
  const json = (x) => JSON.stringify(x);

  function params() {
    const out = {};
    for (const part of location.hash.replace(/^#/, "").split("&")) {
      if (!part) continue;
      const i = part.indexOf("=");
      out[decodeURIComponent(i < 0 ? part : part.slice(0, i))] =
        i < 0 ? "" : decodeURIComponent(part.slice(i + 1));
    }
    return out;
  }
  const hash = (obj) => "#" + Object.entries(obj).filter(([, v]) => v !== "" && v !== undefined && v !== null)
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");
  const episodeUrl = (f, p, task, seed) => "episode.html" + hash({ f, p, t: task, s: seed });

  function app() { return document.getElementById("app"); }
  function show(...nodes) { const a = app(); a.replaceChildren(...nodes); }
  function done() { document.body.dataset.renderMs = (performance.now() - T0).toFixed(0); document.body.dataset.ready = "1"; }
  function fail(err) { show(el("p", { class: "note bad", id: "error" }, String(err.message || err))); done(); }

  function sortable(table) {
    const heads = [...table.querySelectorAll("th")];
    heads.forEach((th, col) => {
      th.classList.add("sortable");
      th.addEventListener("click", () => {
        const desc = th.classList.contains("sorted-asc");
        heads.forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
        th.classList.add(desc ? "sorted-desc" : "sorted-asc");
        const body = table.tBodies[0];
        const rows = [...body.rows];
        const key = (r) => { const c = r.cells[col]; return c.dataset.v !== undefined ? Number(c.dataset.v) : c.textContent; };
        rows.sort((a, b) => { const x = key(a), y = key(b); const o = x < y ? -1 : x > y ? 1 : 0; return desc ? -o : o; });
        body.replaceChildren(...rows);
      });
    });
    return table;
  }
  const num = (v, text) => el("td", { "data-v": v === null || v === undefined ? "" : v }, text);

  // ------------------------------------------------------------------ index
  // What a run's figures are worth, on every page of it: an imported log is the submitter's
  // word; a published split's tasks ship with the package (docs/trust.md).
  const SELF_REPORTED = "imported from a log (python -m eval import-inspect): its calls replay to its records, but that the model made them is the submitter's word; re-run the model for a verified grade";
  function marks(f) {
    const out = [];
    if (f.self_reported) out.push(el("span", { class: "mark self-reported", title: SELF_REPORTED }, "self-reported"));
    if (f.development) out.push(el("span", { class: "mark development", title: "graded on a published split" }, "development figure"));
    if (f.split === "private") out.push(el("span", { class: "mark private", title: "this site holds a run of the private split: keep it to yourself" }, "private split"));
    return out;
  }

  function folderMeta(f) {
    const bits = [`split ${f.split} (fingerprint ${f.fingerprint})`, `probe arm ${f.probe}`,
      `seeds ${(f.seeds || []).join(", ")}`, `${f.episodes.toLocaleString("en-US")} episodes`];
    if (f.sandbox) bits.push(`sandbox: ${f.sandbox}`);
    const m = marks(f);
    return el("p", { class: "meta" }, m.length ? el("span", { class: "marks" }, m) : null, bits.join(" · "), el("br"), el("span", { class: "mono" }, f.path));
  }

  // The index's notes on a run's figures.
  function notes(f) {
    const out = [];
    if (f.self_reported) out.push(el("p", { class: "note self-reported" }, `Self-reported: ${SELF_REPORTED}.`));
    if (f.development) out.push(el("p", { class: "note development", "data-split": f.split },
      `Development figure (${f.split} split): a policy that carries the corpus can memorize these tasks; grades that count are graded on a private split (docs/trust.md).`));
    return out;
  }

  function policyTable(f) {
    const s = f.summary;
    const arm = (s && s.model_arm) || {};
    const model = f.policies.some((p) => arm[p] && "requests_per_episode" in arm[p]);
    const head = ["policy", "episodes", "exact [95% CI]", "mean gap $ [95% CI]", "pass^1", `pass^${(f.seeds || []).length}`,
      "paired settle / fail / avg $", "premature", "gap − baseline $ [95% CI]"];
    if (model) head.push("requests / ep", "tokens in / out per ep", "cost / ep $");
    const body = f.policies.map((p, i) => {
      const x = s.policies[p];
      if (!x) return el("tr", {}, el("td", { class: "l" }, p), el("td", { colspan: head.length - 1, class: "l" }, "not in the summary"));
      const vs = x.vs_baseline;
      const a = arm[p] || {};
      const cells = [
        el("td", { class: "l", "data-v": undefined }, el("a", { href: "episodes.html" + hash({ f: f.id, policy: i }) }, p)),
        num(x.episodes, x.episodes),
        num(x.exact, pct(x.exact) + ci(x.exact_ci, pct)),
        num(x.mean_gap, dollars(x.mean_gap) + ci(x.mean_gap_ci, dollars)),
        num(x.pass_k[0], pct(x.pass_k[0])), num(x.pass_k[x.pass_k.length - 1], pct(x.pass_k[x.pass_k.length - 1])),
        num(x.paired.average, `${dollars(x.paired.settle)} / ${dollars(x.paired.fail)} / ${dollars(x.paired.average)}`),
        num(x.premature, pct(x.premature)),
        vs ? num(vs.mean_gap_diff, `${dollars(vs.mean_gap_diff)}${ci(vs.mean_gap_diff_ci, dollars)} vs ${vs.baseline}`) : num(null, ""),
      ];
      if (model) cells.push(num(a.requests_per_episode, a.requests_per_episode ?? ""),
        num(a.tokens_in_per_episode, a.tokens_in_per_episode === undefined ? "" : `${Math.round(a.tokens_in_per_episode).toLocaleString("en-US")} / ${Math.round(a.tokens_out_per_episode).toLocaleString("en-US")}`),
        num(a.cost_per_episode_usd, a.cost_per_episode_usd === undefined ? "" : a.cost_per_episode_usd.toFixed(4)));
      return el("tr", { "data-policy": p }, cells);
    });
    return sortable(el("table", { class: "policies", "data-folder": f.id },
      el("thead", {}, el("tr", {}, head.map((h, i) => el("th", { class: i === 0 ? "l" : "" }, h)))), el("tbody", {}, body)));
  }

  function archetypeTable(f) {
    const s = f.summary;
    const names = [...new Set(f.policies.flatMap((p) => Object.keys((s.policies[p] || {}).per_archetype || {})))];
    return sortable(el("table", { class: "archetypes" },
      el("thead", {}, el("tr", {}, el("th", { class: "l" }, "policy: mean gap $ (exact)"), names.map((a) => el("th", {}, a)))),
      el("tbody", {}, f.policies.map((p) => el("tr", {}, el("td", { class: "l" }, p), names.map((a) => {
        const x = ((s.policies[p] || {}).per_archetype || {})[a];
        return x ? num(x.mean_gap, `${dollars(x.mean_gap)} (${pct(x.exact)})`) : num(null, "");
      }))))));
  }

  function index(site) {
    const out = [el("h1", {}, "Results"), el("p", { class: "meta" }, `Built by `, el("code", {}, site.built_with),
      `: ${site.folders.length} graded run${site.folders.length === 1 ? "" : "s"}. Money in dollars; intervals are 95% bootstrap intervals over tasks (twin pairs together).`)];
    if (site.cost_figure) out.push(el("h2", {}, "Models: mean gap against cost per episode"),
      el("div", { class: "figures" }, el("img", { id: "cost-figure", src: site.cost_figure, alt: "mean gap against cost per episode" })));
    for (const f of site.folders) {
      out.push(el("h2", { id: `folder-${f.id}` }, f.name), folderMeta(f), ...notes(f));
      if (f.model) out.push(el("p", { class: "meta" }, `model ${f.model.name || f.model.model}` +
        (f.model.served_as ? ` (served as ${f.model.served_as.join(", ")})` : "") + (f.model.base_url ? ` at ${f.model.base_url}` : "") +
        (f.model.price_in !== null && f.model.price_in !== undefined ? ` · $${f.model.price_in} / $${f.model.price_out} per million tokens in / out` : "")));
      if (f.with_calls < f.episodes) out.push(el("p", { class: "note" }, `${f.episodes - f.with_calls} of ${f.episodes} episodes were graded before the grader recorded calls: their pages show the record only.`));
      if (!f.summary) { out.push(el("p", { class: "note" }, "No summary: the private split's statistics are not recomputed here.")); continue; }
      out.push(policyTable(f), el("h3", {}, "By archetype"), archetypeTable(f));
      if (f.figures.length) out.push(el("h3", {}, "Figures"), el("div", { class: "figures" }, f.figures.map((src) => el("a", { href: src }, el("img", { src, alt: src, loading: "lazy" })))));
      out.push(el("p", {}, el("a", { href: "episodes.html" + hash({ f: f.id }) }, `All ${f.episodes.toLocaleString("en-US")} episodes of ${f.name}`)));
    }
    show(...out);
    done();
  }

  // ------------------------------------------------------------------ episodes
  const LIMIT = 500;
  async function episodes(site) {
    const q = params();
    const f = site.folders[Number(q.f || 0)];
    if (!f) throw new Error(`no folder ${q.f} in this site`);
    const data = await load(`data/${f.id}/rows.js`, `rows/${f.id}`);
    const C = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    const set = (k, v) => { const n = { ...params(), [k]: v }; delete n.limit; location.hash = hash(n); };
    const select = (key, label, options) => el("label", {}, label, el("select", { name: key, onchange: (e) => set(key, e.target.value) },
      options.map(([v, t]) => el("option", { value: v, selected: String(q[key] ?? "") === String(v) }, t))));
    const uniq = (c) => [...new Set(data.rows.map((r) => r[C[c]]))].sort();
    let rows = data.rows.filter((r) =>
      (q.policy === undefined || q.policy === "" || r[C.p] === Number(q.policy)) &&
      (!q.archetype || r[C.archetype] === q.archetype) && (!q.label || r[C.label] === q.label) &&
      (!q.twin || r[C.twin] === q.twin) && (q.lapsed === undefined || q.lapsed === "" || r[C.lapsed] === Number(q.lapsed)));
    const sort = q.sort || "-gap";
    const dir = sort.startsWith("-") ? -1 : 1, col = C[sort.replace(/^-/, "")] ?? C.gap;
    rows = rows.map((r, i) => [r, i]).sort((a, b) => (a[0][col] < b[0][col] ? -dir : a[0][col] > b[0][col] ? dir : a[1] - b[1])).map((x) => x[0]);
    const limit = q.limit === "all" ? rows.length : LIMIT;
    const filters = el("div", { class: "filters" },
      site.folders.length > 1 ? select("f", "results folder", site.folders.map((g) => [g.id, g.name])) : null,
      select("policy", "policy", [["", "every policy"], ...f.policies.map((p, i) => [i, p])]),
      select("archetype", "archetype", [["", "every archetype"], ...uniq("archetype").map((a) => [a, a])]),
      select("label", "label", [["", "every label"], ...uniq("label").map((a) => [a, a])]),
      el("label", {}, "twin pair", el("input", { name: "twin", value: q.twin || "", placeholder: "twin id", onchange: (e) => set("twin", e.target.value.trim()) })),
      select("lapsed", "lapsed", [["", "either"], ["1", "lapsed"], ["0", "not lapsed"]]),
      select("sort", "sort", [["-gap", "gap, largest first"], ["gap", "gap, smallest first"], ["task", "task"], ["-calls", "calls, most first"]]));
    const head = ["policy", "task", "archetype", "twin", "half", "seed", "disposition", "lapsed", "premature", "gap $", "label", "calls", "end t", "picture"];
    const table = el("table", { id: "episodes" }, el("thead", {}, el("tr", {}, head.map((h, i) => el("th", { class: i < 3 ? "l" : "" }, h)))),
      el("tbody", {}, rows.slice(0, limit).map((r) => el("tr", { "data-archetype": r[C.archetype], "data-policy": f.policies[r[C.p]] },
        el("td", { class: "l" }, el("a", { href: episodeUrl(f.id, r[C.p], r[C.task], r[C.seed]) }, f.policies[r[C.p]])),
        el("td", { class: "l mono" }, r[C.task]), el("td", { class: "l" }, r[C.archetype]),
        el("td", {}, r[C.twin] ? el("a", { href: "episodes.html" + hash({ f: f.id, twin: r[C.twin] }) }, r[C.twin]) : ""),
        el("td", {}, r[C.half] || ""), el("td", {}, r[C.seed]), el("td", {}, r[C.disposition]),
        el("td", {}, r[C.lapsed] ? "yes" : ""), el("td", {}, r[C.premature] ? "yes" : ""),
        el("td", { class: r[C.gap] > 0 ? "bad" : "" }, usd(r[C.gap])), el("td", {}, r[C.label]), el("td", {}, r[C.calls]),
        el("td", {}, r[C.end_t]), el("td", {}, r[C.picture] ? "drawn" : "")))));
    show(el("h1", {}, `Episodes of ${f.name}`), folderMeta(f), filters,
      el("p", { id: "count" }, `${rows.length.toLocaleString("en-US")} of ${data.rows.length.toLocaleString("en-US")} episodes`,
        rows.length > limit ? el("span", {}, ` (the first ${limit} shown; `, el("a", { href: hash({ ...q, limit: "all" }) }, "show all"), ")") : ""),
      table);
    done();
  }

  // ------------------------------------------------------------------ one episode
  function taskData(f, task) { return load(`data/${f.id}/tasks/${fileName(task)}.js`, `task/${f.id}/${task}`); }
  const fileName = (text) => text.replace(/[^A-Za-z0-9._-]/g, "_").replace(/^\.+/, "") || "_";

  function recordTable(e) {
    const rows = [["disposition", e.lapsed ? `${e.disposition} (lapsed)` : e.disposition], ["label", e.label],
      ["position", usd(e.position)], ["reference", usd(e.reference)], ["gap (reference − position)", usd(e.gap)],
      ["cogs", usd(e.cogs)], ["liability", usd(e.liability)], ["dispute", usd(e.dispute)], ["escalation", usd(e.escalation)],
      ["cash", usd(e.cash)], ["order value", usd(e.order_value)], ["premature", e.premature ? "yes" : "no"],
      ["calls used", e.calls_used], ["ended at", `t=${e.end_t}`]];
    if (e.requests !== undefined) rows.push(["requests (replayed)", `${e.requests} (${e.replayed})`], ["retries", e.retries],
      ["invalid turns", e.invalid_turns], ["tokens in / out", `${e.tokens_in} / ${e.tokens_out}`],
      ["tokens reasoning / cached", `${e.tokens_reasoning ?? 0} / ${e.tokens_cached ?? 0}`],
      ["cost", e.cost_microusd === undefined || e.cost_microusd === null ? "no price given" : `$${(e.cost_microusd / 1e6).toFixed(4)}`],
      ["agent status", e.agent_status]);
    return el("table", { id: "record" }, el("tbody", {}, rows.map(([k, v]) => el("tr", { "data-field": k }, el("td", { class: "l" }, k), el("td", {}, v)))));
  }

  function callsTable(e) {
    if (!e.calls) return el("p", { class: "note", id: "no-calls" }, e.replayed);
    return el("table", { id: "calls" }, el("thead", {}, el("tr", {}, ["#", "t", "tool", "arguments", "result"].map((h, i) => el("th", { class: i > 1 ? "l" : "" }, h)))),
      el("tbody", {}, e.calls.map(([t, tool, args, result], i) => el("tr", { "data-t": t, "data-tool": tool, "data-args": json(args) },
        el("td", {}, i + 1), el("td", {}, t), el("td", { class: "l mono" }, tool),
        el("td", { class: "l mono" }, Object.keys(args).length ? json(args) : ""), el("td", { class: "l mono" }, json(result))))));
  }

  function picture(e) {
    if (!e.picture) return el("p", { class: "note", id: "no-picture" }, "No picture: " + e.replayed);
    const box = el("div", { id: "picture" });
    const missing = el("p", { class: "note" }, "This picture was not drawn when the site was built: build the site with --pictures all, or open it with --serve, which draws it on request.");
    box.appendChild(el("img", { class: "picture", src: e.picture, alt: "timeline of the episode", onerror: () => box.replaceChildren(missing) }));
    return box;
  }

  async function conversation(e) {
    const conv = await load(e.conversation, `conv/${e.folder}/${e.task}/${e.seed}`);
    const out = [el("h2", {}, "Conversation")];
    conv.turns.forEach((turn, n) => {
      for (const m of turn.messages) {
        if (m.kind === "system" && n > 0) continue;
        const body = m.kind === "system" ? el("details", {}, el("summary", {}, "system prompt (the same in every episode)"), el("pre", {}, m.content)) : el("pre", {}, typeof m.content === "string" ? m.content : json(m.content));
        out.push(el("div", { class: `msg ${m.kind}`, "data-kind": m.kind }, el("div", { class: "who" },
          { system: "system", brief: "brief (user)", reminder: "reminder (user): no tool was called", result: "tool result", invalid: "tool result: invalid call", not_executed: "tool result: not executed" }[m.kind] || m.kind,
          m.tool_call_id ? ` · ${m.tool_call_id}` : ""), body));
      }
      const r = turn.reply || {};
      const u = turn.usage || {};
      const retries = (turn.attempts || 1) - 1;
      out.push(el("div", { class: "msg assistant", "data-kind": "assistant", "data-turn": turn.turn },
        el("div", { class: "who" }, `assistant · request ${turn.turn + 1}`),
        r.reasoning_content ? el("details", {}, el("summary", {}, "reasoning"), el("pre", {}, r.reasoning_content)) : null,
        r.content ? el("pre", {}, r.content) : null,
        (r.tool_calls || []).map((c) => el("pre", { class: "tool-call" }, `→ ${c.function && c.function.name}(${c.function && c.function.arguments})${c.id ? "  · " + c.id : ""}`)),
        el("div", { class: "turn-meta" }, `tokens in ${u.prompt_tokens ?? "?"} · out ${u.completion_tokens ?? "?"} · ${turn.latency_s === undefined || turn.latency_s === null ? "" : turn.latency_s.toFixed(2) + " s · "}${retries} ${retries === 1 ? "retry" : "retries"}${turn.finish ? " · finish " + turn.finish : ""}`,
          (turn.errors || []).length ? ` · errors before it: ${turn.errors.map((x) => typeof x === "string" ? x : json(x)).join("; ")}` : "")));
    });
    return el("section", { id: "conversation" }, out);
  }

  function sameCase(site, f, task, seed, self) {
    return site.folders.filter((g) => g.fingerprint === f.fingerprint && g.tasks.includes(task) && (g.seeds || []).includes(seed))
      .flatMap((g) => g.policies.map((p, i) => [g, p, i])).filter(([g, , i]) => !(g.id === f.id && i === self));
  }

  async function episode(site) {
    const q = params();
    const f = site.folders[Number(q.f)];
    if (!f || q.t === undefined) throw new Error("this page shows one episode: episode.html#f=FOLDER&p=POLICY&t=TASK&s=SEED");
    const p = Number(q.p), seed = Number(q.s);
    const data = await taskData(f, q.t);
    const e = data.episodes.find((x) => x.p === p && x.seed === seed);
    if (!e) throw new Error(`${f.policies[p]} has no episode of ${q.t} seed ${seed} in ${f.name}`);
    const out = [el("h1", {}, `${f.policies[p]} on ${q.t}, seed ${seed}`), folderMeta(f),
      el("p", { class: "meta" }, `archetype ${data.archetype}` + (data.twin_id ? ` · twin pair ${data.twin_id} (${data.twin_half} half)` : "")),
      e.replayed === "ok" ? el("p", { class: "ok", id: "replayed" }, "Rebuilt by the engine from the task, the seed and the recorded calls: its record equals the graded one.")
        : el("p", { class: "note", id: "replayed" }, e.replayed)];
    const links = [];
    if (data.twin_task && f.tasks.includes(data.twin_task)) links.push(el("a", { id: "twin", href: episodeUrl(f.id, p, data.twin_task, seed) }, `the other half of the twin pair (${data.twin_task})`));
    const others = sameCase(site, f, q.t, seed, p);
    out.push(el("div", { class: "links", id: "links" }, links, others.length ? el("div", {}, "The same case under: ",
      others.map(([g, name, i]) => el("a", { class: "same-case", href: episodeUrl(g.id, i, q.t, seed) }, g.id === f.id ? name : `${name} (${g.name})`)),
      " · side by side with: ", others.map(([g, name, i]) => el("a", { class: "compare", href: "compare.html" + hash({ t: q.t, s: seed, a: `${f.id}.${p}`, b: `${g.id}.${i}` }) }, name))) : null));
    out.push(el("h2", {}, "Outcome"), recordTable(e), el("h2", {}, "Timeline"), picture(e), el("h2", {}, "Calls"), callsTable(e));
    show(...out);
    if (e.conversation) app().appendChild(await conversation({ ...e, folder: f.id, task: q.t }));
    done();
  }

  // ------------------------------------------------------------------ side by side
  async function compare(site) {
    const q = params();
    const pick = (ref) => { const [g, i] = String(ref || "").split(".").map(Number); const f = site.folders[g]; return f && f.policies[i] !== undefined ? [f, i] : null; };
    const A = pick(q.a), B = pick(q.b);
    if (!A || !B || q.t === undefined) {
      show(el("h1", {}, "Side by side"), el("p", { id: "how" }, "Open an episode and follow a 'side by side with' link, or give compare.html#t=TASK&s=SEED&a=FOLDER.POLICY&b=FOLDER.POLICY."));
      return done();
    }
    const seed = Number(q.s);
    const [da, db] = await Promise.all([taskData(A[0], q.t), taskData(B[0], q.t)]);
    const ea = da.episodes.find((x) => x.p === A[1] && x.seed === seed), eb = db.episodes.find((x) => x.p === B[1] && x.seed === seed);
    if (!ea || !eb) throw new Error(`one of the two policies has no episode of ${q.t} seed ${seed}`);
    const name = ([f, i]) => (site.folders.length > 1 ? `${f.policies[i]} (${f.name})` : f.policies[i]);
    const marked = [A, B].filter(([f], k) => marks(f).length && (k === 0 || B[0].id !== A[0].id));
    const choices = sameCase(site, A[0], q.t, seed, -1);
    const chooser = (key) => el("select", { name: key, onchange: (e) => { location.hash = hash({ ...params(), [key]: e.target.value }); } },
      choices.map(([g, p, i]) => el("option", { value: `${g.id}.${i}`, selected: q[key] === `${g.id}.${i}` }, site.folders.length > 1 ? `${p} (${g.name})` : p)));
    const at = (e) => new Map((e.calls || []).map((c) => [c[0], c]));
    const ma = at(ea), mb = at(eb);
    const times = [...new Set([...ma.keys(), ...mb.keys()])].sort((x, y) => x - y);
    const cell = (c) => (c ? el("td", { class: "l mono" }, c[1] + (Object.keys(c[2]).length ? " " + json(c[2]) : ""), el("br"), el("span", { class: "turn-meta" }, json(c[3]))) : el("td", {}, ""));
    const table = el("table", { id: "side-by-side" }, el("thead", {}, el("tr", {}, el("th", {}, "t"), el("th", { class: "l", id: "left" }, name(A)), el("th", { class: "l", id: "right" }, name(B)))),
      el("tbody", {}, times.map((t) => el("tr", { "data-t": t }, el("td", {}, t), cell(ma.get(t)), cell(mb.get(t))))),
      el("tfoot", {}, el("tr", {}, el("td", {}, "end"), [ea, eb].map((e) => el("td", { class: "l" }, `${e.lapsed ? "lapsed, " : ""}${e.disposition} at t=${e.end_t}: position ${usd(e.position)}, gap ${usd(e.gap)}`)))));
    show(el("h1", {}, `Side by side: ${q.t}, seed ${seed}`), el("div", { class: "filters" }, el("label", {}, "left", chooser("a")), el("label", {}, "right", chooser("b"))),
      el("p", { class: "links" }, el("a", { href: episodeUrl(A[0].id, A[1], q.t, seed) }, `${name(A)}'s episode`), el("a", { href: episodeUrl(B[0].id, B[1], q.t, seed) }, `${name(B)}'s episode`)),
      marked.map(([f]) => el("p", { class: "meta" }, el("span", { class: "marks" }, marks(f)), f.name)),
      (ea.calls && eb.calls) ? null : el("p", { class: "note" }, "One of the two episodes has no recorded calls: " + (ea.calls ? eb.replayed : ea.replayed)), table);
    done();
  }

  // ------------------------------------------------------------------ start
  const VIEWS = { index, episodes, episode, compare };
  async function render() {
    try { await VIEWS[document.body.dataset.page](store.site); } catch (err) { fail(err); }
  }
  function start() {
    if (!store.site) return fail(new Error("data/site.js did not load"));
    window.addEventListener("hashchange", () => { delete document.body.dataset.ready; render(); });
    render();
  }
  return { put, load, start };
})();
